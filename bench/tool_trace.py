"""Where a tool call's time goes: a timeline of `pidesk run`'s steps between two model requests.

Runs what `pidesk run PROJECT PROMPT --model openai/mock --permission auto` runs (an embedded
host, the real OpenAI provider and Bash tool), in this process, against the instant mock of
``_mock_openai.py`` answering every request with one Bash ``echo`` call, N times. The host's
turn-context methods and the provider's request are wrapped to stamp the time on entry and
exit; each gap between the mock's last byte of an answer and the arrival of the next request
is then cut at those stamps, and the median of each segment is printed.

The mock shares this process (a thread), so the total is a little above what
``tool_loop.py`` measures with pidesk in a process of its own; use this for the split, that
for the figure.

    .venv/bin/python bench/tool_trace.py [--calls 50]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from _mock_openai import MockOpenAI, tool_loop

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

Stamp = tuple[float, str]


def stamp_calls(stamps: list[Stamp]) -> None:
    import pidesk.host.context as context
    import pidesk.providers.openai as openai_provider

    def timed_async(owner: Any, name: str) -> None:
        inner: Callable[..., Awaitable[Any]] = getattr(owner, name)

        async def timed(*args: Any, **kwargs: Any) -> Any:
            stamps.append((time.perf_counter(), f"{name}>"))
            result = await inner(*args, **kwargs)
            stamps.append((time.perf_counter(), f"{name}<"))
            return result
        setattr(owner, name, timed)

    def timed_sync(owner: Any, name: str) -> None:
        inner: Callable[..., Any] = getattr(owner, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            stamps.append((time.perf_counter(), f"{name}>"))
            result = inner(*args, **kwargs)
            stamps.append((time.perf_counter(), f"{name}<"))
            return result
        setattr(owner, name, timed)

    for name in ("append", "authorize", "run_tool"):
        timed_async(context.HostTurnContext, name)
    for name in ("add_usage", "history"):
        timed_sync(context.HostTurnContext, name)
    timed_async(openai_provider.OpenAIProvider, "_create")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=50)
    args = parser.parse_args()

    import click

    from pidesk.cli.run import run_unattended
    from pidesk.config import HostConfig

    stamps: list[Stamp] = []
    stamp_calls(stamps)
    click.echo = lambda *a, **k: None  # the run's own output is not the subject here
    with tempfile.TemporaryDirectory(dir=ROOT / "bench" / "out") as scratch, MockOpenAI(tool_loop(args.calls)) as mock:
        project = Path(scratch) / "project"
        project.mkdir()
        (project / "README.md").write_text("# a project\n")
        environ = {"OPENAI_BASE_URL": mock.url, "OPENAI_API_KEY": "mock", "PIDESK_CONFIG": str(Path(scratch) / "none.toml")}
        config = HostConfig.from_environ(environ, data_dir=Path(scratch) / "data", model="openai/mock")
        code = asyncio.run(run_unattended(config, project, f"make {args.calls} calls", "agent", "auto", False))
        hits = list(mock.hits)
    if code != 0 or len(hits) != args.calls + 1:
        print(f"the run failed: exit {code}, {len(hits)} requests", file=sys.stderr)
        return 1
    segments: dict[str, list[float]] = defaultdict(list)
    for answered, arrived in zip(hits[5:], hits[6:]):  # the first few warm the caches
        inside = [(t, n) for t, n in stamps if answered.answered <= t <= arrived.arrived]
        points = [(answered.answered, "answer sent"), *inside, (arrived.arrived, "next request")]
        for (t0, n0), (t1, n1) in zip(points, points[1:]):
            segments[f"{n0} → {n1}"].append((t1 - t0) * 1000)
        segments["per tool call"].append((arrived.arrived - answered.answered) * 1000)
    print(f"# tool_trace — {args.calls} Bash echo calls, medians over calls 6…{args.calls}")
    total = segments.pop("per tool call")
    for name, values in segments.items():
        if len(values) >= (args.calls - 5) // 2:
            print(f"  {statistics.median(values):7.3f} ms  {name}")
    print(f"  {statistics.median(total):7.3f} ms  per tool call")
    return 0


if __name__ == "__main__":
    sys.exit(main())
