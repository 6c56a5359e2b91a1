"""What every tool is: an async function from JSON arguments to a ``ToolResult``.

A tool reports failure as data (STYLE habit 5). Inside a tool, ``ToolFailure``
short-circuits; ``run_tool`` turns it into an error result, turns any other
exception into ``INTERNAL`` (a bug, never the model's fault) and lets
``asyncio.CancelledError`` through untouched: cancellation is how abort reaches
a tool, and the runtime records it as ``TOOL_ABORTED``.

``error_code`` is a stable ``Code`` string for outcomes a client may act on;
``None`` with ``ok=False`` is an ordinary failure the model reads and fixes
(a non-zero exit, ``oldText`` not found, a directory given as a file).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pidesk.core.errors import Code


@dataclass(frozen=True, slots=True)
class ToolResult:
    ok: bool
    output: str
    error_code: str | None = None

    @classmethod
    def error(cls, code: Code, message: str) -> ToolResult:
        return cls(ok=False, output=message, error_code=code.value)

    @classmethod
    def failure(cls, message: str) -> ToolResult:
        return cls(ok=False, output=message, error_code=None)


class ToolFailure(Exception):
    """Raised inside a tool; ``code=None`` is a failure without a stable code."""

    def __init__(self, code: Code | None, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def to_result(self) -> ToolResult:
        if self.code is None:
            return ToolResult.failure(self.message)
        return ToolResult.error(self.code, self.message)


Tool = Callable[[dict[str, Any]], Awaitable[ToolResult]]


async def run_tool(tool: Tool, args: dict[str, Any]) -> ToolResult:
    if not isinstance(args, dict):
        return ToolResult.error(
            Code.INVALID_ARGUMENTS, f"tool arguments must be a JSON object, got {type(args).__name__}"
        )
    try:
        return await tool(args)
    except ToolFailure as failure:
        return failure.to_result()
    except Exception as exc:
        return ToolResult.error(Code.INTERNAL, f"{type(exc).__name__}: {exc}")


def _invalid(tool: str, message: str) -> ToolFailure:
    return ToolFailure(Code.INVALID_ARGUMENTS, f"{tool}: {message}")


def require_str(args: Mapping[str, Any], tool: str, name: str, *, allow_empty: bool = False) -> str:
    value = args.get(name)
    if not isinstance(value, str):
        raise _invalid(tool, f"`{name}` is required and must be a string")
    if not value and not allow_empty:
        raise _invalid(tool, f"`{name}` must not be empty")
    return value


def optional_str(args: Mapping[str, Any], tool: str, name: str) -> str | None:
    value = args.get(name)
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise _invalid(tool, f"`{name}` must be a non-empty string when given")
    return value


def optional_int(
    args: Mapping[str, Any], tool: str, name: str, *, minimum: int, maximum: int | None = None
) -> int | None:
    value = args.get(name)
    if value is None:
        return None
    in_range = isinstance(value, int) and not isinstance(value, bool) and value >= minimum
    if not in_range or (maximum is not None and value > maximum):
        bounds = f">= {minimum}" if maximum is None else f"between {minimum} and {maximum}"
        raise _invalid(tool, f"`{name}` must be an integer {bounds}, got {value!r}")
    result: int = value
    return result


def optional_bool(args: Mapping[str, Any], tool: str, name: str) -> bool:
    value = args.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise _invalid(tool, f"`{name}` must be true or false, got {value!r}")
    return value
