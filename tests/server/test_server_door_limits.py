"""The door's limits against the REAL in-process server (issue 15: authority holes 9, 10, 14, 16).

- Hole 9: a WebSocket client that stops reading is closed with 1013 once it falls more than
  ``max_behind_events`` events (or ``max_behind_bytes``) behind; a reader is unaffected. The
  server here takes small bounds so a short turn crosses them; the default bounds, and the
  host's memory, are measured against a subprocess in ``tests/security/test_security_door.py``.
- Hole 10: a connection that has not sent a complete request within the request deadline is
  closed — silent, one byte, trickled headers, a promised body never sent, a trickled body — and
  a complete request is answered however slowly it was sent within it. The deadline is 1 s here
  (10 s by default); the cap on connections is tested in ``test_security_door.py``.
- Holes 14 and 16: integer params out of range, bools and floats are INVALID_PARAMS with the
  range in the message; ``host.hello`` takes only the integer 1.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from pidesk.providers.scripted import ScriptedProvider
from pidesk.server.protocol import DoorLimits

STALLED = 20


async def stalled_socket(port: int, token: str) -> ClientConnection:
    """An authenticated WebSocket that will not read: a tiny receive buffer, and the client library
    stops reading the socket once a few messages wait in it (``max_queue``)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, 536)  # the host's send buffer then stays small too
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    return await connect(f"ws://127.0.0.1:{port}/rpc", sock=sock, additional_headers={"Authorization": f"Bearer {token}"},
                         proxy=None, max_size=None, compression=None, ping_interval=None, max_queue=4, open_timeout=5)


async def read_to_close(ws: ClientConnection, timeout: float = 15) -> tuple[list[int], int | None]:
    """Read what the host sent until it closes: the seqs of the events, and the close code."""
    seqs: list[int] = []
    try:
        async with asyncio.timeout(timeout):
            async for raw in ws:
                message = json.loads(raw)
                if message.get("method") == "event":
                    seqs.append(message["params"]["seq"])
    except ConnectionClosed:
        pass
    except TimeoutError:
        return seqs, None  # never closed
    return seqs, ws.close_code


def bursts(words: list[str], per_burst: int) -> list[dict[str, Any]]:
    """A model script streaming ``words`` in bursts of ``per_burst`` deltas, each burst ended by a Read
    call. The scripted model streams a response without yielding, so every client is that many events
    behind at once; the tool call between bursts lets a reading client catch up, as a real model's
    pacing does."""
    chunks = [words[i:i + per_burst] for i in range(0, len(words), per_burst)]
    script: list[dict[str, Any]] = [{"text": "".join(chunk), "toolCalls": [{"name": "Read", "args": {"path": "README.md"}}]}
                                    for chunk in chunks[:-1]]
    return [*script, {"text": "".join(chunks[-1])}]


async def stream_a_turn(served: Any, provider: ScriptedProvider, script: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], float]:
    """Run one turn of ``script``; the events a client that reads received, and the slowest
    ``host.hello`` over another connection while it ran (ms)."""
    reader = await served.ws()
    prober = await served.ws()
    session = await reader.call("session.create", {"projectPath": str(served.project), "permissionMode": "auto"})
    provider.enqueue(session["id"], *script)
    turn = await reader.call("agent.prompt", {"sessionId": session["id"], "text": "go"})
    slowest = 0.0
    ended = asyncio.ensure_future(reader.turn_ended(turn["turnId"]))
    for _ in range(10_000):  # bounded: the turn ends long before
        start = time.perf_counter()
        assert (await prober.call("host.hello", {"protocolVersion": 1}))["protocolVersion"] == 1
        slowest = max(slowest, (time.perf_counter() - start) * 1000)
        if ended.done():
            break
    assert (await ended)["reason"] == "completed"
    return reader.events, slowest


def assert_gapless(seqs: list[int]) -> None:
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))) if seqs else True, "a hole in the events received"


