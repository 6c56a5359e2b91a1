"""Scale: what checkpoints cost as projects grow in number, size and age (issue 33 §3).

A real in-process ``Host`` with the scripted (instant) model, permission mode auto, so the figures are the
host's own work: the model costs nothing and no one is asked.

* ``calls_per_s_64_vs_8_projects`` — throughput of Bash tool calls with one busy session in each of 64
  projects, divided by the same with 8 (each session runs turns of ``echo`` calls, all at once).
  Target ≥ 0.8.
* ``turn_ms_100k_files_vs_1k`` — the wall time of a one-Write turn in a project of 100,000 files,
  divided by the same in one of 1,000 (after a warm-up turn: the first snapshot is a one-off).
  Target ≤ 2. 100,000 files is over the checkpoints' 50,000-file limit, so that project is not
  checkpointed at all (as for a user's): the context figure ``turn_ms_45000_files_checkpointed_vs_1k``
  is the largest project that is.
* ``shadow_repo_mb_after_1000_turns`` — the size on disk of the shadow repositories after 1,000 turns,
  each changing one file (reported).
* ``loop_gap_ms_worst`` — the longest the host's event loop went without running a 10 ms probe, over
  all of the above (``loop_gap_ms_<part>``: in each).

    .venv/bin/python bench/scale_checkpoints.py [--quick] [--json PATH]

``--quick`` (≤ 2 minutes here): 10k files instead of 100k, 300 turns instead of 1,000, 32 projects
against 8; the keys keep their names and ``sizes`` says what each was measured at.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402
from harness import Figure  # noqa: E402

from pidesk.config import HostConfig  # noqa: E402
from pidesk.core.events import TurnEnded  # noqa: E402
from pidesk.host import Host  # noqa: E402
from pidesk.providers.scripted import ScriptedProvider  # noqa: E402


class LoopProbe:
    """The longest gap between 10 ms ticks of the loop it runs on, beyond the 10 ms itself, while
    turns run (the turns' time: not the bench's own set-up of files and hosts)."""

    def __init__(self) -> None:
        self.worst = 0.0
        self.active = 0  # turns running now
        self.part = ""  # what is being measured (``worst_by_part``)
        self.worst_by_part: dict[str, float] = {}
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> LoopProbe:
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()

    async def _run(self) -> None:
        while True:
            started = time.perf_counter()
            was_on = self.active > 0
            await asyncio.sleep(0.010)
            if was_on and self.active > 0:
                gap = (time.perf_counter() - started - 0.010) * 1000
                self.worst = max(self.worst, gap)
                self.worst_by_part[self.part] = max(self.worst_by_part.get(self.part, 0.0), gap)


PROBE = LoopProbe()


def make_files(root: Path, count: int) -> None:
    root.mkdir(parents=True)
    per_dir = 500
    body = "a line of a source file, long enough to look like code\n" * 4
    for n in range(count):
        directory = root / f"pkg{n // per_dir}"
        if n % per_dir == 0:
            directory.mkdir()
        (directory / f"mod{n}.py").write_text(body)


class Turns:
    """Turns on one host, each timed to its end. The ends are heard by one listener on the host's bus:
    turns run side by side each sifting every event through a subscription of its own was the bench's
    own work on the host's loop, growing with the square of their number (a third of its time at 64)."""

    def __init__(self, host: Host, provider: ScriptedProvider) -> None:
        self.host, self.provider = host, provider
        self._ends: dict[str, asyncio.Future[None]] = {}
        host.parts.bus.listeners.append(self._heard)

    async def run(self, session_id: str, *responses: dict[str, Any], timeout: float = 300.0) -> float:
        """One turn's wall time (ms)."""
        self.provider.enqueue(session_id, *responses, {"text": "ok"})
        PROBE.active += 1
        try:
            started = time.perf_counter()
            turn = await self.host.call("agent.prompt", {"sessionId": session_id, "text": "go"})
            await asyncio.wait_for(self._end(turn["turnId"]), timeout)
            return (time.perf_counter() - started) * 1000
        finally:
            PROBE.active -= 1

    def _end(self, turn_id: str) -> asyncio.Future[None]:
        return self._ends.setdefault(turn_id, asyncio.get_running_loop().create_future())

    def _heard(self, _seq: int, event: object) -> None:
        if isinstance(event, TurnEnded) and not (end := self._end(event.turn_id)).done():
            end.set_result(None)


def write(path: str, content: str) -> dict[str, Any]:
    return {"toolCalls": [{"name": "Write", "args": {"path": path, "content": content}}]}


