"""Authority holes 1 and 2: nothing may leave a session unable to take a prompt, and no
unattended turn waits for a person.

Each test names the hole it closes and failed on the code before the fix.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from pidesk.core.errors import PideskError, StoreError
from pidesk.core.modes import TurnOrigin
from pidesk.host import Host
from pidesk.providers.scripted import ScriptedProvider
from tests.scenario import ended, plan_requested, prompt, session, state, submit_plan


async def _awaiting_approval(host: Host, provider: ScriptedProvider, project: Path) -> tuple[str, Any, Any]:
    sid = (await session(host, project, mode="plan"))["id"]
    provider.enqueue(sid, submit_plan(), {"text": "executed"})
    sub = host.subscribe()
    await prompt(host, sid)
    approval = (await plan_requested(sub)).approval
    return sid, approval, sub


def _approve(sid: str, approval: Any, permission: str = "ask") -> dict[str, Any]:
    return {"approvalId": approval.id, "sessionId": sid, "turnId": approval.turn_id,
            "decision": "approve", "permissionMode": permission}


async def _takes_a_prompt(host: Host, provider: ScriptedProvider, sid: str, sub: Any) -> None:
    """The session is idle, accepts configuration and a prompt, and that prompt's turn runs."""
    got = await state(host, sid)
    assert got["session"]["status"] == "idle" and got["pendingApproval"] is None
    plans = (await host.call("plans.list", {"sessionId": sid}))["approvals"]
    assert not [a for a in plans if a["executionState"] in ("queued", "running")], plans
    await host.call("session.setPermissionMode", {"sessionId": sid, "permissionMode": "ask"})
    provider.enqueue(sid, {"text": "still alive"})
    turn = await prompt(host, sid, "are you there?")
    assert (await ended(sub, turn["turnId"])).reason == "completed"


@pytest.mark.asyncio
async def test_approve_and_abort_in_one_batch_leave_the_session_able_to_take_a_prompt(
        host: Host, provider: ScriptedProvider, project: Path) -> None:
    """Authority hole 1: `[plans.resolve(approve), agent.abort]` in one batch left the execution
    `queued` forever; prompt, setMode and delete answered AGENT_BUSY until a restart."""
    sid, approval, sub = await _awaiting_approval(host, provider, project)
    approved, aborted = await asyncio.gather(
        host.call("plans.resolve", _approve(sid, approval)),
        host.call("agent.abort", {"sessionId": sid}),
    )
    assert approved["status"] == "approved" and aborted["aborted"] is True
    (row,) = (await host.call("plans.list", {"sessionId": sid}))["approvals"]
    assert row["executionState"] == "aborted", "an aborted approval's execution must not stay queued"
    assert provider.calls(sid) == 1, "the execution ran although the user aborted it"
    assert (await state(host, sid))["session"]["mode"] == "agent"
    await _takes_a_prompt(host, provider, sid, sub)


@pytest.mark.asyncio
async def test_approve_and_abort_racing_as_separate_requests_never_wedge(
        host: Host, provider: ScriptedProvider, project: Path) -> None:
    """Authority hole 1: the two as racing requests (12 of 20 runs wedged). Every interleaving of
    the abort with the approval's wake-up leaves the session idle and able to take a prompt."""
    for passes in range(4):  # the abort lands 0, 1, 2, 3 loop passes after the approval
        sid, approval, sub = await _awaiting_approval(host, provider, project)
        resolving = asyncio.ensure_future(host.call("plans.resolve", _approve(sid, approval)))
        for _ in range(passes):
            await asyncio.sleep(0)
        await host.call("agent.abort", {"sessionId": sid})
        try:
            await resolving
        except PideskError as exc:  # the abort settled the approval first
            assert exc.code in ("PLAN_ALREADY_RESOLVED", "PLAN_APPROVAL_STALE"), exc
        await asyncio.gather(*host.turns._tasks)
        (row,) = (await host.call("plans.list", {"sessionId": sid}))["approvals"]
        assert (row["status"], row["executionState"]) in (
            ("interrupted", "none"), ("approved", "aborted"), ("approved", "completed")), (passes, row)
        await _takes_a_prompt(host, provider, sid, sub)


@pytest.mark.asyncio
async def test_an_execution_that_cannot_start_is_interrupted_not_left_queued(
        host: Host, provider: ScriptedProvider, project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Authority hole 1, the dispatcher's side: when the store refused the execution turn's row,
    the execution stayed `queued` with nothing left to dispatch it, and the session stayed busy."""
    sid, approval, sub = await _awaiting_approval(host, provider, project)
    start = host.turns.start

    async def refused(session_id: str, content: Any, **kw: Any) -> tuple[str, str]:
        if kw.get("origin") is TurnOrigin.EXECUTION:
            raise StoreError("disk full (injected)")
        return await start(session_id, content, **kw)

    monkeypatch.setattr(host.turns, "start", refused)
    await host.call("plans.resolve", _approve(sid, approval))
    await ended(sub, approval.turn_id)
    (row,) = (await host.call("plans.list", {"sessionId": sid}))["approvals"]
    assert row["executionState"] == "interrupted"
    monkeypatch.setattr(host.turns, "start", start)
    await _takes_a_prompt(host, provider, sid, sub)


CONTRACT_TOOLS = ("EnterPlanMode", "EnterGoalMode", "SubmitPlan", "SubmitGoal")


@pytest.mark.asyncio
async def test_a_scheduled_run_whose_model_wants_to_plan_ends_by_itself_in_agent_mode(
        make_host: Any, project: Path) -> None:
    """Authority hole 2: an Agent-mode schedule whose model called EnterPlanMode left a new session
    awaiting an approval nobody could give, every minute. Unattended, every contract tool answers
    PLAN_REQUIRES_INTERACTIVE_SESSION, the mode stays Agent, and the run ends on its own."""
    submit = submit_plan()["toolCalls"][0]
    provider = ScriptedProvider([
        {"toolCalls": [{"name": "EnterPlanMode", "args": {}}]},
        {"toolCalls": [{"name": "EnterGoalMode", "args": {}}]},
        {"toolCalls": [submit]},
        {"toolCalls": [{"name": "SubmitGoal", "args": {**submit["args"], "criteria": ["c1"]}}]},
        {"text": "done without a plan"},
    ])
    host = make_host(provider=provider)
    created = await host.call("schedules.create", {"name": "every minute", "cron": "* * * * *",
                                                   "projectPath": str(project), "prompt": "tidy up"})
    sub = host.subscribe()
    run = await host.call("schedules.runNow", {"scheduleId": created["id"]})
    end = await ended(sub, run["turnId"])
    assert (end.reason, end.error_code) == ("completed", None)
    sid = run["sessionId"]
    got = await state(host, sid)
    assert got["session"]["mode"] == "agent" and got["pendingApproval"] is None
    results = [b for m in got["messages"] for b in m["content"] if b["type"] == "toolResult"]
    assert [(r["name"], r["errorCode"]) for r in results] == [
        (name, "PLAN_REQUIRES_INTERACTIVE_SESSION") for name in CONTRACT_TOOLS]
    assert "nobody can approve" in results[0]["output"]
    assert (await host.call("plans.list", {"sessionId": sid}))["approvals"] == []
    assert not (project / ".pi").exists(), "an unattended run wrote a contract artifact"
    offered = {spec["name"] for spec in provider.requests[0].tools}
    assert offered.isdisjoint(CONTRACT_TOOLS), "an unattended turn was offered the contract tools"
