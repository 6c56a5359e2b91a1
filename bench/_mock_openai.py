"""An instant OpenAI-compatible Chat Completions server for the benchmarks (loopback only).

It speaks what the official SDK expects of ``POST /v1/chat/completions`` with
``stream: true``: HTTP/1.1 with keep-alive (as real servers do, so the SDK's
connection pool is exercised as in production), an SSE body sent chunked, the
whole answer written at once. What to answer is a *policy*, a pure function of
the request body, so any number of sessions can talk to one server at once:

* ``tool_loop(n)``: a Bash ``echo`` call until the conversation holds ``n``
  tool results, then a final text answer (``bench/tool_loop.py``);
* ``read_then_answer``: a Read of README.md when the last message is the
  user's, else a short text answer — one tool call per turn (``bench/rpc_load.py``);
* ``load_mix``: the mix of ``bench/load_soak.py``, steered by the request itself.
  In Plan mode (the offered tools include SubmitPlan) a Read of README.md, then
  a SubmitPlan with a small Markdown plan; in an execution turn (the turn's
  user message is the host's "Approved plan: …") a Bash ``echo``, then text;
  otherwise the prompt's tag picks one tool call before the text answer:
  ``[read]`` a Read, ``[bash]`` a Bash ``echo``, ``[slow]`` a Bash ``sleep``
  (a turn that lasts a while, for queue pushes), ``[text]`` none.

Every request is recorded as a ``Hit``: when it had fully arrived and when the
last byte of its answer was written (``time.perf_counter``), so the gap between
an answer's end and the next request is the harness's time per tool call.

Run in a thread of the benchmark (``MockOpenAI(policy).start()``) or as its own
process, which prints its base URL and serves until stdin closes::

    python bench/_mock_openai.py --policy read_then_answer   # or load_mix
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

Answer = tuple[str, list[dict[str, Any]]]  # (text, tool calls as {"name", "arguments"})
Policy = Callable[[dict[str, Any]], Answer]


def tool_loop(n: int) -> Policy:
    def answer(body: dict[str, Any]) -> Answer:
        done = sum(1 for m in body.get("messages", []) if m.get("role") == "tool")
        if done < n:
            return "", [{"name": "Bash", "arguments": json.dumps({"command": f"echo call {done + 1}"})}]
        return f"All {n} calls done.", []
    return answer


def read_then_answer(body: dict[str, Any]) -> Answer:
    messages = body.get("messages", [])
    if messages and messages[-1].get("role") == "user":
        return "", [{"name": "Read", "arguments": json.dumps({"path": "README.md"})}]
    return "Read it; all good.", []


def load_mix(body: dict[str, Any]) -> Answer:
    messages = body.get("messages", [])
    start = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)
    prompt = _text(messages[start].get("content")) if start >= 0 else ""
    called = [call["function"]["name"] for m in messages[start + 1:] if m.get("role") == "assistant"
              for call in m.get("tool_calls") or []]
    tools = {t.get("function", {}).get("name") for t in body.get("tools", [])}
    if "SubmitPlan" in tools:
        if "Read" not in called:
            return "Let me look first.", [{"name": "Read", "arguments": json.dumps({"path": "README.md"})}]
        if "SubmitPlan" not in called:
            title = prompt.splitlines()[0][:60] if prompt else "a plan"
            markdown = (f"# {title}\n\n## Steps\n\n1. Read README.md again.\n2. Run `echo step`.\n"
                        "3. Report what was found.\n")
            return "Here is my plan.", [{"name": "SubmitPlan", "arguments": json.dumps(
                {"title": title, "markdown": markdown, "question": "May I carry this out?"})}]
        return "The plan is settled.", []
    if prompt.startswith("Approved plan:"):
        tool, args = "Bash", {"command": "echo executing the plan"}
    elif "[read]" in prompt:
        tool, args = "Read", {"path": "README.md"}
    elif "[bash]" in prompt:
        tool, args = "Bash", {"command": "echo hello"}
    elif "[slow]" in prompt:
        tool, args = "Bash", {"command": "sleep 0.3; echo slept"}
    else:
        return "Noted.", []
    if tool not in called:
        return "", [{"name": tool, "arguments": json.dumps(args)}]
    return "Done.", []


def _text(content: Any) -> str:
    if isinstance(content, list):  # content parts
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return content if isinstance(content, str) else ""


POLICIES: dict[str, Policy] = {"read_then_answer": read_then_answer, "load_mix": load_mix}


@dataclass
class Hit:
    arrived: float  # the request's head and body have been read
    answered: float = 0.0  # the answer's last byte was written
    tool_results: int = 0  # tool messages in the request
    calls: int = 0  # tool calls in the answer


@dataclass
class MockOpenAI:
    policy: Policy
    before_answer: Callable[[Hit], None] | None = None  # runs in the server's thread, before answering
    hits: list[Hit] = field(default_factory=list)
    url: str = ""
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None
    _stop: asyncio.Event | None = None
    _ids: int = 0
    _writers: set[asyncio.StreamWriter] = field(default_factory=set)

    # ---- in a thread of the caller ------------------------------------------------------

    def start(self) -> MockOpenAI:
        ready = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main(ready)), name="mock-openai", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("the mock OpenAI server did not start within 10 s")
        return self

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(10)

    def __enter__(self) -> MockOpenAI:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def _main(self, ready: threading.Event) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1"
        ready.set()
        async with server:
            await self._stop.wait()
            server.close()
            for writer in list(self._writers):  # kept-alive connections: their handlers then end
                writer.close()
            for _ in range(100):  # bounded: let the handlers see their connections close
                if not self._writers:
                    break
                await asyncio.sleep(0.01)

    # ---- HTTP --------------------------------------------------------------------------

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            while True:  # keep-alive: one request after another on this connection
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                headers = {k.strip().lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:] if ":" in ln)}
                raw = await reader.readexactly(int(headers.get("content-length", "0")))
                arrived = time.perf_counter()  # before parsing it: the mock's own work is not pidesk's
                body = json.loads(raw or b"{}")
                hit = Hit(arrived, tool_results=sum(1 for m in body.get("messages", []) if m.get("role") == "tool"))
                self.hits.append(hit)
                if self.before_answer is not None:
                    self.before_answer(hit)
                text, calls = self.policy(body)
                hit.calls = len(calls)
                writer.write(self._sse(body.get("model", "mock"), text, calls))
                await writer.drain()
                hit.answered = time.perf_counter()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self._writers.discard(writer)
            writer.close()

    def _sse(self, model: str, text: str, calls: list[dict[str, Any]]) -> bytes:
        self._ids += 1
        base = {"id": f"chatcmpl-{self._ids}", "object": "chat.completion.chunk", "created": 1700000000, "model": model}

        def chunk(delta: dict[str, Any] | None, finish: str | None = None, usage: dict[str, int] | None = None) -> bytes:
            choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
            return b"data: " + json.dumps({**base, "choices": choices, "usage": usage}).encode() + b"\n\n"

        frames = [chunk({"role": "assistant", "content": text})]
        if calls:
            frames.append(chunk({"tool_calls": [
                {"index": i, "id": f"call_{self._ids}_{i}", "type": "function", "function": call}
                for i, call in enumerate(calls)
            ]}))
        frames += [chunk({}, "tool_calls" if calls else "stop"),
                   chunk(None, usage={"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110}),
                   b"data: [DONE]\n\n"]
        body = b"".join(b"%x\r\n%s\r\n" % (len(f), f) for f in frames) + b"0\r\n\r\n"
        head = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
                b"transfer-encoding: chunked\r\nconnection: keep-alive\r\n\r\n")
        return head + body


def main() -> None:
    """Serve in this process: print the base URL, serve until stdin closes (the benchmark ends us)."""
    parser = argparse.ArgumentParser(description="instant mock OpenAI server")
    parser.add_argument("--policy", choices=sorted(POLICIES), default="read_then_answer")
    args = parser.parse_args()
    mock = MockOpenAI(POLICIES[args.policy]).start()
    print(mock.url, flush=True)
    sys.stdin.read()
    mock.stop()
    print(f"requests: {len(mock.hits)}", file=sys.stderr)


if __name__ == "__main__":
    main()
