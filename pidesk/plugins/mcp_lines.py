"""How a stdio MCP server's answers are read: whole lines, in linear time, each at most ``MAX_LINE`` bytes.

The MCP SDK's stdio reader splits the server's stdout with ``(buffer + chunk).split("\\n")``:
every chunk of a long line copies all of the line so far, so a 50 MB answer took 41 s of the
event loop (500 MB never finished) and every later call of the server timed out (issue 29).
``WholeLines`` stands in for the text stream that reader reads (``TextReceiveStream``) and
hands it text that always ends at a newline, so its buffer stays empty and it splits each
chunk once. A line longer than ``MAX_LINE`` is not kept: the rest of it is read and dropped,
and in its place comes an error answer to the request it answered (its ``id`` is near the
start of the line), so the call fails at once and the server's next answers read as usual.
"""

from __future__ import annotations

import codecs
import json
import re
from typing import Any, Final

MAX_LINE: Final = 16 * 1024 * 1024  # bytes of one message from an MCP server
_ID: Final = re.compile(rb'"id"\s*:\s*(-?\d{1,15}|"(?:[^"\\]|\\.){0,200}")')


class WholeLines:
    """A ``TextReceiveStream`` of whole lines (see the module docstring): ``async for text in stream``."""

    def __init__(self, transport_stream: Any, encoding: str = "utf-8", errors: str = "strict") -> None:
        self._stream = transport_stream
        self._decoder = codecs.getincrementaldecoder(encoding)(errors=errors)
        self._partial = bytearray()
        self._dropping: bytes | None = None  # past MAX_LINE: the start of the line being dropped

    def __aiter__(self) -> WholeLines:
        return self

    async def __anext__(self) -> str:
        from anyio import EndOfStream  # (the SDK's own dependency; imported where the SDK runs)

        while True:
            try:
                chunk = bytes(await self._stream.receive())
            except EndOfStream:
                raise StopAsyncIteration from None
            text = self._take(chunk)
            if text:
                return text

    async def aclose(self) -> None:
        await self._stream.aclose()

    def _take(self, chunk: bytes) -> str:
        """What of ``chunk`` completes lines, as text (maybe several lines; "" if none ends in it). Only
        the first line of a chunk can continue an earlier one: the others are shorter than the chunk."""
        out = bytearray()
        if self._dropping is not None:
            end = chunk.find(b"\n")
            if end < 0:
                return ""
            out += _too_long(self._dropping)
            self._dropping, chunk = None, chunk[end + 1:]
        first = chunk.find(b"\n")
        if first >= 0:
            if len(self._partial) + first > MAX_LINE:
                out += _too_long(bytes(self._partial[:256]) if self._partial else chunk[:256])
            else:
                out += self._partial + chunk[:first + 1]
            self._partial.clear()
            last = chunk.rfind(b"\n")
            out += chunk[first + 1:last + 1]
            chunk = chunk[last + 1:]
        self._partial += chunk
        if len(self._partial) > MAX_LINE:
            self._dropping = bytes(self._partial[:256])
            self._partial.clear()
        return self._decoder.decode(bytes(out)) if out else ""


def _too_long(start: bytes) -> bytes:
    """The line that stands in for one over ``MAX_LINE``: an error answer to its request, if it names one."""
    found = _ID.search(start)
    if found is None:
        return b"{}\n"  # (not a message: the SDK reports it and reads on)
    request_id = json.loads(found.group(1))
    message = f"the server's answer was longer than {MAX_LINE // (1 << 20)} MiB; it was not read"
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "error": {"code": -32603, "message": message}}).encode() + b"\n"


def install() -> None:
    """Have the SDK's stdio transport read servers through ``WholeLines`` (idempotent)."""
    import mcp.client.stdio as stdio

    stdio.TextReceiveStream = WholeLines  # type: ignore[misc,assignment]
