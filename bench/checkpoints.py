"""Checkpoints (issue 17): what recording the workspace costs.

* The shadow repository on a 10k-file project (100 directories of 100 files of
  ~250 bytes, a ``.gitignore``): the first snapshot (goal ≤ 1 s), an incremental
  one after one file changed (goal ≤ 20 ms), and one after nothing changed — the
  median of the repeats, each the whole ``ShadowRepo.snapshot`` (its git
  processes included). With the root's inotify watch (the default on Linux),
  and without one: a Write/Edit's named file, and the full scan a Bash call and
  each turn's start make.
* The effect on a turn's per-tool figure: a real ``Host`` with the scripted
  (instant) model runs one turn of N Bash ``echo`` calls, with checkpoints on and
  off (the same host code; off = the file limit set below the project's size),
  and the per-call wall time of each is compared (goal: within +1 ms). The
  after-call checkpoint runs behind the turn, so the figure is what it costs the
  turn, not its own duration.

    .venv/bin/python bench/checkpoints.py [--quick] [--repeats 15]
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Awaitable
from pathlib import Path

import harness
from harness import Figure

from pidesk.config import HostConfig
from pidesk.core.events import TurnEnded
from pidesk.host import Host, checkpoints
from pidesk.providers.scripted import ScriptedProvider
from pidesk.store.checkpoints import ShadowRepo


def make_project(root: Path, dirs: int, per_dir: int) -> None:
    root.mkdir(parents=True)
    (root / ".gitignore").write_text("*.log\nbuild/\n")
    body = "".join(f"line {n} of a source file, long enough to look like code\n" for n in range(4))
    for d in range(dirs):
        sub = root / f"pkg{d}" / "src"
        sub.mkdir(parents=True)
        for f in range(per_dir):
            (sub / f"mod{f}.py").write_text(body + f"# {d}/{f}\n")


async def shadow_figures(scratch: Path, files: int, repeats: int) -> list[Figure]:
    root = scratch / "project"
    make_project(root, files // 100, 100)
    watched = ShadowRepo(scratch / "data", root)
    unwatched = ShadowRepo(scratch / "data-unwatched", root)  # as on a system without inotify
    unwatched.watch.available = False
    started = time.perf_counter()
    await watched.snapshot()
    first = (time.perf_counter() - started) * 1000
    await unwatched.snapshot()
    await asyncio.sleep(1.1)  # past git's racy-clean second: as a real second tool call would be
    timings: dict[str, list[float]] = {}

    async def timed(name: str, snapshot: Awaitable[str]) -> None:
        started = time.perf_counter()
        await snapshot
        timings.setdefault(name, []).append((time.perf_counter() - started) * 1000)

    edited = "pkg7/src/mod3.py"
    for n in range(repeats):
        (root / edited).write_text(f"edited {n}\n")
        await timed("watched", watched.snapshot())
        await timed("unchanged", watched.snapshot())
        await timed("named", unwatched.snapshot([edited]))
        (root / edited).write_text(f"edited again {n}\n")
        await timed("full", unwatched.snapshot())
        await timed("full-unchanged", unwatched.snapshot())
    watched.close()
    median = {name: statistics.median(values) for name, values in timings.items()}
    return [
        Figure(f"first checkpoint, {files} files", first, "ms", 1000, at_least=False),
        Figure(f"checkpoint after one edit, the watch names it, {files} files (median)", median["watched"], "ms",
               20, at_least=False),
        Figure(f"checkpoint with nothing changed, watched, {files} files (median)", median["unchanged"], "ms",
               note="no git process"),
        Figure(f"no watch: after a Write/Edit (its file named), {files} files (median)", median["named"], "ms",
               20, at_least=False),
        Figure(f"no watch: full scan after one edit (a Bash call; each turn's start), {files} files (median)",
               median["full"], "ms"),
        Figure(f"no watch: full scan, nothing changed, {files} files (median)", median["full-unchanged"], "ms",
               note="one git process"),
    ]


async def turn_per_call(scratch: Path, calls: int, on: bool) -> float:
    root = scratch / f"turn-{'on' if on else 'off'}"
    make_project(root, 2, 50)
    provider = ScriptedProvider()
    host = Host.open(HostConfig(data_dir=scratch / f"data-{'on' if on else 'off'}"), provider)
    try:
        if not on:
            checkpoints.of(host.parts).max_files = 1
        session = await host.call("session.create", {"projectPath": str(root), "permissionMode": "auto"})
        sub = host.subscribe()
        warm = [{"toolCalls": [{"name": "Bash", "args": {"command": "echo warm"}}]}]
        provider.enqueue(session["id"], *warm, {"text": "ok"})
        turn = await host.call("agent.prompt", {"sessionId": session["id"], "text": "warm up"})
        await sub.wait_for(lambda e: isinstance(e, TurnEnded) and e.turn_id == turn["turnId"], 60)
        provider.enqueue(session["id"], *[{"toolCalls": [{"name": "Bash", "args": {"command": f"echo {n}"}}]}
                                          for n in range(calls)], {"text": "done"})
        started = time.perf_counter()
        turn = await host.call("agent.prompt", {"sessionId": session["id"], "text": "go"})
        await sub.wait_for(lambda e: isinstance(e, TurnEnded) and e.turn_id == turn["turnId"], 120)
        return (time.perf_counter() - started) * 1000 / calls
    finally:
        await host.close()


async def main() -> int:
    args = harness.parse_args(__doc__, lambda p: p.add_argument("--repeats", type=int, default=15))
    harness.header("checkpoints — the shadow repository's cost, and its effect on a turn's per-tool time", args.quick)
    files = 2000 if args.quick else 10_000
    repeats = 5 if args.quick else args.repeats
    calls = 10 if args.quick else 40
    with harness.scratch("checkpoints") as scratch:
        figures = await shadow_figures(scratch, files, repeats)
        offs: list[float] = []
        ons: list[float] = []
        for run in range(1 if args.quick else 3):  # alternated, so drift of the machine hits both
            offs.append(await turn_per_call(scratch / f"r{run}", calls, on=False))
            ons.append(await turn_per_call(scratch / f"r{run}", calls, on=True))
    off, on = statistics.median(offs), statistics.median(ons)
    figures += [
        Figure(f"turn per Bash call, checkpoints off (median of runs, N={calls})", off, "ms"),
        Figure(f"turn per Bash call, checkpoints on (median of runs, N={calls})", on, "ms"),
        Figure("checkpoints' effect on the per-tool figure", on - off, "ms", 1, at_least=False),
    ]
    return harness.report("checkpoints", figures, args.json)


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
