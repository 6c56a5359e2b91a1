"""Large messages over the WebSocket: sent in fragments the event loop runs between, arriving whole."""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = pytest.mark.asyncio


async def test_a_large_event_arrives_whole_though_sent_in_fragments(served: Any) -> None:
    """Authority hole 6: a large event is encoded once by the bus and sent as one text message in 1 MiB
    fragments cut at character boundaries, so the event loop serves others between them (uvicorn's own
    send encoded, framed and copied it in one step). The client still reads one message, byte for
    byte, multi-byte characters and all — as an event and as a session.get answer."""
    text = ("ünïcödé → 字 " * 80_000)[:900_000]  # a prompt near the 1,000,000-character limit: ~1.9 MB of UTF-8
    ws = await served.ws()
    s = await served.call("session.create", {"projectPath": str(served.project)})
    served.provider.enqueue(s["id"], {"text": "read it"})
    turn = await ws.call("agent.prompt", {"sessionId": s["id"], "text": text})
    appended = await ws.event("message.appended", lambda e: e["turnId"] == turn["turnId"]
                              and e["message"]["role"] == "user")
    assert appended["message"]["content"][0]["text"] == text
    await ws.turn_ended(turn["turnId"])
    got = await ws.call("session.get", {"sessionId": s["id"]})
    assert got["messages"][0]["content"][0]["text"] == text
