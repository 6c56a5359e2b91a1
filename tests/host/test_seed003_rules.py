"""Seed 003 §3: one test per transition rule, through a real Host and store."""

from __future__ import annotations

from pathlib import Path

import pytest

from pidesk.core import events as ev
from pidesk.core.errors import PideskError
from tests.scenario import (
    ended,
    permission_requested,
    plan_requested,
    prompt,
    session,
    state,
    submit_goal,
    submit_plan,
    tool,
    tool_results,
)

pytestmark = pytest.mark.asyncio


async def test_rule01_only_one_active_turn_per_session(host, provider, project):
    s = await session(host, project)
    provider.enqueue(s["id"], {"gate": "hold"})
    await prompt(host, s["id"])
    await provider.wait_reached("hold")
    with pytest.raises(PideskError):
        await prompt(host, s["id"], "again")
    status = await host.call("host.status", {})
    assert status["running"] == 1
    running = [t for t in (await host.call("session.turns", {"sessionId": s["id"]}))["turns"] if t["state"] == "running"]
    assert len(running) == 1
    provider.release("hold")


async def test_rule02_direct_prompt_busy_while_waiting_permission_but_queue_push_is_accepted(host, provider, project):
    s = await session(host, project)
    sub = host.subscribe()
    provider.enqueue(s["id"], tool("Bash", command="true"), {"text": "first done"}, {"text": "queued done"})
    first = await prompt(host, s["id"])
    req = (await permission_requested(sub)).request
    with pytest.raises(PideskError) as busy:
        await prompt(host, s["id"], "now")
    assert busy.value.code == "AGENT_BUSY"
    pushed = await host.call("agent.queue.push", {"sessionId": s["id"], "text": "later"})
    assert pushed["position"] == 1
    await host.call("permissions.resolve", {"requestId": req.id, "sessionId": s["id"], "turnId": first["turnId"],
                                            "decision": "allow"})
    await ended(sub, first["turnId"])
    queued = await sub.wait_for(lambda e: isinstance(e, ev.TurnStarted))
    assert queued.origin == "queued"
    await ended(sub, queued.turn_id)
    assert (await host.call("agent.queue.list", {"sessionId": s["id"]}))["entries"] == []


async def test_rule03_graceful_stop_completes_the_boundary_before_the_queue_is_released(host, provider, project):
    s = await session(host, project)
    sub = host.subscribe()
    provider.enqueue(s["id"], {"gateAfter": "mid", "text": "streaming",
                               "toolCalls": [{"name": "Read", "args": {"path": "README.md"}}]},
                     {"text": "queued answer"})
    first = await prompt(host, s["id"])
    await provider.wait_reached("mid")
    await host.call("agent.queue.push", {"sessionId": s["id"], "text": "next"})
    await host.call("agent.stop", {"sessionId": s["id"]})
    provider.release("mid")
    end = await ended(sub, first["turnId"])
    assert end.reason == "completed"
    messages = (await state(host, s["id"]))["messages"]
    assert tool_results(messages, "Read")[0]["ok"] is True  # the tool boundary completed
    queued = await sub.wait_for(lambda e: isinstance(e, ev.TurnStarted))
    await ended(sub, queued.turn_id)
    assert [m["role"] for m in (await state(host, s["id"]))["messages"]] == \
        ["user", "assistant", "tool", "user", "assistant"]


async def test_rule04_smart_stop_restores_the_draft_before_output_and_keeps_partial_output_after(
        host, provider, project):
    s = await session(host, project)
    sid = s["id"]
    provider.enqueue(sid, {"gate": "before"}, {"gateAfter": "after", "text": "partial answer"})
    sub = host.subscribe()
    attachment = await host.call("attachments.put", {"name": "notes.txt", "mime": "text/plain",
                                                     "data": "bm90ZXMgb24gd29yaw=="})
    await host.call("agent.prompt", {"sessionId": sid, "text": "draft text", "attachments": [attachment]})
    await provider.wait_reached("before")
    aborted = await host.call("agent.abort", {"sessionId": sid, "smart": True})
    assert aborted == {"aborted": True, "restoredDraft": {"text": "draft text", "attachments": [attachment]}}
    assert (await state(host, sid))["messages"] == []
    assert [(e.session_id, e.from_seq) for _, e in sub.pending() if isinstance(e, ev.SessionTruncated)] == [(sid, 1)]
    assert (await host.call("session.turns", {"sessionId": sid}))["turns"][-1]["reason"] == "aborted"
    # once output has begun, abort keeps the partial transcript and restores nothing
    await prompt(host, sid, "second")
    await provider.wait_reached("after")
    aborted = await host.call("agent.abort", {"sessionId": sid, "smart": True})
    assert aborted == {"aborted": True}
    assert [m["role"] for m in (await state(host, sid))["messages"]] == ["user"]


