"""Long-lived hosts (issue 33 §4, §5): lists that grew, and clients that read slowly.

Lists, against a real ``pidesk serve`` subprocess over its WebSocket (loopback only), on a data
directory built in bulk (``dataset.build``): 10,000 sessions (one turn each) and 100,000
notifications of the last two weeks, a tenth of them unseen.

- ``session_list_ms_10k``: the first page (``limit`` 100) of ``session.list`` — target ≤ 10 ms;
- ``notifications_list_ms_100k``: the first page (``limit`` 100) of ``notifications.list``, and of
  its unseen ones (``…_unseen_…``);
- for comparison, the unpaged calls a client made before paging (every session; the UI's
  ``notifications.list {unseenOnly: true}``; every notification), with their answers' sizes;
- ``loop_gap_ms``: the worst latency of a probe process GETting ``/healthz`` every 10 ms on its
  own connection while the paged calls ran (``loop_stall.py``'s probe): how long the host's loop
  was held; and separately while the unpaged ones ran.

Slow clients, against the server in this process at PROTOCOL.md's bound (10,000 events / 64 MiB)
and uvicorn's keepalive defaults (20 s pings, 20 s timeout), events published on its bus at a
steady rate: a client that reads half as fast as they come (``websockets``' client with its own
20 s keepalive), and one that never reads (no keepalive of its own: it would end itself, its library
waiting for the host's pong behind what it never reads). Each: how far behind it was, as it counts, when the
host closed it, the close code, and how long it stayed connected. Full size: 200 events/s against
a reader of 100/s, ~100 s — longer than both keepalives; ``--quick`` runs ten times faster, too
short to see a keepalive.

    .venv/bin/python bench/scale_lists.py [--quick] [--json PATH]

``measure(quick)`` returns the figures as a dict (name → value).
"""

from __future__ import annotations

import asyncio
import json
import random
import sqlite3
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import dataset  # noqa: E402
import harness  # noqa: E402
import loop_stall  # noqa: E402
import rpc_load  # noqa: E402
from harness import Figure  # noqa: E402

from pidesk.ids import iso  # noqa: E402

SESSIONS = 10_000
NOTIFICATIONS = 100_000
UNSEEN_EVERY = 10  # one notification in ten is unseen
PAGE = 100
REPEATS = 50
TARGET_MS = 10.0
BOUND = 10_000  # PROTOCOL.md's, DoorLimits' default


# ---- lists --------------------------------------------------------------------------------


def _build(data_dir: Path, project: Path, sessions: int, notifications: int) -> None:
    dataset.build(data_dir, sessions, 4, project=project)
    rng = random.Random(33)
    now = datetime.now(UTC)
    with sqlite3.connect(data_dir / "index.db") as db:
        ids = [row[0] for row in db.execute("SELECT id FROM sessions")]
        rows = []
        for i in range(notifications):
            created = iso(now - timedelta(seconds=12 * (notifications - i)))  # the last ~2 weeks
            seen = None if i % UNSEEN_EVERY == 0 else created
            rows.append((f"n_{rng.getrandbits(64):016x}", rng.choice(ids), f"t_{rng.getrandbits(64):016x}",
                         "task.completed", created, seen))
        db.executemany("INSERT INTO notifications (id, session_id, turn_id, kind, created_at, seen_at)"
                       " VALUES (?,?,?,?,?,?)", rows)


async def _timed(ws: rpc_load.Ws, method: str, params: dict[str, Any], repeats: int) -> tuple[float, int]:
    """The median round trip (ms) of ``method`` over ``repeats`` calls, and its answer's size in bytes."""
    times = []
    answer: Any = None
    for _ in range(repeats):
        start = time.perf_counter()
        answer = await ws.call(method, params)
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times), len(json.dumps(answer))


