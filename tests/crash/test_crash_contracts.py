"""Crash tests, seed 003 §4: Plan/Goal submission and approval.

Submission writes the exact Markdown bytes to a new ``.pi/<kind>/*.md``, then
commits the pending row, then announces it; approval is one transaction
(outcome, mode, permission mode, execution id, queued). After a restart a
pending approval is ``interrupted`` and the session stays in its contract mode,
planning; an approved one keeps the session in Agent with its execution
``interrupted``; nothing is replayed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from crash_harness import assert_fail_closed, audit_actions, contract, contract_markdown, crash, rows
from scenario import ended, plan_requested, prompt, state

from pidesk.core.errors import Conflict
from pidesk.providers.convert import Answered, Results, exchanges

KINDS = ["plan", "goal"]


def _artifacts(project: Path, kind: str) -> list[Path]:
    return sorted((project / ".pi" / kind).glob("*.md"))


async def _turns(host: Any, session_id: str) -> list[tuple[str, str, str | None]]:
    turns = (await host.call("session.turns", {"sessionId": session_id}))["turns"]
    return [(t["origin"], t["reason"], t["errorCode"]) for t in turns]


async def _resubmit(host: Any, provider: Any, session_id: str, kind: str) -> Any:
    provider.enqueue(session_id, contract(kind, "# Plan v2\n"))
    sub = host.subscribe()
    await prompt(host, session_id, "revise it")
    return (await plan_requested(sub)).approval


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", KINDS)
async def test_seed003_s4_artifact_written_without_row_stays_and_nothing_is_pending_after_crash(
    kind: str, data_dir: Path, project: Path, provider: Any, make_host: Any
) -> None:
    acks = crash("submit", data_dir, project, "submit.after_artifact", kind=kind)
    sid = acks["session"]
    (artifact,) = _artifacts(project, kind)
    assert artifact.read_bytes() == contract_markdown(kind).encode()

    host = make_host()
    assert (await host.call("plans.list", {"sessionId": sid}))["approvals"] == []
    got = await state(host, sid)
    assert got["pendingApproval"] is None
    assert (got["session"]["mode"], got["session"]["planState"]) == (kind, "planning")
    assert await _turns(host, sid) == [("interactive", "aborted", "INTERRUPTED")]
    assert_fail_closed(host, provider)

    revised = await _resubmit(host, provider, sid, kind)
    assert revised.revises is None and revised.artifact_path != f".pi/{kind}/{artifact.name}"
    assert artifact.read_bytes() == contract_markdown(kind).encode()  # never overwritten
    assert len(_artifacts(project, kind)) == 2


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", KINDS)
async def test_seed003_s4_pending_row_without_event_is_interrupted_and_session_stays_planning(
    kind: str, data_dir: Path, project: Path, provider: Any, make_host: Any
) -> None:
    acks = crash("submit", data_dir, project, "submit.after_row", kind=kind)
    sid = acks["session"]

    host = make_host()
    assert host.recovery.interrupted["approvals"] == 1
    (approval,) = (await host.call("plans.list", {"sessionId": sid}))["approvals"]
    assert (approval["status"], approval["kind"], approval["turnId"]) == ("interrupted", kind, acks["turn"])
    assert (approval["permissionMode"], approval["executionId"], approval["executionState"]) == (None, None, "none")
    (artifact,) = _artifacts(project, kind)
    assert approval["artifactPath"] == f".pi/{kind}/{artifact.name}"
    assert artifact.read_bytes() == contract_markdown(kind).encode()
    got = await state(host, sid)
    assert got["pendingApproval"] is None
    assert (got["session"]["mode"], got["session"]["planState"]) == (kind, "planning")
    assert await _turns(host, sid) == [("interactive", "aborted", "INTERRUPTED")]
    with pytest.raises(Conflict) as refused:
        await host.call("plans.resolve", {"approvalId": approval["id"], "sessionId": sid, "turnId": acks["turn"],
                                          "decision": "approve", "permissionMode": "auto"})
    assert refused.value.code == "PLAN_ALREADY_RESOLVED"
    assert_fail_closed(host, provider)

    revised = await _resubmit(host, provider, sid, kind)
    assert revised.revises == approval["id"]
    assert len(_artifacts(project, kind)) == 2 and artifact.read_bytes() == contract_markdown(kind).encode()


@pytest.mark.asyncio
async def test_seed003_s4_after_crash_mid_submit_the_next_vendor_request_answers_every_tool_call(
    data_dir: Path, project: Path, provider: Any, make_host: Any
) -> None:
    """Recovery writes no result for the call the crash cut off; the request builder supplies one."""
    acks = crash("submit", data_dir, project, "submit.after_row", kind="plan")

    host = make_host()
    sub = host.subscribe()
    started = await prompt(host, acks["session"], "where were we?")
    await ended(sub, started["turnId"])
    (request,) = provider.requests
    sequence = exchanges(request.messages)
    answered = [(i, x) for i, x in enumerate(sequence) if isinstance(x, Answered) and x.calls]
    assert [x.calls[0].name for _i, x in answered] == ["SubmitPlan"]
    for i, x in answered:
        results = sequence[i + 1]
        assert isinstance(results, Results)
        assert [r.tool_call_id for r in results.results] == [c.id for c in x.calls]
        assert [r.error_code for r in results.results] == ["TOOL_ABORTED"]


@pytest.mark.asyncio
async def test_seed003_s4_approve_killed_inside_its_transaction_is_not_approved_after_restart(
    data_dir: Path, project: Path, provider: Any, make_host: Any
) -> None:
    acks = crash("approve", data_dir, project, "approve.before_commit")
    sid = acks["session"]
    assert "approved" not in acks

    host = make_host()
    approval = await host.call("plans.get", {"approvalId": acks["approval"]})
    assert approval["status"] == "interrupted"
    assert (approval["permissionMode"], approval["executionId"], approval["executionState"]) == (None, None, "none")
    s = (await state(host, sid))["session"]
    assert (s["mode"], s["permissionMode"], s["planState"]) == ("plan", "ask", "planning")
    actions = audit_actions(host, sid)
    assert "plan.approved" not in actions and "mode.changed" not in actions
    assert await _turns(host, sid) == [("interactive", "aborted", "INTERRUPTED")]
    assert_fail_closed(host, provider)


APPROVED_THEN_CRASH = {  # point -> the submitting turn as recovered
    "approve.after_commit": ("interactive", "aborted", "INTERRUPTED"),
    "turn.after_end": ("interactive", "completed", None),  # the submit turn ended; the dispatch never ran
}


@pytest.mark.asyncio
@pytest.mark.parametrize("point, submit_turn", APPROVED_THEN_CRASH.items(), ids=APPROVED_THEN_CRASH.keys())
async def test_seed003_s4_approved_then_crash_keeps_agent_mode_and_never_runs_the_execution(
    point: str, submit_turn: tuple[str, str, str | None],
    data_dir: Path, project: Path, provider: Any, make_host: Any
) -> None:
    acks = crash("approve", data_dir, project, point)
    sid = acks["session"]

    host = make_host()
    assert host.recovery.interrupted["executions"] == 1
    approval = await host.call("plans.get", {"approvalId": acks["approval"]})
    assert (approval["status"], approval["permissionMode"], approval["executionState"]) == (
        "approved", "auto", "interrupted")
    assert approval["executionId"] is not None
    s = (await state(host, sid))["session"]
    assert (s["mode"], s["permissionMode"], s["planState"], s["status"]) == ("agent", "auto", "inactive", "idle")
    actions = audit_actions(host, sid)
    assert actions.count("plan.approved") == 1 and actions.count("mode.changed") == 1
    assert await _turns(host, sid) == [submit_turn]
    assert_fail_closed(host, provider)

    sub = host.subscribe()
    started = await prompt(host, sid, "what now?")  # an ordinary Agent turn; no execution follows it
    await ended(sub, started["turnId"])
    assert await _turns(host, sid) == [submit_turn, ("interactive", "completed", None)]
    assert host.parts.live.turns == {} and len(provider.requests) == 1
    assert not (project / "NOTES.md").exists()


@pytest.mark.asyncio
async def test_seed003_s4_execution_killed_as_it_starts_is_interrupted_in_agent_mode_and_not_replayed(
    data_dir: Path, project: Path, provider: Any, make_host: Any
) -> None:
    acks = crash("approve", data_dir, project, "turn.after_start", nth=2)
    sid = acks["session"]
    assert acks["approved"] is True

    host = make_host()
    approval = await host.call("plans.get", {"approvalId": acks["approval"]})
    assert (approval["status"], approval["executionState"]) == ("approved", "interrupted")
    assert await _turns(host, sid) == [
        ("interactive", "completed", None), ("execution", "aborted", "PLAN_EXECUTION_INTERRUPTED")]
    s = (await state(host, sid))["session"]
    assert (s["mode"], s["permissionMode"]) == ("agent", "auto")
    assert rows(host, "SELECT execution_state FROM plan_approvals") == [("interrupted",)]
    assert not (project / "NOTES.md").exists()
    assert_fail_closed(host, provider)
