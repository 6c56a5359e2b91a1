"""Anthropic Messages, streamed, on the official ``anthropic`` SDK.

* The SDK is imported on the first ``stream()`` (it costs ~1.7 s); importing
  this module must not import it. ``warm_up()`` does the import ahead of time
  (blocking: call it from a worker thread).
* The SDK's own retries are off; ``retry.stream_with_retries`` decides. An
  ``error`` event inside the stream (``overloaded_error`` …) is classified by
  its error type like the HTTP status it stands for.
* The SDK sends the request; pidesk encodes its body and decodes the
  response's events (``SdkProvider._create``, ``sse.Events``) into the small
  msgspec structs below, of the fields pidesk reads.
* Text deltas are yielded as they arrive. A ``tool_use`` block's input comes
  as ``input_json_delta`` pieces, assembled per block index and yielded, parsed,
  only once the response is complete (``message_stop``); input that is not a
  JSON object is passed on as ``{"_raw": text}``. A stream that ends before
  ``message_stop`` broke off. The stop reason is ``tool_calls`` whenever there
  are tool calls (the API says ``tool_use``).
* Usage: ``message_start`` carries the input side, ``message_delta`` the
  cumulative output (and, lately, input) counts. Cache tokens are
  ``cache_read_input_tokens + cache_creation_input_tokens``; Anthropic's
  ``input_tokens`` exclude both.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import msgspec

from pidesk.providers.base import Done, ModelRequest, StreamEvent, ToolCall, UsageReport
from pidesk.providers.convert import anthropic_messages, anthropic_tools, parse_arguments
from pidesk.providers.retry import DEFAULT_MAX_RETRIES, Sleep
from pidesk.providers.sdk import SdkProvider

DEFAULT_MAX_TOKENS = 8192


class _Usage(msgspec.Struct):
    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_read_input_tokens: int | None = None
    cache_creation_input_tokens: int | None = None


class _Message(msgspec.Struct):
    usage: _Usage | None = None


class _Block(msgspec.Struct):
    type: str = ""
    id: str = ""
    name: str = ""
    input: Any = None
    text: str | None = None


class _Delta(msgspec.Struct):
    type: str = ""
    text: str | None = None
    partial_json: str | None = None


class _Event(msgspec.Struct):
    """The fields of a Messages stream event pidesk reads; the rest are skipped while decoding."""

    type: str = ""
    index: int = 0
    message: _Message | None = None
    content_block: _Block | None = None
    delta: _Delta | None = None
    usage: _Usage | None = None
    error: Any = None  # an ``error`` event's payload


class AnthropicProvider(SdkProvider):
    vendor = "anthropic"
    path = "/v1/messages"
    decoder = msgspec.json.Decoder(_Event)

    def __init__(self, model: str, *, api_key: str, base_url: str | None, lean_http: bool = True,
                 max_retries: int = DEFAULT_MAX_RETRIES, max_tokens: int = DEFAULT_MAX_TOKENS,
                 sleep: Sleep = asyncio.sleep) -> None:
        super().__init__(model, api_key=api_key, base_url=base_url, lean_http=lean_http, max_retries=max_retries,
                         sleep=sleep)
        self._max_tokens = max_tokens

    def _params(self, request: ModelRequest) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model, "max_tokens": self._max_tokens,
                                "messages": anthropic_messages(request.messages), "stream": True}
        if request.system:
            body["system"] = request.system
        if request.tools:
            body["tools"] = anthropic_tools(request.tools)
        return body

    def _sdk(self) -> tuple[Any, Any]:
        import anthropic

        return anthropic, anthropic.AsyncAnthropic

    def _reply(self) -> _Reply:
        return _Reply()


@dataclass
class _ToolUse:
    id: str
    name: str
    start_input: dict[str, Any]
    json: list[str] = field(default_factory=list)


@dataclass
class _Reply:
    """One response being assembled from its events."""

    tools: dict[int, _ToolUse] = field(default_factory=dict)
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read: int = 0
    cache_creation: int = 0
    stopped: bool = False

    @property
    def complete(self) -> bool:
        return self.stopped

    @property
    def last(self) -> bool:  # message_stop: nothing pidesk reads follows
        return self.stopped

    def feed(self, event: Any) -> str:
        """Take one event; returns its text (possibly empty)."""
        kind = getattr(event, "type", None)
        if kind == "message_start":
            self._usage(getattr(getattr(event, "message", None), "usage", None))
        elif kind == "content_block_start":
            block: Any = getattr(event, "content_block", None)
            if getattr(block, "type", None) == "tool_use":
                start = getattr(block, "input", None)
                self.tools[event.index] = _ToolUse(
                    block.id, block.name, start if isinstance(start, dict) else {}
                )
            elif getattr(block, "type", None) == "text":
                return getattr(block, "text", None) or ""
        elif kind == "content_block_delta":
            delta = getattr(event, "delta", None)
            delta_kind = getattr(delta, "type", None)
            if delta_kind == "text_delta":
                return getattr(delta, "text", None) or ""
            if delta_kind == "input_json_delta" and (tool := self.tools.get(event.index)) is not None:
                tool.json.append(getattr(delta, "partial_json", None) or "")
        elif kind == "message_delta":
            self._usage(getattr(event, "usage", None))
        elif kind == "message_stop":
            self.stopped = True
        return ""

    def _usage(self, usage: Any) -> None:
        """Counts are cumulative: a later report replaces what it names."""
        if usage is None:
            return
        self.input_tokens = getattr(usage, "input_tokens", None) or self.input_tokens
        self.output_tokens = getattr(usage, "output_tokens", None) or self.output_tokens
        self.cache_read = getattr(usage, "cache_read_input_tokens", None) or self.cache_read
        self.cache_creation = getattr(usage, "cache_creation_input_tokens", None) or self.cache_creation

    def finish(self) -> list[StreamEvent]:
        events: list[StreamEvent] = [
            ToolCall(t.id, t.name, parse_arguments("".join(t.json)) if t.json else dict(t.start_input))
            for _, t in sorted(self.tools.items())
        ]
        events.append(UsageReport(self.input_tokens, self.output_tokens, self.cache_read + self.cache_creation))
        events.append(Done("tool_calls" if self.tools else "end"))
        return events
