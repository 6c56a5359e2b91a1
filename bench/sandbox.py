"""What the Bash sandbox adds to a call (issue 28): sandbox on against off, in the same rounds.

Two Bash tools over the same root, as a host builds them: one confined by bubblewrap
(``tools/sandbox.py``, the policy a host gives a project session: the root writable, the
data dir and config file hidden, no network), one unconfined (``sandbox = "off"``). Each
round runs a turn's worth of calls on each, in a fresh random order, with a pause between
calls standing in for the model's answer (the spare shell for the next call starts in it,
as in a real turn); each turn's first call starts the sandbox (and no spare is ready yet). Per
call: the wall time of ``await bash(args)`` (``echo``), and the CPU every core spent meanwhile
(the machine's, from /proc/stat: a sandbox's shells are not this process's children, and its
start is work even where no call waits on it).

Figures: the median and p95 per call on each, and the median of the per-round paired
differences (on − off), for later calls and for a turn's first call.
Target: ≤ 5 ms added per call (median).

    .venv/bin/python bench/sandbox.py [--quick] [--rounds 30] [--calls 20] [--think-ms 50]
"""

from __future__ import annotations

import asyncio
import os
import random
import statistics
import time
from pathlib import Path

import harness
from harness import Figure

from pidesk.config import command_environment
from pidesk.tools import make_bash_tool
from pidesk.tools.bash import Bash
from pidesk.tools.sandbox import Bubblewrap, SandboxPolicy, probe
from pidesk.tools.sandbox_server import Sandbox

COMMAND = {"command": "echo sandboxed-or-not"}


def busy_cpu_s() -> float:
    """CPU seconds every CPU has spent busy so far (/proc/stat: processes and the kernel's own work alike;
    a sandboxed shell is not this process's child, so its rusage would not show it)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def p95(values: list[float]) -> float:
    return sorted(values)[min(len(values) - 1, int(len(values) * 0.95))]


class Side:
    """One way of running Bash (sandbox on or off): how to make its tool, and what it measured."""

    def __init__(self, name: str, make: "type[Bash] | object") -> None:
        self.name = name
        self.make = make
        self.later: list[float] = []  # ms per call, the spare shell in use
        self.first: list[float] = []  # ms per call, a turn's first (cold) call
        self.later_rounds: list[float] = []  # each round's median, ms
        self.first_rounds: list[float] = []
        self.cpu: list[float] = []  # ms of CPU of the process tree per later call, per round


async def turn(side: Side, calls: int, think_s: float) -> None:
    bash: Bash = side.make()  # type: ignore[operator]
    times = []
    cpu_before = None
    try:
        for i in range(calls):
            await asyncio.sleep(think_s)  # the model answering; the next call's spare starts meanwhile
            if i == 1:
                cpu_before = busy_cpu_s()
            start = time.perf_counter()
            result = await bash(dict(COMMAND))
            elapsed = (time.perf_counter() - start) * 1000
            assert result.ok and "sandboxed-or-not" in result.output, result.output
            (side.first if i == 0 else times).append(elapsed)
        await asyncio.sleep(think_s)
    finally:
        await bash.aclose()
    assert cpu_before is not None
    side.cpu.append((busy_cpu_s() - cpu_before) * 1000 / (calls - 1))
    side.later += times
    side.later_rounds.append(statistics.median(times))
    side.first_rounds.append(side.first[-1])


async def measure(root: Path, data_dir: Path, config_file: Path, rounds: int, calls: int, think_s: float
                  ) -> tuple[Side, Side]:
    env = command_environment(os.environ)
    policy = SandboxPolicy(root=root, hidden=(data_dir, config_file))
    on = Side("sandbox on", lambda: make_bash_tool(root, env=env, sandbox=Sandbox(Bubblewrap(policy, env.get("PATH")))))
    off = Side("sandbox off", lambda: make_bash_tool(root, env=env))
    rng = random.Random(28)
    for _ in range(2):  # warm-up: page cache, bwrap's --help probe
        for side in (on, off):
            await turn(side, 3, think_s)
    for side in (on, off):
        side.later.clear(), side.first.clear(), side.later_rounds.clear(), side.first_rounds.clear(), side.cpu.clear()
    for _ in range(rounds):
        order = [on, off]
        rng.shuffle(order)
        for side in order:
            await turn(side, calls, think_s)
    return on, off


def main() -> int:
    args = harness.parse_args(__doc__ or "", lambda p: (
        p.add_argument("--rounds", type=int, default=30), p.add_argument("--calls", type=int, default=20),
        p.add_argument("--think-ms", type=float, default=50.0)))
    rounds, calls = (4, 6) if args.quick else (args.rounds, args.calls)
    harness.header("sandbox", args.quick)
    status = probe(True, False)
    if not status.available:
        print(f"  the sandbox cannot run here: {status.detail}")
        return 1
    print(f"  {status.detail}; {rounds} rounds × ({calls} calls a turn, {args.think_ms:g} ms between) per side, "
          f"sides in random order; {harness.wait_for_quiet(120)}")
    with harness.scratch("sandbox") as scratch:
        root, data_dir, config_file = scratch / "project", scratch / "data", scratch / "config.toml"
        root.mkdir()
        data_dir.mkdir()
        config_file.write_text("")
        on, off = asyncio.run(measure(root, data_dir, config_file, rounds, calls, args.think_ms / 1000))
    later_diff = statistics.median(a - b for a, b in zip(on.later_rounds, off.later_rounds, strict=True))
    first_diff = statistics.median(a - b for a, b in zip(on.first_rounds, off.first_rounds, strict=True))
    slower = sum(a > b for a, b in zip(on.later_rounds, off.later_rounds, strict=True))
    figures = [
        Figure("added per call, median of paired rounds", later_diff, "ms", 5.0, at_least=False,
               note=f"on slower in {slower}/{rounds} rounds"),
        Figure("  a call, sandbox on: median", statistics.median(on.later), "ms"),
        Figure("  a call, sandbox on: p95", p95(on.later), "ms"),
        Figure("  a call, sandbox off: median", statistics.median(off.later), "ms"),
        Figure("  a call, sandbox off: p95", p95(off.later), "ms"),
        Figure("added to a turn's first call (no spare yet), median", first_diff, "ms"),
        Figure("  first call, sandbox on: median", statistics.median(on.first), "ms"),
        Figure("  first call, sandbox on: p95", p95(on.first), "ms"),
        Figure("  first call, sandbox off: median", statistics.median(off.first), "ms"),
        Figure("CPU (all cores) per call, sandbox on", statistics.median(on.cpu), "ms"),
        Figure("CPU (all cores) per call, sandbox off", statistics.median(off.cpu), "ms"),
    ]
    return harness.report("sandbox", figures, args.json)


if __name__ == "__main__":
    raise SystemExit(main())
