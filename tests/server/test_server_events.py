"""Events on the wire: one gapless, strictly rising seq per connection, the same for every
connection; and session.focus visibility, which belongs to a connection and dies with it."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from tests.scenario import tool

pytestmark = pytest.mark.asyncio


def seqs(events: list[dict[str, Any]]) -> list[int]:
    return [e["seq"] for e in events]


def gapless(values: list[int]) -> bool:
    return values == list(range(values[0], values[0] + len(values)))


async def ended_count(client, count: int) -> None:
    while len(client.seen("turn.ended")) < count:
        await client.event("turn.ended")


async def test_every_connection_sees_the_same_gapless_rising_seq_across_a_busy_run(served):
    provider = served.provider
    a = await served.ws()
    b = await served.ws(query_token=True)
    sessions = []
    for i in range(6):
        s = await (a if i % 2 else b).call("session.create", {"projectPath": str(served.project),
                                                               "permissionMode": "auto", "title": f"s{i}"})
        provider.enqueue(s["id"],
                         {"text": "reading the readme first", "toolCalls": [{"name": "Read", "args": {"path": "README.md"}}]},
                         {"text": "then globbing", "toolCalls": [{"name": "Glob", "args": {"pattern": "**/*"}}]},
                         {"text": "done with the first prompt"},
                         {"text": "and the queued one, word by word"})
        sessions.append(s["id"])
    await asyncio.gather(*((a if i % 2 else b).call("agent.prompt", {"sessionId": sid, "text": "go"})
                           for i, sid in enumerate(sessions)))
    late = await served.ws()  # joins mid-run
    await asyncio.gather(*(late.call("agent.queue.push", {"sessionId": sid, "text": "after that"}) for sid in sessions))
    await served.call("session.create", {"title": "over http"})
    for client in (a, b):
        await ended_count(client, 2 * len(sessions))
    marker = await served.call("session.create", {"title": "marker"})
    for client in (a, b, late):  # each has now received everything up to the marker
        await client.event("session.updated", lambda e: e["session"]["id"] == marker["id"])

    assert len(a.events) > 100
    assert gapless(seqs(a.events)) and gapless(seqs(late.events))
    assert a.events == b.events  # the same events, with the same seq, in the same order
    first = late.events[0]["seq"]
    assert first > a.events[0]["seq"]
    assert late.events == [e for e in a.events if e["seq"] >= first][: len(late.events)]
    kinds = {e["type"] for e in a.events}
    assert {"session.updated", "turn.started", "message.delta", "message.appended", "tool.started",
            "tool.finished", "queue.changed", "turn.ended", "notification.created"} <= kinds
    origins = [e["origin"] for e in a.seen("turn.started")]
    assert origins.count("interactive") == origins.count("queued") == len(sessions)


async def settled(client, turn_id: str, session_id: str) -> dict[str, Any]:
    """Wait until a turn has ended and its session is idle again (the notification, if any, comes between)."""
    end = await client.turn_ended(turn_id)
    await client.event("session.updated", lambda e: e["session"]["id"] == session_id
                       and e["session"]["status"] == "idle" and e["seq"] > end["seq"])
    return end


def notified(client, turn_id: str) -> bool:
    return any(e["notification"]["turnId"] == turn_id for e in client.seen("notification.created"))


async def run_turn(served, observer, sid: str, text: str) -> str:
    served.provider.enqueue(sid, {"text": text})
    turn = await observer.call("agent.prompt", {"sessionId": sid, "text": text})
    await settled(observer, turn["turnId"], sid)
    return turn["turnId"]


async def test_focus_belongs_to_a_connection_and_ends_with_it(served):
    observer = await served.ws()
    a = await served.ws()
    sid = (await observer.call("session.create", {"projectPath": str(served.project)}))["id"]
    assert await a.call("session.focus", {"sessionId": sid}) == {}

    hidden = await run_turn(served, observer, sid, "while focused")
    assert not notified(observer, hidden)
    assert (await observer.call("notifications.list"))["notifications"] == []

    await a.close()
    await served.host.wait_clients_closed(1)  # the server has processed the close
    shown = await run_turn(served, observer, sid, "after the focusing connection closed")
    assert notified(observer, shown)
    notes = (await observer.call("notifications.list"))["notifications"]
    assert [(n["turnId"], n["kind"]) for n in notes] == [(shown, "task.completed")]


async def test_focus_is_per_connection_and_follows_the_last_call(served):
    observer = await served.ws()
    a, b = await served.ws(), await served.ws()
    s1 = (await observer.call("session.create", {"projectPath": str(served.project)}))["id"]
    s2 = (await observer.call("session.create", {"projectPath": str(served.project)}))["id"]
    await a.call("session.focus", {"sessionId": s1})
    await b.call("session.focus", {"sessionId": s1})
    await a.close()
    await served.host.wait_clients_closed(1)
    assert not notified(observer, await run_turn(served, observer, s1, "b still shows s1"))
    await b.call("session.focus", {"sessionId": s2})  # b moves on: s1 is no longer visible
    assert notified(observer, await run_turn(served, observer, s1, "nobody shows s1"))
    assert not notified(observer, await run_turn(served, observer, s2, "b shows s2"))
    await b.call("session.focus", {"sessionId": None})
    assert notified(observer, await run_turn(served, observer, s2, "b shows nothing"))
    rpc = await b.error("session.focus", {"sessionId": "s_nope"})
    assert (rpc.code, rpc.data_code) == (-32000, "NOT_FOUND")


async def test_focus_over_http_does_not_outlive_its_request(served):
    observer = await served.ws()
    sid = (await observer.call("session.create", {"projectPath": str(served.project)}))["id"]
    assert await served.call("session.focus", {"sessionId": sid}) == {}
    turn = await run_turn(served, observer, sid, "focused by a finished HTTP request")
    assert notified(observer, turn)


async def test_a_failed_turn_notifies_task_failed(served):
    observer = await served.ws()
    sid = (await observer.call("session.create", {"projectPath": str(served.project)}))["id"]
    served.provider.enqueue(sid, {"error": "PROVIDER_ERROR"}, tool("Read", path="README.md"))
    turn = await observer.call("agent.prompt", {"sessionId": sid, "text": "fail"})
    end = await settled(observer, turn["turnId"], sid)
    assert (end["reason"], end["errorCode"]) == ("error", "PROVIDER_ERROR")
    note = next(e["notification"] for e in observer.seen("notification.created"))
    assert (note["turnId"], note["kind"]) == (turn["turnId"], "task.failed")


async def test_racing_prompts_from_two_connections_start_one_turn(served):
    a, b = await served.ws(), await served.ws()
    sid = (await a.call("session.create", {"projectPath": str(served.project)}))["id"]
    served.provider.enqueue(sid, {"gate": "race", "text": "one"})
    answers = await asyncio.gather(a.request("agent.prompt", {"sessionId": sid, "text": "from a"}),
                                   b.request("agent.prompt", {"sessionId": sid, "text": "from b"}))
    won = [x for x in answers if "result" in x]
    lost = [x for x in answers if "error" in x]
    assert len(won) == 1 and [x["error"]["data"]["code"] for x in lost] == ["AGENT_BUSY"]
    served.provider.release("race")
    await a.turn_ended(won[0]["result"]["turnId"])
    assert len((await a.call("session.turns", {"sessionId": sid}))["turns"]) == 1


async def test_back_to_back_messages_are_not_held_back_by_nagle(served):
    c = await served.ws()
    gaps = []
    for i in range(8):
        await c.send_raw(f'{{"jsonrpc":"2.0","id":"a{i}","method":"host.status"}}')
        await c.send_raw(f'{{"jsonrpc":"2.0","id":"b{i}","method":"host.status"}}')
        await c.reply()
        first = time.perf_counter()
        await c.reply()
        gaps.append(time.perf_counter() - first)
    assert sorted(gaps)[len(gaps) // 2] < 0.02, gaps  # a median gap of 20 ms is an eternity on loopback
