"""Scale: what an open web page costs each turn of a long session (issue 33 §1).

Before: the page asked ``session.changes`` for the whole session after every turn; the call
read the checkpoint journal and ran git for every turn, under the project's lock, so at 1,000
turns each turn took ~19 s instead of ~0.1 s. Now each turn's list is stored when it ends and the
page asks for that turn alone.

The session is built by driving real turns (each one Write of a new file, the scripted model) on
an in-process host; then a ``pidesk serve`` subprocess on the same data dir runs the measured
turns, back to back, from a WebSocket driver that prompts and waits for ``turn.ended``:

- without a page: the driver alone;
- with a page: a second WebSocket client that behaves like the web page — it focuses the
  session, reads its changes as the page does when it opens (``session.changes`` pages of
  1,000, no diffs), then after each ``turn.ended`` asks for that turn alone (``{sessionId,
  turnId, diff: false}``; ``--page-diffs``: with its diffs, as the page does when its Changes
  panel is open).

The turns run in rounds of three blocks — no page, a page that only receives the events (what
any open page costs), the page — in a fresh order each round, so the VM's drift falls on all
three. The figure is ``page_open_ratio_1000``: the median turn with the page ÷ the median turn
without (target ≤ 1.1).
Also: the worst ``/healthz`` latency while the measured turns ran (the loop-stall probe of
``bench/loop_stall.py``, target ≤ 50 ms), the page's per-turn call, and its opening read.

    .venv/bin/python bench/scale_changes.py [--quick] [--turns 1000] [--json PATH]

``measure(quick)`` returns the figures as a dict (``--quick``: a 150-turn session; the dict
says how many turns it used).
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402
import loop_stall  # noqa: E402
import rpc_load  # noqa: E402
from harness import Figure  # noqa: E402

from pidesk.config import HostConfig  # noqa: E402
from pidesk.core import events as ev  # noqa: E402
from pidesk.host import Host  # noqa: E402
from pidesk.providers.scripted import ScriptedProvider  # noqa: E402

TARGET_RATIO = 1.1
KINDS = ("without", "events", "with")  # no page; a page that only receives events; the page
TARGET_GAP_MS = loop_stall.TARGET_MS
PAGE = 1000  # turns per session.changes page, as the web page asks


def _write(n: int) -> list[dict[str, Any]]:
    """One turn's model: a Write of a new file, then "Done."."""
    return [{"toolCalls": [{"name": "Write", "args": {"path": f"work/file_{n:05}.txt",
                                                       "content": f"file {n}\n" + "line\n" * (n % 7)}}]},
            {"text": "Done."}]


async def build(data_dir: Path, project: Path, turns: int) -> str:
    """A session of ``turns`` real turns on an in-process host (closed after); its id."""
    provider = ScriptedProvider()
    host = Host.open(HostConfig(data_dir=data_dir), provider)
    try:
        session = await host.call("session.create", {"projectPath": str(project), "permissionMode": "auto"})
        sid = str(session["id"])
        sub = host.subscribe()
        for n in range(turns):
            provider.enqueue(sid, *_write(n))
            turn = await host.call("agent.prompt", {"sessionId": sid, "text": f"Write file {n}"})
            end = await sub.wait_for(lambda e, t=turn["turnId"]: isinstance(e, ev.TurnEnded) and e.turn_id == t, 120)
            assert isinstance(end, ev.TurnEnded)
            if end.reason != "completed":
                raise RuntimeError(f"building turn {n} ended {end.reason}: {end.error_message}")
        return sid
    finally:
        await host.close()


