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
  cumulative output (and, lately, input) counts. Cache reads are
  ``cache_read_input_tokens``, cache writes ``cache_creation_input_tokens``;
  Anthropic's ``input_tokens`` exclude both.
* Extended thinking (per model in the config: ``thinking_budget`` and/or
  ``effort``): ``thinking`` blocks stream as ``thinking_delta`` pieces (yielded
  as ``ThinkingDelta``) and end with a ``signature_delta``; ``redacted_thinking``
  blocks arrive whole (``data``). Each is yielded as a ``Thought`` at its
  ``content_block_stop``, with its signature or data in ``opaque``, and is sent
  back exactly as received (``convert.anthropic_messages``), before the text and
  tool_use blocks of its message, as the API requires when tools are used.
* Prompt caching (``convert.anthropic_cache``): breakpoints on the last tool and
  the system prompt, and a rolling pair on the last two user messages — four,
  the API's limit.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import msgspec

from pidesk.providers.base import Done, ModelRequest, StreamEvent, ThinkingDelta, Thought, UsageReport
from pidesk.providers.convert import ArgumentText, anthropic_cache, anthropic_messages, anthropic_tools
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
    thinking: str | None = None
    signature: str | None = None
    data: str | None = None  # redacted_thinking's encrypted reasoning


class _Delta(msgspec.Struct):
    type: str = ""
    text: str | None = None
    partial_json: str | None = None
    thinking: str | None = None
    signature: str | None = None


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
                 thinking_budget: int | None = None, effort: str | None = None, cache: bool = True,
                 sleep: Sleep = asyncio.sleep) -> None:
        super().__init__(model, api_key=api_key, base_url=base_url, lean_http=lean_http, max_retries=max_retries,
                         sleep=sleep)
        # the budget must stay below max_tokens: the answer gets max_tokens on top of it
        self._max_tokens = max_tokens + thinking_budget if thinking_budget else max_tokens
        self._thinking: dict[str, Any] | None = (
            {"type": "enabled", "budget_tokens": thinking_budget} if thinking_budget
            else {"type": "adaptive"} if effort else None
        )
        self._effort = effort
        self._cache = cache

    def _params(self, request: ModelRequest) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model, "max_tokens": self._max_tokens,
                                "messages": anthropic_messages(request.messages), "stream": True}
        if request.system:
            body["system"] = request.system
        if request.tools:
            body["tools"] = anthropic_tools(request.tools)
            if request.tool_choice == "none":
                body["tool_choice"] = {"type": "none"}
        if self._thinking is not None:
            body["thinking"] = self._thinking
        if self._effort:
            body["output_config"] = {"effort": self._effort}
        if self._cache:
            anthropic_cache(body)
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
    json: ArgumentText = field(default_factory=ArgumentText)


@dataclass
class _Thinking:
    text: list[str] = field(default_factory=list)
    signature: str = ""
    data: str | None = None  # a redacted_thinking block's


@dataclass
class _Reply:
    """One response being assembled from its events."""

    tools: dict[int, _ToolUse] = field(default_factory=dict)
    thinking: dict[int, _Thinking] = field(default_factory=dict)  # open thinking blocks, by index
    out: list[StreamEvent] = field(default_factory=list)  # events besides text, for the caller to take
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
            elif getattr(block, "type", None) == "thinking":
                thinking = self.thinking[event.index] = _Thinking(signature=getattr(block, "signature", None) or "")
                if first := getattr(block, "thinking", None):
                    thinking.text.append(first)
                    self.out.append(ThinkingDelta(first))
            elif getattr(block, "type", None) == "redacted_thinking":
                self.thinking[event.index] = _Thinking(data=getattr(block, "data", None) or "")
        elif kind == "content_block_delta":
            delta = getattr(event, "delta", None)
            delta_kind = getattr(delta, "type", None)
            if delta_kind == "text_delta":
                return getattr(delta, "text", None) or ""
            if delta_kind == "input_json_delta" and (tool := self.tools.get(event.index)) is not None:
                tool.json.add(getattr(delta, "partial_json", None) or "")
            elif delta_kind in ("thinking_delta", "signature_delta") and event.index in self.thinking:
                self._think(self.thinking[event.index], delta)
        elif kind == "content_block_stop":
            if (done := self.thinking.pop(event.index, None)) is not None:
                self.out.append(_thought(done))
        elif kind == "message_delta":
            self._usage(getattr(event, "usage", None))
        elif kind == "message_stop":
            self.stopped = True
        return ""

    def _think(self, block: _Thinking, delta: Any) -> None:
        if piece := getattr(delta, "thinking", None):
            block.text.append(piece)
            self.out.append(ThinkingDelta(piece))
        block.signature += getattr(delta, "signature", None) or ""

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
            t.json.tool_call(t.id, t.name, default=t.start_input) for _, t in sorted(self.tools.items())
        ]
        events.extend(_thought(t) for _, t in sorted(self.thinking.items()))  # never stopped: keep them anyway
        events.append(UsageReport(self.input_tokens, self.output_tokens, self.cache_read, self.cache_creation,
                                  input_includes_cache=False))
        events.append(Done("tool_calls" if self.tools else "end"))
        return events


def _thought(block: _Thinking) -> Thought:
    if block.data is not None:
        return Thought("", redacted=True, opaque={"vendor": "anthropic", "data": block.data})
    return Thought("".join(block.text), opaque={"vendor": "anthropic", "signature": block.signature})
