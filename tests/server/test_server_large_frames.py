"""Large messages over the WebSocket: sent in fragments the event loop runs between, arriving whole."""

from __future__ import annotations

from typing import Any

import pytest

from tests.scenario import tool

pytestmark = pytest.mark.asyncio


async def test_a_large_event_arrives_whole_though_sent_in_fragments(served: Any) -> None:
    """Authority hole 6 (10 MB tool arguments): a large event is encoded once by the bus and sent as one
    text message in 1 MiB fragments cut at character boundaries, so the event loop serves others
    between them. The client still reads one message, byte for byte, multi-byte characters and all —
    as an event and as a session.get answer."""
    content = ("ünïcödé → 字 " * 200_000)[:2_500_000]  # ~3.6 MB of UTF-8, well past one fragment
    ws = await served.ws()
    s = await served.call("session.create", {"projectPath": str(served.project), "permissionMode": "auto"})
    served.provider.enqueue(s["id"], tool("Write", path="big.txt", content=content), {"text": "written"})
    turn = await ws.call("agent.prompt", {"sessionId": s["id"], "text": "write it"})
    started = await ws.event("tool.started", lambda e: e["turnId"] == turn["turnId"])
    assert started["args"]["content"] == content
    await ws.turn_ended(turn["turnId"])
    assert (served.project / "big.txt").read_text() == content
    got = await ws.call("session.get", {"sessionId": s["id"]})
    calls = [b for m in got["messages"] for b in m["content"] if b["type"] == "toolCall"]
    assert calls[0]["args"]["content"] == content
