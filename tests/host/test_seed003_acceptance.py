"""Seed 003 §5: one test per acceptance item, through a real Host and store."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from pidesk.core import events as ev
from pidesk.core.errors import PideskError
from pidesk.providers.scripted import ScriptedProvider
from tests.conftest import HostFactory
from tests.scenario import die, ended, permission_requested, plan_requested, prompt, session, state, submit_goal, submit_plan, tool

pytestmark = pytest.mark.asyncio


async def test_acceptance01_busy_session_cannot_start_a_second_concurrent_turn(host, provider, project):
    s = await session(host, project)
    provider.enqueue(s["id"], {"gate": "hold", "text": "working"})
    first = await prompt(host, s["id"])
    await provider.wait_reached("hold")
    with pytest.raises(PideskError) as busy:
        await prompt(host, s["id"], "second")
    assert busy.value.code == "AGENT_BUSY"
    turns = (await host.call("session.turns", {"sessionId": s["id"]}))["turns"]
    assert [t["id"] for t in turns] == [first["turnId"]]
    provider.release("hold")


async def test_acceptance02_abort_is_idempotent(host, provider, project):
    s = await session(host, project)
    provider.enqueue(s["id"], {"gate": "hold"})
    sub = host.subscribe()
    started = await prompt(host, s["id"])
    await provider.wait_reached("hold")
    first = await host.call("agent.abort", {"sessionId": s["id"]})
    second = await host.call("agent.abort", {"sessionId": s["id"]})
    assert first == {"aborted": True} and second == {"aborted": False}
    turn = (await host.call("session.turns", {"sessionId": s["id"]}))["turns"][-1]
    assert (turn["id"], turn["state"], turn["reason"]) == (started["turnId"], "ended", "aborted")
    endings = [e for _, e in sub.pending() if isinstance(e, ev.TurnEnded)]
    assert len(endings) == 1
    assert (await state(host, s["id"]))["session"]["status"] == "idle"


async def test_acceptance03_waiting_permission_is_visible_in_status(host, provider, project):
    s = await session(host, project)
    provider.enqueue(s["id"], tool("Bash", command="echo hi"))
    sub = host.subscribe()
    await prompt(host, s["id"])
    requested = await permission_requested(sub)
    got = await state(host, s["id"])
    assert got["session"]["status"] == "waiting_permission"
    assert [r["id"] for r in got["pendingPermissions"]] == [requested.request.id]
    updates = [e for _, e in sub.pending() if isinstance(e, ev.SessionUpdated)]
    assert updates == [] or updates[-1].session.status == "waiting_permission"
    await host.call("permissions.resolve", {"requestId": requested.request.id, "sessionId": s["id"],
                                            "turnId": requested.request.turn_id, "decision": "allow"})
    await ended(sub)
    assert (await state(host, s["id"]))["session"]["status"] == "idle"


async def test_acceptance04_sessions_in_two_projects_run_without_crossover(host, provider, tmp_path):
    roots = [tmp_path / "alpha", tmp_path / "beta"]
    for root in roots:
        root.mkdir()
    a, b = [await session(host, root) for root in roots]
    for s, gate in ((a, "ga"), (b, "gb")):
        provider.enqueue(s["id"], {"gate": gate, "toolCalls": [{"name": "Write", "args": {
            "path": "out.txt", "content": s["id"]}}]}, {"text": "done"})
        await host.call("session.setPermissionMode", {"sessionId": s["id"], "permissionMode": "auto"})
    sub = host.subscribe()
    ta, tb = await prompt(host, a["id"]), await prompt(host, b["id"])
    await provider.wait_reached("ga")
    await provider.wait_reached("gb")
    provider.release("gb")
    await ended(sub, tb["turnId"])
    assert (await state(host, a["id"]))["session"]["status"] == "running"
    provider.release("ga")
    await ended(sub, ta["turnId"])
    assert (roots[0] / "out.txt").read_text() == a["id"]
    assert (roots[1] / "out.txt").read_text() == b["id"]
    for s, t in ((a, ta), (b, tb)):
        messages = (await state(host, s["id"]))["messages"]
        assert {m["turnId"] for m in messages} == {t["turnId"]}


async def test_acceptance05_one_notification_per_unseen_terminal_turn_none_for_visible_or_aborted(
        host, provider, project):
    s = await session(host, project)
    sub = host.subscribe()
    provider.enqueue(s["id"], {"text": "ok"}, {"error": "PROVIDER_ERROR"}, {"text": "seen"}, {"gate": "hold"})
    done = await prompt(host, s["id"])
    await ended(sub, done["turnId"])
    failed = await prompt(host, s["id"])
    await ended(sub, failed["turnId"])
    await host.call("session.focus", {"sessionId": s["id"]})
    visible = await prompt(host, s["id"])
    await ended(sub, visible["turnId"])
    await host.call("session.focus", {"sessionId": None})
    aborted = await prompt(host, s["id"])
    await provider.wait_reached("hold")
    await host.call("agent.abort", {"sessionId": s["id"]})
    notes = (await host.call("notifications.list", {}))["notifications"]
    assert [(n["turnId"], n["kind"]) for n in notes] == [
        (done["turnId"], "task.completed"), (failed["turnId"], "task.failed")]
    assert aborted["turnId"] not in {n["turnId"] for n in notes}


async def test_acceptance06_idle_fork_is_independent_and_busy_source_makes_no_child(host, provider, project):
    s = await session(host, project)
    sub = host.subscribe()
    provider.enqueue(s["id"], {"text": "first answer"}, {"gate": "hold"})
    await ended(sub, (await prompt(host, s["id"]))["turnId"])
    child = await host.call("session.fork", {"sessionId": s["id"]})
    assert child["id"] != s["id"] and child["status"] == "idle" and child["currentTurnId"] is None
    assert child["forkedFrom"] == {"sessionId": s["id"], "throughMessageId": None}
    assert [m["content"] for m in (await state(host, child["id"]))["messages"]] == \
        [m["content"] for m in (await state(host, s["id"]))["messages"]]
    await prompt(host, s["id"], "again")
    await provider.wait_reached("hold")
    before = (await host.call("session.list", {}))["sessions"]
    with pytest.raises(PideskError) as busy:
        await host.call("session.fork", {"sessionId": s["id"]})
    assert busy.value.code == "AGENT_BUSY"
    assert (await host.call("session.list", {}))["sessions"] == before
    assert len(list((host.store.data_dir / "transcripts").glob("*.jsonl"))) == len(before)
    provider.release("hold")


async def test_acceptance07_message_scoped_fork_excludes_later_rows_and_runtime_state(host, provider, project):
    s = await session(host, project)
    sub = host.subscribe()
    provider.enqueue(s["id"], {"text": "one"}, {"text": "two"})
    await ended(sub, (await prompt(host, s["id"], "q1"))["turnId"])
    await ended(sub, (await prompt(host, s["id"], "q2"))["turnId"])
    messages = (await state(host, s["id"]))["messages"]
    cut = messages[1]
    child = await host.call("session.fork", {"sessionId": s["id"], "throughMessageId": cut["id"]})
    got = await state(host, child["id"])
    assert [m["content"] for m in got["messages"]] == [m["content"] for m in messages[:2]]
    assert got["pendingPermissions"] == [] and got["pendingApproval"] is None and got["queue"] == []
    assert (await host.call("session.turns", {"sessionId": child["id"]}))["turns"] == []
    assert all(m["turnId"] is None for m in got["messages"])


async def test_acceptance08_queue_is_removable_fifo_send_now_stops_at_boundary_abort_keeps_it(
        host, provider, project):
    s = await session(host, project)
    sid = s["id"]
    sub = host.subscribe()
    provider.enqueue(sid, {"gate": "g1", "text": "part one", "toolCalls": [{"name": "Read", "args": {"path": "README.md"}}]},
                     {"text": "from b"}, {"gate": "g2"})
    first = await prompt(host, sid)
    await provider.wait_reached("g1")
    a = await host.call("agent.queue.push", {"sessionId": sid, "text": "a"})
    b = await host.call("agent.queue.push", {"sessionId": sid, "text": "b"})
    c = await host.call("agent.queue.push", {"sessionId": sid, "text": "c"})
    await host.call("agent.queue.remove", {"sessionId": sid, "entryId": a["entryId"]})
    entries = (await host.call("agent.queue.list", {"sessionId": sid}))["entries"]
    assert [e["text"] for e in entries] == ["b", "c"]
    await host.call("agent.queue.sendNow", {"sessionId": sid, "entryId": b["entryId"]})
    provider.release("g1")
    end = await ended(sub, first["turnId"])
    assert end.reason == "completed"
    started = await sub.wait_for(lambda e: isinstance(e, ev.TurnStarted))
    assert started.origin == "queued"
    await ended(sub, started.turn_id)
    started = await sub.wait_for(lambda e: isinstance(e, ev.TurnStarted))
    await provider.wait_reached("g2")
    messages = (await state(host, sid))["messages"]
    assert [m["content"][0]["text"] for m in messages if m["role"] == "user"] == ["go", "b", "c"]
    # the first turn finished its tool boundary (the Read ran) and made no further model call
    assert [m["role"] for m in messages[:5]] == ["user", "assistant", "tool", "user", "assistant"]
    assert messages[4]["content"][0]["text"] == "from b"
    d = await host.call("agent.queue.push", {"sessionId": sid, "text": "d"})
    await host.call("agent.abort", {"sessionId": sid})
    assert [e["id"] for e in (await host.call("agent.queue.list", {"sessionId": sid}))["entries"]] == [d["entryId"]]
    assert (await state(host, sid))["session"]["status"] == "idle"
    assert c["entryId"] != d["entryId"]


async def test_acceptance09_one_agent_ui_and_tool_entry_converge_and_approval_resumes_it(host, provider, project):
    via_ui = await session(host, project)
    await host.call("session.setMode", {"sessionId": via_ui["id"], "mode": "plan"})
    via_tool = await session(host, project)
    sub = host.subscribe()
    provider.enqueue(via_tool["id"], tool("EnterPlanMode", reason="big change"), submit_plan(), {"text": "did it"})
    turn = await prompt(host, via_tool["id"])
    requested = await plan_requested(sub)
    ui_state = (await state(host, via_ui["id"]))["session"]
    tool_state = (await state(host, via_tool["id"]))["session"]
    assert (ui_state["mode"], ui_state["planState"]) == ("plan", "planning")
    assert (tool_state["mode"], tool_state["planState"]) == ("plan", "awaiting_approval")
    await host.call("plans.resolve", {"approvalId": requested.approval.id, "sessionId": via_tool["id"],
                                      "turnId": turn["turnId"], "decision": "approve", "permissionMode": "ask"})
    await ended(sub, turn["turnId"])
    execution = await sub.wait_for(lambda e: isinstance(e, ev.TurnStarted))
    assert (execution.session_id, execution.origin) == (via_tool["id"], "execution")
    await ended(sub, execution.turn_id)
    after = (await state(host, via_tool["id"]))["session"]
    assert (after["mode"], after["planState"], after["permissionMode"]) == ("agent", "inactive", "ask")
    assert len((await host.call("session.list", {}))["sessions"]) == 2


@pytest.mark.parametrize("mode", ["plan", "goal"])
async def test_acceptance10_contract_policy_bash_by_permission_mode_write_edit_denied_despite_auto_and_grants(
        host, provider, project, mode):
    s = await session(host, project)
    sid = s["id"]
    sub = host.subscribe()
    provider.enqueue(sid, tool("Write", path="granted.txt", content="x"), {"text": "ok"})
    await prompt(host, sid)
    request = await permission_requested(sub)
    await host.call("permissions.resolve", {"requestId": request.request.id, "sessionId": sid,
                                            "turnId": request.request.turn_id, "decision": "allow",
                                            "remember": "session"})
    await ended(sub)
    await host.call("session.setMode", {"sessionId": sid, "mode": mode})
    await host.call("session.setPermissionMode", {"sessionId": sid, "permissionMode": "auto"})
    provider.enqueue(sid, {"toolCalls": [
        {"name": "Write", "args": {"path": "blocked.txt", "content": "x"}},
        {"name": "Edit", "args": {"path": "README.md", "oldText": "demo", "newText": "owned"}},
        {"name": "Bash", "args": {"command": "echo auto-ran > bash.txt"}},
    ]}, {"text": "done"})
    await ended(sub, (await prompt(host, sid))["turnId"])
    results = {b["name"]: b for m in (await state(host, sid))["messages"] for b in m["content"]
               if b["type"] == "toolResult" and m["seq"] > 3}
    assert results["Write"]["errorCode"] == "WRITE_DISABLED_IN_PLAN"
    assert results["Edit"]["errorCode"] == "EDIT_DISABLED_IN_PLAN"
    assert results["Bash"]["ok"] is True
    assert not (project / "blocked.txt").exists() and "demo" in (project / "README.md").read_text()
    assert (project / "bash.txt").read_text().strip() == "auto-ran"
    await host.call("session.setPermissionMode", {"sessionId": sid, "permissionMode": "accept-edits"})
    provider.enqueue(sid, tool("Bash", command="echo asked"), {"text": "done"})
    await prompt(host, sid)
    asked = await permission_requested(sub)
    assert asked.request.tool == "Bash"
    await host.call("agent.abort", {"sessionId": sid})


async def test_acceptance11_submit_writes_exact_unique_artifact_and_only_approve_or_reject_resolve(
        host, provider, project):
    s = await session(host, project, mode="plan")
    sid = s["id"]
    markdown = "# Plan\r\n\n1. keep these bytes — exactly ✓\n\n"
    sub = host.subscribe()
    provider.enqueue(sid, submit_plan(markdown=markdown), submit_plan(markdown=markdown))
    first = await prompt(host, sid)
    one = (await plan_requested(sub)).approval
    data = (project / one.artifact_path).read_bytes()
    assert data == markdown.encode()
    assert (one.artifact_sha256, one.artifact_size) == (hashlib.sha256(data).hexdigest(), len(data))
    assert (one.title, one.question, one.kind, one.status) == ("Add notes", "Shall I?", "plan", "pending")
    assert one.artifact_path.startswith(".pi/plan/") and one.artifact_path.endswith(".md")
    resolved = await host.call("plans.resolve", {"approvalId": one.id, "sessionId": sid, "turnId": first["turnId"],
                                                 "decision": "reject", "feedback": "smaller"})
    assert (resolved["status"], resolved["feedback"]) == ("rejected", "smaller")
    with pytest.raises(PideskError) as again:
        await host.call("plans.resolve", {"approvalId": one.id, "sessionId": sid, "turnId": first["turnId"],
                                          "decision": "approve", "permissionMode": "auto"})
    assert again.value.code == "PLAN_ALREADY_RESOLVED"
    await ended(sub, first["turnId"])
    second = await prompt(host, sid)
    two = (await plan_requested(sub)).approval
    assert two.artifact_path != one.artifact_path and two.artifact_sha256 == one.artifact_sha256
    assert two.revises == one.id
    await host.call("agent.abort", {"sessionId": sid})
    assert (await host.call("plans.get", {"approvalId": two.id}))["status"] == "interrupted"
    assert second["turnId"] != first["turnId"]


async def test_acceptance12_expiry_times_out_and_restart_replays_nothing(make_host, provider, project):
    host = make_host(approval_timeout=0.05)
    s = await session(host, project, mode="goal")
    sid = s["id"]
    sub = host.subscribe()
    provider.enqueue(sid, submit_goal(["NOTES.md exists"]), submit_goal(["NOTES.md exists"]), {"text": "never"})
    expired_turn = await prompt(host, sid)
    resolved = await sub.wait_for(lambda e: isinstance(e, ev.PlanResolved))
    assert resolved.approval.status == "expired"
    await ended(sub, expired_turn["turnId"])
    result = [b for m in (await state(host, sid))["messages"] for b in m["content"] if b["type"] == "toolResult"]
    assert result[-1]["errorCode"] == "PLAN_APPROVAL_TIMEOUT"
    assert (await state(host, sid))["session"]["mode"] == "goal"
    # a pending approval, then a crash: the restarted host interrupts it and replays nothing
    crashed = make_host(approval_timeout=60)
    sub2 = crashed.subscribe()
    turn = await prompt(crashed, sid)
    await plan_requested(sub2)
    await die(crashed)
    calls_before = provider.calls(sid)
    restarted = make_host()
    got = await state(restarted, sid)
    assert got["pendingApproval"] is None and got["session"]["status"] == "idle"
    assert (got["session"]["mode"], got["session"]["planState"]) == ("goal", "planning")
    turns = (await restarted.call("session.turns", {"sessionId": sid}))["turns"]
    assert (turns[-1]["id"], turns[-1]["reason"], turns[-1]["errorCode"]) == (turn["turnId"], "aborted", "INTERRUPTED")
    approvals = (await restarted.call("plans.list", {"sessionId": sid}))["approvals"]
    assert [a["status"] for a in approvals] == ["expired", "interrupted"]
    assert provider.calls(sid) == calls_before


async def test_acceptance13_goal_reports_every_criterion_and_unattended_goal_is_refused(
        host, provider, project):
    s = await session(host, project, mode="goal")
    sid = s["id"]
    criteria = ["NOTES.md exists", "tests pass"]
    sub = host.subscribe()
    provider.enqueue(
        sid, submit_goal(criteria),
        tool("Write", path="NOTES.md", content="notes\n"),
        {"text": "I think I am done."},  # ends without a report: one nudge
        tool("ReportCriteria", results=[{"criterion": criteria[0], "outcome": "met", "evidence": "file written"}]),
        tool("ReportCriteria", results=[{"criterion": criteria[1], "outcome": "met", "evidence": "ran them"}]),
    )
    turn = await prompt(host, sid)
    approval = (await plan_requested(sub)).approval
    assert approval.criteria == criteria
    await host.call("plans.resolve", {"approvalId": approval.id, "sessionId": sid, "turnId": turn["turnId"],
                                      "decision": "approve", "permissionMode": "accept-edits"})
    execution = await sub.wait_for(lambda e: isinstance(e, ev.TurnStarted) and e.origin == "execution")
    end = await ended(sub, execution.turn_id)
    assert (end.reason, end.error_code) == ("completed", None)
    got = await host.call("plans.get", {"approvalId": approval.id})
    assert got["executionState"] == "completed"
    texts = [m["content"][0].get("text", "") for m in (await state(host, sid))["messages"] if m["role"] == "user"]
    assert any("ReportCriteria" in t for t in texts[2:])  # the nudge
    reports = [e for e in (await host.call("audit.list", {"sessionId": sid}))["entries"] if e["action"] == "goal.reported"]
    assert [r["detail"]["results"][0]["criterion"] for r in reports] == criteria
    # unattended
    unattended = await session(host, project, mode="goal")
    with pytest.raises(PideskError) as refused:
        await host.agent_prompt(unattended["id"], "go", unattended=True)
    assert refused.value.code == "PLAN_REQUIRES_INTERACTIVE_SESSION"
    assert provider.calls(unattended["id"]) == 0


async def test_acceptance13_goal_ending_unreported_twice_fails_goal_unreported(host, provider, project):
    s = await session(host, project, mode="goal")
    sid = s["id"]
    sub = host.subscribe()
    provider.enqueue(sid, submit_goal(["it works"]), {"text": "done"}, {"text": "really done"})
    turn = await prompt(host, sid)
    approval = (await plan_requested(sub)).approval
    await host.call("plans.resolve", {"approvalId": approval.id, "sessionId": sid, "turnId": turn["turnId"],
                                      "decision": "approve", "permissionMode": "ask"})
    execution = await sub.wait_for(lambda e: isinstance(e, ev.TurnStarted) and e.origin == "execution")
    end = await ended(sub, execution.turn_id)
    assert (end.reason, end.error_code) == ("error", "GOAL_UNREPORTED")
    assert (await host.call("plans.get", {"approvalId": approval.id}))["executionState"] == "failed"
