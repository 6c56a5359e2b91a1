"""``protocol.Window``: what a WebSocket client has been sent and not yet confirmed reading (issue 33 §5).

A simulated connection: the host sends events (when the window has room) and answers; its pings go
into the same ordered stream; the client reads that stream at its own pace and answers each ping
it reads (its pongs may travel back late, but in order). Whatever the interleaving:

- the window never counts as read an event the client has not read;
- it counts as unread at most a mark's spacing of what the client has read (1/256 of the bound,
  or a quarter of the window) — so a client is never closed much before it is really behind;
- an event is sent only while the window has room, and a full window always has a ping in flight
  whose answer frees it (the host never waits on a client that has read everything).
"""

from __future__ import annotations

import asyncio
from collections import deque

from hypothesis import given, settings
from hypothesis import strategies as st

from pidesk.server.protocol import Window

MOST = (250, 64 * 1024)  # a bound of 1,000 events / 256 KiB


class Link:
    """The ordered stream from host to client, and the pongs on their way back."""

    def __init__(self) -> None:
        self.now = 0.0
        self.stream: deque[tuple[str, object]] = deque()
        self.pongs: deque[bytes] = deque()
        self.window = Window(MOST, lambda payload: self.stream.append(("ping", payload)), clock=lambda: self.now)
        self.sent = 0  # events
        self.read = 0  # events the client has read

    def send(self, size: int, *, event: bool = True) -> None:
        if event:
            assert not self.window.full()
            self.sent += 1
        self.stream.append(("event" if event else "answer", size))
        self.window.sent(size, event=event)

    def client_reads(self, count: int) -> None:
        for _ in range(count):
            if not self.stream:
                return
            kind, item = self.stream.popleft()
            if kind == "event":
                self.read += 1
            elif kind == "ping":
                assert isinstance(item, bytes)
                self.pongs.append(item)

    def pongs_arrive(self, count: int) -> None:
        for _ in range(min(count, len(self.pongs))):
            self.window.answered(self.pongs.popleft())


steps = st.lists(st.tuples(st.sampled_from(["event", "answer", "read", "pong", "tick"]),
                           st.integers(1, 40), st.integers(1, 20_000)), max_size=300)


@settings(max_examples=300, deadline=None)
@given(steps)
def test_the_window_counts_what_the_client_read_within_a_marks_spacing(script):
    link = Link()
    window = link.window
    for action, count, size in script:
        if action == "event":
            for _ in range(count):
                if window.full():
                    break
                link.send(size)
        elif action == "answer":
            link.send(size, event=False)
        elif action == "read":
            link.client_reads(count)
        elif action == "pong":
            link.pongs_arrive(count)
        else:
            link.now += count / 10
        confirmed = link.sent - window.events
        assert window.events >= 0 and window.nbytes >= 0
        assert confirmed <= link.read, "the window counts as read an event the client has not read"
        assert 16 <= window.size[0] <= MOST[0] and 16 * 1024 <= window.size[1] <= MOST[1]
        if not link.pongs and link.read == link.sent and not any(kind == "ping" for kind, _ in link.stream):
            # every pong in: what is unconfirmed is the unmarked tail, under a mark's spacing
            assert window.events <= max(1, min(window.size[0] // 4, MOST[0] // 64)), (window.events, window.size)
    # a full window has a ping in flight: once the client reads everything and its pongs arrive, it has room
    asyncio.run(_room_is_made(link))


async def _room_is_made(link: Link) -> None:
    waiter = asyncio.ensure_future(link.window.room())
    await asyncio.sleep(0)
    link.client_reads(10**6)
    link.pongs_arrive(10**6)
    await asyncio.wait_for(waiter, 1)
    assert not link.window.full()


def test_the_window_follows_how_fast_the_client_reads():
    """A reader that confirms as fast as it is sent widens the window to a quarter of the bound; one
    that reads 20 events a second narrows it to about that (a second of its reading): so the host's
    pong to that client's own ping never waits behind more than about a second of its reading."""
    link = Link()
    window = link.window
    start = window.size
    for _ in range(20):  # a fast reader
        while not window.full():
            link.send(100)
        link.client_reads(10**6)
        link.pongs_arrive(10**6)
    assert window.size == MOST and start < MOST
    for _ in range(400):  # 20 s of a reader taking an event every 50 ms
        while not window.full():
            link.send(100)
        link.now += 0.05
        read = link.read
        while link.read == read and link.stream:
            link.client_reads(1)
        link.pongs_arrive(10**6)
    assert window.size[0] <= 2 * 20, window.size
    assert window.events <= window.size[0], "more than the window was left unconfirmed"
