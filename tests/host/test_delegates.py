"""Delegates (Task/TaskWait) and seed 003 §3 rule 17."""

from __future__ import annotations

import pytest

from pidesk.core import events as ev
from tests.scenario import alive, ended, permission_requested, process_running, prompt, session, state, tool, tool_results

pytestmark = pytest.mark.asyncio


async def test_a_delegate_works_in_its_own_context_and_taskwait_returns_its_answer(host, provider, project):
    s = await session(host, project)
    sub = host.subscribe()
    provider.enqueue(s["id"], tool("Task", description="read the readme", prompt="what is in README.md?"),
                     tool("TaskWait", taskIds=["task_1"]), {"text": "the delegate says: demo project"})
    provider.enqueue(f"{s['id']}/task_1", tool("Read", path="README.md"), {"text": "It is a demo project."})
    turn = await prompt(host, s["id"])
    assert (await ended(sub, turn["turnId"])).reason == "completed"
    waited = tool_results((await state(host, s["id"]))["messages"], "TaskWait")[0]
    assert "It is a demo project." in waited["output"]
    delegate_request = [r for r in provider.requests if r.agent == "task_1"][0]
    assert [m.text() for m in delegate_request.messages] == ["what is in README.md?"]  # its own context
    assert all(m["role"] != "assistant" or "It is a demo" not in str(m["content"])
               for m in (await state(host, s["id"]))["messages"])  # its messages stay out of the transcript


@pytest.mark.parametrize("mode", ["plan", "goal"])
async def test_a_delegate_in_a_contract_mode_cannot_write_submit_or_change_mode(host, provider, project, mode):
    s = await session(host, project, mode=mode, permissionMode="auto")
    sub = host.subscribe()
    provider.enqueue(s["id"], tool("Task", description="try", prompt="try everything"),
                     tool("TaskWait", taskIds=["task_1"]), {"text": "done"})
    submit = "SubmitPlan" if mode == "plan" else "SubmitGoal"
    provider.enqueue(f"{s['id']}/task_1",
                     tool("Write", path="x.txt", content="x"),
                     tool(submit, title="t", markdown="m", question="q", criteria=["c"]),
                     tool("EnterGoalMode"), {"text": "nothing worked"})
    codes = []
    await prompt(host, s["id"])
    while True:
        event = await sub.wait_for(lambda e: isinstance(e, (ev.ToolFinished, ev.TurnEnded)))
        if isinstance(event, ev.TurnEnded):
            break
        codes.append((event.name, event.error_code))
    assert ("Write", "WRITE_DISABLED_IN_PLAN") in codes
    assert (submit, "TOOL_DISABLED_IN_PLAN") in codes and ("EnterGoalMode", "TOOL_DISABLED_IN_PLAN") in codes
    assert not (project / "x.txt").exists() and not (project / ".pi").exists()
    assert (await state(host, s["id"]))["session"]["mode"] == mode


async def test_rule17_a_parent_gone_idle_keeps_its_turn_open_while_delegates_run(host, provider, project):
    s = await session(host, project)
    sub = host.subscribe()
    provider.enqueue(s["id"], tool("Task", description="slow", prompt="take your time"), {"text": "parent done"})
    provider.enqueue(f"{s['id']}/task_1", {"gate": "delegate", "text": "finally"})
    turn = await prompt(host, s["id"])
    await provider.wait_reached("delegate")
    await sub.wait_for(lambda e: isinstance(e, ev.MessageAppended) and e.message.text() == "parent done")
    assert (await state(host, s["id"]))["session"]["status"] == "running"
    provider.release("delegate")
    assert (await ended(sub, turn["turnId"])).reason == "completed"
    assert (await state(host, s["id"]))["session"]["status"] == "idle"


async def test_rule17_a_parent_provider_error_aborts_leftover_delegates_and_returns_to_idle(host, provider, project):
    s = await session(host, project, permissionMode="auto")
    sub = host.subscribe()
    provider.enqueue(s["id"], tool("Task", description="bash", prompt="run it"),
                     {"gate": "parent", "error": "PROVIDER_ERROR"}, {"text": "continued"})
    provider.enqueue(f"{s['id']}/task_1", tool("Bash", command="exec sleep 60.0128"))
    turn = await prompt(host, s["id"])
    await sub.wait_for(lambda e: isinstance(e, ev.ToolStarted) and e.name == "Bash")
    pid = await process_running("sleep\x0060.0128")
    provider.release("parent")
    end = await ended(sub, turn["turnId"])
    assert not alive(pid)
    assert (end.reason, end.error_code) == ("error", "PROVIDER_ERROR")
    assert (await state(host, s["id"]))["session"]["status"] == "idle"
    again = await prompt(host, s["id"], "continue")
    assert (await ended(sub, again["turnId"])).reason == "completed"


async def test_a_delegates_ask_reaches_the_user_as_the_parent_turns_request(host, provider, project):
    s = await session(host, project)
    sub = host.subscribe()
    provider.enqueue(s["id"], tool("Task", description="write", prompt="write a file"),
                     tool("TaskWait", taskIds=["task_1"]), {"text": "ok"})
    provider.enqueue(f"{s['id']}/task_1", tool("Write", path="d.txt", content="d"), {"text": "wrote d"})
    turn = await prompt(host, s["id"])
    request = (await permission_requested(sub)).request
    assert (request.turn_id, request.tool) == (turn["turnId"], "Write")
    await host.call("permissions.resolve", {"requestId": request.id, "sessionId": s["id"], "turnId": turn["turnId"],
                                            "decision": "allow"})
    await ended(sub, turn["turnId"])
    assert (project / "d.txt").read_text() == "d"