async def test_rule04_abort_from_waiting_permission_interrupts_the_request(host, provider, project):
    s = await session(host, project)
    sub = host.subscribe()
    provider.enqueue(s["id"], tool("Bash", command="echo never > never.txt"))
    turn = await prompt(host, s["id"])
    req = (await permission_requested(sub)).request
    assert (await host.call("agent.abort", {"sessionId": s["id"]}))["aborted"] is True
    assert (await host.call("permissions.pending", {}))["requests"] == []
    result = tool_results((await state(host, s["id"]))["messages"], "Bash")[0]
    assert result["errorCode"] == "TOOL_ABORTED"
    assert not (project / "never.txt").exists()
    with pytest.raises(PideskError) as late:
        await host.call("permissions.resolve", {"requestId": req.id, "sessionId": s["id"], "turnId": turn["turnId"],
                                                "decision": "allow"})
    assert late.value.code == "TURN_ENDED"


async def test_rule05_denied_permission_becomes_tool_denied_and_the_agent_continues(host, provider, project):
    s = await session(host, project)
    sub = host.subscribe()
    provider.enqueue(s["id"], tool("Write", path="x.txt", content="x"), {"text": "ok, I will not write"})
    turn = await prompt(host, s["id"])
    req = (await permission_requested(sub)).request
    await host.call("permissions.resolve", {"requestId": req.id, "sessionId": s["id"], "turnId": turn["turnId"],
                                            "decision": "deny"})
    end = await ended(sub, turn["turnId"])
    messages = (await state(host, s["id"]))["messages"]
    assert tool_results(messages, "Write")[0]["errorCode"] == "TOOL_DENIED"
    assert messages[-1]["content"][0]["text"] == "ok, I will not write"
    assert end.reason == "completed" and not (project / "x.txt").exists()


async def test_rule06_session_is_idle_once_the_terminal_state_is_persisted(host, provider, project):
    s = await session(host, project)
    sub = host.subscribe()
    provider.enqueue(s["id"], {"error": "PROVIDER_ERROR"})
    turn = await prompt(host, s["id"])
    end = await ended(sub, turn["turnId"])
    assert (end.reason, end.error_code) == ("error", "PROVIDER_ERROR")
    got = await state(host, s["id"])
    assert (got["session"]["status"], got["session"]["currentTurnId"]) == ("idle", None)
    row = (await host.call("session.turns", {"sessionId": s["id"]}))["turns"][-1]
    assert (row["state"], row["reason"], row["errorCode"]) == ("ended", "error", "PROVIDER_ERROR")


async def test_rule07_changing_focus_neither_transitions_nor_aborts_a_background_session(host, provider, project):
    background, other = await session(host, project), await session(host, project)
    await host.call("session.focus", {"sessionId": background["id"]})
    provider.enqueue(background["id"], {"gate": "hold", "text": "done"})
    sub = host.subscribe()
    turn = await prompt(host, background["id"])
    await provider.wait_reached("hold")
    await host.call("session.focus", {"sessionId": other["id"]})
    assert (await state(host, background["id"]))["session"]["status"] == "running"
    provider.release("hold")
    assert (await ended(sub, turn["turnId"])).reason == "completed"
    notes = (await host.call("notifications.list", {}))["notifications"]
    assert [n["turnId"] for n in notes] == [turn["turnId"]]  # it finished unseen