async def _lists(server: rpc_load.Server, probe: loop_stall.HealthzProbe, quick: bool) -> dict[str, float]:
    ws = await rpc_load.Ws.open(server)
    out: dict[str, float] = {}
    try:
        await ws.call("host.hello", {"protocolVersion": 1})
        repeats = 10 if quick else REPEATS
        begin = time.monotonic()
        await asyncio.sleep(1.0)  # the probe alone: what this machine's noise gives
        out["loop_gap_idle_ms"] = probe.worst_ms(begin, time.monotonic())
        begin = time.monotonic()
        out["session_list_ms_10k"], _ = await _timed(ws, "session.list", {"limit": PAGE}, repeats)
        out["notifications_list_ms_100k"], _ = await _timed(ws, "notifications.list", {"limit": PAGE}, repeats)
        out["notifications_unseen_list_ms_100k"], _ = await _timed(
            ws, "notifications.list", {"limit": PAGE, "unseenOnly": True}, repeats)
        first = await ws.call("notifications.list", {"limit": PAGE})
        out["notifications_next_page_ms_100k"], _ = await _timed(
            ws, "notifications.list", {"limit": PAGE, "cursor": first["nextCursor"]}, repeats)
        out["loop_gap_ms"] = probe.worst_ms(begin, time.monotonic())
        begin = time.monotonic()
        unpaged = 1 if quick else 3
        out["session_list_all_ms_10k"], size = await _timed(ws, "session.list", {}, unpaged)
        out["session_list_all_mb_10k"] = size / 1e6
        out["notifications_unseen_all_ms_100k"], size = await _timed(
            ws, "notifications.list", {"unseenOnly": True}, unpaged)
        out["notifications_unseen_all_mb_100k"] = size / 1e6
        out["notifications_all_ms_100k"], size = await _timed(ws, "notifications.list", {}, unpaged)
        out["notifications_all_mb_100k"] = size / 1e6
        out["loop_gap_unpaged_ms"] = probe.worst_ms(begin, time.monotonic())
    finally:
        await ws.close()
    return out


def lists(quick: bool) -> dict[str, float]:
    with harness.scratch("scale-lists") as scratch:
        project = scratch / "project"
        project.mkdir()
        data_dir = scratch / "data"
        began = time.monotonic()
        _build(data_dir, project, SESSIONS, NOTIFICATIONS)
        print(f"  built {SESSIONS:,} sessions and {NOTIFICATIONS:,} notifications in "
              f"{time.monotonic() - began:.0f} s", flush=True)
        with rpc_load.served(scratch, data_dir, None) as server:
            with loop_stall.HealthzProbe(server, scratch / "probes.txt") as probe:
                return asyncio.run(_lists(server, probe, quick))


# ---- slow clients -------------------------------------------------------------------------


async def _in_process_server(data_dir: Path) -> tuple[Any, asyncio.Task[None], int, str]:
    from pidesk.config import HostConfig
    from pidesk.providers.scripted import ScriptedProvider
    from pidesk.server import serve as serve_module
    from pidesk.server.serve import ServeOptions

    hosts: list[Any] = []

    class Kept(serve_module.Host):  # type: ignore[misc,name-defined]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            hosts.append(self)

    ready = asyncio.Event()
    where: dict[str, Any] = {}

    def announce(url: str, token: str) -> None:
        where["port"], where["token"] = int(url.rsplit(":", 1)[1]), token
        ready.set()

    original, serve_module.Host = serve_module.Host, Kept  # type: ignore[misc]
    try:
        task = asyncio.create_task(serve_module.serve(HostConfig(data_dir=data_dir), ScriptedProvider(),
                                                      ServeOptions(port=0), announce))
        await asyncio.wait_for(ready.wait(), 30)
    finally:
        serve_module.Host = original  # type: ignore[misc]
    return hosts[0], task, where["port"], where["token"]