@pytest.mark.asyncio
async def test_stalled_websockets_are_closed_1013_past_the_event_bound(start_server):
    """Authority hole 9: 20 authenticated sockets that never read while a turn streams 3,000 deltas
    of 1 kB (3 MB: more than the kernel takes into a stalled loopback socket, ~1.3 MB). Each
    is closed with 1013 once more than 500 events wait for it (the bound here), and sees the code
    when it reads later: first a gapless run of events, then the close. The client that reads gets
    every delta, and the host answers others meanwhile. Before the fix each stalled socket's queue
    grew without bound and none was ever closed."""
    provider = ScriptedProvider()
    served = await start_server(provider=provider, limits=DoorLimits(max_behind_events=500))
    stalled = [await stalled_socket(served.port, served.token) for _ in range(STALLED)]
    words = [f"{i:07d}" + "x" * 1016 + " " for i in range(3000)]
    events, slowest = await stream_a_turn(served, provider, bursts(words, 200))
    assert [e["text"] for e in events if e["type"] == "message.delta"] == words  # the reader lost nothing
    assert slowest < 1000, f"host.hello took {slowest:.0f} ms while the stalled sockets fell behind"
    for ws in stalled:
        seqs, code = await read_to_close(ws)
        assert code == 1013, f"a stalled socket was not closed 1013 (code {code}) after {len(seqs)} events"
        assert ws.close_reason and "re-read" in ws.close_reason
        assert_gapless(seqs)
        assert len(seqs) < len(words), "a stalled socket was sent every event: it never fell behind"
    assert all(c.closed is None for c in served.clients)  # the reader and the prober were never cut


@pytest.mark.asyncio
async def test_stalled_websockets_are_closed_1013_past_the_byte_bound(start_server):
    """Authority hole 9 (bytes): a turn streaming 3 MB in 8 kB deltas — few events, many bytes.
    With a 1 MiB bound (and no event bound to speak of) each of 20 sockets that never read is
    closed 1013; the reader gets all 3 MB. (A reader is behind by what it has not confirmed reading:
    right after a burst, the burst's 128 kB and the 128 kB message that repeats it. Before issue 33
    the kernel's buffers hid that, and this bound was 256 kB.)"""
    provider = ScriptedProvider()
    served = await start_server(provider=provider, limits=DoorLimits(max_behind_events=10**6,
                                                                      max_behind_bytes=1024 * 1024))
    stalled = [await stalled_socket(served.port, served.token) for _ in range(STALLED)]
    words = [f"{i:07d}" + "x" * 8184 + " " for i in range(384)]
    events, _slowest = await stream_a_turn(served, provider, bursts(words, 16))
    assert "".join(e["text"] for e in events if e["type"] == "message.delta") == "".join(words)
    for ws in stalled:
        seqs, code = await read_to_close(ws)
        assert code == 1013, f"a stalled socket was not closed 1013 (code {code}) after {len(seqs)} events"
        assert_gapless(seqs)
    assert all(c.closed is None for c in served.clients)


# ---- hole 10: the request deadline --------------------------------------------------------------------


async def closed_by_host(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, trickle: bytes = b"",
                         every: float = 0.2, within: float = 5.0) -> float | None:
    """Keep sending ``trickle`` one byte every ``every`` s (if given) until the host closes the
    connection; seconds until it did, or None when it was still open after ``within`` s."""
    start = time.perf_counter()
    loop_deadline = start + within
    sent = 0
    while time.perf_counter() < loop_deadline:
        try:
            async with asyncio.timeout(every):
                data = await reader.read(65536)
            if not data:
                return time.perf_counter() - start
            continue  # an answer (e.g. 401): keep going until the host closes
        except TimeoutError:
            pass
        except ConnectionResetError:
            return time.perf_counter() - start
        if sent < len(trickle):
            try:
                writer.write(trickle[sent:sent + 1])
                await writer.drain()
            except (ConnectionResetError, BrokenPipeError):
                return time.perf_counter() - start
            sent += 1
    return None


async def read_response(reader: asyncio.StreamReader) -> tuple[int, Any]:
    """One HTTP response with a Content-Length: (status, JSON body)."""
    lines = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
    length = next(int(line.split(":", 1)[1]) for line in lines if line.lower().startswith("content-length:"))
    return int(lines[0].split()[1]), json.loads(await reader.readexactly(length))


def head(port: int, token: str | None, extra: str = "") -> bytes:
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    return f"POST /rpc HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{auth}Content-Type: application/json\r\n{extra}\r\n".encode()


