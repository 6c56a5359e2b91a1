"""HTTP/1.1 over plain TCP for model servers at ``http://`` addresses (Ollama, vLLM, llama.cpp,
LM Studio, a mock): the transport under the SDKs' HTTP client (httpx) when nothing it sends
needs TLS or a proxy. Everything else keeps httpx's default transport.

Why it exists: a tool round trip against a local model is pidesk's own time plus one request,
and the default transport (httpcore on anyio, with h11 parsing) spent about 1 ms of a 4.5 ms
round trip on a loopback request (docs/benchmarks-server.md). The SDKs' aiohttp backend, a kept
library, was tried in its place and measured slower in the whole tool loop (docs/architecture.md
"The HTTP layer"). This one is asyncio streams and the framing rules of RFC 9112 §6.3, nothing
more:

* one request at a time per connection; connections are kept alive and reused per host and
  port (at most ``max_idle`` idle), dropped when the server closed them or said ``close``, and
  never reused after a response that was not read to its end;
* a response body is framed by ``Transfer-Encoding: chunked``, ``Content-Length``, or the
  connection's close — or has none (HEAD, 1xx, 204, 304); informational 1xx heads are skipped;
  it is passed on as it arrives, at most ``READ_SIZE`` at a time, whatever size a chunk claims;
* the request's ``timeout`` extension (what the SDK sets) bounds the connect, each write and
  each read;
* every failure is the httpx exception the default transport raises for it, so the SDK and
  pidesk's retry driver judge both transports' failures alike.

Not here: TLS, proxies, HTTP/2, upgrades, pipelining (``providers/sdk.py``'s ``plain_http`` and
the config's ``lean_http`` decide when this transport is used at all).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

import httpx2

log = logging.getLogger(__name__)
T = TypeVar("T")
HEAD_LIMIT = 64 * 1024  # the largest response head (status line and headers) accepted
READ_SIZE = 64 * 1024  # the most of a body read at once (a chunk's, one framed by length, or up to the close)


# ---- the response head and its framing (pure) --------------------------------------------


@dataclass(frozen=True, slots=True)
class Head:
    status: int
    reason: bytes
    headers: list[tuple[bytes, bytes]]
    keep_alive: bool  # HTTP/1.1 without ``Connection: close``, or HTTP/1.0 with ``keep-alive``


@dataclass(frozen=True, slots=True)
class Framing:
    """How the body after a head ends: ``length`` bytes (0: no body), chunked, or at close."""

    length: int = 0
    chunked: bool = False
    until_close: bool = False


def parse_head(block: bytes) -> Head:
    """A response head, from its status line through the blank line that ends it."""
    lines = block.split(b"\r\n")
    version, _, rest = lines[0].partition(b" ")
    code, _, reason = rest.partition(b" ")
    if version not in (b"HTTP/1.1", b"HTTP/1.0") or len(code) != 3 or not code.isdigit():
        raise httpx2.RemoteProtocolError(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
    headers: list[tuple[bytes, bytes]] = []
    connection: set[bytes] = set()  # the Connection header's tokens
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon or not name or name != name.strip() or line[:1] in (b" ", b"\t"):
            raise httpx2.RemoteProtocolError(f"malformed response header line: {line[:80]!r}")
        value = value.strip(b" \t")
        headers.append((name, value))
        if name.lower() == b"connection":
            connection.update(token.strip().lower() for token in value.split(b","))
    keep_alive = b"close" not in connection and (version == b"HTTP/1.1" or b"keep-alive" in connection)
    return Head(int(code), reason, headers, keep_alive)


def framing(method: bytes, head: Head) -> Framing:
    """RFC 9112 §6.3: which of the framings the body after ``head`` has."""
    if method == b"HEAD" or head.status < 200 or head.status in (204, 304):
        return Framing()
    codings = [value for name, value in head.headers if name.lower() == b"transfer-encoding"]
    if codings:
        last = b",".join(codings).split(b",")[-1].strip().lower()
        return Framing(chunked=True) if last == b"chunked" else Framing(until_close=True)
    lengths = {length.strip() for name, value in head.headers if name.lower() == b"content-length"
               for length in value.split(b",")}
    if not lengths:
        return Framing(until_close=True)
    if len(lengths) > 1 or not all(v.isdigit() for v in lengths):
        raise httpx2.RemoteProtocolError(f"invalid Content-Length: {sorted(lengths)!r}")
    return Framing(length=int(lengths.pop()))


# ---- a connection ----------------------------------------------------------------------------


class Connection:
    """One TCP connection: writes a request, reads a head and then a body's pieces."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(cls, host: str, port: int, timeout: float | None) -> Connection:
        try:
            async with asyncio.timeout(timeout):
                reader, writer = await asyncio.open_connection(host, port, limit=HEAD_LIMIT)
        except TimeoutError:
            raise httpx2.ConnectTimeout(f"connecting to {host}:{port} took more than {timeout} s") from None
        except OSError as exc:
            raise httpx2.ConnectError(f"cannot connect to {host}:{port}: {exc}") from exc
        return cls(reader, writer)

    @property
    def usable(self) -> bool:
        """Idle and still open: the server has not closed it meanwhile."""
        return not self.reader.at_eof() and not self.writer.is_closing()

    def close(self) -> None:
        self.writer.close()

    async def send(self, data: bytes, timeout: float | None) -> None:
        try:
            self.writer.write(data)
            async with asyncio.timeout(timeout):
                await self.writer.drain()
        except TimeoutError:
            raise httpx2.WriteTimeout(f"sending the request took more than {timeout} s") from None
        except OSError as exc:
            raise httpx2.WriteError(f"sending the request failed: {exc}") from exc

    async def head(self, timeout: float | None) -> Head:
        """The next final (non-1xx) response head."""
        first = True
        while True:
            try:
                block = await self._read(self.reader.readuntil(b"\r\n\r\n"), timeout)
            except asyncio.IncompleteReadError as exc:
                if not exc.partial and first:
                    raise NothingReceived("Server disconnected without sending a response.") from None
                raise httpx2.RemoteProtocolError("the server closed the connection inside a response head") from None
            except httpx2.ReadError as exc:
                if first:
                    raise NothingReceived(f"Server disconnected without sending a response: {exc}") from exc
                raise
            except asyncio.LimitOverrunError:
                raise httpx2.RemoteProtocolError(f"response head larger than {HEAD_LIMIT} bytes") from None
            first = False
            head = parse_head(block[:-4])
            if head.status == 101:
                raise httpx2.RemoteProtocolError("the server switched protocols, which this client does not speak")
            if head.status >= 200:
                return head

    async def pieces(self, framing: Framing, timeout: float | None) -> AsyncGenerator[bytes, None]:
        """The body's bytes as they arrive, to its framed end."""
        read = self._read
        try:
            if framing.chunked:  # a chunk's data as it arrives: its declared size is the server's word
                while size := _chunk_size(await read(self.reader.readuntil(b"\r\n"), timeout)):
                    async for piece in self._sized(size, timeout):
                        yield piece
                    if await read(self.reader.readexactly(2), timeout) != b"\r\n":
                        raise httpx2.RemoteProtocolError("a chunk of the response body is not followed by CRLF")
                while await read(self.reader.readuntil(b"\r\n"), timeout) != b"\r\n":  # trailers
                    pass
            elif framing.until_close:
                while piece := await read(self.reader.read(READ_SIZE), timeout):
                    yield piece
            else:
                async for piece in self._sized(framing.length, timeout):
                    yield piece
        except asyncio.IncompleteReadError:
            raise httpx2.RemoteProtocolError(
                "peer closed connection without sending complete message body (incomplete chunked read)"
                if framing.chunked else "peer closed connection without sending complete message body"
            ) from None
        except asyncio.LimitOverrunError:
            raise httpx2.RemoteProtocolError("a chunk-size line of the response body is too long") from None

    async def _sized(self, size: int, timeout: float | None) -> AsyncGenerator[bytes, None]:
        """The next ``size`` bytes as they arrive, at most ``READ_SIZE`` at a time."""
        left = size
        while left:
            piece = await self._read(self.reader.read(min(left, READ_SIZE)), timeout)
            if not piece:
                raise asyncio.IncompleteReadError(b"", left)
            left -= len(piece)
            yield piece

    @staticmethod
    async def _read(reading: Awaitable[T], timeout: float | None) -> T:
        try:
            async with asyncio.timeout(timeout):
                return await reading
        except TimeoutError:
            raise httpx2.ReadTimeout(f"no response data for {timeout} s") from None
        except ConnectionError as exc:
            raise httpx2.ReadError(f"reading the response failed: {exc}") from exc