async def _slow_client(data_dir: Path, publish_rate: float, read_rate: float | None) -> dict[str, float]:
    """Publish at ``publish_rate`` events/s until the client is closed; it reads at ``read_rate``
    (None: never). How far behind it was when the host closed it, the close code, the time."""
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed

    from pidesk.core.events import MessageDelta

    host, task, port, token = await _in_process_server(data_dir)
    bus = host.parts.bus
    closed_at: list[tuple[int, float]] = []  # the last seq published when the host closed the client, and when
    reported = host.client_closed

    def client_closed(client_id: str) -> None:
        closed_at.append((bus.seq, time.monotonic()))
        reported(client_id)

    host.client_closed = client_closed
    # The silent client has no keepalive of its own: its library would wait for the host's pong behind
    # what it never reads, and close the connection itself after 40 s.
    ws = await connect(f"ws://127.0.0.1:{port}/rpc", additional_headers={"Authorization": f"Bearer {token}"},
                       proxy=None, compression=None, ping_interval=20.0 if read_rate is not None else None)
    first = bus.seq + 1

    async def publish() -> None:
        sent, began = 0, time.monotonic()
        while not closed_at:
            for _ in range(int((time.monotonic() - began) * publish_rate) - sent):
                bus.publish(MessageDelta(session_id="s", turn_id="t", message_id="m", text=f"{sent:08d} " + "x" * 200))
                sent += 1
            await asyncio.sleep(0.005)

    began = time.monotonic()
    publisher = asyncio.create_task(publish())
    read = first - 1  # the last seq the client read
    behind: int | None = None
    try:
        async with asyncio.timeout(600):
            if read_rate is None:
                await publisher  # it stops once the client is closed
                behind = closed_at[0][0] - first + 1
                await asyncio.sleep(0)
            async for raw in ws:  # the slow reader; the silent one reads what was left, to its close
                message = json.loads(raw)
                if message.get("method") == "event":
                    read = message["params"]["seq"]
                if closed_at and behind is None:
                    behind = closed_at[0][0] - read
                if read_rate is not None:
                    await asyncio.sleep(1 / read_rate)
    except (ConnectionClosed, TimeoutError):
        pass
    seconds = (closed_at[0][1] if closed_at else time.monotonic()) - began
    code = ws.close_code
    publisher.cancel()
    await asyncio.gather(publisher, return_exceptions=True)
    await ws.close()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    return {"behind": float(behind if behind is not None else bus.seq - read), "code": float(code or 0),
            "seconds": seconds}


def slow_clients(quick: bool) -> dict[str, float]:
    rate = 2000.0 if quick else 200.0
    out: dict[str, float] = {}
    for name, read_rate in (("slow_reader", rate / 2), ("silent_reader", None)):
        with tempfile.TemporaryDirectory(prefix="scale-slow-", dir=harness.OUT if harness.OUT.exists() else None) as tmp:
            got = asyncio.run(_slow_client(Path(tmp), rate, read_rate))
        for key, value in got.items():
            out[f"{name}_{key}"] = value
        print(f"  {name}: closed {int(got['code'])} at {got['behind']:,.0f} behind after {got['seconds']:.0f} s",
              flush=True)
    return out


# ---- the script ---------------------------------------------------------------------------


def measure(quick: bool) -> dict[str, float]:
    """Every figure, by name: the lists' (ms, MB; ``session_list_ms_10k`` has the 10 ms target), then
    the slow clients' (``…_behind`` events, ``…_code``, ``…_seconds``)."""
    harness.OUT.mkdir(exist_ok=True)
    return {**lists(quick), **slow_clients(quick)}


def figures(measured: dict[str, float]) -> list[Figure]:
    out = []
    for name, value in measured.items():
        if name.endswith(("_code", "_seconds")):
            continue
        if name.endswith("_behind"):
            client = name.removesuffix("_behind")
            out.append(Figure(name, value, "events", BOUND, note=f"closed {measured[client + '_code']:.0f} after "
                              f"{measured[client + '_seconds']:.0f} s, as the client counted (bound 10,000)"))
        elif "_mb" in name:
            out.append(Figure(name, value, "MB"))
        else:
            out.append(Figure(name, value, "ms", TARGET_MS if name == "session_list_ms_10k" else None, at_least=False))
    return out


def main() -> int:
    args = harness.parse_args(__doc__ or "")
    harness.header("scale: lists and slow clients", args.quick)
    measured = measure(args.quick)
    return harness.report("scale_lists", figures(measured), args.json)


if __name__ == "__main__":
    sys.exit(main())
