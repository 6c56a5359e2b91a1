"""Host behaviour the issue names beyond the seed's numbered rules: steering, hash re-check,
path denials before any Ask, audit completeness, abort killing Bash, held queues."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from pidesk.core import events as ev
from pidesk.core.errors import PideskError
from tests.scenario import (
    alive,
    die,
    ended,
    permission_requested,
    process_running,
    plan_requested,
    prompt,
    session,
    spare_shells,
    state,
    submit_plan,
    tool,
    tool_results,
)

pytestmark = pytest.mark.asyncio


async def test_steer_is_injected_at_the_next_boundary_of_its_turn_only(host, provider, project):
    s = await session(host, project)
    sub = host.subscribe()
    provider.enqueue(s["id"], {"gateAfter": "mid", "text": "reading",
                               "toolCalls": [{"name": "Read", "args": {"path": "README.md"}}]},
                     {"text": "steered answer"})
    turn = await prompt(host, s["id"])
    await provider.wait_reached("mid")
    await host.call("agent.steer", {"sessionId": s["id"], "turnId": turn["turnId"], "text": "also check src/"})
    provider.release("mid")
    await ended(sub, turn["turnId"])
    roles = [(m["role"], m["content"][0].get("text")) for m in (await state(host, s["id"]))["messages"]]
    assert roles[3] == ("user", "also check src/")  # after the tool boundary, before the next model call
    assert provider.requests[-1].messages[-1].text() == "also check src/"
    with pytest.raises(PideskError) as late:
        await host.call("agent.steer", {"sessionId": s["id"], "turnId": turn["turnId"], "text": "too late"})
    assert late.value.code == "TURN_ENDED"


async def test_a_changed_artifact_fails_the_execution_before_any_model_call(host, provider, project):
    s = await session(host, project, mode="plan")
    sub = host.subscribe()
    provider.enqueue(s["id"], submit_plan(), tool("Write", path="should-not.txt", content="x"))
    turn = await prompt(host, s["id"])
    approval = (await plan_requested(sub)).approval
    (project / approval.artifact_path).write_text("# Plan\n\n1. something else entirely\n")
    await host.call("plans.resolve", {"approvalId": approval.id, "sessionId": s["id"], "turnId": turn["turnId"],
                                      "decision": "approve", "permissionMode": "auto"})
    execution = await sub.wait_for(lambda e: isinstance(e, ev.TurnStarted) and e.origin == "execution")
    calls = provider.calls(s["id"])
    end = await ended(sub, execution.turn_id)
    assert (end.reason, end.error_code) == ("error", "PLAN_ARTIFACT_HASH_MISMATCH")
    assert provider.calls(s["id"]) == calls
    assert (await host.call("plans.get", {"approvalId": approval.id}))["executionState"] == "failed"
    assert not (project / "should-not.txt").exists()


@pytest.mark.parametrize("path", [".env", "config/.env.local", "deploy/id_rsa", ".git/config", ".pi/plan/x.md",
                                  "../outside.txt"])
async def test_protected_paths_are_denied_before_any_ask_in_every_mode(host, provider, project, path):
    s = await session(host, project)  # agent mode, permission ask: an allowed path would Ask
    sub = host.subscribe()
    provider.enqueue(s["id"], tool("Write", path=path, content="secret"), {"text": "ok"})
    await ended(sub, (await prompt(host, s["id"]))["turnId"])
    assert not [e for _, e in sub.pending() if isinstance(e, ev.PermissionRequested)]
    code = tool_results((await state(host, s["id"]))["messages"], "Write")[0]["errorCode"]
    assert code == ("PATH_OUTSIDE_WORKSPACE" if path.startswith("..") else "WORKSPACE_PATH_DENIED")
    assert not (project / path).exists()


async def test_the_audit_log_records_mode_changes_grants_denials_and_decisions(host, provider, project):
    s = await session(host, project)
    sid = s["id"]
    sub = host.subscribe()
    provider.enqueue(sid, tool("Bash", command="true"), tool("Write", path=".env", content="x"),
                     {"text": "ok"}, submit_plan(), {"text": "executed"})
    turn = await prompt(host, sid)
    req = (await permission_requested(sub)).request
    await host.call("permissions.resolve", {"requestId": req.id, "sessionId": sid, "turnId": turn["turnId"],
                                            "decision": "allow", "remember": "session"})
    await ended(sub, turn["turnId"])
    await host.call("session.setMode", {"sessionId": sid, "mode": "plan"})
    turn = await prompt(host, sid)
    approval = (await plan_requested(sub)).approval
    await host.call("plans.resolve", {"approvalId": approval.id, "sessionId": sid, "turnId": turn["turnId"],
                                      "decision": "approve", "permissionMode": "accept-edits"})
    execution = await sub.wait_for(lambda e: isinstance(e, ev.TurnStarted) and e.origin == "execution")
    await ended(sub, execution.turn_id)
    entries = (await host.call("audit.list", {"sessionId": sid}))["entries"]
    actions = [(e["action"], e["detail"].get("code") or e["detail"].get("cause") or e["detail"].get("tool"))
               for e in entries]
    assert ("permission.resolved", "Bash") in actions
    assert ("grant.created", "Bash") in actions
    assert ("tool.denied", "WORKSPACE_PATH_DENIED") in actions
    assert ("mode.changed", "user") in actions and ("mode.changed", "approval") in actions
    assert any(a == "plan.submitted" for a, _ in actions) and any(a == "plan.approved" for a, _ in actions)
    with host.store.db.read() as db, pytest.raises(Exception, match="append-only"):
        db.execute("DELETE FROM audit")


async def test_abort_kills_a_running_bash_before_it_is_acknowledged(host, provider, project):
    s = await session(host, project, permissionMode="auto")
    sub = host.subscribe()
    provider.enqueue(s["id"], tool("Bash", command="exec sleep 60.0128"))
    await prompt(host, s["id"])
    await sub.wait_for(lambda e: isinstance(e, ev.ToolStarted))
    pid = await process_running("sleep\x0060.0128")
    assert (await host.call("agent.abort", {"sessionId": s["id"]}))["aborted"] is True
    assert not alive(pid)
    assert tool_results((await state(host, s["id"]))["messages"], "Bash")[0]["errorCode"] == "TOOL_ABORTED"


async def test_a_restored_queue_waits_for_focus_then_starts_once(make_host, provider, project):
    first = make_host()
    s = await session(first, project)
    provider.enqueue(s["id"], {"gate": "hold"}, {"text": "queued ran"})
    await prompt(first, s["id"])
    await provider.wait_reached("hold")
    await first.call("agent.queue.push", {"sessionId": s["id"], "text": "after restart"})
    await die(first)
    second = make_host()
    sub = second.subscribe()
    got = await state(second, s["id"])
    assert [e["text"] for e in got["queue"]] == ["after restart"] and got["session"]["status"] == "idle"
    await second.call("session.focus", {"sessionId": s["id"]})
    started = await sub.wait_for(lambda e: isinstance(e, ev.TurnStarted))
    assert started.origin == "queued"
    await ended(sub, started.turn_id)
    assert (await state(second, s["id"]))["queue"] == []
    await second.call("session.focus", {"sessionId": s["id"]})
    assert len((await second.call("session.turns", {"sessionId": s["id"]}))["turns"]) == 2


async def test_direct_prompt_on_idle_session_is_accepted_even_with_a_held_queue(make_host, provider, project):
    first = make_host()
    s = await session(first, project)
    provider.enqueue(s["id"], {"gate": "hold"})
    await prompt(first, s["id"])
    await provider.wait_reached("hold")
    await first.call("agent.queue.push", {"sessionId": s["id"], "text": "held"})
    await die(first)
    second = make_host()
    sub = second.subscribe()
    turn = await prompt(second, s["id"], "direct")
    await ended(sub, turn["turnId"])
    assert [e["text"] for e in (await state(second, s["id"]))["queue"]] == ["held"]


async def test_submit_in_agent_mode_is_plan_not_active_and_enter_in_scratch_needs_a_project(host, provider):
    s = await session(host)
    sub = host.subscribe()
    provider.enqueue(s["id"], tool("SubmitPlan", title="t", markdown="m", question="q"), tool("EnterPlanMode"),
                     {"text": "ok"})
    await ended(sub, (await prompt(host, s["id"]))["turnId"])
    messages = (await state(host, s["id"]))["messages"]
    assert tool_results(messages, "SubmitPlan")[0]["errorCode"] == "PLAN_NOT_ACTIVE"
    assert tool_results(messages, "EnterPlanMode")[0]["errorCode"] == "PLAN_WORKSPACE_REQUIRED"
    assert (await state(host, s["id"]))["session"]["mode"] == "agent"


async def test_session_get_pages_by_seq(host, provider, project):
    s = await session(host, project)
    sub = host.subscribe()
    for i in range(5):
        provider.enqueue(s["id"], {"text": f"answer {i}"})
        await ended(sub, (await prompt(host, s["id"], f"q{i}"))["turnId"])
    newest = await host.call("session.get", {"sessionId": s["id"], "limit": 4})
    assert [m["seq"] for m in newest["messages"]] == [7, 8, 9, 10] and newest["hasMore"] is True
    older = await host.call("session.get", {"sessionId": s["id"], "limit": 4, "beforeSeq": 7})
    assert [m["seq"] for m in older["messages"]] == [3, 4, 5, 6] and older["hasMore"] is True
    oldest = await host.call("session.get", {"sessionId": s["id"], "limit": 4, "beforeSeq": 3})
    assert [m["seq"] for m in oldest["messages"]] == [1, 2] and oldest["hasMore"] is False


async def test_a_page_of_large_messages_is_bounded_in_bytes_and_the_rest_follows(host, provider, project, monkeypatch):
    """Issue 29 item 7: session.get returned 259 MB (200 large messages at once). A page holds at most
    PAGE_BYTES of transcript (the newest message always); ``hasMore`` and beforeSeq bring the rest."""
    from pidesk.store import store as store_module

    monkeypatch.setattr(store_module, "PAGE_BYTES", 250_000)
    s = await session(host, project)
    sub = host.subscribe()
    for i in range(4):
        provider.enqueue(s["id"], {"text": f"answer {i} " + "x" * 100_000})
        await ended(sub, (await prompt(host, s["id"], f"q{i}"))["turnId"])
    seen, before = [], None
    while True:
        page = await host.call("session.get", {"sessionId": s["id"], **({"beforeSeq": before} if before else {})})
        assert sum(len(m["content"][0]["text"]) for m in page["messages"]) <= 250_000 or len(page["messages"]) == 1
        seen = [m["seq"] for m in page["messages"]] + seen
        if not page["hasMore"]:
            break
        before = page["messages"][0]["seq"]
    assert seen == list(range(1, 9))  # every message, in order, across the pages


async def test_delete_removes_the_session_and_its_transcript(host, provider, project):
    s = await session(host, project)
    await host.call("session.delete", {"sessionId": s["id"]})
    assert (await host.call("session.list", {}))["sessions"] == []
    assert not Path(host.store.transcripts.path(s["id"])).exists()
    with pytest.raises(PideskError) as gone:
        await state(host, s["id"])
    assert gone.value.code == "NOT_FOUND"
    assert os.listdir(host.store.transcripts.dir) == []


async def test_new_context_changes_the_models_view_and_keeps_the_transcript(host, provider, project):
    s = await session(host, project)
    sub = host.subscribe()
    provider.enqueue(s["id"], {"text": "first answer"}, tool("NewContext", summary="the user wants notes"),
                     {"text": "fresh start"})
    await ended(sub, (await prompt(host, s["id"], "hello"))["turnId"])
    await ended(sub, (await prompt(host, s["id"], "start over"))["turnId"])
    seen = provider.requests[-1].messages
    assert seen[0].text().endswith("the user wants notes") and "hello" not in "".join(m.text() for m in seen)
    texts = [m["content"][0].get("text") for m in (await state(host, s["id"]))["messages"]]
    assert texts[:2] == ["hello", "first answer"]  # the transcript keeps every message


async def test_attachments_are_stored_by_content_and_referenced_never_inlined(host, provider, project):
    import base64

    s = await session(host, project)
    sub = host.subscribe()
    data = base64.b64encode(b"\x89PNG fake image bytes").decode()
    uploaded = await host.call("attachments.put", {"name": "shot.png", "mime": "image/png", "data": data})
    assert uploaded["kind"] == "image" and uploaded["ref"].startswith("sha256:")
    again = await host.call("attachments.put", {"name": "copy.png", "mime": "image/png", "data": data})
    assert again["ref"] == uploaded["ref"]  # content-addressed
    provider.enqueue(s["id"], {"text": "nice picture"})
    await ended(sub, (await host.call("agent.prompt", {"sessionId": s["id"], "text": "look",
                                                       "attachments": [uploaded]}))["turnId"])
    first = (await state(host, s["id"]))["messages"][0]
    assert first["content"][1] == {"type": "attachment", **uploaded}
    transcript = host.store.transcripts.path(s["id"]).read_bytes()
    assert data.encode() not in transcript and b"fake image bytes" not in transcript
    assert host.store.blobs.get(uploaded["ref"]) == b"\x89PNG fake image bytes"


@pytest.mark.parametrize("mode", ["plan", "goal"])
async def test_strict_planning_runs_contract_mode_bash_read_only_even_under_auto(make_host, provider, project, mode):
    import os
    import shutil

    if shutil.which("bwrap") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("CI must have bubblewrap: .ci/run installs the Debian package bubblewrap")
        pytest.skip("bubblewrap is not installed: `apt-get install bubblewrap` to run this test")
    host = make_host(strict_planning=True)
    s = await session(host, project, mode=mode, permissionMode="auto")
    sub = host.subscribe()
    provider.enqueue(s["id"], tool("Bash", command="cat README.md; echo changed > README.md; touch new.txt"),
                     {"text": "looked"})
    await ended(sub, (await prompt(host, s["id"]))["turnId"])
    result = tool_results((await state(host, s["id"]))["messages"], "Bash")[0]
    assert "# demo project" in result["output"] and "Read-only file system" in result["output"]
    assert (project / "README.md").read_text() == "# demo project\n" and not (project / "new.txt").exists()
    await host.call("session.setMode", {"sessionId": s["id"], "mode": "agent"})
    provider.enqueue(s["id"], tool("Bash", command="touch new.txt"), {"text": "ok"})
    await ended(sub, (await prompt(host, s["id"]))["turnId"])
    assert (project / "new.txt").exists()  # Agent mode is not sandboxed


async def test_strict_planning_is_off_by_default_and_said_so_to_clients(make_host, provider, project):
    host = make_host()
    assert (await host.call("host.hello", {"protocolVersion": 1}))["strictPlanning"] is False
    s = await session(host, project, mode="plan", permissionMode="auto")
    sub = host.subscribe()
    provider.enqueue(s["id"], tool("Bash", command="touch made-while-planning.txt"), {"text": "done"})
    await ended(sub, (await prompt(host, s["id"]))["turnId"])
    assert (project / "made-while-planning.txt").exists()  # the seeds' choice: Bash under auto is not sandboxed


@pytest.mark.parametrize("mode", ["plan", "goal"])
async def test_strict_planning_without_bubblewrap_refuses_bash_instead_of_running_it_unconfined(
    make_host, provider, project, mode, monkeypatch, tmp_path
):
    empty = tmp_path / "no-bwrap-here"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))  # no bwrap to be found (bash itself falls back to /bin/bash)
    host = make_host(strict_planning=True)
    assert (await host.call("host.hello", {"protocolVersion": 1}))["strictPlanning"] is True
    s = await session(host, project, mode=mode, permissionMode="auto")
    sub = host.subscribe()
    provider.enqueue(s["id"], tool("Bash", command="touch new.txt"), {"text": "looked"})
    await ended(sub, (await prompt(host, s["id"]))["turnId"])
    result = tool_results((await state(host, s["id"]))["messages"], "Bash")[0]
    assert result["errorCode"] == "SANDBOX_UNAVAILABLE" and "apt-get install bubblewrap" in result["output"]
    assert not (project / "new.txt").exists()


async def test_the_next_turn_runs_to_its_end_even_if_the_turn_that_started_it_is_cancelled(host, provider, project):
    """A queued turn starts from the end of the previous turn, inside that turn's task; the load soak
    twice found it started and never ended. Whatever becomes of the task that starts a turn, the turn
    has a task of its own from its first commit on."""
    s = await session(host, project)
    sub = host.subscribe()
    provider.enqueue(s["id"], {"gate": "hold"}, {"text": "queued ran"})
    await prompt(host, s["id"])
    await provider.wait_reached("hold")
    await host.call("agent.queue.push", {"sessionId": s["id"], "text": "queued"})
    previous = host.parts.live.turns[s["id"]].task
    assert previous is not None
    writing, may_write = threading.Event(), threading.Event()
    append = host.store.append_message

    def slow_prompt(session_id: str, turn_id: str, role: str, content: list[Any], *rest: Any) -> Any:
        if role == "user" and getattr(content[0], "text", None) == "queued":  # a slow disk, for this write only
            writing.set()
            assert may_write.wait(10)
        return append(session_id, turn_id, role, content, *rest)

    host.store.append_message = slow_prompt  # type: ignore[method-assign]
    provider.release("hold")
    queued = await sub.wait_for(lambda e: isinstance(e, ev.TurnStarted) and e.origin == "queued")
    assert await asyncio.to_thread(writing.wait, 10)
    assert not previous.done()  # the previous turn's task is waiting for the queued prompt to be stored
    previous.cancel()
    may_write.set()
    end = await ended(sub, queued.turn_id)
    assert (end.reason, end.error_code) == ("completed", None)
    got = await state(host, s["id"])
    assert got["session"]["status"] == "idle" and got["queue"] == []
    assert [m["content"][0]["text"] for m in got["messages"][-2:]] == ["queued", "queued ran"]


async def test_a_turn_cancelled_without_an_abort_ends_as_an_error_instead_of_running_forever(host, provider, project):
    """Only an abort (or the shutdown, which aborts) may cancel a turn's task. A stray cancellation —
    a library's, say — ends the turn with INTERNAL, and the session goes on to its queue."""
    s = await session(host, project)
    sub = host.subscribe()
    provider.enqueue(s["id"], {"gate": "hold"}, {"text": "next ran"})
    first = await prompt(host, s["id"])
    await provider.wait_reached("hold")
    await host.call("agent.queue.push", {"sessionId": s["id"], "text": "next"})
    task = host.parts.live.turns[s["id"]].task
    assert task is not None
    task.cancel()
    end = await ended(sub, first["turnId"])
    assert (end.reason, end.error_code) == ("error", "INTERNAL")
    queued = await sub.wait_for(lambda e: isinstance(e, ev.TurnStarted) and e.origin == "queued")
    assert (await ended(sub, queued.turn_id)).reason == "completed"
    assert (await state(host, s["id"]))["session"]["status"] == "idle"


