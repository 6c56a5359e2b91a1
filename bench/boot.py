"""Boot to ready: ``Host.open`` over a big data dir, and over one full of interrupted work.

1. 10k sessions holding 1M indexed messages (``--quick``: 1k / 100k), consistent
   as a clean shutdown leaves them: the BootReport of every run must be empty.
   Target: median ``Host.open`` ≤ 1 s.
2. Recovery: 1k sessions whose running turn waits on a pending plan approval and
   1k more with a running turn (half of them waiting on a permission request),
   each started from a queue entry, and for half of those the crash left the entry
   queued after its prompt line landed (recovery must find the line and spend the
   entry). Every run boots a fresh copy; afterwards nothing may be pending or
   running, and no entry whose prompt landed may be left queued.
   Target: median ``Host.open`` ≤ 1 s.

Datasets are built in bulk by ``dataset.build`` and cached under bench/out/cache/;
the first full run spends a minute or so building, later runs reuse the cache.
The page cache is warm (the build or the previous run just read the files).

    .venv/bin/python bench/boot.py [--quick] [--runs N]
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
import time
from pathlib import Path

import dataset
import harness
from harness import Figure

from pidesk.config import HostConfig
from pidesk.core.modes import Mode, SessionStatus
from pidesk.host import Host
from pidesk.providers.scripted import ScriptedProvider
from pidesk.store import BootReport

APPROVALS = 1000
RUNNING = 1000
RECOVERY_MESSAGES = 8


def open_host(data_dir: Path) -> tuple[Host, float]:
    start = time.perf_counter()
    host = Host.open(HostConfig(data_dir=data_dir), ScriptedProvider())
    return host, time.perf_counter() - start


def close_host(host: Host) -> None:
    asyncio.run(host.close())


def big_dataset(sessions: int, messages: int) -> Path:
    def make(entry: Path) -> None:
        started = time.perf_counter()
        print(f"  building {sessions} sessions / {messages} messages into {entry} (cached for later runs)")
        dataset.build(entry / "data", sessions, messages // sessions, progress=_progress)
        dataset.verify(entry / "data")
        if sys.stdout.isatty():
            print()  # end the progress line
        print(f"  built in {time.perf_counter() - started:.0f} s, {dataset.dir_size(entry) / 2**20:.0f} MiB")

    return dataset.cached("boot", {"sessions": sessions, "messages": messages}, make) / "data"


def recovery_dataset() -> Path:
    def plan(index: int) -> dataset.SessionPlan:
        if index < APPROVALS:
            return dataset.SessionPlan(mode=Mode.PLAN, status=SessionStatus.RUNNING, running_turn=True,
                                       pending_approval=True)
        waiting = index % 2 == 0
        return dataset.SessionPlan(
            status=SessionStatus.WAITING_PERMISSION if waiting else SessionStatus.RUNNING, running_turn=True,
            pending_permission=waiting, from_queue=True, entry_left=index % 4 < 2,
        )

    def make(entry: Path) -> None:
        project = entry / "project"
        project.mkdir()
        dataset.build(entry / "data", APPROVALS + RUNNING, RECOVERY_MESSAGES, seed=2, project=project, plan=plan)

    return dataset.cached("recovery", {"approvals": APPROVALS, "running": RUNNING, "from_queue": True,
                                       "messages": RECOVERY_MESSAGES}, make) / "data"


def _progress(text: str) -> None:
    if sys.stdout.isatty():
        print(f"\r  {text}", end="", flush=True)


def bench_boot(data_dir: Path, runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        host, elapsed = open_host(data_dir)
        try:
            assert host.recovery is not None
            if host.recovery.boot != BootReport() or any(host.recovery.interrupted.values()):
                raise SystemExit(f"boot repaired something in {data_dir}: {host.recovery}; delete the cache entry")
        finally:
            close_host(host)
        times.append(elapsed)
    return times


def bench_recovery(base: Path, runs: int) -> tuple[list[float], dict[str, int]]:
    times, counts = [], {}
    for _ in range(runs):
        with harness.scratch("recovery") as tmp:
            data_dir = tmp / "data"
            shutil.copytree(base, data_dir)
            host, elapsed = open_host(data_dir)
            try:
                assert host.recovery is not None
                counts = host.recovery.interrupted
                _check_nothing_left(host)
            finally:
                close_host(host)
        times.append(elapsed)
    return times, counts


def _check_nothing_left(host: Host) -> None:
    with host.store.db.read() as db:
        left = db.execute(
            "SELECT (SELECT count(*) FROM plan_approvals WHERE status = 'pending'),"
            " (SELECT count(*) FROM permission_requests WHERE status = 'pending'),"
            " (SELECT count(*) FROM turns WHERE state = 'running'),"
            " (SELECT count(*) FROM sessions WHERE status != 'idle' OR current_turn_id IS NOT NULL),"
            " (SELECT count(*) FROM queue q JOIN turns t ON t.queue_entry = q.id)"
        ).fetchone()
    if any(left):
        raise SystemExit(f"recovery left work behind: approvals, permissions, turns, sessions, spent entries = {left}")


def process_boot(data_dir: Path) -> float:
    """Wall time of a fresh interpreter that imports pidesk and opens the host: what a user waits for."""
    code = (
        "import sys, asyncio; sys.path.insert(0, %r)\n"
        "from pathlib import Path\n"
        "from pidesk.config import HostConfig\n"
        "from pidesk.host import Host\n"
        "from pidesk.providers.scripted import ScriptedProvider\n"
        "host = Host.open(HostConfig(data_dir=Path(%r)), ScriptedProvider())\n"
        "asyncio.run(host.close())\n"
    ) % (str(harness.BENCH_DIR.parent), str(data_dir))
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True)
    return time.perf_counter() - start


def main() -> int:
    args = harness.parse_args(
        __doc__ or "", lambda p: p.add_argument("--runs", type=int, default=0, help="Host.open runs per dataset")
    )
    sessions, messages = (1_000, 100_000) if args.quick else (10_000, 1_000_000)
    runs = args.runs or (3 if args.quick else 7)
    harness.header("boot", args.quick)
    big = big_dataset(sessions, messages)
    print(f"  dataset {big.parent.name}: {sessions} sessions, {messages} messages, "
          f"{dataset.dir_size(big) / 2**20:.0f} MiB; {runs} runs each")
    boot = bench_boot(big, runs)
    process = [process_boot(big) for _ in range(3)]
    recovery, counts = bench_recovery(recovery_dataset(), runs)
    expected = {"approvals": APPROVALS, "executions": 0, "turns": APPROVALS + RUNNING, "permissions": RUNNING // 2}
    if counts != expected:
        raise SystemExit(f"recovery interrupted {counts}, expected {expected}")
    figures = [
        Figure(f"Host.open, {sessions // 1000}k sessions / {messages // 1000}k msgs (median)",
               harness.median(boot) * 1000, "ms", 1000, at_least=False,
               note=f"min {min(boot) * 1000:.0f}, max {max(boot) * 1000:.0f}; BootReport empty"),
        Figure("  python start + imports + Host.open (median of 3)", harness.median(process) * 1000, "ms",
               note="context: a fresh process"),
        Figure(f"Host.open recovering {APPROVALS} approvals + {APPROVALS + RUNNING} turns (median)",
               harness.median(recovery) * 1000, "ms", 1000, at_least=False,
               note=f"min {min(recovery) * 1000:.0f}, max {max(recovery) * 1000:.0f}; "
                    f"interrupted {counts}; nothing left pending or running"),
    ]
    return harness.report("boot", figures, args.json)


if __name__ == "__main__":
    raise SystemExit(main())
