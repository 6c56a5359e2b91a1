"""The protocols the host listens with: uvicorn's h11 and websockets, plus the door's limits.

Nothing here needs a token: these limits hold before any request is read.

- **Request deadline.** A connection must send a complete request — headers and
  the whole body — within ``request_timeout`` seconds (10) of connecting, or of
  its previous answer; else it is closed. Silence, one byte, headers trickled a
  byte at a time, a body promised and never sent: all are closed at the deadline.
  (uvicorn alone reaps none of these: its keep-alive timer starts only after a
  first answer and stops at the next byte.) A request being answered, however
  long it takes, and an upgraded WebSocket have no deadline.
- **Connection cap.** At most ``max_connections`` connections are open at once
  (by default the open-files limit less headroom for the store, transcripts,
  subprocesses and plugins), so ``accept`` never fails with EMFILE. At the cap a
  new connection takes the place of the one that has waited longest for its
  request to arrive (a slow sender, never a client being answered nor a
  WebSocket) — among those that have had their chance to send: read at least
  once, or open for ``FRESH`` seconds. (Connections are accepted in bursts,
  before any of them is read: without that, a burst of slow ones would push out
  a real client accepted with them before its request could be read.) When none
  is to be shed, the new connection is answered 503 and closed at once. The
  listening socket (``ListeningSocket``) accepts at most ``ACCEPT_BATCH``
  connections per turn of the event loop (asyncio would take up to the whole
  backlog, 2,048, before admitting any): the cap is applied before the
  descriptors run out, with the rest of the headroom to spare.
- **Closing a WebSocket now.** ``CLOSE_NOW`` in a WebSocket scope's extensions is
  a callable ``(code, reason)`` that queues the close frame behind what is already
  buffered without waiting for the peer to read (uvicorn's own close waits for the
  write buffer to drain, which a stalled reader never lets happen). A peer that
  has not read up to it within ``CLOSE_GRACE`` seconds is cut off.
- **Sending a large message in fragments.** ``SEND_UTF8`` in a WebSocket scope's
  extensions is a coroutine ``(data)`` that sends UTF-8 bytes (the JSON the host
  encoded once) as one text message in fragments of ``FRAGMENT`` bytes, cut at
  character boundaries, letting the event loop run between them: uvicorn's own
  send encodes, frames and copies a whole message in one step (about 60 ms for a
  10 MB event, during which no other client is served). The caller sends one message
  at a time (app.py's send lock): fragments of two messages never interleave.
- **What a WebSocket client has read** (``WINDOW`` in its scope's extensions: a
  ``Window``). Once bytes leave the host, only the client knows how far it has
  read: a loopback client's kernel takes megabytes into its receive buffer (one
  that read 100 events a second was 187,000 events behind, none of them in the
  host). So the host places pings among the events it sends, and a client's pong
  to one (sent when its WebSocket reads up to the ping: RFC 6455 §5.5.2, in order)
  says it has read that far. At most a window of events is sent and not yet
  confirmed; the rest waits in the client's bus subscription, which counts the
  unconfirmed ones as behind too (``Subscription.downstream``). So "behind" is what
  the client has not confirmed reading, wherever it waits. The window is what the
  client confirmed in the last ``WINDOW_SECONDS`` (at least 16 events or 16 KiB, at
  most a quarter of the bound): a fast reader is not held up by it, and the host's
  pong to a slow reader's own ping waits behind about a second of its reading, not
  behind everything it has not read.
- **Keepalive.** Every ``ping_interval`` seconds the host pings; a client that
  answers nothing within ``ping_timeout`` is closed (1011) — but only when that
  ping had nothing unread ahead of it. A ping behind events the client has not
  read yet is answered when it gets there, however slowly it reads; a client that
  falls behind is the bound's business (1013), not the keepalive's. (Before, a slow
  reader was ended by a keepalive at a few thousand events behind: the host's ping,
  or its pong to the client's own ping, stood behind everything it had not read.)
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import resource
import socket
import struct
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.exceptions import InvalidState
from websockets.frames import Frame

log = logging.getLogger("pidesk.server")

CLOSE_NOW = "pidesk.close_now"
SEND_UTF8 = "pidesk.send_utf8"
WINDOW = "pidesk.window"
WINDOW_SECONDS = 1.0  # a client's window: about what it reads in this long
WINDOW_START = (128, 256 * 1024)  # a new client's window: events, bytes
WINDOW_LEAST = (16, 16 * 1024)
FRAGMENT = 1 << 20  # bytes of a large message per WebSocket frame (one step of the event loop)
CLOSE_GRACE = 30.0
FRESH = 1.0  # seconds an unread new connection is not shed
ACCEPT_BATCH = 32  # connections accepted per turn of the event loop (admitted two turns later)
SHED_SCAN = 64  # how many of the longest-waiting connections are looked at for one to shed
BUSY = b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
FD_HEADROOM = 256  # at least this many descriptors stay free for everything but client connections
WAITING = (h11.IDLE, h11.SEND_BODY)  # the client's h11 states while its request is still arriving


@dataclass(frozen=True)
class DoorLimits:
    request_timeout: float = 10.0
    max_connections: int | None = None  # None: from the open-files limit (``default_max_connections``)
    max_behind_events: int = 10_000  # a WebSocket further behind than this is closed 1013
    max_behind_bytes: int = 64 * 1024 * 1024
    ping_interval: float | None = 20.0  # the WebSocket keepalive (None: no pings but the window's)
    ping_timeout: float | None = 20.0

    def window(self) -> tuple[int, int]:
        """The largest window, events and bytes: a quarter of the bound, so a client reading along
        is never near it."""
        return max(1, self.max_behind_events // 4), max(1, self.max_behind_bytes // 4)


def default_max_connections() -> int:
    """The open-files soft limit less headroom: an eighth of it, at least ``FD_HEADROOM``."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = 65536
    return max(16, soft - max(FD_HEADROOM, soft // 8))


class Waiting(Protocol):
    def sheddable(self, now: float) -> bool: ...


class Connections:
    """The open connections of one server (by transport, which a WebSocket upgrade keeps) and,
    longest waiting first, those whose request has not all arrived."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.open: set[asyncio.BaseTransport] = set()
        self.waiting: dict[asyncio.BaseTransport, Waiting] = {}  # insertion-ordered: the longest waiting first
        self.shed = 0
        self.refused = 0
        self._warned_at = -1e9

    def admit(self, transport: asyncio.BaseTransport, now: float) -> bool:
        """Make room for a new connection (shedding the longest waiting one); False: refuse it."""
        if len(self.open) >= self.cap:
            victim = next((t for t, c in itertools.islice(self.waiting.items(), SHED_SCAN) if c.sheddable(now)), None)
            if victim is None:
                self.refused += 1
                self._warn()
                return False
            self.release(victim)
            self.shed += 1
            self._warn()
            _abort(victim)
        self.open.add(transport)
        return True

    def release(self, transport: asyncio.BaseTransport) -> None:
        self.open.discard(transport)
        self.waiting.pop(transport, None)

    def _warn(self) -> None:
        now = time.monotonic()
        if now - self._warned_at >= 60:
            self._warned_at = now
            log.warning("at the cap of %d open connections (is something holding connections open without "
                        "sending requests?); so far, slow connections closed to make room: %d, new ones refused: %d",
                        self.cap, self.shed, self.refused)


_MARK = struct.Struct("!Q")  # a ping's payload: the number of the point it marks


class Window:
    """What one WebSocket client has been sent and not yet confirmed reading.

    Each ``mark`` pings with a fresh number, recording how many event frames (and their
    bytes) were sent before it; the client's pong to it (``answered``) confirms them all,
    and any earlier mark (a pong may answer only the latest ping). ``events`` and
    ``nbytes`` are what is sent and unconfirmed — a subscription's ``downstream``. Marks
    are placed after every quarter window of events or of bytes sent (answers to requests
    count in the bytes), and at least every 1/256 of the bound, so a reader confirms as it
    reads and is counted behind by at most that much more than it is; ``room`` waits
    while a full window is unconfirmed (one event is always let through, however large),
    marking what it sent last.

    The window's size follows the client: it is what the client confirmed in the last
    ``WINDOW_SECONDS``, between ``least`` and ``most``. Not the time a ping took to be
    answered: a client's WebSocket may answer at once pings its application will not read for
    seconds (websockets' client parses all a read of its socket brings, up to 256 KiB, before
    it stops reading), and a window grown on that put tens of seconds of reading before the
    host's pong to the client's own ping. What is confirmed in a second is bounded by what was
    sent, so a fast reader's window at most doubles a round trip, from 16 to a quarter of the
    bound in a few milliseconds.
    """

    def __init__(self, most: tuple[int, int], ping: Callable[[bytes], None],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.most = most
        self.least = (min(WINDOW_LEAST[0], most[0]), min(WINDOW_LEAST[1], most[1]))
        self.size = (min(WINDOW_START[0], most[0]), min(WINDOW_START[1], most[1]))
        self._ping = ping
        self._clock = clock
        self.sent_events = self.sent_bytes = 0  # event frames sent (cumulative), and their bytes
        self.read_events = self.read_bytes = 0  # of those, confirmed read
        self.written = 0  # bytes of every frame sent: events and answers
        self.answers = 0  # pongs that confirmed a mark
        self.closed = False
        self._marks: deque[tuple[int, int, int]] = deque()  # (number, sent_events, sent_bytes), unanswered
        self._reads: deque[tuple[float, int, int]] = deque([(clock(), 0, 0)])  # (at, read_events, read_bytes)
        self._marked = (0, 0)  # (sent_events, written) at the last mark
        self._next = 1
        self._room = asyncio.Event()

    @property
    def events(self) -> int:
        return self.sent_events - self.read_events

    @property
    def nbytes(self) -> int:
        return self.sent_bytes - self.read_bytes

    def full(self) -> bool:
        return self.events > 0 and (self.events >= self.size[0] or self.nbytes >= self.size[1])

    def sent(self, nbytes: int, *, event: bool) -> None:
        """A frame of ``nbytes`` went out (an event's, or an answer's); mark when a quarter window passed."""
        self.written += nbytes
        if event:
            self.sent_events += 1
            self.sent_bytes += nbytes
        if (self.sent_events - self._marked[0] >= min(self.size[0] // 4, self.most[0] // 64)
                or self.written - self._marked[1] >= min(self.size[1] // 4, self.most[1] // 64)):
            self.mark()

    def caught_up(self) -> bool:
        """Every frame sent is confirmed read (nothing would stand before a ping sent now)."""
        return not self._marks and self._marked == (self.sent_events, self.written)

    def mark(self) -> int:
        """Ping, marking what was sent so far; the mark's number."""
        number = self._next
        self._next += 1
        self._marks.append((number, self.sent_events, self.sent_bytes))
        self._marked = (self.sent_events, self.written)
        self._ping(_MARK.pack(number))
        return number

    def unanswered(self, number: int) -> bool:
        return bool(self._marks) and self._marks[0][0] <= number

    def answered(self, payload: bytes) -> bool:
        """A pong: True when it answered a mark (confirming it and every one before)."""
        if len(payload) != _MARK.size or not self._marks:
            return False
        (number,) = _MARK.unpack(payload)
        if not self._marks[0][0] <= number <= self._marks[-1][0]:
            return False
        while self._marks and self._marks[0][0] <= number:
            _, self.read_events, self.read_bytes = self._marks.popleft()
        self.answers += 1
        now = self._clock()
        reads = self._reads
        reads.append((now, self.read_events, self.read_bytes))
        while len(reads) > 1 and reads[1][0] <= now - WINDOW_SECONDS:
            reads.popleft()  # the first left is where the client was a second ago
        _, events, nbytes = reads[0]
        self.size = (max(self.least[0], min(self.most[0], self.read_events - events)),
                     max(self.least[1], min(self.most[1], self.read_bytes - nbytes)))
        self._room.set()
        return True

    async def room(self) -> None:
        """Return once another event may be sent (or the connection is closing)."""
        while self.full() and not self.closed:
            if self._marked[0] < self.sent_events:
                self.mark()  # what is unmarked would never be confirmed
            self._room.clear()
            await self._room.wait()

    def close(self) -> None:
        self.closed = True
        self._room.set()


class ListeningSocket(socket.socket):
    """A listening socket whose ``accept`` takes at most ``ACCEPT_BATCH`` connections per turn of the
    event loop; past that it answers "nothing waiting" (asyncio's accept loop then stops until the
    next turn, and the kernel keeps the rest queued)."""

    _accepted = 0

    def accept(self) -> tuple[socket.socket, Any]:
        if self._accepted >= ACCEPT_BATCH:
            raise BlockingIOError("the connections accepted this turn are not admitted yet")
        conn, address = super().accept()
        if self._accepted == 0:
            asyncio.get_running_loop().call_soon(self._next_turn)
        self._accepted += 1
        return conn, address

    def _next_turn(self) -> None:
        self._accepted = 0


def _abort(transport: asyncio.BaseTransport) -> None:
    abort = getattr(transport, "abort", None)
    if abort is not None:
        abort()
    else:  # pragma: no cover — every TCP transport can abort
        transport.close()


def protocols(limits: DoorLimits) -> tuple[type[H11Protocol], type[WebSocketsSansIOProtocol]]:
    """The HTTP and WebSocket protocol classes for one server, sharing its connection table."""
    table = Connections(limits.max_connections or default_max_connections())

    class DoorH11Protocol(H11Protocol):
        _deadline: asyncio.TimerHandle | None = None
        _upgraded = False
        _admitted = False
        _read = False
        _admitted_at = 0.0

        def connection_made(self, transport: Any) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._admitted_at = self.loop.time()
            self._admitted = table.admit(transport, self._admitted_at)
            if not self._admitted:
                transport.write(BUSY)
                transport.close()
                return
            self._track()

        def data_received(self, data: bytes) -> None:
            self._read = True
            super().data_received(data)
            self._track()

        def sheddable(self, now: float) -> bool:
            return self._read or now - self._admitted_at >= FRESH

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._track()

        def handle_websocket_upgrade(self, event: h11.Request) -> None:
            self._upgraded = True  # from here the WebSocket protocol owns the transport (and its slot)
            self._track()
            super().handle_websocket_upgrade(event)

        def connection_lost(self, exc: Exception | None) -> None:
            self._stop_deadline()
            if self._admitted:
                table.release(self.transport)
            super().connection_lost(exc)

        def _track(self) -> None:
            """Arm the deadline when the connection starts waiting for a request, stop it once one is in."""
            waiting = (self._admitted and not self._upgraded and not self.transport.is_closing()
                       and self.conn.their_state in WAITING)
            if waiting and self._deadline is None:
                self._deadline = self.loop.call_later(limits.request_timeout, self._expire)
                table.waiting[self.transport] = self
            elif not waiting and self._deadline is not None:
                self._stop_deadline()

        def _stop_deadline(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None
            if self._admitted:
                table.waiting.pop(self.transport, None)

        def _expire(self) -> None:
            self._deadline = None
            table.waiting.pop(self.transport, None)
            if self.transport.get_write_buffer_size():
                self.transport.abort()  # what is buffered would wait for a peer that may never read
            else:
                self.transport.close()

    widest = limits.window()

    class DoorWebSocketProtocol(WebSocketsSansIOProtocol):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.window = Window(widest, self._send_ping)
            self._keepalive_mark: int | None = None  # the keepalive ping not answered yet

        def handle_connect(self, event: Any) -> None:
            super().handle_connect(event)
            scope = getattr(self, "scope", None)
            if scope is not None:
                scope["extensions"][CLOSE_NOW] = self.close_now
                scope["extensions"][SEND_UTF8] = self.send_utf8
                scope["extensions"][WINDOW] = self.window

        def connection_lost(self, exc: Exception | None) -> None:
            table.release(self.transport)
            self.window.close()
            super().connection_lost(exc)

        def _send_ping(self, payload: bytes) -> None:
            if self.close_sent or self.disconnected or self.transport.is_closing():
                return
            try:
                self.conn.send_ping(payload)
            except InvalidState:  # closing: nothing more is confirmed
                return
            self.transport.write(b"".join(self.conn.data_to_send()))

        def send_keepalive_ping(self) -> None:
            """A keepalive ping is a mark like any other. It has a deadline only when nothing unread
            stands before it; else it is answered when the client reads up to it, and the next
            keepalive ping follows that answer."""
            self.ping_timer = None
            if self.close_sent or self.transport.is_closing():
                return
            judged = self.window.caught_up()
            self._keepalive_mark = self.window.mark()
            if self.ping_timeout is None:
                self.schedule_ping()
            elif judged:
                self.pong_timer = self.loop.call_later(self.ping_timeout, self.keepalive_timeout)

        def handle_pong(self, event: Frame) -> None:
            if not self.window.answered(bytes(event.data)):
                return  # unsolicited, or answering a mark already confirmed
            mark = self._keepalive_mark
            if mark is not None and not self.window.unanswered(mark):
                self._keepalive_mark = None
                if self.pong_timer is not None:
                    self.pong_timer.cancel()
                    self.pong_timer = None
                if self.ping_timer is None and self.ping_timeout is not None:
                    self.schedule_ping()

        def keepalive_timeout(self) -> None:
            super().keepalive_timeout()
            if self.transport.get_write_buffer_size():  # a peer that answers nothing would never drain it
                self.transport.abort()

        def shutdown(self) -> None:
            super().shutdown()
            if self.transport.get_write_buffer_size():  # a peer that does not read would hold up the exit
                self.transport.abort()

        async def send_utf8(self, data: bytes) -> None:
            view, start = memoryview(data), 0
            while True:
                await self.writable.wait()  # uvicorn's flow control: the peer's buffer has room
                if self.disconnected or self.close_sent or self.transport.is_closing():
                    raise ConnectionResetError("the WebSocket closed while a message was being sent")
                end = _utf8_boundary(data, start + FRAGMENT)
                fin = end >= len(data)
                if start == 0:
                    self.conn.send_text(view[start:end], fin=fin)
                else:
                    self.conn.send_continuation(view[start:end], fin=fin)
                self.transport.write(b"".join(self.conn.data_to_send()))
                if fin:
                    return
                start = end
                await asyncio.sleep(0)  # a turn of the event loop between fragments

        def close_now(self, code: int, reason: str) -> None:
            if self.close_sent or self.disconnected or self.transport.is_closing():
                return
            try:
                self.conn.send_close(code, reason)
            except InvalidState:  # the peer's close is already in: the connection is ending anyway
                return
            self.queue.put_nowait({"type": "websocket.disconnect", "code": code, "reason": reason})
            self.transport.write(b"".join(self.conn.data_to_send()))
            self.close_sent = True
            if self.read_paused:
                self.read_paused = False
                self.transport.resume_reading()
            if self.close_timer is not None:
                self.close_timer.cancel()
            self.close_timer = self.loop.call_later(CLOSE_GRACE, self.transport.abort)

    return DoorH11Protocol, DoorWebSocketProtocol


def _utf8_boundary(data: bytes, at: int) -> int:
    """``at``, moved back to the start of the UTF-8 character it falls in (or the end of ``data``)."""
    if at >= len(data):
        return len(data)
    while at > 0 and data[at] & 0xC0 == 0x80:  # a continuation byte: not a character's start
        at -= 1
    return at
