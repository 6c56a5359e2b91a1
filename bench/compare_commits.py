"""The peer benchmark across commits: is ``pidesk run``'s tool loop slower than at BASE?

Issue 16 asks that ``bench/tool_loop.py`` be "not slower than today". This VM's
speed drifts by tens of per cent between minutes, so two separate runs of
``tool_loop.py`` cannot answer that; this script runs each commit's ``pidesk run``
(a git worktree of it, bytecode compiled — this machine sets
PYTHONDONTWRITEBYTECODE — put first on ``PYTHONPATH``) against the same mock, in
rounds of one run per commit in a fresh random order, so every commit sees the
same minutes. Each commit keeps its own store and project across its runs, as
``tool_loop.py`` does (a warm-up run creates them).

Per commit: the median over runs of each run's per-call gap (an answer's last byte
to the next request, ``tool_loop.py``'s figure), the 10th and 25th percentiles of
all its calls (noise only adds time, so low percentiles show the intrinsic cost
best), and the first model request. Against the first commit, the paired
differences per round: their median, and in how many rounds the commit was slower.

    .venv/bin/python bench/compare_commits.py [REV ...] [--rounds 30] [--calls 20] [--quick]

REVs default to ``1d69ef2`` (the day issue 16 was filed) and ``HEAD``; the working
tree is ``.``.
"""

from __future__ import annotations

import os
import random
import statistics
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import harness
import tool_loop

REPO = harness.BENCH_DIR.parent
DEFAULT_REVS = ["1d69ef2", "HEAD"]


@dataclass
class Tree:
    rev: str
    path: Path  # what goes on PYTHONPATH
    gaps: list[float] = field(default_factory=list)  # each run's median gap, ms
    calls: list[float] = field(default_factory=list)  # every call's gap, ms
    first: list[float] = field(default_factory=list)  # each run's first request, ms


def checkout(rev: str, into: Path) -> Path:
    """A compiled worktree of ``rev`` (the working tree itself for ``.``)."""
    if rev == ".":
        path = REPO
    else:
        path = into / rev.replace("/", "_")
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "-q", str(path), rev], check=True)
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(path / "pidesk")], check=True)
    return path


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))]


def main() -> int:
    args = harness.parse_args(__doc__, lambda p: (
        p.add_argument("revs", nargs="*", default=DEFAULT_REVS, help="commits to compare, the first the baseline"),
        p.add_argument("--rounds", type=int, default=30),
        p.add_argument("--calls", type=int, default=20),
    ))
    rounds, calls = (3, 5) if args.quick else (args.rounds, args.calls)
    harness.header(f"tool loop across commits: {', '.join(args.revs)}; {rounds} rounds of {calls} calls", args.quick)
    with harness.scratch("compare") as scratch:
        trees = [Tree(rev, checkout(rev, scratch / "worktrees")) for rev in args.revs]
        try:
            for tree in trees:  # a store and a project each, made by a warm-up run (not counted)
                os.environ["PYTHONPATH"] = str(tree.path)
                home = scratch / tree.path.name
                (home / "project").mkdir(parents=True)
                (home / "scratch").mkdir()
                tool_loop.run_once(1, home / "project", home / "data", home / "scratch")
            for _ in range(rounds):
                for tree in random.sample(trees, len(trees)):
                    os.environ["PYTHONPATH"] = str(tree.path)
                    home = scratch / tree.path.name
                    run = tool_loop.run_once(calls, home / "project", home / "data", home / "scratch")
                    if run.exit_code != 0:
                        raise SystemExit(f"{tree.rev}: pidesk run exited {run.exit_code}")
                    tree.gaps.append(statistics.median(run.gaps) * 1000)
                    tree.calls.extend(gap * 1000 for gap in run.gaps)
                    tree.first.append(run.first_request * 1000)
        finally:
            for tree in trees:
                if tree.path != REPO:
                    subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree.path)],
                                   check=False)
    base = trees[0]
    print(f"  {'commit':<10} {'per call':>9} {'p10':>6} {'p25':>6} {'first request':>14}   paired against {base.rev}")
    for tree in trees:
        line = (f"  {tree.rev:<10} {statistics.median(tree.gaps):>6.2f} ms {percentile(tree.calls, 0.1):>6.2f}"
                f" {percentile(tree.calls, 0.25):>6.2f} {statistics.median(tree.first):>11.0f} ms")
        if tree is not base:
            gap = [a - b for a, b in zip(tree.gaps, base.gaps)]
            first = [a - b for a, b in zip(tree.first, base.first)]
            line += (f"   per call {statistics.median(gap):+.2f} ms (slower in {sum(d > 0 for d in gap)}/{rounds}),"
                     f" first request {statistics.median(first):+.0f} ms (slower in {sum(d > 0 for d in first)}/{rounds})")
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
