"""Races through the real server: requests that arrive together over the wire.

Authority hole 1: `[plans.resolve(approve), agent.abort]` as one POST batch, or as two
racing requests, left the approval's execution `queued` forever and the session
answering AGENT_BUSY to prompt, setMode and delete until a restart.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.scenario import submit_plan


async def _pending_plan(served: Any, ws: Any) -> tuple[str, dict[str, Any]]:
    s = await served.call("session.create", {"projectPath": str(served.project), "mode": "plan"})
    served.provider.enqueue(s["id"], submit_plan(), {"text": "executed"})
    await served.call("agent.prompt", {"sessionId": s["id"], "text": "plan it"})
    requested = await ws.event("plan.requested", lambda e: e["approval"]["sessionId"] == s["id"])
    return s["id"], requested["approval"]


def _approve(sid: str, approval: dict[str, Any]) -> dict[str, Any]:
    return {"approvalId": approval["id"], "sessionId": sid, "turnId": approval["turnId"],
            "decision": "approve", "permissionMode": "ask"}


async def _usable(served: Any, ws: Any, sid: str) -> None:
    """The session takes a configuration change and a prompt whose turn completes, then deletes."""
    async with asyncio.timeout(10):
        while (await served.call("session.get", {"sessionId": sid}))["session"]["status"] != "idle":
            await ws.event("session.updated", lambda e: e["session"]["id"] == sid)
    await served.call("session.setMode", {"sessionId": sid, "mode": "agent"})
    served.provider.enqueue(sid, {"text": "alive"})
    turn = await served.call("agent.prompt", {"sessionId": sid, "text": "still there?"})
    assert (await ws.turn_ended(turn["turnId"]))["reason"] == "completed"
    assert await served.call("session.delete", {"sessionId": sid}) == {}


@pytest.mark.asyncio
async def test_approve_then_abort_in_one_post_batch_leaves_the_session_usable(served: Any) -> None:
    """Authority hole 1, the batch: approve and abort in one POST; the execution is aborted, not
    stranded in `queued`, and the session takes prompts, setMode and delete at once."""
    ws = await served.ws()
    sid, approval = await _pending_plan(served, ws)
    answers = (await served.post([
        {"jsonrpc": "2.0", "id": 1, "method": "plans.resolve", "params": _approve(sid, approval)},
        {"jsonrpc": "2.0", "id": 2, "method": "agent.abort", "params": {"sessionId": sid}},
    ])).json()
    by_id = {a["id"]: a for a in answers}
    assert by_id[1]["result"]["status"] == "approved" and by_id[2]["result"]["aborted"] is True
    (row,) = (await served.call("plans.list", {"sessionId": sid}))["approvals"]
    assert row["executionState"] == "aborted"
    await _usable(served, ws, sid)


@pytest.mark.asyncio
async def test_approve_and_abort_as_racing_requests_never_wedge_the_session(served: Any) -> None:
    """Authority hole 1, the race: 20 rounds of approve and abort sent at once on two connections
    (12 of 20 wedged before); whichever wins, the session ends usable."""
    ws = await served.ws()
    for _ in range(20):
        sid, approval = await _pending_plan(served, ws)
        approve = served.post({"jsonrpc": "2.0", "id": 1, "method": "plans.resolve",
                               "params": _approve(sid, approval)})
        abort = served.post({"jsonrpc": "2.0", "id": 2, "method": "agent.abort", "params": {"sessionId": sid}})
        approved, _aborted = await asyncio.gather(approve, abort)
        answer = approved.json()
        if "error" in answer:
            assert answer["error"]["data"]["code"] in ("PLAN_ALREADY_RESOLVED", "PLAN_APPROVAL_STALE"), answer
        await _usable(served, ws, sid)
