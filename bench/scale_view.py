"""A model request costs what is new (issue 33 §2): host CPU per turn and the event loop's worst gap as a
session's history grows from 100 turns to 10,000 (and 50,000 without --quick).

Each case writes one session's history through the store's own API (``Store.create_session`` with its
messages: ``dataset.turn_messages``, four messages a turn, ~300 bytes a line): ``older`` turns, a
compaction (a ~2,000-character summary keeping nothing), then 100 turns — every size has the same
view (the summary and the last 100 turns) behind more history; at 100 turns nothing is older. The
``…-uncompacted`` cases have no compaction at all: the window's guard (runtime/context_window.py)
keeps the view to half the 128k-token window, so their request is ~8× the others' and costs so,
whatever the history (a figure for the loop's gap and the cold build, no target on CPU).

A ``pidesk serve`` subprocess opens the data dir with the mock OpenAI server (bench/_mock_openai.py,
its own process, policy read_then_answer: a Read of README.md, then a sentence) as its model over
loopback. The turns are real: ``agent.prompt`` over a WebSocket, wait for ``turn.ended``, then
``session.get`` (50 messages) and ``session.context``, as the browser does after each turn. The
first ``WARMUP`` turns (the first builds the view from the transcript, once) are not counted; then
the host process's CPU (utime + stime, /proc) over ``TURNS`` turns, per turn.

The loop's gap: bench/loop_stall.py's probe (its own process, a ``/healthz`` GET every 10 ms on one
kept-alive connection) from the session's first turn to its last turn's end, the worst latency: the
host has not read the session yet, so its view is built meanwhile. (What any host pays once — the
SDK's import, the first connection to the model — is paid before, by one turn of a new session.)

Figures: CPU per turn at each size; ``cpu_per_turn_ratio_10k_vs_100`` (target ≤ 2); the worst probe
latency at the largest size (target ≤ 50 ms); the host's peak RSS.

    .venv/bin/python bench/scale_view.py [--quick] [--json PATH]
"""

from __future__ import annotations

import asyncio
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import dataset  # noqa: E402
import harness  # noqa: E402
import loop_stall  # noqa: E402
import rpc_load  # noqa: E402
from harness import Figure  # noqa: E402

from pidesk.core.modes import Mode, PermissionMode, PlanState, SessionStatus  # noqa: E402
from pidesk.core.records import CompactionBlock, Message, Session  # noqa: E402
from pidesk.ids import iso  # noqa: E402
from pidesk.store import Store  # noqa: E402

RECENT = 100  # turns after the compaction: the view every case shares
WARMUP = 3
TARGET_RATIO = 2.0
TARGET_GAP_MS = 50.0
SUMMARY = "## Goal\nKeep the inventory service's handlers correct.\n## Decisions\n" + (
    "Coerce each handler's input with int() before use; the tests pass strings. " * 25)


@dataclass(frozen=True)
class Case:
    name: str
    turns: int  # of history
    compacted: bool = True


@dataclass
class Row:
    case: Case
    cpu_ms: float  # host CPU per measured turn
    wall_ms: float  # wall time per measured turn
    worst_gap_ms: float
    probes: int
    peak_rss_mib: float
    build_s: float  # writing the history


def cases(quick: bool) -> list[Case]:
    out = [Case("100", 100), Case("10k", 10_000)]
    if quick:
        return [*out, Case("10k-uncompacted", 10_000, compacted=False)]
    return [*out, Case("50k", 50_000), Case("50k-uncompacted", 50_000, compacted=False)]


# ---- the history -------------------------------------------------------------------------------