class Page:
    """A WebSocket client that does what the web page does for the Changes panel."""

    def __init__(self, ws: rpc_load.Ws, sid: str, diffs: bool = False, asks: bool = True) -> None:
        self.ws = ws
        self.sid = sid
        self.diffs = diffs  # ask each ended turn with its diffs (the page asks them only for its open panel)
        self.asks = asks  # False: a page that only receives the events (what any open page costs)
        self.calls: list[float] = []  # seconds per per-turn session.changes
        self.pending: set[asyncio.Task[None]] = set()
        self.failures: list[str] = []
        self.answered = asyncio.Event()  # set at each answer

    @classmethod
    async def open(cls, server: rpc_load.Server, sid: str, diffs: bool = False, asks: bool = True
                   ) -> tuple[Page, float, int]:
        """Connect, focus the session, read its changes page by page; the read's seconds and turns."""
        page = cls(await rpc_load.Ws.open(server), sid, diffs, asks)
        page.ws.keep_events = False
        await page.ws.call("session.focus", {"sessionId": sid})
        started = time.perf_counter()
        listed, cursor = 0, None
        for _ in range(1000):
            got = await page.ws.call("session.changes", {"sessionId": sid, "limit": PAGE}
                                     | ({"cursor": cursor} if cursor else {}))
            listed += len(got["turns"])
            cursor = got["nextCursor"]
            if cursor is None:
                break
        read = time.perf_counter() - started
        if asks:
            page.ws.listeners.append(page._event)
        return page, read, listed

    def _event(self, _at: float, event: dict[str, Any]) -> None:
        if event.get("type") == "turn.ended" and event.get("sessionId") == self.sid:
            task = asyncio.get_running_loop().create_task(self._turn(event["turnId"]))
            self.pending.add(task)
            task.add_done_callback(self.pending.discard)

    async def _turn(self, turn_id: str) -> None:
        started = time.perf_counter()
        try:
            got = await self.ws.call("session.changes", {"sessionId": self.sid, "turnId": turn_id}
                                     | ({} if self.diffs else {"diff": False}))
            if [t["turnId"] for t in got["turns"]] != [turn_id] or not got["turns"][0]["files"]:
                self.failures.append(f"{turn_id}: {got['turns']}")
        except Exception as exc:  # (a figure, not a crash: said in the note)
            self.failures.append(f"{turn_id}: {exc}")
        self.calls.append(time.perf_counter() - started)
        self.answered.set()

    async def close(self, turns: int) -> None:
        """Once it has asked about ``turns`` turns (and had its answers)."""
        async with asyncio.timeout(120):
            while self.asks and len(self.calls) < turns:
                self.answered.clear()
                await self.answered.wait()
        await self.ws.close()


async def _turns(ws: rpc_load.Ws, sid: str, count: int) -> list[float]:
    """``count`` turns back to back: seconds from each prompt to its ``turn.ended``."""
    ended: asyncio.Queue[str] = asyncio.Queue()

    def listen(_at: float, event: dict[str, Any]) -> None:
        if event.get("type") == "turn.ended" and event.get("sessionId") == sid:
            ended.put_nowait(str(event.get("reason")))

    ws.listeners.append(listen)
    times = []
    try:
        for n in range(count):
            started = time.perf_counter()
            await ws.call("agent.prompt", {"sessionId": sid, "text": f"Measured turn {n}"})
            async with asyncio.timeout(300):
                reason = await ended.get()
            times.append(time.perf_counter() - started)
            if reason != "completed":
                raise RuntimeError(f"a measured turn ended {reason}")
    finally:
        ws.listeners.remove(listen)
    return times


async def _measure_served(server: rpc_load.Server, sid: str, per_block: int, rounds: int,
                          page_diffs: bool = False) -> dict[str, Any]:
    """Rounds of three blocks of ``per_block`` turns each — no page, a page that only receives the
    events, the page — in a fresh order each round."""
    driver = await rpc_load.Ws.open(server)
    driver.keep_events = False
    times: dict[str, list[float]] = {kind: [] for kind in KINDS}
    windows: list[tuple[str, float, float]] = []
    reads: list[tuple[float, int]] = []
    calls: list[float] = []
    failures: list[str] = []
    order = random.Random(33)
    try:
        await _turns(driver, sid, 2)  # warm: the server's first turns (imports, the shadow repo's first scan)
        for _ in range(rounds):
            for kind in order.sample(KINDS, len(KINDS)):
                page = None
                if kind != "without":
                    page, read, listed = await Page.open(server, sid, page_diffs, asks=kind == "with")
                    if kind == "with":
                        reads.append((read, listed))
                begin = time.monotonic()
                times[kind] += await _turns(driver, sid, per_block)
                if page is not None:
                    await page.close(per_block)
                    calls += page.calls
                    failures += page.failures
                windows.append((kind, begin, time.monotonic()))
        started = time.perf_counter()  # what the page asked after every turn before (now the CLI's /undo list)
        whole = await driver.call("session.changes", {"sessionId": sid})
        unpaged = (time.perf_counter() - started, len(whole["turns"]))
    finally:
        await driver.close()
    return {"times": times, "windows": windows, "reads": reads, "calls": calls, "failures": failures,
            "unpaged": unpaged}


