"""OpenAI-compatible Chat Completions, streamed, on the official ``openai`` SDK.

Works with any server that speaks the format (OpenAI, Ollama, vLLM, llama.cpp,
LM Studio, OpenRouter) through ``base_url``.

* The SDK is imported on the first ``stream()`` (it costs ~0.7 s); importing
  this module must not import it. ``warm_up()`` does the import ahead of time
  (blocking: call it from a worker thread).
* The SDK's own retries are off; ``retry.stream_with_retries`` decides.
* Text deltas are yielded as they arrive. Tool calls arrive split across
  chunks and interleaved by ``index``: they are assembled per index and
  yielded, with their arguments parsed, only once the response is complete.
  Arguments that are not a JSON object are passed on as ``{"_raw": text}``,
  so the tool answers ``INVALID_ARGUMENTS`` and the model can try again.
* A response is complete at ``data: [DONE]`` after a chunk with a
  ``finish_reason``; a stream that ends without one broke off. The stop reason
  is ``tool_calls`` whenever there are tool calls (some servers say ``stop``).
* Usage comes from the last chunk (``stream_options.include_usage``):
  ``prompt_tokens`` (which include the cached ones), ``completion_tokens``,
  ``prompt_tokens_details.cached_tokens`` (cache reads; OpenAI reports no writes).
* Reasoning: ``reasoning_effort`` is sent when the model's config sets it.
  Streamed ``reasoning_content`` (DeepSeek, vLLM, llama.cpp) and ``reasoning``
  (OpenRouter, Ollama) deltas are yielded as ``ThinkingDelta`` and become one
  ``Thought`` when the answer's text or tool calls begin (or it ends). Chat
  Completions takes no reasoning back: ``convert.openai_messages`` leaves it out — but for the
  models that need it in a tool loop (DeepSeek's and Kimi's thinking models: the model's
  ``reasoning_content = true`` setting), where an answer that called tools carries it back.
* Caching: ``prompt_cache_key`` is the session id, so a session's requests
  land where its prefix is cached (servers that do not know it ignore it;
  ``cache = false`` in the model's config leaves it out).
* The SDK sends the request; pidesk encodes its body and decodes the
  response's events (``SdkProvider._create``, ``sse.Events``) into the small
  msgspec structs below, of the fields pidesk reads.
"""

from __future__ import annotations

import asyncio
import secrets
from dataclasses import dataclass, field
from typing import Any

import msgspec

from pidesk.core.errors import Code
from pidesk.providers.base import Done, ModelRequest, StreamEvent, ThinkingDelta, Thought, UsageReport
from pidesk.providers.convert import ArgumentText, openai_messages, openai_tools
from pidesk.providers.retry import DEFAULT_MAX_RETRIES, Sleep
from pidesk.providers.sdk import SdkProvider


class _Function(msgspec.Struct):
    name: str | None = None
    arguments: str | None = None


class _CallPart(msgspec.Struct):
    index: int | None = None
    id: str | None = None
    function: _Function | None = None


class _Delta(msgspec.Struct):
    content: str | None = None
    tool_calls: list[_CallPart] | None = None
    reasoning_content: str | None = None  # DeepSeek, vLLM, llama.cpp
    reasoning: str | None = None  # OpenRouter, Ollama


class _Choice(msgspec.Struct):
    index: int = 0
    delta: _Delta | None = None
    finish_reason: str | None = None


class _TokenDetails(msgspec.Struct):
    cached_tokens: int | None = None


class _Usage(msgspec.Struct):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    prompt_tokens_details: _TokenDetails | None = None


class _Chunk(msgspec.Struct):
    """The fields of a ``chat.completion.chunk`` pidesk reads; the rest are skipped while decoding."""

    choices: list[_Choice] | None = None  # vLLM may send ``choices: null``
    usage: _Usage | None = None
    error: Any = None  # a relay's in-stream error (OpenRouter and others)


class OpenAIClient(SdkProvider):
    """What both of OpenAI's endpoints share: the SDK's client and the per-model settings
    (``reasoning_effort``; ``cache``: send ``prompt_cache_key`` = the session id; ``reasoning_content``:
    send a tool-calling answer's reasoning back, Chat Completions only)."""

    def __init__(self, model: str, *, api_key: str, base_url: str | None, lean_http: bool = True,
                 max_retries: int = DEFAULT_MAX_RETRIES, reasoning_effort: str | None = None, cache: bool = True,
                 reasoning_content: bool = False, sleep: Sleep = asyncio.sleep) -> None:
        super().__init__(model, api_key=api_key, base_url=base_url, lean_http=lean_http, max_retries=max_retries,
                         sleep=sleep)
        self._reasoning_effort = reasoning_effort
        self._cache = cache
        self._reasoning_back = reasoning_content

    def _sdk(self) -> tuple[Any, Any]:
        import openai

        return openai, openai.AsyncOpenAI


