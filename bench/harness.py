"""What every benchmark script shares: the command line, figures, timing, scratch dirs.

A benchmark is a script that prints figures, never a test: each figure names its
target (or none, for context), and ``--json PATH`` also writes them for
``run_all.py``. Scratch data lives under ``bench/out/`` (gitignored, on the
repository's own disk — a tmpfs ``/tmp`` would make every fsync free) and is
removed when the script ends; only ``boot.py``'s dataset cache is kept.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
OUT = BENCH_DIR / "out"
sys.path.insert(0, str(BENCH_DIR.parent))  # run as `python bench/x.py` from a checkout


@dataclass(frozen=True)
class Figure:
    """One measured value. ``target`` with ``at_least`` is a bound the value must meet."""

    name: str
    value: float
    unit: str
    target: float | None = None
    at_least: bool = True
    note: str = ""

    @property
    def met(self) -> bool | None:
        if self.target is None:
            return None
        return self.value >= self.target if self.at_least else self.value <= self.target

    def target_text(self) -> str:
        if self.target is None:
            return ""
        return f"{'≥' if self.at_least else '≤'} {num(self.target)} {self.unit}".rstrip()

    def verdict(self) -> str:
        return {None: "", True: "met", False: "MISSED"}[self.met]

    def line(self) -> str:
        target = f"  (target {self.target_text()}: {self.verdict()})" if self.target is not None else ""
        note = f"  — {self.note}" if self.note else ""
        return f"  {self.name:<56} {num(self.value):>12} {self.unit:<10}{target}{note}"


def num(value: float) -> str:
    if value >= 1000:
        return f"{value:,.0f}"
    if value >= 100:
        return f"{value:.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def parse_args(description: str, extra: Callable[[argparse.ArgumentParser], object] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description.strip().splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes: a sanity run of a few seconds")
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the figures to PATH as JSON")
    if extra is not None:
        extra(parser)
    return parser.parse_args()


def header(title: str, quick: bool) -> None:
    print(f"# {title}{'  [--quick]' if quick else ''}")
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"  python {platform.python_version()} on {platform.platform()}, {_cpus()} cpu, load average {load}")


def _cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def report(script: str, figures: list[Figure], json_path: Path | None) -> int:
    """Print the figures; write them as JSON if asked. Exit status 0 — a missed target is a finding."""
    for figure in figures:
        print(figure.line())
    if json_path is not None:
        json_path.write_text(json.dumps({"script": script, "figures": [asdict(f) for f in figures]}, indent=2))
    return 0


@contextmanager
def scratch(prefix: str) -> Iterator[Path]:
    """A temporary directory under bench/out/, removed afterwards whatever happens."""
    OUT.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"{prefix}-", dir=OUT) as name:
        yield Path(name)


def cpu_busy(seconds: float = 2.0) -> float | None:
    """The fraction of all CPUs busy over ``seconds`` (Linux /proc/stat), or None elsewhere."""

    def sample() -> tuple[int, int]:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        return sum(fields), fields[3] + fields[4]  # total, idle + iowait

    try:
        total0, idle0 = sample()
        time.sleep(seconds)
        total1, idle1 = sample()
    except OSError:
        return None
    return 1 - (idle1 - idle0) / max(1, total1 - total0)


def wait_for_quiet(limit: float, busy: float = 0.15) -> str:
    """Wait (at most ``limit`` s) until other work leaves the CPUs ≤ ``busy``; say how it went."""
    start = time.monotonic()
    while True:
        now = cpu_busy()
        if now is None or now <= busy:
            return f"quiet after {time.monotonic() - start:.0f} s" + (f" ({now:.0%} busy)" if now is not None else "")
        if time.monotonic() - start > limit:
            return f"NOT quiet: still {now:.0%} busy after {limit:.0f} s"
        time.sleep(5)


def median(values: list[float]) -> float:
    return statistics.median(values)


def scale_figures(keys: dict[str, Any], targets: dict[str, tuple[float, bool]]) -> list[Figure]:
    """A ``bench/scale_*.py`` module's keys as figures: its named keys with their targets (``(bound,
    at_least)``), then its ``context`` figures; ``sizes`` (what a ``--quick`` run measured) as notes."""
    sizes = keys.get("sizes", {})
    figures = [Figure(key, value, "", *targets.get(key, (None, True)), note=sizes.get(key, ""))
               for key, value in keys.items() if key not in ("context", "sizes")]
    return figures + [Figure(key, value, "") for key, value in keys.get("context", {}).items()]