async def test_rule08_tools_keep_the_originating_root_and_temporary_sessions_use_scratch(host, provider, project, tmp_path):
    scratch = await session(host)
    assert scratch["projectPath"] is None
    assert Path(scratch["root"]) == host.store.data_dir / "scratch" / scratch["id"]
    other = tmp_path / "other"
    other.mkdir()
    sub = host.subscribe()
    await host.call("session.setPermissionMode", {"sessionId": scratch["id"], "permissionMode": "auto"})
    provider.enqueue(scratch["id"], {"gate": "hold", "toolCalls": [{"name": "Write", "args": {"path": "f.txt", "content": "s"}}]})
    turn = await prompt(host, scratch["id"])
    await provider.wait_reached("hold")
    active = await session(host, other)
    await host.call("session.focus", {"sessionId": active["id"]})
    provider.release("hold")
    await ended(sub, turn["turnId"])
    assert (Path(scratch["root"]) / "f.txt").read_text() == "s"
    assert not (other / "f.txt").exists() and not (project / "f.txt").exists()
    with pytest.raises(PideskError) as refused:
        await host.call("session.setMode", {"sessionId": scratch["id"], "mode": "plan"})
    assert refused.value.code == "PLAN_WORKSPACE_REQUIRED"


async def test_rule09_terminal_update_is_once_with_its_notification(host, provider, project):
    s = await session(host, project)
    sub = host.subscribe()
    provider.enqueue(s["id"], {"text": "done"})
    turn = await prompt(host, s["id"])
    await ended(sub, turn["turnId"])
    live = host.parts.live
    assert s["id"] not in live.turns
    from pidesk.host.live import LiveTurn
    from pidesk.core.modes import TurnOrigin
    from pidesk.runtime.loop import Failed
    stale = LiveTurn(session_id=s["id"], turn_id=turn["turnId"], origin=TurnOrigin.INTERACTIVE, unattended=False)
    await host.turns.finish(stale, Failed("PROVIDER_ERROR"))  # a repeated terminal call
    row = (await host.call("session.turns", {"sessionId": s["id"]}))["turns"][-1]
    assert (row["reason"], row["errorCode"]) == ("completed", None)
    notes = (await host.call("notifications.list", {}))["notifications"]
    assert [(n["turnId"], n["kind"]) for n in notes] == [(turn["turnId"], "task.completed")]


async def test_rule10_fork_only_while_idle_and_no_partial_child(host, provider, project):
    s = await session(host, project, mode="plan")
    sub = host.subscribe()
    provider.enqueue(s["id"], submit_plan())
    turn = await prompt(host, s["id"])
    approval = (await plan_requested(sub)).approval
    with pytest.raises(PideskError) as busy:
        await host.call("session.fork", {"sessionId": s["id"]})
    assert busy.value.code == "AGENT_BUSY"
    assert len((await host.call("session.list", {}))["sessions"]) == 1
    await host.call("plans.resolve", {"approvalId": approval.id, "sessionId": s["id"], "turnId": turn["turnId"],
                                      "decision": "reject"})
    await ended(sub, turn["turnId"])
    child = await host.call("session.fork", {"sessionId": s["id"]})
    assert (child["status"], child["mode"], child["planState"]) == ("idle", "plan", "planning")


async def test_rule11_through_message_changes_only_the_boundary(host, provider, project):
    s = await session(host, project)
    sub = host.subscribe()
    provider.enqueue(s["id"], {"text": "a"}, {"text": "b"})
    await ended(sub, (await prompt(host, s["id"], "1"))["turnId"])
    await ended(sub, (await prompt(host, s["id"], "2"))["turnId"])
    source = (await state(host, s["id"]))["messages"]
    whole = await host.call("session.fork", {"sessionId": s["id"]})
    scoped = await host.call("session.fork", {"sessionId": s["id"], "throughMessageId": source[2]["id"]})
    assert len((await state(host, whole["id"]))["messages"]) == 4
    assert [m["seq"] for m in (await state(host, scoped["id"]))["messages"]] == [1, 2, 3]
    assert whole["id"] != scoped["id"] and scoped["forkedFrom"]["throughMessageId"] == source[2]["id"]
    # the child runs its own turn; the source is untouched
    provider.enqueue(scoped["id"], {"text": "child"})
    await ended(sub, (await prompt(host, scoped["id"], "3"))["turnId"])
    assert (await state(host, s["id"]))["messages"] == source
    with pytest.raises(PideskError) as missing:
        await host.call("session.fork", {"sessionId": s["id"], "throughMessageId": "m_nope"})
    assert missing.value.code == "NOT_FOUND"


