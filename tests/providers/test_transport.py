"""PlainHttpTransport: httpx's client over pidesk's HTTP/1.1 transport, against a real loopback
server that writes exactly the bytes each test scripts (``providers/transport.py``)."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx2
import pytest
import pytest_asyncio
from hypothesis import given, settings
from hypothesis import strategies as st

from pidesk.providers.transport import Connection, Framing, PlainHttpTransport
from tests.providers.mock_vendors import closed_port_url

# ---- a server that answers with scripted bytes ------------------------------------------


@dataclass(frozen=True)
class Answer:
    data: bytes = b""  # written once the request has been read
    then: Literal["keep", "close", "hang", "drop"] = "keep"
    # keep: wait for the next request; close: close after writing; hang: write nothing, wait
    # for the client to go; drop: close at once, writing nothing
    after: int = 0  # answer only once this many requests have arrived (on any connection)


def ok(body: bytes = b"", *headers: str) -> Answer:
    head = "".join(f"{h}\r\n" for h in (f"Content-Length: {len(body)}", *headers))
    return Answer(b"HTTP/1.1 200 OK\r\n" + head.encode() + b"\r\n" + body)


@dataclass
class Received:
    head: list[bytes]
    body: bytes


@dataclass
class RawServer:
    answers: deque[Answer] = field(default_factory=deque)
    requests: list[Received] = field(default_factory=list)
    connections: int = 0
    client_gone: asyncio.Event = field(default_factory=asyncio.Event)  # a hanging answer's client left
    waiting: asyncio.Event = field(default_factory=asyncio.Event)  # a request is being held (hang)
    arrived: asyncio.Condition = field(default_factory=asyncio.Condition)  # notified as each request arrives
    url: str = ""
    _server: asyncio.Server | None = None
    _handlers: set[asyncio.Task[Any]] = field(default_factory=set)

    def script(self, *answers: Answer) -> None:
        self.answers.extend(answers)

    async def __aenter__(self) -> RawServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for handler in self._handlers:  # e.g. one waiting for a request that will not come
            handler.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        handler = asyncio.current_task()
        assert handler is not None
        self._handlers.add(handler)
        try:
            while request := await _read_request(reader):
                answer = self.answers.popleft()
                async with self.arrived:
                    self.requests.append(request)
                    self.arrived.notify_all()
                    await asyncio.wait_for(self.arrived.wait_for(lambda: len(self.requests) >= answer.after), 5)
                writer.write(answer.data)
                await writer.drain()
                if answer.then == "hang":
                    self.waiting.set()
                    await reader.read()  # the client's EOF
                    self.client_gone.set()
                if answer.then != "keep":
                    break
        except ConnectionError:
            pass
        finally:
            self._handlers.discard(handler)
            writer.close()


async def _read_request(reader: asyncio.StreamReader) -> Received | None:
    try:
        head = (await reader.readuntil(b"\r\n\r\n"))[:-4].split(b"\r\n")
    except asyncio.IncompleteReadError:
        return None
    headers = {name.strip().lower(): value.strip() for name, _, value in (line.partition(b":") for line in head[1:])}
    if headers.get(b"transfer-encoding") == b"chunked":
        body = b""
        while size := int((await reader.readuntil(b"\r\n"))[:-2], 16):
            body += (await reader.readexactly(size + 2))[:-2]
        await reader.readuntil(b"\r\n")
    else:
        body = await reader.readexactly(int(headers.get(b"content-length", b"0")))
    return Received(head, body)


@pytest_asyncio.fixture
async def server() -> AsyncIterator[RawServer]:
    async with RawServer() as raw:
        yield raw


def client(server: RawServer, transport: PlainHttpTransport | None = None, **options: Any) -> httpx2.AsyncClient:
    return httpx2.AsyncClient(base_url=server.url, transport=transport or PlainHttpTransport(), **options)


# ---- requests and bodies -------------------------------------------------------------------


@pytest.mark.asyncio
async def test_an_https_address_is_refused_not_sent_in_the_clear() -> None:
    async with httpx2.AsyncClient(transport=PlainHttpTransport()) as http:
        with pytest.raises(httpx2.UnsupportedProtocol):
            await http.get("https://127.0.0.1:9/v1/models")


@pytest.mark.asyncio
async def test_the_request_goes_out_as_written_and_bodies_of_each_framing_come_back_whole(server: RawServer) -> None:
    server.script(
        Answer(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
               b"5;name=value\r\nHello\r\n1\r\n,\r\n6\r\n world\r\n0\r\nX-Trailer: yes\r\n\r\n"),
        ok(b"by length"),
    )
    async with client(server) as http:
        chunked = await http.post("/v1/chat?x=1", content=b'{"a": 1}', headers={"Authorization": "Bearer k"})
        sized = await http.get("/v1/models")
    assert (chunked.status_code, chunked.content, sized.content) == (200, b"Hello, world", b"by length")
    assert chunked.http_version == "HTTP/1.1"
    first, second = server.requests
    assert first.head[0] == b"POST /v1/chat?x=1 HTTP/1.1"
    assert {b"Host: " + server.url.removeprefix("http://").encode(), b"Authorization: Bearer k",
            b"Content-Length: 8"} <= set(first.head)
    assert first.body == b'{"a": 1}'
    assert second.head[0] == b"GET /v1/models HTTP/1.1"
    assert server.connections == 1  # kept alive: both bodies were read to their end


@pytest.mark.asyncio
async def test_a_streamed_request_body_is_sent_chunked(server: RawServer) -> None:
    async def parts() -> AsyncIterator[bytes]:
        yield b"one, "
        yield b"two"

    server.script(ok(b"got it"))
    async with client(server) as http:
        response = await http.post("/upload", content=parts())
    assert response.content == b"got it"
    assert b"Transfer-Encoding: chunked" in server.requests[0].head
    assert server.requests[0].body == b"one, two"


@pytest.mark.asyncio
async def test_heads_without_a_body_leave_the_connection_ready_for_the_next_request(server: RawServer) -> None:
    server.script(
        Answer(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n"),  # a HEAD: the length is the GET's
        Answer(b"HTTP/1.1 204 No Content\r\n\r\n"),
        Answer(b"HTTP/1.1 304 Not Modified\r\nContent-Length: 5\r\n\r\n"),
        Answer(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"
               b"HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok"),  # informational heads are skipped
    )
    async with client(server) as http:
        statuses = [(await http.request(method, "/")).status_code for method in ("HEAD", "GET", "GET", "POST")]
    assert statuses == [200, 204, 304, 201]
    assert server.connections == 1


@pytest.mark.asyncio
@pytest.mark.parametrize(("answer", "reused"), [
    (Answer(b"HTTP/1.1 200 OK\r\n\r\nuntil the close", then="close"), False),  # no length: the close ends it
    # the server leaves these open, but said it would not keep them: the client must not reuse them
    (Answer(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok"), False),
    (Answer(b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok"), False),
    (Answer(b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\nok"), True),
    (Answer(b"HTTP/1.1 200 OK\r\nConnection: Keep-Alive, Upgrade\r\nContent-Length: 2\r\n\r\nok"), True),
])
async def test_a_connection_is_reused_only_when_the_server_keeps_it_alive(
    server: RawServer, answer: Answer, reused: bool
) -> None:
    server.script(answer, ok(b"next"))
    async with client(server) as http:
        first = await http.get("/")
        second = await http.get("/")
    assert first.content in (b"ok", b"until the close")
    assert second.content == b"next"
    assert server.connections == (1 if reused else 2)


# ---- a server that closes, cuts or stalls ---------------------------------------------------


@pytest.mark.asyncio
async def test_a_request_the_server_drops_on_a_kept_alive_connection_is_sent_again_on_a_new_one(
    server: RawServer
) -> None:
    """The server's idle timeout closing the connection as the request goes out: nothing of a
    response came back, so the request is sent once more (as Go's client does)."""
    server.script(ok(b"first"), Answer(then="drop"), ok(b"second"))
    async with client(server) as http:
        assert (await http.get("/")).content == b"first"
        assert (await http.post("/", content=b"again")).content == b"second"
    assert (server.connections, len(server.requests)) == (2, 3)
    assert server.requests[1].body == server.requests[2].body == b"again"


@pytest.mark.asyncio
async def test_a_request_dropped_on_a_new_connection_fails_and_is_not_sent_again(server: RawServer) -> None:
    server.script(Answer(then="drop"), ok(b"never asked for"))
    async with client(server) as http:
        with pytest.raises(httpx2.RemoteProtocolError, match="without sending a response"):
            await http.get("/")
    assert len(server.requests) == 1


@pytest.mark.asyncio
@pytest.mark.parametrize("answer", [
    Answer(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nHello\r\n3\r\nwo", then="close"),
    Answer(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nHello", then="close"),
], ids=["chunked", "by-length"])
async def test_a_body_cut_short_is_a_protocol_error_and_its_connection_is_not_reused(
    server: RawServer, answer: Answer
) -> None:
    server.script(answer, ok(b"fresh"))
    async with client(server) as http:
        with pytest.raises(httpx2.RemoteProtocolError, match="without sending complete message body"):
            await http.get("/")
        assert (await http.get("/")).content == b"fresh"
    assert server.connections == 2


@pytest.mark.asyncio
async def test_a_response_left_before_its_end_closes_its_connection(server: RawServer) -> None:
    server.script(Answer(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nHello\r\n", then="hang"),
                  ok(b"fresh"))
    async with client(server) as http:
        async with http.stream("GET", "/") as response:
            async for piece in response.aiter_bytes():
                assert piece == b"Hello"
                break
        await asyncio.wait_for(server.client_gone.wait(), 5)  # closed, not parked with a body unread
        assert (await http.get("/")).content == b"fresh"
    assert server.connections == 2


@pytest.mark.asyncio
async def test_a_chunk_comes_through_as_it_arrives_whatever_size_it_claims(server: RawServer) -> None:
    """A server that declares a 1 GiB chunk and streams it (or never ends it) is read a piece at a time:
    what has arrived is passed on, and nothing waits in memory for the rest of a chunk."""
    sent = b"x" * 300_000
    server.script(Answer(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n40000000\r\n" + sent, then="hang"))
    async with client(server) as http:
        async with http.stream("GET", "/") as response:
            got = b""
            async for piece in response.aiter_bytes():
                assert len(piece) <= 64 * 1024
                got += piece
                if len(got) == len(sent):
                    break
        assert got == sent
        await asyncio.wait_for(server.client_gone.wait(), 5)  # left early: its connection closed


@pytest.mark.asyncio
async def test_no_answer_within_the_read_timeout_is_a_read_timeout(server: RawServer) -> None:
    server.script(Answer(then="hang"))
    async with client(server, timeout=httpx2.Timeout(5, read=0.2)) as http:
        with pytest.raises(httpx2.ReadTimeout):
            await http.get("/")
    await asyncio.wait_for(server.client_gone.wait(), 5)


@pytest.mark.asyncio
async def test_a_request_cancelled_while_it_waits_closes_its_connection(server: RawServer) -> None:
    server.script(Answer(then="hang"))
    async with client(server) as http:
        request = asyncio.create_task(http.get("/"))
        await asyncio.wait_for(server.waiting.wait(), 5)
        request.cancel()
        with pytest.raises(asyncio.CancelledError):
            await request
        await asyncio.wait_for(server.client_gone.wait(), 5)


@pytest.mark.asyncio
async def test_nothing_listening_is_a_connect_error() -> None:
    async with httpx2.AsyncClient(transport=PlainHttpTransport()) as http:
        with pytest.raises(httpx2.ConnectError):
            await http.get(await closed_port_url())


@pytest.mark.asyncio
@pytest.mark.parametrize("data", [
    b"HTTP/2 200 OK\r\n\r\n",
    b"HTTP/1.1 2000 OK\r\n\r\n",
    b"ICY 200 OK\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nok",
    b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nX-Folded: a\r\n b\r\nContent-Length: 0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nNo colon here\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nX-Big: " + b"x" * 70_000 + b"\r\n\r\n",
    b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0x5\r\nHello\r\n0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nHelloXX0\r\n\r\n",
], ids=["http2", "status", "not-http", "two-lengths", "negative-length", "folded", "no-colon", "huge-head",
        "upgrade", "0x-size", "no-crlf-after-chunk"])
async def test_a_malformed_response_is_a_protocol_error(server: RawServer, data: bytes) -> None:
    server.script(Answer(data, then="close"), ok(b"fresh"))
    async with client(server) as http:
        with pytest.raises(httpx2.RemoteProtocolError):
            await http.get("/")
        assert (await http.get("/")).content == b"fresh"


@pytest.mark.asyncio
async def test_requests_at_once_each_get_a_connection_and_later_ones_reuse_them(server: RawServer) -> None:
    """What a host does: many sessions' requests through one provider's client at the same time."""
    server.script(*[Answer(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", after=3)] * 3, *[ok(b"again")] * 3)
    async with client(server) as http:
        together = await asyncio.gather(*(http.get("/") for _ in range(3)))  # each held until all three arrived
        assert server.connections == 3
        again = await asyncio.gather(*(http.get("/") for _ in range(3)))
    assert [r.content for r in together] == [b"ok"] * 3
    assert [r.content for r in again] == [b"again"] * 3
    assert server.connections == 3  # all three were kept and reused


@pytest.mark.asyncio
async def test_idle_connections_are_bounded_and_closed_with_the_transport(server: RawServer) -> None:
    server.script(ok(b"a"), ok(b"b"))
    async with client(server, PlainHttpTransport(max_idle=0)) as http:
        assert [(await http.get("/")).content for _ in range(2)] == [b"a", b"b"]
    assert server.connections == 2  # none kept
    server.script(Answer(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nc", then="hang"))
    async with client(server) as http:
        assert (await http.get("/")).content == b"c"  # kept idle ...
    await asyncio.wait_for(server.client_gone.wait(), 5)  # ... and closed when the client closed


# ---- the body parser, whatever the packets --------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(
    body=st.binary(max_size=600),
    cuts=st.lists(st.integers(min_value=1, max_value=200), max_size=8),  # chunk sizes
    extension=st.sampled_from([b"", b";a=b", b"; name=\"v\""]),
    trailers=st.sampled_from([b"", b"X-T: 1\r\n", b"A: 1\r\nB: 2\r\n"]),
    packets=st.lists(st.integers(min_value=1, max_value=50), min_size=1, max_size=30),  # arrival sizes
)
def test_a_chunked_body_reassembles_exactly_whatever_its_chunks_and_packets(
    body: bytes, cuts: list[int], extension: bytes, trailers: bytes, packets: list[int]
) -> None:
    chunks, at = [], 0
    for size in [*cuts, len(body)]:
        if at < len(body):
            chunks.append(body[at:at + size])
            at += len(chunks[-1])
    wire = b"".join(b"%x%s\r\n%s\r\n" % (len(c), extension, c) for c in chunks) + b"0\r\n" + trailers + b"\r\n"
    wire += b"HTTP/1.1 200 OK\r\n"  # the next response's start: not part of this body

    async def read() -> tuple[bytes, bytes]:
        reader = asyncio.StreamReader()
        at = 0
        for size in packets * (len(wire) // sum(packets) + 1):
            reader.feed_data(wire[at:at + size])
            at += size
        reader.feed_eof()
        connection = Connection(reader, writer=None)  # type: ignore[arg-type]  # only read here
        got = b"".join([piece async for piece in connection.pieces(Framing(chunked=True), 5)])
        return got, await reader.read()

    assert asyncio.run(read()) == (body, b"HTTP/1.1 200 OK\r\n")


# ---- the same as httpx's own transport, for any well-formed response ----------------------


@dataclass(frozen=True)
class Response:
    data: bytes
    then: Literal["keep", "close"]


_TOKEN = st.text("abcdefghijklmnopqrstuvwxyz-", min_size=1, max_size=12).map(lambda s: "x-" + s.strip("-") or "x-a")
_VALUE = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=20)


@st.composite
def responses(draw: st.DrawFn, method: str) -> Response:
    """A well-formed HTTP/1.x response: any status, headers, framing, chunking and preface."""
    version = draw(st.sampled_from(["HTTP/1.1", "HTTP/1.1", "HTTP/1.0"]))
    status = draw(st.sampled_from([200, 201, 204, 304, 400, 404, 429, 500, 503]))
    reason = draw(st.sampled_from(["OK", "Whatever", "", "Too Many Requests"]))
    headers = [f"{name}: {value}" for name, value in draw(st.lists(st.tuples(_TOKEN, _VALUE), max_size=4))]
    body = draw(st.binary(max_size=300)) if status not in (204, 304) else b""
    framings = ["length", "close"] + (["chunked"] if version == "HTTP/1.1" else [])
    framing = draw(st.sampled_from(framings))
    then: Literal["keep", "close"] = "keep"
    if status in (204, 304):
        payload = b""
    elif framing == "length":
        headers.append(f"Content-Length: {len(body)}")
        payload = body if method != "HEAD" else b""
    elif framing == "chunked":
        headers.append("Transfer-Encoding: chunked")
        sizes = draw(st.lists(st.integers(1, 120), max_size=6))
        chunks, at = [], 0
        for size in [*sizes, len(body)]:
            if at < len(body):
                chunks.append(body[at:at + size])
                at += len(chunks[-1])
        extension = draw(st.sampled_from([b"", b";a=1"]))
        trailer = draw(st.sampled_from([b"", b"X-Trailer: t\r\n"]))
        payload = b"".join(b"%x%s\r\n%s\r\n" % (len(c), extension, c) for c in chunks) + b"0\r\n" + trailer + b"\r\n"
        payload = payload if method != "HEAD" else b""
    else:  # the close ends it
        payload, then = (body if method != "HEAD" else b""), "close"
    if version == "HTTP/1.0" or draw(st.booleans()):
        then = "close"
        headers.append("Connection: close")
    preface = draw(st.sampled_from([b"", b"HTTP/1.1 100 Continue\r\n\r\n",
                                    b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"]))
    head = f"{version} {status} {reason}\r\n" + "".join(f"{h}\r\n" for h in headers) + "\r\n"
    return Response(preface + head.encode() + payload, then)


@settings(max_examples=60, deadline=None)
@given(data=st.data(), method=st.sampled_from(["GET", "POST", "HEAD"]))
def test_any_well_formed_response_reads_the_same_as_through_httpx_own_transport(
    data: st.DataObject, method: str
) -> None:
    response = data.draw(responses(method))

    async def fetch(transport: httpx2.AsyncBaseTransport) -> tuple[int, str, list[tuple[str, str]], bytes]:
        async with RawServer() as raw:
            raw.script(Answer(response.data, then=response.then))
            async with httpx2.AsyncClient(base_url=raw.url, transport=transport) as http:
                got = await http.request(method, "/v1/x", content=b"{}" if method == "POST" else None)
                return got.status_code, got.reason_phrase, got.headers.multi_items(), got.content

    assert asyncio.run(fetch(PlainHttpTransport())) == asyncio.run(fetch(httpx2.AsyncHTTPTransport()))


@settings(max_examples=60, deadline=None)
@given(data=st.data(), method=st.sampled_from(["GET", "HEAD"]))
def test_a_response_cut_anywhere_fails_or_reads_the_same_as_through_httpx_own_transport(
    data: st.DataObject, method: str
) -> None:
    """The retry driver judges a failure by its httpx class, so both transports must raise alike."""
    response = data.draw(responses(method))
    cut = data.draw(st.integers(0, max(0, len(response.data) - 1)))

    async def fetch(transport: httpx2.AsyncBaseTransport) -> tuple[Any, ...]:
        async with RawServer() as raw:
            raw.script(Answer(response.data[:cut], then="close"))
            async with httpx2.AsyncClient(base_url=raw.url, transport=transport) as http:
                try:
                    got = await http.request(method, "/v1/x")
                except httpx2.TransportError as exc:
                    kinds = (httpx2.RemoteProtocolError, httpx2.ReadError, httpx2.TimeoutException)
                    return ("failed", next((k.__name__ for k in kinds if isinstance(exc, k)), type(exc).__name__))
                return "read", got.status_code, got.headers.multi_items(), got.content

    assert asyncio.run(fetch(PlainHttpTransport())) == asyncio.run(fetch(httpx2.AsyncHTTPTransport()))