def write_history(data_dir: Path, project: Path, case: Case) -> str:
    """One session of ``case.turns`` turns (a compaction ``RECENT`` turns before the end), written through
    ``Store.create_session``; returns its id."""
    ids = dataset.Ids(33)
    session_id = ids("s")
    messages: list[Message] = []
    older = case.turns - RECENT if case.compacted else case.turns

    def turns(count: int) -> None:
        for _ in range(count):
            moment = dataset.EPOCH + timedelta(seconds=30 * len(messages))
            messages.extend(dataset.turn_messages(session_id, ids("t"), len(messages) + 1, ids, moment))

    turns(older)
    if case.compacted:
        block = CompactionBlock(summary=SUMMARY, reason="auto", tokens_before=110_000, tokens_after=2_000)
        messages.append(Message(id=ids("m"), session_id=session_id, turn_id=None, seq=len(messages) + 1, role="user",
                                content=[block], created_at=iso(dataset.EPOCH)))
        turns(RECENT)
    now = iso(dataset.EPOCH)
    session = Session(id=session_id, title=f"scale {case.name}", project_path=str(project), root=str(project),
                      mode=Mode.AGENT, permission_mode=PermissionMode.AUTO, status=SessionStatus.IDLE,
                      plan_state=PlanState.INACTIVE, current_turn_id=None, forked_from=None, created_at=now,
                      updated_at=now)
    store = Store(data_dir)
    try:
        store.create_session(session, messages)
    finally:
        store.close()
    return session_id


# ---- the turns -------------------------------------------------------------------------------------


class Driver:
    """Turns over one WebSocket, each as the browser runs it: prompt, wait for its end, then read the
    session back (``session.get``, ``session.context``)."""

    def __init__(self, ws: rpc_load.Ws) -> None:
        self.ws = ws
        self.waiting: dict[str, asyncio.Future[dict[str, Any]]] = {}
        ws.keep_events = False
        ws.listeners.append(self._event)

    def _event(self, _at: float, event: dict[str, Any]) -> None:
        future = self.waiting.pop(event.get("sessionId", ""), None) if event.get("type") == "turn.ended" else None
        if future is not None:
            future.set_result(event)

    async def turn(self, session_id: str, n: int) -> None:
        ended = self.waiting[session_id] = asyncio.get_running_loop().create_future()
        await self.ws.call("agent.prompt", {"sessionId": session_id, "text": f"Look at module {n} again."})
        event = await asyncio.wait_for(ended, 120)
        if event["reason"] != "completed":
            raise RuntimeError(f"turn {n} ended {event['reason']}: {event.get('errorMessage')}")
        await self.ws.call("session.get", {"sessionId": session_id, "limit": 50})
        await self.ws.call("session.context", {"sessionId": session_id})


async def warm_host(server: rpc_load.Server, project: Path) -> None:
    """One turn on a new, empty session: what a host pays once, whatever its history (the SDK's import,
    the first connection to the model), is paid before the probe's window."""
    ws = await rpc_load.Ws.open(server)
    try:
        session = await ws.call("session.create", {"projectPath": str(project), "permissionMode": "auto"})
        await Driver(ws).turn(session["id"], 0)
    finally:
        await ws.close()


async def drive(server: rpc_load.Server, session_id: str, turns: int) -> tuple[float, float]:
    """``WARMUP`` turns of the session (its view built on the first), then ``turns`` measured ones: (host
    CPU seconds, wall seconds) of the measured."""
    ws = await rpc_load.Ws.open(server)
    driver = Driver(ws)
    try:
        for n in range(WARMUP):
            await driver.turn(session_id, n)
        cpu, wall = rpc_load.cpu_seconds_of(server.proc.pid), time.perf_counter()
        for n in range(turns):
            await driver.turn(session_id, WARMUP + n)
        return rpc_load.cpu_seconds_of(server.proc.pid) - cpu, time.perf_counter() - wall
    finally:
        await ws.close()


