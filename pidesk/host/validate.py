"""Argument checks for the Host API: bad input raises INVALID_PARAMS before anything changes.

The server passes JSON values straight through, so every public Host method
checks its arguments' types itself. An integer parameter is a JSON integer — never
``true``/``false`` (Python's ``True == 1``) nor ``1.0`` — inside the range it allows
(``integer``); anything else is INVALID_PARAMS with that range in the message, before
the value reaches SQLite (whose integers are 64-bit: a larger one raised OverflowError).
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from pidesk.core.errors import Code, InvalidParams
from pidesk.core.records import Attachment

E = TypeVar("E", bound=StrEnum)

MAX_TEXT = 1_000_000
MAX_NAME = 200  # characters of a name a person gives: a session's title, a schedule's name
INT64_MAX = 2**63 - 1


def text(value: Any, name: str, *, allow_empty: bool = False) -> str:
    if not isinstance(value, str) or (not allow_empty and not value.strip()):
        raise InvalidParams(f"{name} must be a non-empty string")
    if "\x00" in value:
        raise InvalidParams(f"{name} must not contain a NUL character")
    if len(value) > MAX_TEXT:
        raise InvalidParams(f"{name} is longer than {MAX_TEXT} characters")
    return value


def label(value: Any, name: str) -> str:
    """A name a person gives (a session's title, a schedule's name): text, trimmed, at most ``MAX_NAME``
    characters — one limit wherever a name is set."""
    trimmed = text(value, name).strip()
    if len(trimmed) > MAX_NAME:
        raise InvalidParams(f"{name} is {len(trimmed):,} characters long; at most {MAX_NAME} are allowed")
    return trimmed


def project_dir(value: Any, name: str = "projectPath", *, must_exist: bool = True) -> Path:
    """An absolute project directory, resolved (symlinks followed); anything unusable is INVALID_PARAMS."""
    raw = text(value, name)
    try:
        path = Path(raw).expanduser()
        if not path.is_absolute():
            raise InvalidParams(f"{name} must be an absolute path; got {brief(raw)}")
        resolved = path.resolve()
        if must_exist and not resolved.is_dir():
            raise InvalidParams(f"{name} {brief(raw)} is not a directory")
    except (OSError, RuntimeError, ValueError) as exc:  # ~nosuchuser, a symlink loop, a name too long
        raise InvalidParams(f"{name} {brief(raw)} is not a usable path: "
                            f"{exc.strerror if isinstance(exc, OSError) and exc.strerror else exc}") from None
    return resolved


def optional_text(value: Any, name: str) -> str | None:
    return None if value is None else text(value, name, allow_empty=True)


def ident(value: Any, name: str) -> str:
    if not isinstance(value, str) or not value or len(value) > 200:
        raise InvalidParams(f"{name} must be an id string")
    return value


def enum(value: Any, kind: type[E], name: str, code: Code = Code.INVALID_PARAMS) -> E:
    try:
        return kind(value)
    except ValueError:
        choices = ", ".join(repr(v.value) for v in kind)
        raise InvalidParams(f"{name} must be one of {choices}; got {value!r}", code) from None


def integer(value: Any, name: str, minimum: int, maximum: int) -> int:
    """A JSON integer in ``minimum..maximum``: a bool, a float (even ``1.0``) or a number out of
    range is INVALID_PARAMS naming the range."""
    if not isinstance(value, int) or isinstance(value, bool) or not minimum <= value <= maximum:
        raise InvalidParams(f"{name} must be an integer from {minimum} to {maximum}; got {brief(value)}")
    return value


def positive_int(value: Any, name: str, default: int, maximum: int) -> int:
    """An optional count (a page size): ``default`` when absent, else an integer in ``1..maximum``."""
    return default if value is None else integer(value, name, 1, maximum)


def brief(value: Any) -> str:
    """A short rendering of a client's value for an error message (a 4,000-digit number is not echoed)."""
    if isinstance(value, bool) or value is None:
        return {True: "true", False: "false", None: "null"}[value]
    if isinstance(value, int):
        return str(value) if abs(value) < 10**30 else f"a {len(str(abs(value)))}-digit number"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):
        return repr(value) if len(value) <= 40 else repr(value[:40]) + "…"
    if isinstance(value, list):
        return "an array"
    return "an object" if isinstance(value, dict) else type(value).__name__


def attachments(value: Any) -> list[Attachment]:
    if value is None:
        return []
    try:
        files = msgspec.convert(value, list[Attachment])
    except msgspec.ValidationError as exc:
        raise InvalidParams(f"attachments: {exc}") from None
    for index, item in enumerate(files):
        integer(item.size, f"attachments[{index}].size", 0, INT64_MAX)
    return files
