"""Paging a long session: 200 messages out of 100k, from the store and over the host API.

``Store.page`` reads (id, seq, offset, length) of the page from the index, then one
contiguous byte range of the transcript, and decodes those lines only — so a page
costs the same at message 100 or message 100,000. Timed: the newest page
(``before_seq=None``) and one from the middle (``before_seq`` = half), directly
and through ``await host.call("session.get", …)`` (which adds the session row,
queue, pending approval/permissions and the conversion to JSON-ready values).
The session is built as turns of four messages (prompt, tool call, tool result,
answer): 100k messages are 25k turns.
Target: median ≤ 10 ms for each.

    .venv/bin/python bench/page.py [--quick]
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import dataset
import harness
from harness import Figure

from pidesk.config import HostConfig
from pidesk.host import Host
from pidesk.providers.scripted import ScriptedProvider
from pidesk.store import repo

PAGE = 200


def sample(fn: Callable[[], object], runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


async def sample_async(fn: Callable[[], Awaitable[object]], runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        await fn()
        times.append(time.perf_counter() - start)
    return times


def figure(name: str, times: list[float], target: float | None = 10, note: str = "") -> Figure:
    ms = sorted(t * 1000 for t in times)
    p95 = ms[int(len(ms) * 0.95) - 1]
    return Figure(name, statistics.median(ms), "ms", target, at_least=False, note=f"p95 {p95:.2f}, n={len(ms)}{note}")


async def measure(host: Host, session_id: str, middle: int, runs: int) -> list[Figure]:
    store = host.store
    first, has_more = store.page(session_id, None, PAGE)
    mid, _ = store.page(session_id, middle, PAGE)
    if len(first) != PAGE or not has_more or mid[-1].seq != middle - 1:
        raise SystemExit(f"unexpected pages: {len(first)} newest, middle ends at {mid[-1].seq}")
    got = await host.call("session.get", {"sessionId": session_id, "beforeSeq": middle})
    if [m["seq"] for m in got["messages"]] != [m.seq for m in mid]:
        raise SystemExit("session.get returned a different middle page than Store.page")
    with store.db.read() as db:
        turns = int(db.execute("SELECT count(*) FROM turns WHERE session_id = ?", (session_id,)).fetchone()[0])
    for _ in range(20):  # warm the SQLite page cache and the code paths
        store.page(session_id, None, PAGE)
        await host.call("session.get", {"sessionId": session_id})
    return [
        figure("Store.page newest 200 of 100k", sample(lambda: store.page(session_id, None, PAGE), runs)),
        figure(f"Store.page 200 before seq {middle}", sample(lambda: store.page(session_id, middle, PAGE), runs)),
        figure('host.call("session.get") newest 200',
               await sample_async(lambda: host.call("session.get", {"sessionId": session_id}), runs)),
        figure('host.call("session.get") middle 200',
               await sample_async(lambda: host.call("session.get", {"sessionId": session_id, "beforeSeq": middle}),
                                  runs)),
        figure("  one read of the session row (Parts.session)", sample(lambda: host.parts.session(session_id), runs),
               None, f"; context: session.get reads it several times; the session has {turns:,} turns"),
    ]


async def run(data_dir: Path, messages: int, runs: int) -> list[Figure]:
    host = Host.open(HostConfig(data_dir=data_dir), ScriptedProvider())
    try:
        with host.store.db.read() as db:
            session_id = next(iter(repo.session_watermarks(db)))
        return await measure(host, session_id, messages // 2, runs)
    finally:
        await host.close()


def main() -> int:
    args = harness.parse_args(__doc__ or "")
    messages, runs = (100_000, 50) if args.quick else (100_000, 500)
    harness.header("page", args.quick)
    with harness.scratch("page") as tmp:
        data_dir = tmp / "data"
        dataset.build(data_dir, 1, messages)
        dataset.verify(data_dir)
        print(f"  one session, {messages} messages; {runs} runs each")
        figures = asyncio.run(run(data_dir, messages, runs))
    return harness.report("page", figures, args.json)


if __name__ == "__main__":
    raise SystemExit(main())
