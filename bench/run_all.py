"""Run every benchmark, each in its own interpreter, then print one summary table.

A fresh process per script keeps one benchmark's threads, caches and memory out
of the next one's figures. Output of each script streams through as it runs.
Exit status is 1 if a script failed to run; a missed target is a finding, not a
failure, and shows as MISSED in the table.

    .venv/bin/python bench/run_all.py [--quick] [--only boot,page] [--wait-idle 600]
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys

import harness
from harness import Figure

SCRIPTS = ("durable_append", "boot", "page", "policy")


def main() -> int:
    def options(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--only", default="", help="comma-separated script names")
        parser.add_argument("--wait-idle", type=float, default=0, metavar="S",
                            help="before each script, wait up to S seconds for the CPUs to be ≤15%% busy")

    args = harness.parse_args(__doc__ or "", options)
    chosen = [s for s in SCRIPTS if not args.only or s in args.only.split(",")]
    rows: list[tuple[str, Figure]] = []
    failed: list[str] = []
    with harness.scratch("run_all") as tmp:
        for script in chosen:
            out = tmp / f"{script}.json"
            command = [sys.executable, str(harness.BENCH_DIR / f"{script}.py"), "--json", str(out)]
            if args.quick:
                command.append("--quick")
            print(f"\n$ {' '.join(command[1:])}", flush=True)
            if args.wait_idle:
                print(f"  {harness.wait_for_quiet(args.wait_idle)}", flush=True)
            if subprocess.run(command).returncode != 0 or not out.exists():
                failed.append(script)
                continue
            for raw in json.loads(out.read_text())["figures"]:
                rows.append((script, Figure(**raw)))
    stamp = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    print(f"\n# summary{'  [--quick]' if args.quick else ''} — {stamp}")
    print(f"  {'script':<15} {'figure':<58} {'value':>14}  {'target':<22} verdict")
    for script, figure in rows:
        value = f"{harness.num(figure.value)} {figure.unit}"
        print(f"  {script:<15} {figure.name:<58} {value:>14}  {figure.target_text():<22} {figure.verdict()}")
    if failed:
        print(f"\n  failed to run: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