class NothingReceived(httpx2.RemoteProtocolError):
    """The server closed or reset the connection before any byte of a response."""


def _chunk_size(line: bytes) -> int:
    digits = line.split(b";", 1)[0].strip(b" \t\r\n")
    if not digits or digits.strip(b"0123456789abcdefABCDEF"):
        raise httpx2.RemoteProtocolError(f"malformed chunk-size line: {line[:80]!r}")
    return int(digits, 16)


# ---- the transport -------------------------------------------------------------------------


Key = tuple[str, int]


class PlainHttpTransport(httpx2.AsyncBaseTransport):
    """httpx's transport interface over ``Connection``s, with a pool of idle ones per host and
    port (one provider's client, shared by every session of a host, uses one of these)."""

    def __init__(self, max_idle: int = 100) -> None:
        self._idle: dict[Key, list[Connection]] = {}
        self._idle_count = 0
        self._max_idle = max_idle
        self._closed = False

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        url = request.url
        if url.scheme != "http":
            raise httpx2.UnsupportedProtocol(f"this transport speaks plain HTTP only, not {url.scheme}://")
        timeouts: dict[str, float | None] = request.extensions.get("timeout", {})
        method = request.method.encode("ascii")
        body = await request.aread()
        if "transfer-encoding" in request.headers:  # a streamed body: sent as one chunk
            body = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body) if body else b"0\r\n\r\n"
        message = b"".join([
            method, b" ", url.raw_path, b" HTTP/1.1\r\n",
            *(b"%s: %s\r\n" % pair for pair in request.headers.raw), b"\r\n", body,
        ])
        key = (url.host, url.port or 80)
        connection, head = await self._exchange(key, message, timeouts)
        try:
            body_framing = framing(method, head)
        except httpx2.RemoteProtocolError:
            connection.close()
            raise
        release = self._releaser(key, connection, head.keep_alive and not body_framing.until_close)
        return httpx2.Response(
            head.status, headers=head.headers,
            stream=Body(connection.pieces(body_framing, timeouts.get("read")), release),
            extensions={"http_version": b"HTTP/1.1", "reason_phrase": head.reason},
        )

    async def aclose(self) -> None:
        self._closed = True
        for connections in self._idle.values():
            for connection in connections:
                connection.close()
        self._idle.clear()
        self._idle_count = 0

    async def _exchange(
        self, key: Key, message: bytes, timeouts: Mapping[str, float | None]
    ) -> tuple[Connection, Head]:
        """Send the request and read its response head, on a kept-alive connection if one is
        idle. If the server closed that one as the request went out (its idle timeout), nothing
        of a response came back, and the request goes once more on a new connection, as Go's
        HTTP client does in the same case."""
        if (idle := self._take(key)) is not None:
            try:
                return idle, await self._on(idle, message, timeouts)
            except (NothingReceived, httpx2.WriteError):
                log.debug("a kept-alive connection to %s:%s was closed by the server; sending again", *key)
        connection = await Connection.open(*key, timeouts.get("connect"))
        return connection, await self._on(connection, message, timeouts)

    @staticmethod
    async def _on(connection: Connection, message: bytes, timeouts: Mapping[str, float | None]) -> Head:
        try:
            await connection.send(message, timeouts.get("write"))
            return await connection.head(timeouts.get("read"))
        except BaseException:  # an error, or the request was cancelled: the connection's state is unknown
            connection.close()
            raise

    def _take(self, key: Key) -> Connection | None:
        connections = self._idle.get(key)
        while connections:
            connection = connections.pop()
            self._idle_count -= 1
            if connection.usable:
                return connection
            connection.close()
        return None

    def _releaser(self, key: Key, connection: Connection, reusable: bool) -> Callable[[bool], None]:
        def release(complete: bool) -> None:
            """Back to the pool if the body was read to its end and the server keeps it alive."""
            if complete and reusable and not self._closed and self._idle_count < self._max_idle and connection.usable:
                self._idle.setdefault(key, []).append(connection)
                self._idle_count += 1
            else:
                connection.close()
        return release


class Body(httpx2.AsyncByteStream):
    """A response body: its pieces, then its connection released once — back to the pool if
    the body was read to its end, closed if not (a stream left early, an error, a cancel)."""

    def __init__(self, pieces: AsyncGenerator[bytes, None], release: Callable[[bool], None]) -> None:
        self._pieces = pieces
        self._release: Callable[[bool], None] | None = release
        self._complete = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for piece in self._pieces:
                yield piece
        except BaseException:  # a failed read, a cancel, or the reader leaving early
            self._done()
            raise
        self._complete = True
        self._done()

    async def aclose(self) -> None:
        self._done()
        await self._pieces.aclose()

    def _done(self) -> None:
        if self._release is not None:
            release, self._release = self._release, None
            release(self._complete)
