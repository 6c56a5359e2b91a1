"""The Provider protocol: one streaming call per model response.

A stream never raises into the agent loop (STYLE habit 5): it yields text
deltas, thinking (``ThinkingDelta`` as it streams, then one ``Thought`` per
finished reasoning block, in the order the blocks came), tool calls and usage, and always ends with exactly one ``Done`` whose
``stop_reason`` is ``end``, ``tool_calls``, ``error`` (with a turn error code)
or ``aborted``. Cancellation of the consuming task is the abort signal.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from pidesk.core.records import Message, Usage


@dataclass(frozen=True)
class ModelRequest:
    session_id: str
    turn_id: str
    system: str
    messages: list[Message]
    tools: list[dict[str, Any]]
    agent: str = "main"  # "main", or the id of a delegate (Task) working inside the turn
    # "none": the tools are offered (the prompt's cached prefix stays the same) but no call may be
    # made — a compaction's summary request (runtime/compaction.py)
    tool_choice: Literal["auto", "none"] = "auto"


@dataclass(frozen=True)
class TextDelta:
    text: str


@dataclass(frozen=True)
class ThinkingDelta:
    """Reasoning text as it streams (shown live; the block itself comes as a ``Thought``)."""

    text: str


@dataclass(frozen=True)
class Thought:
    """One finished reasoning block: its text (empty when ``redacted``) and the vendor's opaque
    fields (signature, encrypted reasoning) the block must be sent back with, unchanged."""

    text: str
    redacted: bool = False
    opaque: dict[str, Any] | None = None


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    args: dict[str, Any]
    oversized: int = 0  # characters of argument text that came and were not kept (convert.ArgumentText)


@dataclass(frozen=True)
class UsageReport:
    """One response's token counts, as the vendor reports them (OpenAI's input includes the
    cached part, Anthropic's excludes it). Cache reads and writes are kept apart."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    input_includes_cache: bool = True  # OpenAI's way; Anthropic reports the cached part apart

    @property
    def cache_tokens(self) -> int:
        return self.cache_read_tokens + self.cache_write_tokens

    def as_usage(self) -> Usage:
        """The counts as a turn (or a session) records them."""
        return Usage(input_tokens=self.input_tokens, output_tokens=self.output_tokens, cache_tokens=self.cache_tokens,
                     cache_read_tokens=self.cache_read_tokens, cache_write_tokens=self.cache_write_tokens)

    @property
    def prompt_tokens(self) -> int:
        """The whole input of the request, cached or not: how much of the window it filled."""
        return self.input_tokens if self.input_includes_cache else self.input_tokens + self.cache_tokens


@dataclass(frozen=True)
class Done:
    stop_reason: Literal["end", "tool_calls", "error", "aborted"]
    error_code: str | None = None
    detail: str = field(default="")
    overflow: bool = False  # the provider refused the input as longer than the model's window


@dataclass(frozen=True)
class Retrying:
    """The request failed in a way worth trying again (a 429, a 5xx, a broken stream), and nothing of it
    was shown: it is sent again after ``wait_s`` seconds. ``attempt`` counts the retries (1 for the
    first), ``of`` is the budget, ``reason`` the failure in a person's words."""

    attempt: int
    of: int
    wait_s: float
    reason: str


StreamEvent = TextDelta | ThinkingDelta | Thought | ToolCall | UsageReport | Retrying | Done


class Provider(Protocol):
    name: str

    def stream(self, request: ModelRequest) -> AsyncGenerator[StreamEvent, None]: ...