async def turn_ms(scratch: Path, files: int, repeats: int) -> float:
    root = scratch / f"files-{files}"
    await asyncio.to_thread(make_files, root, files)
    provider = ScriptedProvider()
    host = Host.open(HostConfig(data_dir=scratch / f"data-files-{files}"), provider)
    turns = Turns(host, provider)
    try:
        session = await host.call("session.create", {"projectPath": str(root), "permissionMode": "auto"})
        await turns.run(session["id"], write("warm.txt", "warm\n"))  # the first snapshot
        times = [await turns.run(session["id"], write("notes.txt", f"turn {n}\n")) for n in range(repeats)]
        return harness.median(times)
    finally:
        await host.close()


async def calls_per_s(scratch: Path, projects: int, calls: int) -> float:
    provider = ScriptedProvider()
    host = Host.open(HostConfig(data_dir=scratch / f"data-projects-{projects}"), provider)
    turns = Turns(host, provider)
    try:
        sessions = []
        for n in range(projects):
            root = scratch / f"projects-{projects}" / f"p{n}"
            await asyncio.to_thread(make_files, root, 20)
            sessions.append((await host.call("session.create", {"projectPath": str(root), "permissionMode": "auto"}))["id"])
        echo = [{"toolCalls": [{"name": "Bash", "args": {"command": f"echo {n}"}}]} for n in range(calls)]
        await asyncio.gather(*(turns.run(s, echo[0]) for s in sessions))  # warm
        started = time.perf_counter()
        await asyncio.gather(*(turns.run(s, *echo, timeout=600) for s in sessions))
        return projects * calls / (time.perf_counter() - started)
    finally:
        await host.close()


async def shadow_mb(scratch: Path, turns: int) -> float:
    root = scratch / "aging"
    await asyncio.to_thread(make_files, root, 200)
    provider = ScriptedProvider()
    data = scratch / "data-aging"
    host = Host.open(HostConfig(data_dir=data), provider)
    aging = Turns(host, provider)
    try:
        session = await host.call("session.create", {"projectPath": str(root), "permissionMode": "auto"})
        for n in range(turns):
            await aging.run(session["id"], write(f"pkg0/mod{n % 200}.py", f"version {n}\n" * 20))
    finally:
        await host.close()
    shadow = data / "checkpoints"
    return sum(p.stat().st_size for p in shadow.rglob("*") if p.is_file()) / 2**20 if shadow.exists() else 0.0


async def measure(quick: bool) -> dict[str, float]:
    big, small = (10_000 if quick else 100_000), 1_000
    many, few = (32 if quick else 64), 8
    turns = 300 if quick else 1_000
    with harness.scratch("scale-checkpoints") as scratch:
        async with PROBE as probe:
            probe.part = f"turns_{small}_files"
            small_ms = await turn_ms(scratch, small, 5)
            probe.part = f"turns_{big}_files"
            big_ms = await turn_ms(scratch, big, 5)
            # 100k files is over the checkpoints' 50,000-file limit (MAX_FILES): that project is not
            # checkpointed, so its turn is cheap. The largest project that is, for the curve:
            largest = 10_000 if quick else 45_000
            probe.part = f"turns_{largest}_files"
            largest_ms = big_ms if largest == big else await turn_ms(scratch, largest, 5)
            probe.part = f"calls_{few}_projects"
            few_rate = await calls_per_s(scratch, few, 20)
            probe.part = f"calls_{many}_projects"
            many_rate = await calls_per_s(scratch, many, 20)
            probe.part = f"aging_{turns}_turns"
            mb = await shadow_mb(scratch, turns)
    return {
        "turn_ms_100k_files_vs_1k": big_ms / small_ms,
        "calls_per_s_64_vs_8_projects": many_rate / few_rate,
        "shadow_repo_mb_after_1000_turns": mb,
        "loop_gap_ms_worst": probe.worst,
        **{f"loop_gap_ms_{part}": gap for part, gap in probe.worst_by_part.items()},
        "context": {f"turn_ms_{big}_files": big_ms, f"turn_ms_{small}_files": small_ms,
                    f"turn_ms_{largest}_files_checkpointed_vs_1k": largest_ms / small_ms,
                    f"calls_per_s_{few}_projects": few_rate, f"calls_per_s_{many}_projects": many_rate},
        "sizes": {"turn_ms_100k_files_vs_1k": f"{big:,} vs {small:,} files",
                  "calls_per_s_64_vs_8_projects": f"{many} vs {few} projects",
                  "shadow_repo_mb_after_1000_turns": f"{turns:,} turns"},
    }


TARGETS = {"turn_ms_100k_files_vs_1k": (2.0, False), "calls_per_s_64_vs_8_projects": (0.8, True),
           "loop_gap_ms_worst": (50.0, False)}


async def main() -> int:
    args = harness.parse_args(__doc__)
    harness.header("scale: checkpoints as projects grow in number, size and age", args.quick)
    keys = await measure(args.quick)
    return harness.report("scale_checkpoints", harness.scale_figures(keys, TARGETS), args.json)


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
