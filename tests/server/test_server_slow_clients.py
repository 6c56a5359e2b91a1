"""Slow WebSocket clients against the REAL in-process server, at PROTOCOL.md's bound (issue 33 §5).

PROTOCOL.md "Limits": a client that falls more than 10,000 events (or 64 MiB) behind is closed
with 1013. Before: a slow reader's own kernel took megabytes of events into its receive buffer,
where the host could not count them, so it was never closed at the bound — a keepalive ping
stuck behind those bytes closed it instead (1006/1011 at ~3,200 events behind), and a client
that never read outlived 12,000 events. Here "behind" is what the client has not read: the
test publishes the events itself (``bus.publish``) and knows which ones the client took.

Clients are ``websockets``' own, with its defaults (a 16-message queue, the kernel's receive
buffer): what a user's client is. The keepalive is short here (pings every 0.2 s on both sides),
so a test of a few seconds sees it many times over; PROTOCOL.md's bound is kept.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed
from websockets.protocol import State

from pidesk.core.events import MessageDelta
from pidesk.server.protocol import DoorLimits

pytestmark = pytest.mark.asyncio

BOUND = DoorLimits().max_behind_events  # 10,000
QUICK_KEEPALIVE = DoorLimits(ping_interval=0.2, ping_timeout=1.0)
PAUSE = 1.5  # s: a client reading nothing this long outlasts the keepalive's timeout
# How far from the bound the close may come, as the client counts. Early: what it read since the
# last ping it answered (the host pings at least every 1/256 of the bound). Late: what its WebSocket
# took and answered for but the test has not read yet (a 16-message queue, and as much as one read
# of the socket took: up to 256 KiB), and the few events published while the close is processed.
EARLY = BOUND // 256
LATE = 1000


def delta(i: int, size: int = 200) -> MessageDelta:
    return MessageDelta(session_id="s-slow", turn_id="t-slow", message_id="m-slow", text=f"{i:08d}" + "x" * size)


async def client(served: Any, **options: Any) -> ClientConnection:
    return await connect(served.ws_url, additional_headers=served.auth(), proxy=None, compression=None,
                         open_timeout=5, **options)


async def hello_ms(prober: Any) -> float:
    start = time.perf_counter()
    assert (await prober.call("host.hello", {"protocolVersion": 1}))["protocolVersion"] == 1
    return (time.perf_counter() - start) * 1000


async def test_a_slow_reader_is_closed_1013_at_the_bound_and_not_before(start_server):
    """A client reading one event for every two published, its own keepalive and the host's pinging
    every 0.2 s: at 5,000 behind it stops reading for 1.5 s (past the keepalive's 1 s timeout) and is
    still connected, the host answering another client meanwhile; it is closed with 1013 once
    10,000 behind — not before — after a gapless run of events. Before the fix: no close at 10,000
    behind (the events sat in the client's kernel, uncounted) and the keepalive's ping, stuck
    behind them, ended it during the pause."""
    served = await start_server(limits=QUICK_KEEPALIVE)
    bus = served.host.parts.bus
    prober = await served.ws()
    ws = await client(served, ping_interval=0.2, ping_timeout=5)
    first = bus.seq + 1
    read: list[int] = []
    at_half: float | None = None
    behind_at_close: int | None = None
    code = None
    try:
        for i in range(3 * BOUND):  # bounded: the close comes at about BOUND steps
            bus.publish(delta(2 * i))
            bus.publish(delta(2 * i + 1))
            message = json.loads(await asyncio.wait_for(ws.recv(), 10))
            if message.get("method") == "event":
                read.append(message["params"]["seq"])
            behind = bus.seq - read[-1] if read else bus.seq - first + 1
            if behind_at_close is None and served.host.closed_clients:
                behind_at_close = behind
            if at_half is None and behind >= BOUND // 2:
                at_half = await hello_ms(prober)
                await asyncio.sleep(PAUSE)  # the client: stuck a while, longer than the keepalive's timeout
                assert ws.state is State.OPEN and not served.host.closed_clients, "closed before the bound"
    except ConnectionClosed as exc:
        code = exc.rcvd.code if exc.rcvd else None
    assert code == 1013, f"not closed 1013 (closed: {code}) after {len(read)} events read, {bus.seq - first + 1} published"
    assert at_half is not None and at_half < 1000, f"host.hello took {at_half} ms with the slow reader 5,000 behind"
    assert behind_at_close is not None, "the host never reported the slow client closed"
    assert BOUND - EARLY <= behind_at_close <= BOUND + LATE, f"closed at {behind_at_close} behind (bound {BOUND})"
    assert read == list(range(first, first + len(read))), "a hole in the events the slow reader got"
    assert ws.latency > 0, "the client's own keepalive pings were never answered"
    assert prober.closed is None


async def test_a_client_that_never_reads_is_closed_1013_at_the_same_bound(start_server):
    """A client that never reads (its WebSocket takes a first window, then its queue is full): the
    host stops sending it and closes it 1013 once 10,000 events are behind — not at 12,000 nor
    later, as when the kernel's buffers hid them, nor earlier by the keepalive during a 1.5 s lull —
    and answers another client meanwhile. Read later, the client finds a gapless run of events,
    then the 1013."""
    served = await start_server(limits=QUICK_KEEPALIVE)
    bus = served.host.parts.bus
    prober = await served.ws()
    silent = await client(served, ping_interval=0.2, ping_timeout=5)
    first = bus.seq + 1
    closed_at: int | None = None
    slowest = 0.0
    for i in range(3 * BOUND):  # bounded: the close comes at about BOUND events
        bus.publish(delta(i))
        await asyncio.sleep(0)  # a turn of the loop per event, as a streaming turn gives (the pusher sends)
        if served.host.closed_clients:
            closed_at = bus.seq - first + 1
            break
        if i % 1000 == 0:
            slowest = max(slowest, await hello_ms(prober))
        if i == BOUND // 2:
            await asyncio.sleep(PAUSE)  # no events for a while: the keepalive must not end it either
    assert closed_at is not None, f"a client that never read was not closed after {bus.seq - first + 1} events"
    assert BOUND - EARLY <= closed_at <= BOUND + LATE, f"closed at {closed_at} events behind (bound {BOUND})"
    assert slowest < 1000, f"host.hello took {slowest:.0f} ms while a client never read"
    seqs: list[int] = []
    code = None
    try:
        async with asyncio.timeout(10):
            async for raw in silent:
                seqs.append(json.loads(raw)["params"]["seq"])
    except ConnectionClosed as exc:
        code = exc.rcvd.code if exc.rcvd else None
    assert code == 1013
    assert seqs == list(range(first, first + len(seqs))) and len(seqs) <= BOUND // 4, (
        f"{len(seqs)} events reached a client that never read: more than the host lets out unconfirmed")
    assert prober.closed is None


async def test_a_client_that_never_reads_is_closed_at_64_mib_behind(start_server):
    """PROTOCOL.md's byte bound (64 MiB) on its own: 256 KiB events to a client that never reads. It
    is closed 1013 once 64 MiB are behind. (Its WebSocket holds one message at most: what a client's
    library takes and answers for counts as read — with websockets' default of 16 that is 4 MiB.)"""
    served = await start_server(limits=QUICK_KEEPALIVE)
    bus = served.host.parts.bus
    silent = await client(served, ping_interval=None, max_size=None, max_queue=1)
    size = 256 * 1024
    first = bus.seq + 1
    closed_at: int | None = None
    for i in range(3 * 64 * 1024 * 1024 // size):
        bus.publish(delta(i, size))
        await asyncio.sleep(0)
        if served.host.closed_clients:
            closed_at = (bus.seq - first + 1) * size
            break
    assert closed_at is not None, "a client that never read was not closed past 64 MiB"
    mib = closed_at / (1 << 20)
    assert 64 <= mib <= 64 + 2, f"closed at {mib:.1f} MiB behind"
    try:
        async with asyncio.timeout(10):
            async for _raw in silent:
                pass
    except ConnectionClosed as exc:
        assert exc.rcvd is not None and exc.rcvd.code == 1013


async def test_a_peer_that_answers_no_ping_is_still_closed_by_the_keepalive(start_server):
    """The keepalive still ends a peer that has read everything and answers no ping (gone, or not a
    WebSocket): a raw socket that completes the handshake, then neither reads nor answers."""
    served = await start_server(limits=DoorLimits(ping_interval=0.1, ping_timeout=0.3))
    reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
    try:
        writer.write((f"GET /rpc HTTP/1.1\r\nHost: 127.0.0.1:{served.port}\r\nUpgrade: websocket\r\n"
                      "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                      f"Sec-WebSocket-Version: 13\r\nAuthorization: Bearer {served.token}\r\n\r\n").encode())
        async with asyncio.timeout(10):
            assert b" 101 " in (await reader.readuntil(b"\r\n\r\n")).split(b"\r\n", 1)[0]
            await served.host.wait_clients_closed(1)
            received = await reader.read()  # to the end: the host closed it
    finally:
        writer.close()
    assert received.startswith(b"\x89")  # a ping, never answered
    assert b"\x88" in received and b"keepalive ping timeout" in received  # then the close (1011)