def measure(quick: bool, turns: int | None = None, page_diffs: bool = False) -> dict[str, Any]:
    """Build a session of ``turns`` turns (1,000; 150 with ``quick``), then measure; the figures."""
    size = turns or (150 if quick else 1000)
    per_block, rounds = (4, 3) if quick else (5, 8)
    with harness.scratch("scale-changes") as scratch:
        project = scratch / "project"
        (project / "src").mkdir(parents=True)
        (project / "README.md").write_text("# a project\n")
        for n in range(50):
            (project / "src" / f"m{n}.py").write_text(f"value = {n}\n")
        data = scratch / "data"
        started = time.perf_counter()
        sid = asyncio.run(build(data, project, size))
        built = time.perf_counter() - started
        measured = 2 + per_block * rounds * len(KINDS)
        script = scratch / "script.json"
        script.write_text(json.dumps({"responses": [r for n in range(measured) for r in _write(size + n)]}))
        with rpc_load.served(scratch, data, f"scripted/{script}") as server:
            with loop_stall.HealthzProbe(server, scratch / "probes.txt") as probe:
                got = asyncio.run(_measure_served(server, sid, per_block, rounds, page_diffs))
            gaps: dict[str, float] = dict.fromkeys(KINDS, 0.0)
            for kind, begin, end in got["windows"]:
                gaps[kind] = max([gaps[kind], *probe.during(begin, end)])
    times = got["times"]
    turn_without, turn_events, turn_with = (harness.median(times[k]) for k in KINDS)
    return {
        "turns_in_session": size,
        "page_asks_diffs": page_diffs,
        "measured_turns": {k: len(v) for k, v in times.items()},
        "page_open_ratio_1000": turn_with / turn_without,
        "events_only_ratio": turn_events / turn_without,
        "turn_ms_without_page": turn_without * 1000,
        "turn_ms_events_only_page": turn_events * 1000,
        "turn_ms_with_page": turn_with * 1000,
        "turn_ms_worst_with_page": max(times["with"]) * 1000,
        "worst_loop_gap_ms": max(gaps.values()) * 1000,
        "worst_loop_gap_ms_with_page": gaps["with"] * 1000,
        "worst_loop_gap_ms_without_page": gaps["without"] * 1000,
        "page_turn_call_ms_median": harness.median(got["calls"]) * 1000 if got["calls"] else float("nan"),
        "page_turn_call_ms_worst": max(got["calls"], default=float("nan")) * 1000,
        "page_open_read_ms": max(r for r, _n in got["reads"]) * 1000,
        "page_open_listed": got["reads"][0][1] if got["reads"] else 0,
        "page_failures": got["failures"][:5],
        "unpaged_call_ms": got["unpaged"][0] * 1000,
        "unpaged_call_turns": got["unpaged"][1],
        "build_s": built,
    }


def figures(result: dict[str, Any]) -> list[Figure]:
    size = result["turns_in_session"]
    return [
        Figure(f"turn with a page open ÷ without ({size}-turn session)", result["page_open_ratio_1000"], "×",
               TARGET_RATIO, at_least=False,
               note=f"median {result['turn_ms_with_page']:.0f} vs {result['turn_ms_without_page']:.0f} ms; "
                    f"worst with the page {result['turn_ms_worst_with_page']:.0f} ms; "
                    f"{result['measured_turns']['with']} turns each"),
        Figure("turn with a page that only receives events ÷ without", result["events_only_ratio"], "×",
               note=f"median {result['turn_ms_events_only_page']:.0f} ms: what any open page costs, "
                    "Changes aside"),
        Figure("worst /healthz latency during the measured turns", result["worst_loop_gap_ms"], "ms", TARGET_GAP_MS,
               at_least=False, note=f"with the page open {result['worst_loop_gap_ms_with_page']:.1f} ms, without "
                                    f"{result['worst_loop_gap_ms_without_page']:.1f} ms"),
        Figure("the page's session.changes {turnId} after a turn (median)"
               + (" with diffs" if result["page_asks_diffs"] else ""), result["page_turn_call_ms_median"], "ms",
               note=f"worst {result['page_turn_call_ms_worst']:.1f} ms"
                    + (f"; WRONG ANSWERS: {result['page_failures']}" if result["page_failures"] else "")),
        Figure("the page's opening read of every turn's changes", result["page_open_read_ms"], "ms",
               note=f"{result['page_open_listed']} turns, pages of {PAGE}, no diffs"),
        Figure("session.changes unpaged: every turn with its diffs", result["unpaged_call_ms"], "ms",
               note=f"{result['unpaged_call_turns']} turns (the page asked this after each turn before: 21-26 s "
                    "at 1,000 turns)"),
        Figure("building the session (real turns, in-process)", result["build_s"], "s"),
    ]


def main() -> int:
    def options(parser: Any) -> None:
        parser.add_argument("--turns", type=int, default=None, help="turns in the session (default 1000)")
        parser.add_argument("--page-diffs", action="store_true", help="the page asks each turn with its diffs")

    args = harness.parse_args(__doc__ or "", options)
    size = args.turns or (150 if args.quick else 1000)
    harness.header(f"scale: the Changes panel on a {size}-turn session", args.quick)
    result = measure(args.quick, args.turns, args.page_diffs)
    code = harness.report("scale_changes", figures(result), args.json)
    if args.json is not None:  # the figures, and measure()'s dict beside them
        written = json.loads(args.json.read_text())
        args.json.write_text(json.dumps(written | {"result": result}, indent=2))
    return code


if __name__ == "__main__":
    sys.exit(main())
