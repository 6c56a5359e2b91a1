"""Anthropic Messages, streamed, on the official ``anthropic`` SDK.

* The SDK is imported on the first ``stream()`` (it costs ~1.7 s); importing
  this module must not import it. ``warm_up()`` does the import ahead of time
  (blocking: call it from a worker thread).
* The SDK's own retries are off; ``retry.stream_with_retries`` decides. An
  ``error`` event inside the stream (``overloaded_error`` …) is classified by
  its error type like the HTTP status it stands for.
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
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any

from pidesk.providers.base import Done, ModelRequest, StreamEvent, TextDelta, ToolCall, UsageReport
from pidesk.providers.convert import anthropic_messages, anthropic_tools, parse_arguments
from pidesk.providers.retry import DEFAULT_MAX_RETRIES, Failure, Sleep
from pidesk.providers.sdk import SdkProvider

DEFAULT_MAX_TOKENS = 8192


class AnthropicProvider(SdkProvider):
    vendor = "anthropic"

    def __init__(self, model: str, *, api_key: str, base_url: str | None,
                 max_retries: int = DEFAULT_MAX_RETRIES, max_tokens: int = DEFAULT_MAX_TOKENS,
                 sleep: Sleep = asyncio.sleep) -> None:
        super().__init__(model, api_key=api_key, base_url=base_url, max_retries=max_retries, sleep=sleep)
        self._max_tokens = max_tokens

    def _params(self, request: ModelRequest) -> dict[str, Any]:
        # Wire-format messages and tools go in extra_body, past the SDK's per-request transform
        # of the whole history (26 ms at 50 tool rounds; the same body is sent). The OpenAI
        # provider also encodes its body and decodes its events itself, for the last ~1 ms a
        # call; this one keeps the SDK's typed events.
        body: dict[str, Any] = {"messages": anthropic_messages(request.messages)}
        if request.system:
            body["system"] = request.system
        if request.tools:
            body["tools"] = anthropic_tools(request.tools)
        return {"model": self.model, "max_tokens": self._max_tokens, "messages": [], "stream": True,
                "extra_body": body}

    def _sdk(self) -> tuple[Any, Any]:
        import anthropic

        return anthropic, anthropic.AsyncAnthropic

    async def _create(self, client: Any, params: dict[str, Any]) -> Any:
        return await client.messages.create(**params)

    async def _attempt(self, request: ModelRequest) -> AsyncGenerator[StreamEvent | Failure, None]:
        started = await self._start(request)
        if isinstance(started, Failure):
            yield started
            return
        stream, errors = started
        reply = _Reply()
        try:
            async with stream:
                async for event in stream:
                    if text := reply.feed(event):
                        yield TextDelta(text)
                    if reply.stopped:
                        break  # do not wait for the server to close the response
        except Exception as exc:
            yield errors.stream_failure(exc)
            return
        if not reply.stopped:
            yield Failure("broken", "the anthropic stream ended before message_stop")
            return
        for event in reply.finish():
            yield event


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
