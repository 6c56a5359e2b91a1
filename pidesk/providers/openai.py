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
  ``prompt_tokens_details.cached_tokens``.
* The SDK sends the request (its headers, connection pool and error statuses)
  through ``client.post``; the body is encoded here with msgspec, as it is
  already in wire format, and the response's server-sent events are decoded
  here (``_Events``), straight into small msgspec structs of the fields pidesk
  reads. The SDK's typed chunk models cost about 0.1 ms
  per chunk — a tenth of a tool call's budget (docs/benchmarks-server.md). An
  ``error`` payload in the stream raises the SDK's ``APIError``, as the SDK's
  own stream does.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from pidesk.core.errors import Code
from pidesk.providers.base import Done, ModelRequest, StreamEvent, TextDelta, ToolCall, UsageReport
from pidesk.providers.convert import openai_messages, openai_tools, parse_arguments
from pidesk.providers.retry import Failure
from pidesk.providers.sdk import SdkProvider


class OpenAIProvider(SdkProvider):
    vendor = "openai"

    def _params(self, request: ModelRequest) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model, "messages": openai_messages(request.system, request.messages),
                                "stream": True, "stream_options": {"include_usage": True}}
        if request.tools:
            body["tools"] = openai_tools(request.tools)
        return body

    def _sdk(self) -> tuple[Any, Any]:
        import openai

        return openai, openai.AsyncOpenAI

    async def _create(self, client: Any, params: dict[str, Any]) -> Any:
        # The SDK's documented way to send a body it need not look at: ``post`` with ``content``.
        # ``chat.completions.create`` would walk the whole history through its type-directed
        # transform and encode it with the json module; the body is already wire format, and
        # msgspec encodes it in a tenth of the time (docs/benchmarks-server.md). The SDK still
        # builds the headers, sends the request and raises its errors for a failed status.
        import httpx2  # the SDK's HTTP client, loaded with it

        response = await client.post("/chat/completions", cast_to=httpx2.Response, content=_body.encode(params),
                                     stream=True)
        assert self._errors is not None  # set with the client
        return _Events(response, self._errors.api)

    async def _attempt(self, request: ModelRequest) -> AsyncGenerator[StreamEvent | Failure, None]:
        started = await self._start(request)
        if isinstance(started, Failure):
            yield started
            return
        stream, errors = started
        reply = _Reply()
        try:
            async with stream:
                async for chunk in stream:
                    if text := reply.feed(chunk):
                        yield TextDelta(text)
        except Exception as exc:
            yield errors.stream_failure(exc)
            return
        if reply.finish_reason is None:
            yield Failure("broken", "the openai stream ended before the response was finished")
            return
        for event in reply.finish():
            yield event


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


_chunks = msgspec.json.Decoder(_Chunk)
_body = msgspec.json.Encoder()


class _Events:
    """One streamed response's chunks, decoded from its server-sent events until ``[DONE]``."""

    def __init__(self, response: Any, api_error: Callable[..., Exception]) -> None:
        self._response = response  # the SDK's HTTP response, its body not yet read
        self._api_error = api_error

    async def __aenter__(self) -> _Events:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._response.aclose()

    async def __aiter__(self) -> AsyncIterator[_Chunk]:
        data: list[bytes] = []
        lines = _lines(self._response.aiter_bytes())
        async for line in lines:
            if line.startswith(b"data:"):
                data.append(line[6:] if line.startswith(b"data: ") else line[5:])
                continue
            if line or not data:  # another field (event:, id:, retry:) or a comment: nothing pidesk reads
                continue
            payload, data = b"\n".join(data), []  # a blank line ends the event
            if payload.startswith(b"[DONE]"):
                await _drain(lines)
                return
            chunk = _chunks.decode(payload)
            if chunk.error:
                error = chunk.error
                message = error.get("message") if isinstance(error, dict) else None
                raise self._api_error(str(message or "An error occurred during streaming"),
                                      self._response.request, body=error)
            yield chunk


async def _lines(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """The body's lines, without their ends, which server-sent events may write as LF, CRLF or CR,
    whichever chunks the body arrives in. (Bytes, split here: the SDK's text lines cost ~0.1 ms
    more per response.)"""
    rest = b""
    after_cr = False
    async for chunk in chunks:
        if after_cr and chunk.startswith(b"\n"):
            chunk = chunk[1:]  # the LF of a CRLF that two chunks split
        text = rest + chunk
        after_cr = text.endswith(b"\r")
        lines = text.splitlines(keepends=True)
        rest = lines.pop() if lines and not lines[-1].endswith((b"\n", b"\r")) else b""
        for line in lines:
            yield line.rstrip(b"\r\n")
    if rest:
        yield rest


async def _drain(lines: AsyncIterator[bytes]) -> None:
    """Read what follows ``[DONE]`` (normally nothing but the body's end), for at most 0.1 s: an
    HTTP/1.1 connection goes back to the pool only once its body has been read to the end.

    The bound is an anyio cancel scope, as in the SDK's own drain: httpx's reads run inside
    anyio scopes, and an ``asyncio.timeout`` around them can let its cancellation escape as a
    plain ``CancelledError`` — which would end the turn's task without ending the turn.
    """
    import anyio  # loaded with the SDK: httpx runs on it

    with anyio.move_on_after(0.1):
        async for _ in lines:
            pass


@dataclass
class _Call:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


@dataclass
class _Reply:
    """One response being assembled from its chunks."""

    calls: list[_Call] = field(default_factory=list)
    slots: dict[int, int] = field(default_factory=dict)  # a delta's index -> its call in ``calls``
    finish_reason: str | None = None
    usage: UsageReport | None = None

    def feed(self, chunk: Any) -> str:
        """Take one chunk; returns its text (possibly empty)."""
        if usage := getattr(chunk, "usage", None):
            details = getattr(usage, "prompt_tokens_details", None)
            self.usage = UsageReport(
                input_tokens=getattr(usage, "prompt_tokens", 0) or 0,
                output_tokens=getattr(usage, "completion_tokens", 0) or 0,
                cache_tokens=getattr(details, "cached_tokens", 0) or 0,
            )
        text = ""
        for choice in getattr(chunk, "choices", None) or []:  # vLLM may send ``choices: null``
            if getattr(choice, "index", 0):  # only the first choice (n=1 is all we ask for)
                continue
            delta = getattr(choice, "delta", None)
            text += getattr(delta, "content", None) or ""
            for part in getattr(delta, "tool_calls", None) or []:
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
            call.arguments.append(arguments)

    def finish(self) -> list[StreamEvent]:
        events: list[StreamEvent] = [
            ToolCall(call.id or f"call_{secrets.token_hex(8)}", call.name, parse_arguments("".join(call.arguments)))
            for call in self.calls
        ]
        if self.usage is not None:
            events.append(self.usage)
        if self.finish_reason == "content_filter" and not self.calls:
            events.append(Done("error", Code.PROVIDER_ERROR, "the provider's content filter stopped the answer"))
        else:
            events.append(Done("tool_calls" if self.calls else "end"))
        return events

