"""The Provider protocol: one streaming call per model response.

A stream never raises into the agent loop (STYLE habit 5): it yields text
deltas, tool calls and usage, and always ends with exactly one ``Done`` whose
``stop_reason`` is ``end``, ``tool_calls``, ``error`` (with a turn error code)
or ``aborted``. Cancellation of the consuming task is the abort signal.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from pidesk.core.records import Message


@dataclass(frozen=True)
class ModelRequest:
    session_id: str
    turn_id: str
    system: str
    messages: list[Message]
    tools: list[dict[str, Any]]
    agent: str = "main"  # "main", or the id of a delegate (Task) working inside the turn


@dataclass(frozen=True)
class TextDelta:
    text: str


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    args: dict[str, Any]


@dataclass(frozen=True)
class UsageReport:
    input_tokens: int = 0
    output_tokens: int = 0
    cache_tokens: int = 0


@dataclass(frozen=True)
class Done:
    stop_reason: Literal["end", "tool_calls", "error", "aborted"]
    error_code: str | None = None
    detail: str = field(default="")


StreamEvent = TextDelta | ToolCall | UsageReport | Done


class Provider(Protocol):
    name: str

    def stream(self, request: ModelRequest) -> AsyncGenerator[StreamEvent, None]: ...