class OpenAIProvider(OpenAIClient):
    vendor = "openai"
    path = "/chat/completions"
    ends_with_done = True  # a stream without data: [DONE] broke off, finish_reason or not
    decoder = msgspec.json.Decoder(_Chunk)

    def _params(self, request: ModelRequest) -> dict[str, Any]:
        messages = openai_messages(request.system, request.messages, self._reasoning_back)
        body: dict[str, Any] = {"model": self.model, "messages": messages,
                                "stream": True, "stream_options": {"include_usage": True}}
        if request.tools:
            body["tools"] = openai_tools(request.tools)
            if request.tool_choice == "none":
                body["tool_choice"] = "none"
        if self._reasoning_effort:
            body["reasoning_effort"] = self._reasoning_effort
        if self._cache:
            body["prompt_cache_key"] = request.session_id
        return body

    def _reply(self) -> _Reply:
        return _Reply()


@dataclass
class _Call:
    id: str = ""
    name: str = ""
    arguments: ArgumentText = field(default_factory=ArgumentText)


@dataclass
class _Reply:
    """One response being assembled from its chunks."""

    calls: list[_Call] = field(default_factory=list)
    slots: dict[int, int] = field(default_factory=dict)  # a delta's index -> its call in ``calls``
    reasoning: list[str] = field(default_factory=list)  # the open reasoning block's text
    out: list[StreamEvent] = field(default_factory=list)
    finish_reason: str | None = None
    usage: UsageReport | None = None
    last = False  # the usage chunk and [DONE] follow the finish_reason: read to the end

    @property
    def complete(self) -> bool:
        return self.finish_reason is not None

    @property
    def whole(self) -> bool:
        """Nothing can be missing even without ``data: [DONE]``: the finish reason came, and the usage
        chunk that follows it (some servers close the body there, as the official SDK accepts)."""
        return self.finish_reason is not None and self.usage is not None

    def feed(self, chunk: Any) -> str:
        """Take one chunk; returns its text (possibly empty)."""
        if usage := getattr(chunk, "usage", None):
            details = getattr(usage, "prompt_tokens_details", None)
            self.usage = UsageReport(
                input_tokens=getattr(usage, "prompt_tokens", 0) or 0,
                output_tokens=getattr(usage, "completion_tokens", 0) or 0,
                cache_read_tokens=getattr(details, "cached_tokens", 0) or 0,
            )
        text = ""
        for choice in getattr(chunk, "choices", None) or []:  # vLLM may send ``choices: null``
            if getattr(choice, "index", 0):  # only the first choice (n=1 is all we ask for)
                continue
            delta = getattr(choice, "delta", None)
            if thinking := getattr(delta, "reasoning_content", None) or getattr(delta, "reasoning", None):
                self.reasoning.append(thinking)
                self.out.append(ThinkingDelta(thinking))
            content = getattr(delta, "content", None) or ""
            calls = getattr(delta, "tool_calls", None) or []
            if self.reasoning and (content or calls):
                self._end_reasoning()
            text += content
            for part in calls:
                self._feed_call(part)
            if reason := getattr(choice, "finish_reason", None):
                self.finish_reason = reason
        return text

    def _feed_call(self, part: Any) -> None:
        index = getattr(part, "index", None)
        part_id = getattr(part, "id", None) or ""
        slot = self.slots.get(index) if index is not None else None
        # A new call: an unseen index, no index at all (a server sending whole calls), or a
        # new id at a used index (a server numbering every call 0).
        if slot is None or (part_id and self.calls[slot].id and part_id != self.calls[slot].id):
            slot = len(self.calls)
            self.calls.append(_Call())
            if index is not None:
                self.slots[index] = slot
        call = self.calls[slot]
        function = getattr(part, "function", None)
        call.id = call.id or part_id
        call.name = call.name or getattr(function, "name", None) or ""
        if arguments := getattr(function, "arguments", None):
            call.arguments.add(arguments)

    def _end_reasoning(self) -> None:
        self.out.append(Thought("".join(self.reasoning)))
        self.reasoning = []

    def finish(self) -> list[StreamEvent]:
        if self.reasoning:  # a reasoning-only answer
            self._end_reasoning()
        events: list[StreamEvent] = [*self.out]  # the reasoning just ended, if any
        self.out.clear()
        events += [
            call.arguments.tool_call(call.id or f"call_{secrets.token_hex(8)}", call.name) for call in self.calls
        ]
        if self.usage is not None:
            events.append(self.usage)
        if self.finish_reason == "content_filter" and not self.calls:
            events.append(Done("error", Code.PROVIDER_ERROR, "the provider's content filter stopped the answer"))
        else:
            events.append(Done("tool_calls" if self.calls else "end"))
        return events

