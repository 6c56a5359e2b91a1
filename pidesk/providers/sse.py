"""A streamed response's server-sent events, decoded by pidesk for both vendor providers.

The SDKs send the request (headers, auth, connection pool, error statuses);
the response's body is read here, as bytes, and each event's data is decoded
by msgspec straight into the small structs of the fields a provider reads.
The SDKs' own typed event models cost about 0.1 ms an event, and their text
line decoder ~0.1 ms a response (docs/benchmarks-server.md).

* Lines may end in LF, CRLF or CR, and chunks may split them anywhere.
* ``event:``, ``id:`` and ``retry:`` fields and comments are skipped: every
  vendor event names its own type in its data.
* ``data: [DONE]`` (OpenAI) ends the stream (``done`` says it came: a Chat
  Completions stream whose body ends without it broke off), as ``skip_rest()`` does once a
  provider has read what it needs (Anthropic's ``message_stop``); the rest of
  the body is read, so the connection goes back to the pool (over TLS, a new
  connection is a new handshake).
* An event whose data is not the JSON its vendor sends raises ``CorruptEvent``:
  the stream is broken (retried like a cut while nothing of it was shown). So does a
  line or an event's data past ``MAX_EVENT_BYTES``, which is not kept whole waiting for
  its end.
* A body past ``MAX_ANSWER_BYTES`` raises ``AnswerTooLarge`` and is not read further:
  a server that does not stop (a loop, a hostile proxy) must not grow the host's memory
  without bound, and asking again would only repeat it.
* An event whose data has a non-null ``error`` raises the SDK's ``APIError``
  with that error as its body, as the SDKs' own streams do; ``retry`` then
  classifies it by its type or code like the HTTP status it stands for.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any, Generic, TypeVar

import msgspec

from pidesk.providers.retry import AnswerTooLarge, CorruptEvent

T = TypeVar("T")
# One event's data, or one line: the largest real ones are a tool call's whole arguments sent
# at once, and arguments past 1 MiB are refused anyway (runtime/loop.py, MAX_TOOL_ARGUMENTS).
MAX_EVENT_BYTES = 16 << 20
# One response's body: 128k output tokens streamed a token an event by a verbose server come
# to ~40 MB of events.
MAX_ANSWER_BYTES = 128 << 20


class Events(Generic[T]):
    """One response's events, each decoded by ``decoder``, until ``[DONE]`` or the body's end."""

    def __init__(self, response: Any, decoder: msgspec.json.Decoder[T], api_error: Callable[..., Exception]) -> None:
        self._response = response  # the SDK's HTTP response, its body not yet read
        self._body = lines(response.aiter_bytes())
        self._decoder = decoder
        self._api_error = api_error
        self.done = False  # ``data: [DONE]`` arrived

    @property
    def content_type(self) -> str:
        return str(self._response.headers.get("content-type", "")).lower()

    async def head(self, limit: int = 64 * 1024) -> bytes:
        """Up to ``limit`` bytes of the body as it is (for a body that is not a stream of events)."""
        out = bytearray()
        async for chunk in self._response.aiter_bytes():
            out += chunk
            if len(out) >= limit:
                break
        return bytes(out[:limit])

    async def skip_rest(self) -> None:
        """The provider has read all it needs (between events): read the body's end, so the
        connection goes back to the pool."""
        await _drain(self._body)

    async def __aenter__(self) -> Events[T]:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._response.aclose()

    async def __aiter__(self) -> AsyncIterator[T]:
        data: list[bytes] = []
        size = 0  # of the data lines so far
        async for line in self._body:
            if line.startswith(b"data:"):
                data.append(line[6:] if line.startswith(b"data: ") else line[5:])
                size += len(data[-1])
                if size > MAX_EVENT_BYTES:
                    raise CorruptEvent(f"an event of more than {MAX_EVENT_BYTES:,} bytes")
                continue
            if line or not data:  # another field (event:, id:, retry:) or a comment: nothing pidesk reads
                continue
            payload, data, size = b"\n".join(data), [], 0  # a blank line ends the event
            if payload.startswith(b"[DONE]"):
                self.done = True
                await _drain(self._body)
                return
            try:
                event = self._decoder.decode(payload)
            except msgspec.DecodeError as exc:  # ValidationError included
                raise CorruptEvent(f"{exc} in {payload[:80]!r}") from None
            error = getattr(event, "error", None)
            if error:
                message = error.get("message") if isinstance(error, dict) else None
                raise self._api_error(str(message or "An error occurred during streaming"),
                                      self._response.request, body=error)
            yield event


async def lines(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """The body's lines, without their ends, whichever chunks the body arrives in (within
    ``MAX_EVENT_BYTES`` a line and ``MAX_ANSWER_BYTES`` in all)."""
    rest: list[bytes] = []  # the line begun so far, in the pieces it came in (joined once it ends)
    pending = 0  # its length
    total = 0
    after_cr = False
    async for chunk in chunks:
        total += len(chunk)
        if total > MAX_ANSWER_BYTES:
            raise AnswerTooLarge(f"more than {MAX_ANSWER_BYTES:,} bytes without ending")
        if after_cr and chunk.startswith(b"\n"):
            chunk = chunk[1:]  # the LF of a CRLF that two chunks split
        after_cr = chunk.endswith(b"\r")
        if not chunk:
            continue
        if b"\n" not in chunk and b"\r" not in chunk:
            rest.append(chunk)  # a long line in many chunks is copied once, not once a chunk
            pending += len(chunk)
        else:
            split = b"".join([*rest, chunk]).splitlines(keepends=True)
            rest = [split.pop()] if not split[-1].endswith((b"\n", b"\r")) else []
            pending = len(rest[0]) if rest else 0
            for line in split:
                yield line.rstrip(b"\r\n")
        if pending > MAX_EVENT_BYTES:
            raise CorruptEvent(f"a line of more than {MAX_EVENT_BYTES:,} bytes")
    if rest:
        yield b"".join(rest)


async def _drain(body: AsyncIterator[bytes]) -> None:
    """Read what follows ``[DONE]`` (normally nothing but the body's end), for at most 0.1 s: an
    HTTP/1.1 connection goes back to the pool only once its body has been read to the end.

    The bound is an anyio cancel scope, as in the SDK's own drain: httpx's reads run inside
    anyio scopes, and an ``asyncio.timeout`` around them can let its cancellation escape as a
    plain ``CancelledError`` — which would end the turn's task without ending the turn.
    """
    import anyio  # loaded with the SDK: httpx runs on it

    with anyio.move_on_after(0.1):
        async for _ in body:
            pass
