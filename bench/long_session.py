"""A long session in a small window: compaction keeps every request inside it and the cache hitting
(issue 30's figure).

A real Host (embedded, its own data dir under bench/out/) drives 200 turns of one session through
the real ``AnthropicProvider`` against the caching Messages API mock of ``cache_coverage.py``
(loopback, its own thread; it models Anthropic's prompt cache as the API documents it, so its
cache figures are a lower bound). The model's window is 32,000 tokens. Each turn the mock's
model Reads one of the project's files (~600 tokens) and answers in a sentence; a summary
request (``tool_choice: {"type": "none"}``) is answered with a ~300-token summary.

Figures: the largest request's input (target: within the window), the number of compactions,
cache coverage — tokens read from the cache over input tokens — of the requests between
compactions (the first request after each compaction, which no earlier request could have
cached, counted apart; target ≥ 90 %), the host's time per compaction (from the summary
request's arrival to the next request's) and the input tokens each summary request sent.

    .venv/bin/python bench/long_session.py [--quick] [--turns 200] [--window 32000] [--json PATH]
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402
from cache_coverage import CachingMock, _event  # noqa: E402
from harness import Figure  # noqa: E402

from pidesk.config import HostConfig  # noqa: E402
from pidesk.core import events as ev  # noqa: E402
from pidesk.host import Host  # noqa: E402
from pidesk.providers.anthropic import AnthropicProvider  # noqa: E402

FILES = 12
SUMMARY = ("## Goal\nKeep the inventory service's modules documented.\n## Decisions\n" + "Read each module in turn; "
           * 40 + "\n## Next\nThe next module.")


class LongSessionMock(CachingMock):
    """The caching mock, answering a turn as Read-then-text and a summary request with a summary."""

    def __init__(self) -> None:
        super().__init__(steps=0, tools=[])
        self.arrivals: list[tuple[float, bool]] = []  # (monotonic time, a summary request) of each request

    def answer(self, body: dict[str, Any]) -> list[bytes]:
        summary = body.get("tool_choice") == {"type": "none"}
        self.arrivals.append((time.monotonic(), summary))
        read, written, total, marks, possible = self.cache(body)
        from cache_coverage import Request

        self.requests.append(Request(total, read, written, marks, possible))
        usage = {"input_tokens": total - read - written, "output_tokens": 1, "cache_read_input_tokens": read,
                 "cache_creation_input_tokens": written}
        frames = [_event("message_start", message={"id": "msg", "type": "message", "role": "assistant",
                                                   "model": "claude-mock", "content": [], "usage": usage})]
        last = body["messages"][-1]["content"][-1]
        if summary or last.get("type") == "tool_result":
            text = SUMMARY if summary else "Read it: nothing to change there."
            frames += [_event("content_block_start", index=0, content_block={"type": "text", "text": ""}),
                       _event("content_block_delta", index=0, delta={"type": "text_delta", "text": text}),
                       _event("content_block_stop", index=0)]
            stop = "end_turn"
        else:
            turn = sum(1 for m in body["messages"] for b in m["content"] if b.get("type") == "tool_result")
            path = f"src/module_{turn % FILES}.py"
            frames += [
                _event("content_block_start", index=0, content_block={"type": "tool_use", "id": f"toolu_{len(self.requests)}",
                                                                      "name": "Read", "input": {}}),
                _event("content_block_delta", index=0, delta={"type": "input_json_delta",
                                                              "partial_json": f'{{"path": "{path}"}}'}),
                _event("content_block_stop", index=0),
            ]
            stop = "tool_use"
        frames += [_event("message_delta", delta={"stop_reason": stop}, usage={"output_tokens": 12}),
                   _event("message_stop")]
        return frames


def _project(root: Path) -> None:
    (root / "src").mkdir(parents=True)
    for n in range(FILES):
        (root / "src" / f"module_{n}.py").write_text("".join(
            f"def step_{n}_{i}(value: int) -> int:\n    \"\"\"Step {i} of module {n}.\"\"\"\n    return value * {i}\n\n"
            for i in range(30)))


async def drive(scratch: Path, turns: int, window: int, mock: LongSessionMock) -> dict[str, Any]:
    project = scratch / "project"
    _project(project)
    config = HostConfig(data_dir=scratch / "data", context_limit=window, model="anthropic/claude-mock")
    provider = AnthropicProvider("claude-mock", api_key="sk-ant-bench-0000", base_url=mock.url, max_tokens=1024)
    host = Host.open(config, provider)
    try:
        session = await host.call("session.create", {"projectPath": str(project), "permissionMode": "auto"})
        sub = host.subscribe()
        compactions: list[ev.ContextCompacted] = []
        for n in range(turns):
            turn = await host.call("agent.prompt", {"sessionId": session["id"], "text": f"Look at the next module ({n})."})
            while True:
                event = await sub.wait_for(lambda e: isinstance(e, (ev.TurnEnded, ev.ContextCompacted)), 60)
                if isinstance(event, ev.ContextCompacted):
                    compactions.append(event)
                elif isinstance(event, ev.TurnEnded) and event.turn_id == turn["turnId"]:
                    if event.reason != "completed":
                        raise RuntimeError(f"turn {n} ended {event.reason}: {event.error_message}")
                    break
        window_now = (await host.call("session.context", {"sessionId": session["id"]}))["window"]
        return {"compactions": compactions, "window": window_now}
    finally:
        await host.close()
        await provider.aclose()


def figures(mock: LongSessionMock, result: dict[str, Any], window: int) -> list[Figure]:
    summary_at = [i for i, (_t, summary) in enumerate(mock.arrivals) if summary]
    after = {i + 1 for i in summary_at}
    plain = [r for i, r in enumerate(mock.requests) if i not in summary_at and i not in after and i > 0]
    first = [r for i, r in enumerate(mock.requests) if i in after]
    coverage = sum(r.read for r in plain) / max(1, sum(r.input_tokens for r in plain))
    lowest = min((r.coverage for r in plain), default=0.0)
    timings = [(mock.arrivals[i + 1][0] - mock.arrivals[i][0]) * 1000 for i in summary_at if i + 1 < len(mock.arrivals)]
    largest = max(r.input_tokens for r in mock.requests)
    sent = [mock.requests[i].input_tokens for i in summary_at]
    return [
        Figure("largest request's input", largest, "tokens", window, at_least=False),
        Figure("compactions", len(result["compactions"]), "", note=f"{len(mock.requests)} requests in all"),
        Figure("cache coverage between compactions", coverage * 100, "%", 90,
               note=f"lowest one request {lowest:.1%}; the first after each compaction "
                    f"{sum(r.read for r in first) / max(1, sum(r.input_tokens for r in first)):.1%}"),
        Figure("host time per compaction (median)", harness.median(timings) if timings else 0.0, "ms",
               note=f"worst {max(timings, default=0):.0f} ms"),
        Figure("input tokens per summary request (median)", harness.median([float(s) for s in sent]) if sent else 0.0,
               "tokens", note="tokens after: " + ", ".join(f"{c.tokens_after:,}" for c in result["compactions"][:6])),
    ]


def main() -> int:
    args = harness.parse_args(__doc__, lambda p: (p.add_argument("--turns", type=int, default=200),
                                                   p.add_argument("--window", type=int, default=32_000)))
    turns = 40 if args.quick else args.turns
    harness.header(f"long session: {turns} turns in a {args.window:,}-token window", args.quick)
    mock = LongSessionMock()
    mock.start()
    with harness.scratch("long-session") as scratch:
        result = asyncio.run(drive(scratch, turns, args.window, mock))
    return harness.report("long_session", figures(mock, result, args.window), args.json)


if __name__ == "__main__":
    sys.exit(main())