async def test_no_spare_shell_outlives_its_turn_whether_it_ends_or_is_aborted(host, provider, project):
    """Each Bash call starts the next call's shell (tools/bash.py); the turn's end kills the one left."""
    before = spare_shells()
    s = await session(host, project, permissionMode="auto")
    sub = host.subscribe()
    provider.enqueue(s["id"], tool("Bash", command="echo one"), tool("Bash", command="echo two"), {"text": "done"})
    await ended(sub, (await prompt(host, s["id"]))["turnId"])
    assert [r["output"].splitlines()[0] for r in tool_results((await state(host, s["id"]))["messages"])] == [
        "one", "two"]
    assert spare_shells() == before
    provider.enqueue(s["id"], tool("Bash", command="true"), tool("Bash", command="sleep 30"))
    turn = await prompt(host, s["id"])
    await sub.wait_for(lambda e: isinstance(e, ev.ToolStarted) and e.args.get("command") == "sleep 30")
    await host.call("agent.abort", {"sessionId": s["id"]})
    assert (await ended(sub, turn["turnId"])).reason == "aborted"
    assert spare_shells() == before


@pytest.mark.parametrize("method", ["agent.prompt", "agent.queue.push"])
async def test_an_attachment_must_name_stored_bytes_of_its_stated_size_on_every_way_in(host, project, method):
    """agent.queue.push took an attachment whose `size` did not match its stored bytes (agent.prompt
    refused it): a queued prompt could carry a size its bytes contradict. Both check the same way now."""
    import base64

    s = await session(host, project)
    uploaded = await host.call("attachments.put", {"name": "a.txt", "mime": "text/plain",
                                                   "data": base64.b64encode(b"four").decode()})
    for wrong, why in (({**uploaded, "size": 5}, "does not match"), ({**uploaded, "ref": "sha256:" + "0" * 64},
                                                                     "unknown ref")):
        with pytest.raises(PideskError) as refused:
            await host.call(method, {"sessionId": s["id"], "text": "see attached", "attachments": [wrong]})
        assert refused.value.code == "INVALID_PARAMS" and why in str(refused.value)
    assert (await state(host, s["id"]))["queue"] == [] and (await state(host, s["id"]))["messages"] == []


@pytest.mark.asyncio
async def test_a_prompt_starts_its_turn_through_the_step_gate(make_host, provider, project):
    """Starting a turn is turn work: with every slot of the step gate busy, a prompt waits in the gate's
    queue. (64 prompts at once otherwise committed their turns in one go and held every client behind them.)"""
    host = make_host(step_slots=1)
    s = await session(host, project)
    provider.enqueue(s["id"], {"text": "hi"})
    sub = host.subscribe()
    async with host.parts.gate.slot():  # the one slot, held as a turn's CPU step holds it
        call = asyncio.create_task(host.call("agent.prompt", {"sessionId": s["id"], "text": "hi"}))
        for _ in range(1000):  # (bounded: the prompt reaches the gate within a few turns of the loop)
            if host.parts.gate.queued:
                break
            await asyncio.sleep(0)
        assert host.parts.gate.queued == 1 and not call.done()
        assert (await state(host, s["id"]))["session"]["status"] == "idle"  # not started: no turn yet
    turn = await call
    assert (await ended(sub, turn["turnId"])).reason == "completed"