@pytest.mark.asyncio
async def test_connections_without_a_complete_request_are_closed_at_the_deadline(start_server):
    """Authority hole 10: with a 1 s request deadline, every connection that has not sent a complete
    request is closed within it — whatever it has sent: nothing, one byte, headers trickled a byte
    every 0.2 s, all headers and half a promised body, an unauthenticated request whose body never
    comes (after its 401), a body trickled a byte every 0.2 s. No token needed for any of it. Before
    the fix only the silent one was reaped (after 5 s); the others stayed open for ever."""
    served = await start_server(limits=DoorLimits(request_timeout=1.0))
    port, token = served.port, served.token
    body = b'{"jsonrpc":"2.0","id":1,"method":"host.status"}'
    cases: dict[str, tuple[bytes, bytes]] = {  # name -> (sent at once, then trickled)
        "silent": (b"", b""),
        "one byte": (b"P", b""),
        "trickled headers": (b"", head(port, token)),
        "half a promised body": (head(port, token, f"Content-Length: {len(body)}\r\n") + body[:10], b""),
        "unauthenticated, body never sent": (head(port, None, "Content-Length: 100000\r\n"), b""),
        "trickled body": (head(port, token, f"Content-Length: {len(body)}\r\n"), body),
        "trickled WebSocket upgrade": (b"", f"GET /rpc HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
                                            "Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\n".encode()),
    }
    conns = {name: await asyncio.open_connection("127.0.0.1", port) for name in cases}
    for name, (at_once, _trickle) in cases.items():
        if at_once:
            conns[name][1].write(at_once)
    took = await asyncio.gather(*(closed_by_host(*conns[name], trickle=cases[name][1]) for name in cases))
    for (_reader, writer) in conns.values():
        writer.close()
    late = {name: t for name, t in zip(cases, took, strict=True) if t is None or not 0.5 <= t <= 2.5}
    assert not late, f"not closed within the 1 s deadline (None: still open after 5 s): {late}"
    # the host is fine, and a normal request is answered
    assert (await served.call("host.hello", {"protocolVersion": 1}))["protocolVersion"] == 1


