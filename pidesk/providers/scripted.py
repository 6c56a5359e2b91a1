"""A real, deterministic provider driven by a script (``--model scripted/<file>``).

The script is a JSON file::

    {"responses": [
        {"text": "Let me look around.", "toolCalls": [{"name": "Read", "args": {"path": "README.md"}}]},
        {"toolCalls": [{"name": "SubmitPlan", "args": {"title": "…", "markdown": "…", "question": "…"}}]},
        {"text": "Done.", "usage": {"inputTokens": 120, "outputTokens": 8}},
        {"error": "PROVIDER_ERROR"},
        {"gate": "hold", "text": "…"},
        {"thinking": "First, the README.", "text": "It says hello."},
        {"thinkingRedacted": true, "text": "Done."}
    ]}

Each model call of a session takes that session's next response; every session
replays the script from its start, then whatever a test ``enqueue``d for it. A
delegate (Task) has its own queue, keyed ``<session id>/<task id>``.
Past the end the model answers "Done." and ends its turn, so loops always end.

Fields of a response, applied in this order: ``retrying`` (a retry notice first:
``{"attempt", "of", "waitS", "reason"}``, as a vendor provider's wait before a retry), ``gate`` (wait until a test calls
``release(name)``; ``wait_reached(name)`` tells it the model got there), ``thinking``
(a reasoning block, streamed word by word as ``ThinkingDelta`` then one ``Thought``),
``thinkingRedacted`` (true: a redacted reasoning block, no text), ``text`` (streamed
word by word), ``gateAfter`` (the same, after the text), ``toolCalls``
(ids default to ``call_<n>``), ``usage`` (``inputTokens``, ``outputTokens``, ``cacheReadTokens`` — or
``cacheTokens`` — and ``cacheWriteTokens``), ``error`` (end the stream with that code;
``"overflow": true`` beside it: the provider refused the input as too long for the window).

A summary request (``tool_choice: "none"``, a compaction's) takes the next response only
when it has ``summary`` (its text); else the model writes a short summary of its own
(the number of messages and the last user message), leaving the script where it was.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncGenerator, AsyncIterator
from pathlib import Path
from typing import Any

from pidesk.providers.base import (
    Done,
    ModelRequest,
    Retrying,
    StreamEvent,
    TextDelta,
    ThinkingDelta,
    Thought,
    ToolCall,
    UsageReport,
)

_WORDS = re.compile(r"\S+\s*|\s+")


class ScriptError(ValueError):
    pass


class ScriptedProvider:
    def __init__(self, responses: list[dict[str, Any]] | None = None, name: str = "scripted") -> None:
        self.name = name
        self._script = list(responses or [])
        self._queues: dict[str, list[dict[str, Any]]] = {}
        self._extra: dict[str, list[dict[str, Any]]] = {}
        self._calls: dict[str, int] = {}
        self._reached: dict[str, asyncio.Event] = {}
        self._released: dict[str, asyncio.Event] = {}
        self.requests: list[ModelRequest] = []

    @classmethod
    def from_file(cls, path: Path) -> ScriptedProvider:
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ScriptError(f"cannot read model script {path}: {exc}") from exc
        responses = data.get("responses") if isinstance(data, dict) else None
        if not isinstance(responses, list) or not all(isinstance(r, dict) for r in responses):
            raise ScriptError(f'{path}: a model script is {{"responses": [{{…}}, …]}}')
        return cls(responses, name=f"scripted/{path.name}")

    def enqueue(self, session_id: str, *responses: dict[str, Any]) -> None:
        """Add responses for one session after whatever it has left."""
        if session_id in self._queues:
            self._queues[session_id].extend(responses)
        else:
            self._extra.setdefault(session_id, []).extend(responses)

    async def wait_reached(self, gate: str, timeout: float = 10.0) -> None:
        async with asyncio.timeout(timeout):
            await self._event(self._reached, gate).wait()

    def release(self, gate: str) -> None:
        self._event(self._released, gate).set()

    def calls(self, session_id: str) -> int:
        """How many model requests this session has made."""
        return self._calls.get(session_id, 0)

    async def stream(self, request: ModelRequest) -> AsyncGenerator[StreamEvent, None]:
        self.requests.append(request)
        sid = request.session_id if request.agent == "main" else f"{request.session_id}/{request.agent}"
        self._calls[sid] = self._calls.get(sid, 0) + 1
        queue = self._queues.get(sid)
        if queue is None:
            queue = self._queues[sid] = [*self._script, *self._extra.pop(sid, [])]
        if request.tool_choice == "none":
            if queue and "summary" in queue[0]:
                scripted = queue.pop(0)
                response = {**scripted, "text": scripted["summary"]}
            else:
                response = _summary(request)
        else:
            response = queue.pop(0) if queue else {"text": "Done."}
        try:
            async for event in self._play(response, sid):
                yield event
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a malformed script is a provider error, never a crash
            yield Done("error", "PROVIDER_ERROR", f"bad script response {response!r}: {exc}")

    async def _play(self, response: dict[str, Any], sid: str) -> AsyncIterator[StreamEvent]:
        if retry := response.get("retrying"):
            yield Retrying(int(retry.get("attempt", 1)), int(retry.get("of", 10)), float(retry.get("waitS", 1.0)),
                           str(retry.get("reason", "scripted failure")))
        if "gate" in response:
            await self._hold(response["gate"])
        if thinking := response.get("thinking"):
            for word in _WORDS.findall(str(thinking)):
                yield ThinkingDelta(word)
            yield Thought(str(thinking))
        if response.get("thinkingRedacted"):
            yield Thought("", redacted=True)
        for word in _WORDS.findall(response.get("text", "")):
            yield TextDelta(word)
        if "gateAfter" in response:
            await self._hold(response["gateAfter"])
        calls = response.get("toolCalls", [])
        for call in calls:
            n = self._calls[sid]
            yield ToolCall(str(call.get("id") or f"call_{n}_{calls.index(call)}"), call["name"], dict(call.get("args", {})))
        if usage := response.get("usage"):
            yield UsageReport(usage.get("inputTokens", 0), usage.get("outputTokens", 0),
                              usage.get("cacheReadTokens", usage.get("cacheTokens", 0)),
                              usage.get("cacheWriteTokens", 0))
        if error := response.get("error"):
            yield Done("error", str(error), response.get("detail", "scripted error"), bool(response.get("overflow")))
        else:
            yield Done("tool_calls" if calls else "end")

    async def _hold(self, gate: str) -> None:
        self._event(self._reached, gate).set()
        await self._event(self._released, gate).wait()

    @staticmethod
    def _event(table: dict[str, asyncio.Event], name: str) -> asyncio.Event:
        event = table.get(name)
        if event is None:
            event = table[name] = asyncio.Event()
        return event


def _summary(request: ModelRequest) -> dict[str, Any]:
    """The scripted model's own summary of a conversation: enough to tell one compaction from another."""
    said = [m.text() for m in request.messages if m.role == "user" and m.text().strip()]
    last = said[-2] if len(said) >= 2 else "(none)"  # the last is the request for the summary itself
    return {"text": f"Summary of {len(request.messages) - 1} messages. The last request was: {last[:200]}"}