async def test_rule12_exclusive_tools_alone_in_batch_and_kind_mismatch_writes_nothing(host, provider, project):
    s = await session(host, project, mode="plan")
    sub = host.subscribe()
    provider.enqueue(s["id"], {"toolCalls": [
        {"name": "Read", "args": {"path": "README.md"}},
        {"name": "SubmitPlan", "args": {"title": "t", "markdown": "m", "question": "q"}},
    ]}, tool("SubmitGoal", title="t", markdown="m", question="q", criteria=["c"]), {"text": "ok"})
    await ended(sub, (await prompt(host, s["id"]))["turnId"])
    got = tool_results((await state(host, s["id"]))["messages"])
    assert [(r["name"], r["errorCode"]) for r in got] == [
        ("Read", "TOOL_BATCH_EXCLUSIVE"), ("SubmitPlan", "TOOL_BATCH_EXCLUSIVE"), ("SubmitGoal", "PLAN_KIND_MISMATCH")]
    assert not (project / ".pi").exists()
    assert (await host.call("plans.list", {"sessionId": s["id"]}))["approvals"] == []


async def test_rule13_only_a_matching_resolve_settles_and_approval_is_atomic(host, provider, project):
    s = await session(host, project, mode="plan")
    other = await session(host, project)
    sub = host.subscribe()
    provider.enqueue(s["id"], submit_plan(), {"text": "executing"})
    turn = await prompt(host, s["id"])
    approval = (await plan_requested(sub)).approval
    base = {"approvalId": approval.id, "decision": "approve", "permissionMode": "auto"}
    for wrong in ({"sessionId": other["id"], "turnId": turn["turnId"]}, {"sessionId": s["id"], "turnId": "t_other"}):
        with pytest.raises(PideskError) as stale:
            await host.call("plans.resolve", {**base, **wrong})
        assert stale.value.code == "PLAN_APPROVAL_STALE"
    with pytest.raises(PideskError) as unknown:
        await host.call("plans.resolve", {**base, "approvalId": "pa_nope", "sessionId": s["id"], "turnId": turn["turnId"]})
    assert unknown.value.code == "PLAN_NOT_FOUND"
    with pytest.raises(PideskError) as no_mode:
        await host.call("plans.resolve", {"approvalId": approval.id, "sessionId": s["id"], "turnId": turn["turnId"],
                                          "decision": "approve"})
    assert no_mode.value.code == "PLAN_PERMISSION_MODE_REQUIRED"
    with pytest.raises(PideskError) as bad_mode:
        await host.call("plans.resolve", {**base, "sessionId": s["id"], "turnId": turn["turnId"], "permissionMode": "yolo"})
    assert bad_mode.value.code == "PLAN_PERMISSION_MODE_INVALID"
    assert (await host.call("plans.get", {"approvalId": approval.id}))["status"] == "pending"
    approved = await host.call("plans.resolve", {**base, "sessionId": s["id"], "turnId": turn["turnId"]})
    assert (approved["status"], approved["permissionMode"], approved["executionState"]) == ("approved", "auto", "queued")
    assert approved["executionId"]
    session_now = (await state(host, s["id"]))["session"]
    assert (session_now["mode"], session_now["permissionMode"]) == ("agent", "auto")
    audit = [e["action"] for e in (await host.call("audit.list", {"sessionId": s["id"]}))["entries"]]
    assert "plan.approved" in audit and "mode.changed" in audit


@pytest.mark.parametrize("outcome", ["reject", "expire", "abort"])
async def test_rule14_reject_expiry_and_interruption_return_to_planning_in_the_same_mode(
        make_host, provider, project, outcome):
    host = make_host(approval_timeout=0.05 if outcome == "expire" else 60)
    s = await session(host, project, mode="goal")
    sub = host.subscribe()
    provider.enqueue(s["id"], submit_goal(["c1"]), tool("Write", path="w.txt", content="x"), {"text": "k"})
    turn = await prompt(host, s["id"])
    approval = (await plan_requested(sub)).approval
    if outcome == "reject":
        await host.call("plans.resolve", {"approvalId": approval.id, "sessionId": s["id"], "turnId": turn["turnId"],
                                          "decision": "reject", "feedback": "no"})
    elif outcome == "abort":
        await host.call("agent.abort", {"sessionId": s["id"]})
    await ended(sub, turn["turnId"])
    got = await state(host, s["id"])
    assert (got["session"]["mode"], got["session"]["planState"], got["session"]["status"]) == ("goal", "planning", "idle")
    expected = {"reject": "rejected", "expire": "expired", "abort": "interrupted"}[outcome]
    assert (await host.call("plans.get", {"approvalId": approval.id}))["status"] == expected
    code = tool_results(got["messages"], "SubmitGoal")[0]["errorCode"]
    assert code == {"reject": "PLAN_REJECTED", "expire": "PLAN_APPROVAL_TIMEOUT", "abort": "PLAN_APPROVAL_INTERRUPTED"}[outcome]
    await ended(sub, (await prompt(host, s["id"], "try writing"))["turnId"])
    assert tool_results((await state(host, s["id"]))["messages"], "Write")[0]["errorCode"] == "WRITE_DISABLED_IN_PLAN"