@pytest.mark.asyncio
async def test_a_slow_but_complete_request_and_an_idle_websocket_are_not_cut(start_server):
    """Authority hole 10, the other side: a request trickled in within the deadline is answered; a
    WebSocket that has completed its handshake may stay idle past the deadline; the deadline starts
    again after each answer on a kept-alive connection."""
    served = await start_server(limits=DoorLimits(request_timeout=1.0))
    ws = await served.ws()
    body = b'{"jsonrpc":"2.0","id":1,"method":"host.status"}'
    request = head(served.port, served.token, f"Content-Length: {len(body)}\r\n") + body
    reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
    for round_ in range(2):  # two requests on one kept-alive connection, each sent over ~0.6 s
        for start in range(0, len(request), len(request) // 6 + 1):
            writer.write(request[start:start + len(request) // 6 + 1])
            await asyncio.sleep(0.1)  # pacing the sender, not waiting for the host
        async with asyncio.timeout(5):
            status, answer = await read_response(reader)
        assert status == 200 and "sessions" in answer["result"], (round_, status, answer)
    writer.close()
    await asyncio.sleep(1.5)  # idle past the deadline: pacing the client, as a person would
    assert (await ws.call("host.hello", {"protocolVersion": 1}))["protocolVersion"] == 1


# ---- holes 14 and 16: integers --------------------------------------------------------------------------

NOT_INTEGERS = [True, False, 1.0, 2.5, "1", None, [1], {"n": 1}]
OUT_OF_INT64 = [2**63, -(2**63) - 1, 2**64, 2**70, -(2**70), 10**300]


@pytest.mark.asyncio
async def test_out_of_range_integers_are_invalid_params_naming_the_range(served):
    """Authority hole 14: ``beforeSeq`` 2^63 (and −2^63−1, 2^64, …) was INTERNAL with an OverflowError
    from SQLite; every integer param of every method now answers INVALID_PARAMS with the allowed range,
    for numbers outside it, bools and floats alike, and nothing is logged as a failure."""
    c = await served.ws()
    session = await c.call("session.create", {"projectPath": str(served.project)})
    sid = session["id"]
    cases: list[tuple[str, dict[str, Any], str]] = []
    for value in OUT_OF_INT64 + [-1] + [v for v in NOT_INTEGERS if v is not None]:
        cases.append(("session.get", {"sessionId": sid, "beforeSeq": value}, "beforeSeq"))
    for value in OUT_OF_INT64 + [0, -1, 1001] + [v for v in NOT_INTEGERS if v is not None]:
        cases += [("session.get", {"sessionId": sid, "limit": value}, "limit"),
                  ("session.turns", {"sessionId": sid, "limit": value}, "limit")]
    for value in OUT_OF_INT64 + [0, 10_001, True, 1.0]:
        cases.append(("audit.list", {"limit": value}, "limit"))
    for method, params, name in cases:
        error = await c.error(method, params)
        assert (error.code, error.data_code) == (-32602, "INVALID_PARAMS"), (method, params, error.response)
        message = error.response["error"]["message"]
        assert name in message and " from " in message, (method, params, message)
    # the edges are accepted
    assert (await c.call("session.get", {"sessionId": sid, "beforeSeq": 2**63 - 1, "limit": 1000}))["messages"] == []
    assert (await c.call("session.get", {"sessionId": sid, "beforeSeq": 0, "limit": 1}))["messages"] == []
    assert "entries" in await c.call("audit.list", {"limit": 10_000})
    assert (await c.call("session.turns", {"sessionId": sid, "limit": 1000}))["turns"] == []


@pytest.mark.asyncio
async def test_attachment_sizes_out_of_range_are_invalid_params(served):
    """Authority hole 14: an attachment's ``size`` outside 0..2^63−1 is INVALID_PARAMS (agent.queue.push
    stored any number it was given)."""
    c = await served.ws()
    sid = (await c.call("session.create", {"projectPath": str(served.project)}))["id"]
    put = await c.call("attachments.put", {"name": "a.txt", "mime": "text/plain", "data": "YQ=="})
    for size in (2**63, 2**70, -1, True, 1.0):
        for method in ("agent.queue.push", "agent.prompt"):
            error = await c.error(method, {"sessionId": sid, "text": "hi", "attachments": [{**put, "size": size}]})
            assert (error.code, error.data_code) == (-32602, "INVALID_PARAMS"), (method, size, error.response)
    assert (await c.call("agent.queue.list", {"sessionId": sid}))["entries"] == []


@pytest.mark.asyncio
async def test_host_hello_takes_only_the_integer_version(served):
    """Authority hole 16: ``protocolVersion: true`` and ``1.0`` were accepted as 1 (Python's ``True == 1``,
    ``1.0 == 1``). A version that is not an integer is INVALID_PARAMS; another integer is
    PROTOCOL_MISMATCH; only the integer 1 is answered."""
    c = await served.ws()
    for value in (True, 1.0, "1", [1], {"v": 1}, None, 1.5):
        error = await c.error("host.hello", {"protocolVersion": value})
        assert (error.code, error.data_code) == (-32602, "INVALID_PARAMS"), (value, error.response)
        assert "protocolVersion must be an integer" in error.response["error"]["message"]
    for value in (0, 2, -1, 2**63, 2**70):
        error = await c.error("host.hello", {"protocolVersion": value})
        assert (error.code, error.data_code) == (-32000, "PROTOCOL_MISMATCH"), (value, error.response)
    assert (await c.call("host.hello", {"protocolVersion": 1}))["protocolVersion"] == 1


@pytest.mark.asyncio
async def test_a_batch_stops_running_once_its_answers_pass_the_bound(served, monkeypatch):
    """Issue 29 item 7: a 5.6 KB batch of 100 session.list over 10,000 sessions built a 405 MB reply (17 s on
    the loop, 1.6 GB). Once a batch's answers pass the bound, the rest is answered LIMIT_EXCEEDED and not
    run (here the bound is made small: a few session lists), over HTTP and over a WebSocket alike."""
    from pidesk.server import rpc

    for n in range(20):
        await served.call("session.create", {"title": f"session {n} " + "x" * 150})
    monkeypatch.setattr(rpc, "MAX_BATCH_REPLY", 20_000)  # ~ four answers of 20 sessions
    batch = [{"jsonrpc": "2.0", "id": i, "method": "session.list"} for i in range(10)]
    batch += [{"jsonrpc": "2.0", "id": 10, "method": "session.create", "params": {"title": "after the bound"}}]
    answers = (await served.post(batch)).json()
    assert [a["id"] for a in answers] == list(range(11))
    ran = [a for a in answers if "result" in a]
    refused = [a for a in answers if "error" in a]
    assert 1 <= len(ran) < 10 and len(ran) + len(refused) == 11
    assert {a["error"]["data"]["code"] for a in refused} == {"LIMIT_EXCEEDED"}
    titles = [s["title"] for s in (await served.call("session.list"))["sessions"]]
    assert "after the bound" not in titles  # not run
    client = await served.ws()
    await client.send_raw(json.dumps(batch))
    over_ws = await client.reply()
    assert [a["id"] for a in over_ws] == list(range(11)) and "error" in over_ws[-1]