def run_case(case: Case, turns: int, scratch: Path) -> Row:
    project = scratch / "project"
    project.mkdir()
    (project / "README.md").write_text("# bench project\n\nA small file for the Read tool.\n")
    data_dir = scratch / "data"
    started = time.perf_counter()
    session_id = write_history(data_dir, project, case)
    build_s = time.perf_counter() - started
    with rpc_load.mock_openai(scratch) as (base_url, _mock_pid), \
            rpc_load.served(scratch, data_dir, "openai/mock", {"OPENAI_BASE_URL": base_url,
                                                               "OPENAI_API_KEY": "sk-bench-0000"}) as server:
        asyncio.run(warm_host(server, project))
        with loop_stall.HealthzProbe(server, scratch / "probes.txt") as probe:
            begin = time.monotonic()
            cpu_s, wall_s = asyncio.run(drive(server, session_id, turns))
            end = time.monotonic()
            peak = rpc_load.vm(server.proc.pid, "VmHWM") / 1024
    during = probe.during(begin, end)
    return Row(case, cpu_s / turns * 1000, wall_s / turns * 1000, max(during) * 1000 if during else float("nan"),
               len(during), peak, build_s)


# ---- figures ---------------------------------------------------------------------------------------


def measure(quick: bool, progress: Any = None) -> dict[str, Any]:
    """Run every case; the figures by key (``cpu_per_turn_ratio_10k_vs_100`` among them) and the rows."""
    turns = 30 if quick else 100
    rows: list[Row] = []
    for case in cases(quick):
        with harness.scratch(f"scale-view-{case.name}") as scratch:
            row = run_case(case, turns, scratch)
        rows.append(row)
        if progress is not None:
            progress(row)
    by = {row.case.name: row for row in rows}
    largest = max((r for r in rows if r.case.compacted), key=lambda r: r.case.turns)
    out: dict[str, Any] = {f"cpu_per_turn_ms_{name}": row.cpu_ms for name, row in by.items()}
    out.update({f"worst_loop_gap_ms_{name}": row.worst_gap_ms for name, row in by.items()})
    out.update({f"peak_rss_mib_{name}": row.peak_rss_mib for name, row in by.items()})
    out["cpu_per_turn_ratio_10k_vs_100"] = by["10k"].cpu_ms / by["100"].cpu_ms
    out["worst_loop_gap_ms_largest"] = max(r.worst_gap_ms for r in rows if r.case.turns == largest.case.turns)
    out["largest_turns"] = largest.case.turns
    out["turns_measured"] = turns
    out["rows"] = rows
    return out


def figures(result: dict[str, Any]) -> list[Figure]:
    rows: list[Row] = result["rows"]
    out = [Figure(f"host CPU per turn, {row.case.name} turns of history", row.cpu_ms, "ms",
                  note=f"wall {row.wall_ms:.1f} ms a turn; history written in {row.build_s:.1f} s")
           for row in rows]
    out.append(Figure("cpu_per_turn_ratio_10k_vs_100", result["cpu_per_turn_ratio_10k_vs_100"], "×", TARGET_RATIO,
                      at_least=False))
    out += [Figure(f"worst /healthz gap, {row.case.name} (cold start, then turns)", row.worst_gap_ms, "ms",
                   TARGET_GAP_MS if row.case.turns == result["largest_turns"] else None, at_least=False,
                   note=f"{row.probes} probes; peak RSS {row.peak_rss_mib:.0f} MiB") for row in rows]
    return out


def main() -> int:
    args = harness.parse_args(__doc__ or "")
    harness.header("scale: model view — host CPU per turn and loop gaps as history grows", args.quick)
    print(f"  {'case':<18} {'CPU/turn':>10} {'wall/turn':>10} {'worst gap':>10} {'probes':>7} {'peak RSS':>9}")

    def show(row: Row) -> None:
        print(f"  {row.case.name:<18} {row.cpu_ms:>7.1f} ms {row.wall_ms:>7.1f} ms {row.worst_gap_ms:>7.1f} ms "
              f"{row.probes:>7} {row.peak_rss_mib:>5.0f} MiB", flush=True)

    result = measure(args.quick, show)
    return harness.report("scale_view", figures(result), args.json)


if __name__ == "__main__":
    sys.exit(main())
