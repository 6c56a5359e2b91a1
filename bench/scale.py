"""Scale: does a turn cost the same at turn 10,000 as at turn 10? (issue 33)

Runs the scale benchmarks, each a module of its own with ``measure(quick) -> dict``, and puts their
keys in one object:

| key | module | what | target |
| --- | --- | --- | --- |
| ``page_open_ratio_1000`` | scale_changes | turn wall time with a web page open ÷ without, on a 1,000-turn session | ≤ 1.1 |
| ``cpu_per_turn_ratio_10k_vs_100`` | scale_view | host CPU per turn at 10k turns of history ÷ at 100 | ≤ 2 |
| ``session_list_ms_10k`` | scale_lists | ``session.list``'s first page at 10,000 sessions | ≤ 10 ms |
| ``calls_per_s_64_vs_8_projects`` | scale_checkpoints | tool-call throughput, 64 busy projects ÷ 8 | ≥ 0.8 |
| ``turn_ms_100k_files_vs_1k`` | scale_checkpoints | a turn's wall time in a 100k-file project ÷ a 1k-file one | ≤ 2 |
| ``shadow_repo_mb_after_1000_turns`` | scale_checkpoints | the shadow repositories' size after 1,000 changing turns, with retention | reported |
| ``loop_gap_ms_worst`` | all | the longest the host's loop went without its 10 ms probe, over every module | ≤ 50 ms |

``--quick`` (≤ 5 minutes here) measures at smaller sizes; every key keeps its name, and ``sizes`` says
what each was measured at. ``--json`` prints the one object on stdout (the figures go to stderr).
Full-size runs are recorded in docs/benchmarks.md, "Scale".

    .venv/bin/python bench/scale.py [--quick] [--json] [--only changes,view,lists,checkpoints]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402
from harness import Figure  # noqa: E402

MODULES = ("changes", "view", "lists", "checkpoints")
TARGETS: dict[str, tuple[float, bool]] = {
    "page_open_ratio_1000": (1.1, False),
    "cpu_per_turn_ratio_10k_vs_100": (2.0, False),
    "session_list_ms_10k": (10.0, False),
    "calls_per_s_64_vs_8_projects": (0.8, True),
    "turn_ms_100k_files_vs_1k": (2.0, False),
    "loop_gap_ms_worst": (50.0, False),
}


# Each module runs in a process of its own, in its main thread (a module may start a host that installs signal
# handlers, or run its own event loop), its prints sent to stderr and its keys written as one JSON line.
CHILD = r"""
import asyncio, inspect, json, os, sys
sys.path.insert(0, sys.argv[1])
out = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)
sys.stdout = sys.stderr
module = __import__("scale_" + sys.argv[2])
quick = sys.argv[3] == "1"
keys = asyncio.run(module.measure(quick)) if inspect.iscoroutinefunction(module.measure) else module.measure(quick)
out.write(json.dumps({k: v for k, v in keys.items() if isinstance(v, (int, float, str, dict))}) + "\n")
"""


async def measure(name: str, quick: bool) -> dict[str, Any]:
    child = await asyncio.create_subprocess_exec(sys.executable, "-c", CHILD, str(Path(__file__).resolve().parent),
                                                 name, "1" if quick else "0", stdout=asyncio.subprocess.PIPE)
    out, _ = await child.communicate()
    if child.returncode != 0:
        raise SystemExit(f"bench/scale_{name}.py failed (exit {child.returncode}): see its output above")
    return dict(json.loads(out.decode().strip().splitlines()[-1]))


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes (≤ 5 minutes); sizes says which")
    parser.add_argument("--json", action="store_true", help="print one JSON object of the keys on stdout")
    parser.add_argument("--only", default=",".join(MODULES), help="which modules, comma-separated")
    args = parser.parse_args()
    out = sys.stdout
    if args.json:
        sys.stdout = sys.stderr  # the modules' own prints, and the figures, must not mix into the object
    harness.header("scale: a turn at turn 10,000 as at turn 10", args.quick)
    keys: dict[str, Any] = {"quick": args.quick, "sizes": {}, "seconds": {}, "loop_gaps": {}, "context": {}}
    for name in [n.strip() for n in args.only.split(",") if n.strip()]:
        started = time.monotonic()
        found = await measure(name, args.quick)
        keys["seconds"][name] = round(time.monotonic() - started, 1)
        keys["sizes"].update(found.pop("sizes", {}))
        keys["context"].update(found.pop("context", {}))
        for key, value in found.items():
            if "loop_gap" in key or "gap_ms" in key:
                keys["loop_gaps"][f"{name}: {key}"] = float(value)
            elif isinstance(value, (int, float)):
                keys[key] = value
    keys["loop_gap_ms_worst"] = max(keys["loop_gaps"].values(), default=0.0)
    figures = [Figure(key, float(value), "", *TARGETS.get(key, (None, True)), note=keys["sizes"].get(key, ""))
               for key, value in keys.items() if key not in ("quick", "sizes", "seconds", "loop_gaps", "context")]
    figures += [Figure(key, float(value), "") for key, value in keys["context"].items()]
    figures += [Figure(f"loop gap, {where}", value, "ms") for where, value in keys["loop_gaps"].items()]
    harness.report("scale", figures, None)
    if args.json:
        out.write(json.dumps(keys) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