async def test_rule15_busy_session_refuses_prompt_submission_and_configuration(host, provider, project):
    s = await session(host, project, mode="plan")
    sub = host.subscribe()
    provider.enqueue(s["id"], submit_plan())
    await prompt(host, s["id"])
    await plan_requested(sub)
    calls = [
        ("agent.prompt", {"text": "more"}), ("session.setMode", {"mode": "agent"}),
        ("session.setPermissionMode", {"permissionMode": "auto"}), ("session.delete", {}), ("session.fork", {}),
    ]
    for method, params in calls:
        with pytest.raises(PideskError) as busy:
            await host.call(method, {"sessionId": s["id"], **params})
        assert busy.value.code == "AGENT_BUSY", method
    assert (await state(host, s["id"]))["session"]["mode"] == "plan"


async def test_rule16_a_revision_is_a_new_immutable_artifact(host, provider, project):
    s = await session(host, project, mode="plan")
    sub = host.subscribe()
    provider.enqueue(s["id"], submit_plan(markdown="v1\n"), submit_plan(markdown="v2\n"))
    first_turn = await prompt(host, s["id"])
    first = (await plan_requested(sub)).approval
    await host.call("plans.resolve", {"approvalId": first.id, "sessionId": s["id"], "turnId": first_turn["turnId"],
                                      "decision": "reject", "feedback": "shorter"})
    await ended(sub, first_turn["turnId"])
    await prompt(host, s["id"], "revise")
    second = (await plan_requested(sub)).approval
    assert second.revises == first.id and second.artifact_path != first.artifact_path
    assert (project / first.artifact_path).read_text() == "v1\n"
    assert (project / second.artifact_path).read_text() == "v2\n"
    await host.call("agent.abort", {"sessionId": s["id"]})


async def test_rule17_terminal_provider_error_returns_the_session_to_idle_so_continue_is_accepted(
        host, provider, project):
    s = await session(host, project)
    sub = host.subscribe()
    provider.enqueue(s["id"], {"text": "partial", "error": "STREAM_FAILED"}, {"text": "continued"})
    turn = await prompt(host, s["id"])
    end = await ended(sub, turn["turnId"])
    assert (end.reason, end.error_code) == ("error", "STREAM_FAILED")
    assert (await state(host, s["id"]))["session"]["status"] == "idle"
    again = await prompt(host, s["id"], "continue")
    assert (await ended(sub, again["turnId"])).reason == "completed"
    assert (await state(host, s["id"]))["messages"][1]["content"][0]["text"] == "partial"


async def test_rule15_an_executing_contract_cannot_enter_a_new_contract_mode(host, provider, project):
    s = await session(host, project, mode="plan")
    sub = host.subscribe()
    provider.enqueue(s["id"], submit_plan(), tool("EnterGoalMode"), {"text": "carrying on"})
    turn = await prompt(host, s["id"])
    approval = (await plan_requested(sub)).approval
    await host.call("plans.resolve", {"approvalId": approval.id, "sessionId": s["id"], "turnId": turn["turnId"],
                                      "decision": "approve", "permissionMode": "ask"})
    execution = await sub.wait_for(lambda e: isinstance(e, ev.TurnStarted) and e.origin == "execution")
    await ended(sub, execution.turn_id)
    assert tool_results((await state(host, s["id"]))["messages"], "EnterGoalMode")[0]["errorCode"] == "PLAN_ALREADY_ACTIVE"
    assert (await state(host, s["id"]))["session"]["mode"] == "agent"
