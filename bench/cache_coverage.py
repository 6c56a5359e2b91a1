"""Prompt-cache coverage of a tool loop against an Anthropic mock that caches (issue 16 §3's figure).

``pidesk run PROJECT PROMPT --model anthropic/claude-mock --permission auto`` runs as a real
subprocess against a Messages API mock (in a thread of this script, loopback, keep-alive) that
answers 20 tool calls (Glob, Read, Grep, Bash in turn, over a small project), then a text.
The mock models Anthropic's prompt cache the way the API documents it:

* a request is a sequence of blocks: the tools, the system prompt's blocks, then each
  message's content blocks, in that order; a block's size is its JSON's length / 4 tokens;
* each block marked ``cache_control`` is a breakpoint: the prefix that ends there is written
  to the cache (unless it is there already);
* a request reads the longest prefix ending at one of its breakpoints that an earlier
  request wrote (the API also looks back up to 20 blocks from a breakpoint; this mock does
  not, so its figure is a lower bound);
* it answers with that split in ``usage`` (``input_tokens`` the rest), so pidesk's
  Turn.usage is checked against the mock's own sums.

Per request: its input tokens, the part read from the cache (coverage = read / input), the
part written, and the most any breakpoint scheme could have read: the prefix an earlier
request had sent at all (``possible``). The issue's bar: from step 2 on, each request's
coverage is >= 90 %. Whether a workload can meet it depends on how big each step is next to
the conversation so far (the newest step was never sent before, so no cache holds it): two
workloads are run, ``echo`` (Bash echo calls, as bench/tool_loop.py) and ``survey`` (Glob,
Read, Grep, Bash over a small project: outputs of 50-480 tokens).

    .venv/bin/python bench/cache_coverage.py [--steps 20] [--workload echo|survey|both] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
WORKLOADS = {
    "echo": [("Bash", {"command": "echo step"})],
    "survey": [("Glob", {"pattern": "**/*.py"}), ("Read", {"path": "src/app.py"}), ("Grep", {"pattern": "def "}),
               ("Bash", {"command": "ls -la src"})],
}


@dataclass
class Request:
    input_tokens: int
    read: int
    written: int
    breakpoints: int
    possible: int  # the prefix some earlier request had sent: the most any scheme could read

    @property
    def coverage(self) -> float:
        return self.read / self.input_tokens if self.input_tokens else 0.0


@dataclass
class CachingMock:
    steps: int
    tools: list[tuple[str, dict[str, Any]]]
    requests: list[Request] = field(default_factory=list)
    written: set[int] = field(default_factory=set)  # hashes of the cached prefixes
    sent: set[int] = field(default_factory=set)  # hashes of every prefix any request sent
    url: str = ""

    def start(self) -> None:
        ready = threading.Event()

        def serve() -> None:
            async def main() -> None:
                server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
                self.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
                ready.set()
                async with server:
                    await server.serve_forever()

            asyncio.run(main())

        threading.Thread(target=serve, daemon=True).start()
        if not ready.wait(10):
            raise RuntimeError("the mock did not start")

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            for _ in range(10_000):  # keep-alive: many requests on one connection, bounded
                head = await reader.readuntil(b"\r\n\r\n")
                headers = dict(line.split(":", 1) for line in head.decode("latin-1").split("\r\n")[1:] if line)
                length = int(next((v for k, v in headers.items() if k.strip().lower() == "content-length"), "0"))
                body = json.loads(await reader.readexactly(length))
                frames = self.answer(body)
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
                for frame in frames:
                    writer.write(b"%x\r\n%s\r\n" % (len(frame), frame))
                writer.write(b"0\r\n\r\n")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    def answer(self, body: dict[str, Any]) -> list[bytes]:
        read, written, total, marks, possible = self.cache(body)
        self.requests.append(Request(total, read, written, marks, possible))
        results = sum(1 for m in body["messages"] for b in m["content"] if b.get("type") == "tool_result")
        usage = {"input_tokens": total - read - written, "output_tokens": 1, "cache_read_input_tokens": read,
                 "cache_creation_input_tokens": written}
        frames = [_event("message_start", message={"id": "msg", "type": "message", "role": "assistant",
                                                   "model": "claude-mock", "content": [], "usage": usage})]
        if results < self.steps:
            name, args = self.tools[results % len(self.tools)]
            frames += [
                _event("content_block_start", index=0, content_block={"type": "tool_use", "id": f"toolu_{results}",
                                                                      "name": name, "input": {}}),
                _event("content_block_delta", index=0, delta={"type": "input_json_delta",
                                                              "partial_json": json.dumps(args)}),
                _event("content_block_stop", index=0),
            ]
            stop = "tool_use"
        else:
            frames += [_event("content_block_start", index=0, content_block={"type": "text", "text": ""}),
                       _event("content_block_delta", index=0, delta={"type": "text_delta", "text": "Done."}),
                       _event("content_block_stop", index=0)]
            stop = "end_turn"
        frames += [_event("message_delta", delta={"stop_reason": stop}, usage={"output_tokens": 12}),
                   _event("message_stop")]
        return frames

    def cache(self, body: dict[str, Any]) -> tuple[int, int, int, int, int]:
        """(tokens read, tokens written, input tokens, breakpoints, tokens sent before) of one request."""
        system = body.get("system") or []
        blocks = [*body.get("tools", []),
                  *([{"type": "text", "text": system}] if isinstance(system, str) else system),
                  *({"role": m["role"], **b} for m in body["messages"] for b in m["content"])]
        sizes, prefixes, marks = [], [], []
        running = 0
        for block in blocks:
            plain = {k: v for k, v in block.items() if k != "cache_control"}
            text = json.dumps(plain, sort_keys=True)
            running = hash((running, text))
            sizes.append(max(1, len(text) // 4))
            prefixes.append(running)
            if "cache_control" in block:
                marks.append(len(sizes) - 1)
        if len(marks) > 4:
            raise ValueError(f"{len(marks)} cache breakpoints: the API allows 4")
        total = sum(sizes)
        hit = max((i for i in marks if prefixes[i] in self.written), default=-1)
        read = sum(sizes[:hit + 1])
        last = max(marks, default=-1)
        written = sum(sizes[hit + 1:last + 1]) if last > hit else 0
        self.written.update(prefixes[i] for i in marks)
        seen = max((i for i, h in enumerate(prefixes) if h in self.sent), default=-1)
        self.sent.update(prefixes)
        return read, written, total, len(marks), sum(sizes[:seen + 1])


def _event(kind: str, **payload: Any) -> bytes:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **payload})}\n\n".encode()


def _project(root: Path) -> None:
    (root / "src").mkdir(parents=True)
    (root / "README.md").write_text("# shop\n\nA small inventory service.\n")
    for name in ("app", "models", "store"):
        (root / "src" / f"{name}.py").write_text("".join(
            f"def {name}_{i}(value: int) -> int:\n    \"\"\"Step {i} of {name}.\"\"\"\n    return value * {i} + 1\n\n"
            for i in range(12)))


def run(workload: str, steps: int) -> dict[str, Any]:
    mock = CachingMock(steps, WORKLOADS[workload])
    mock.start()
    with tempfile.TemporaryDirectory(prefix="pidesk-cache-") as tmp:
        project, data = Path(tmp) / "project", Path(tmp) / "data"
        _project(project)
        config = Path(tmp) / "config.toml"
        config.write_text("")
        env = {**os.environ, "ANTHROPIC_API_KEY": "sk-ant-bench-0000", "ANTHROPIC_BASE_URL": mock.url,
               "PIDESK_CONFIG": str(config), "XDG_CONFIG_HOME": tmp}
        done = subprocess.run(
            [sys.executable, "-m", "pidesk", "run", str(project), "Survey the project's Python code.",
             "--model", "anthropic/claude-mock", "--permission", "auto", "--json", "--data-dir", str(data)],
            capture_output=True, text=True, timeout=300, env=env, cwd=ROOT,
        )
    if done.returncode != 0:
        raise RuntimeError(f"pidesk run failed: {done.stderr}")
    usage = json.loads(done.stdout.splitlines()[-1]).get("usage") or {}
    requests = mock.requests
    worst = min((r.coverage for r in requests[1:]), default=0.0)
    sums = {"cacheReadTokens": sum(r.read for r in requests), "cacheWriteTokens": sum(r.written for r in requests)}
    return {
        "workload": workload, "steps": steps, "requests": len(requests),
        "perRequest": [{"step": i + 1, "inputTokens": r.input_tokens, "cacheRead": r.read, "cacheWrite": r.written,
                        "possible": r.possible, "breakpoints": r.breakpoints, "coverage": round(r.coverage, 4)}
                       for i, r in enumerate(requests)],
        "minCoverageFromStep2": round(worst, 4), "meetsBar": worst >= 0.9,
        "readAllPossible": all(r.read == r.possible for r in requests),
        "turnUsage": usage, "usageMatchesMock": all(usage.get(k) == v for k, v in sums.items()),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--workload", choices=[*WORKLOADS, "both"], default="both")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    reports = [run(w, args.steps) for w in (WORKLOADS if args.workload == "both" else [args.workload])]
    if args.json:
        print(json.dumps(reports, indent=2))
    for report in reports if not args.json else []:
        print(f"workload {report['workload']}: {report['steps']} tool calls, {report['requests']} requests")
        print(f"{'step':>4} {'input':>7} {'read':>7} {'write':>6} {'possible':>8} {'bp':>2} coverage")
        for row in report["perRequest"]:
            print(f"{row['step']:>4} {row['inputTokens']:>7} {row['cacheRead']:>7} {row['cacheWrite']:>6} "
                  f"{row['possible']:>8} {row['breakpoints']:>2} {row['coverage']:8.1%}")
        print(f"min coverage from step 2: {report['minCoverageFromStep2']:.1%} "
              f"({'meets' if report['meetsBar'] else 'misses'} the 90 % bar); every request read all an earlier "
              f"one had sent: {report['readAllPossible']}; Turn.usage "
              f"{'matches' if report['usageMatchesMock'] else 'DIFFERS FROM'} the mock's sums: {report['turnUsage']}\n")
    return 0 if all(r["readAllPossible"] and r["usageMatchesMock"] for r in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
