"""The HTTP layer under the SDK, in one run (issue 16 §5; docs/architecture.md "The HTTP layer").

One model request as a tool loop makes it — the real ``OpenAIProvider`` streaming a
tool-call answer from ``_mock_openai`` (loopback, keep-alive, in a thread of this
script) — timed end to end (request sent, body read, events decoded, ``Done``), over:

* ``pidesk``: ``providers/transport.py`` under the SDK's httpx client, what a plain-http://
  base URL gets;
* ``aiohttp``: the SDK's ``DefaultAioHttpClient`` (its vendored httpx-aiohttp), which issue 16
  §5 weighed against it — only when aiohttp is installed (``.uv/bin/uv sync --group bench``;
  pidesk itself does not install it, and ``bin/dev`` takes it out again);
* ``httpx``: the SDK's default httpx transport (httpcore on anyio), what https:// gets.

The variants are interleaved round by round (the machine is shared: its speed drifts, and
interleaving spreads the drift over all of them), and each prints the median of its calls. This
is the HTTP call alone; ``compare_commits.py`` weighs a choice in the whole tool loop.

    .venv/bin/python bench/http_transports.py [--rounds 20] [--calls 25] [--history 20]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import random
import statistics
import sys
import time
from contextlib import aclosing
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _mock_openai import MockOpenAI  # noqa: E402

from pidesk.core.records import Message, TextBlock, ToolCallBlock, ToolResultBlock  # noqa: E402
from pidesk.providers.base import Done, ModelRequest  # noqa: E402
from pidesk.providers.openai import OpenAIProvider  # noqa: E402



def aiohttp_installed() -> bool:
    return importlib.util.find_spec("aiohttp") is not None


def with_aiohttp(provider: OpenAIProvider) -> OpenAIProvider:
    """``provider`` with its client rebuilt on the SDK's aiohttp backend (everything else as built)."""
    import openai

    client, _ = provider._connect()
    provider._client = client.with_options(http_client=openai.DefaultAioHttpClient())
    return provider


def always_a_call(body: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    return "", [{"name": "Bash", "arguments": json.dumps({"command": "echo hi"})}]


def history(n: int) -> list[Message]:
    out: list[Message] = [Message(id="m0", session_id="s", turn_id="t", seq=0, role="user",
                                  content=[TextBlock(text="run echo many times")], created_at="2025-01-01T00:00:00Z")]
    for i in range(n):
        out.append(Message(id=f"a{i}", session_id="s", turn_id="t", seq=2 * i + 1, role="assistant",
                           content=[ToolCallBlock(id=f"c{i}", name="Bash", args={"command": f"echo {i}"})],
                           created_at="2025-01-01T00:00:00Z"))
        out.append(Message(id=f"r{i}", session_id="s", turn_id="t", seq=2 * i + 2, role="tool",
                           content=[ToolResultBlock(tool_call_id=f"c{i}", name="Bash", ok=True, output=f"{i}\n")],
                           created_at="2025-01-01T00:00:00Z"))
    return out


async def one_call(provider: OpenAIProvider, request: ModelRequest) -> float:
    started = time.perf_counter()
    async with aclosing(provider.stream(request)) as events:
        async for event in events:
            if isinstance(event, Done) and event.stop_reason != "tool_calls":
                raise RuntimeError(f"unexpected end: {event}")
    return time.perf_counter() - started


async def measure(url: str, rounds: int, calls: int, n_history: int) -> dict[str, list[float]]:
    providers: dict[str, OpenAIProvider] = {
        "pidesk": OpenAIProvider("mock", api_key="x", base_url=url, lean_http=True),
        "httpx": OpenAIProvider("mock", api_key="x", base_url=url, lean_http=False),
    }
    if aiohttp_installed():
        providers["aiohttp"] = with_aiohttp(OpenAIProvider("mock", api_key="x", base_url=url, lean_http=False))
    request = ModelRequest(session_id="s", turn_id="t", system="You are a bench.", messages=history(n_history),
                           tools=[{"name": "Bash", "description": "run", "parameters": {"type": "object"}}])
    for provider in providers.values():  # connect, import, warm the pools
        for _ in range(5):
            await one_call(provider, request)
    times: dict[str, list[float]] = {name: [] for name in providers}
    order = list(providers)
    for _ in range(rounds):
        random.shuffle(order)
        for name in order:
            for _ in range(calls):
                times[name].append(await one_call(providers[name], request))
    for provider in providers.values():
        await provider.aclose()
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--calls", type=int, default=25)
    parser.add_argument("--history", type=int, default=20, help="tool round trips already in the request")
    args = parser.parse_args()
    with MockOpenAI(always_a_call) as mock:
        times = asyncio.run(measure(mock.url, args.rounds, args.calls, args.history))
    base = statistics.median(times["pidesk"])
    print(f"{args.rounds} rounds x {args.calls} calls per variant, interleaved; history {args.history} round trips")
    if "aiohttp" not in times:
        print("aiohttp  not installed: `.uv/bin/uv sync --group bench` adds it (`bin/dev` removes it again)")
    for name in sorted(times, key=lambda name: statistics.median(times[name])):
        median = statistics.median(times[name])
        q = statistics.quantiles(times[name], n=10)
        print(f"{name:8s} median {median * 1000:6.3f} ms  p10 {q[0] * 1000:6.3f}  p90 {q[-1] * 1000:6.3f}"
              f"  vs pidesk {(median - base) * 1000:+6.3f} ms ({(median / base - 1) * 100:+5.1f} %)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
