"""The demo model walks the whole product offline, on a copy of the sample project."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from pidesk.core import events as ev
from pidesk.providers.demo import CRITERIA, DemoProvider
from tests.scenario import ended, plan_requested, prompt, session, state

pytestmark = pytest.mark.asyncio
SAMPLE = Path(__file__).parents[2] / "examples" / "sample-project"


@pytest.fixture
def sample(tmp_path: Path) -> Path:
    return Path(shutil.copytree(SAMPLE, tmp_path / "sample"))


async def test_demo_plans_then_executes_after_approval(make_host, sample):
    host = make_host(provider=DemoProvider())
    s = await session(host, sample)
    sub = host.subscribe()
    turn = await prompt(host, s["id"], "add some notes about this project")
    approval = (await plan_requested(sub)).approval
    assert (await state(host, s["id"]))["session"]["mode"] == "plan"
    markdown = (sample / approval.artifact_path).read_text()
    assert "README.md" in markdown and "NOTES.md" in markdown
    assert not (sample / "NOTES.md").exists()
    await host.call("plans.resolve", {"approvalId": approval.id, "sessionId": s["id"], "turnId": turn["turnId"],
                                      "decision": "approve", "permissionMode": "accept-edits"})
    execution = await sub.wait_for(lambda e: isinstance(e, ev.TurnStarted) and e.origin == "execution")
    assert (await ended(sub, execution.turn_id)).reason == "completed"
    notes = (sample / "NOTES.md").read_text()
    assert "pyproject.toml" in notes and "src" in notes
    tools = [b["name"] for m in (await state(host, s["id"]))["messages"] for b in m["content"] if b["type"] == "toolCall"]
    assert tools == ["EnterPlanMode", "Glob", "Read", "SubmitPlan", "Write"]


async def test_demo_goal_reports_every_criterion(make_host, sample):
    host = make_host(provider=DemoProvider())
    s = await session(host, sample, mode="goal")
    sub = host.subscribe()
    turn = await prompt(host, s["id"], "make sure the project has notes")
    approval = (await plan_requested(sub)).approval
    assert approval.criteria == CRITERIA
    await host.call("plans.resolve", {"approvalId": approval.id, "sessionId": s["id"], "turnId": turn["turnId"],
                                      "decision": "approve", "permissionMode": "accept-edits"})
    execution = await sub.wait_for(lambda e: isinstance(e, ev.TurnStarted) and e.origin == "execution")
    assert (await ended(sub, execution.turn_id)).reason == "completed"
    assert (await host.call("plans.get", {"approvalId": approval.id}))["executionState"] == "completed"
    reported = [e for e in (await host.call("audit.list", {"sessionId": s["id"]}))["entries"]
                if e["action"] == "goal.reported"]
    assert [r["criterion"] for r in reported[0]["detail"]["results"]] == CRITERIA


async def test_demo_respects_a_rejection(make_host, sample):
    host = make_host(provider=DemoProvider())
    s = await session(host, sample, mode="plan")
    sub = host.subscribe()
    turn = await prompt(host, s["id"], "plan notes")
    approval = (await plan_requested(sub)).approval
    await host.call("plans.resolve", {"approvalId": approval.id, "sessionId": s["id"], "turnId": turn["turnId"],
                                      "decision": "reject", "feedback": "not now"})
    await ended(sub, turn["turnId"])
    assert not (sample / "NOTES.md").exists()
    assert (await state(host, s["id"]))["session"]["mode"] == "plan"


async def test_demo_revises_its_plan_with_the_feedback(make_host, sample):
    """Issue 18 item 20: the demo model ignored the request and the feedback (always NOTES.md, revision diff
    +0 -0); its plan quotes the request, its revision takes the feedback in, and it writes the file asked for."""
    host = make_host(provider=DemoProvider())
    s = await session(host, sample, mode="plan")
    sub = host.subscribe()
    turn = await prompt(host, s["id"], "document the project for newcomers")
    first = (await plan_requested(sub)).approval
    v1 = (sample / first.artifact_path).read_text()
    assert "document the project for newcomers" in v1
    await host.call("plans.resolve", {"approvalId": first.id, "sessionId": s["id"], "turnId": turn["turnId"],
                                      "decision": "reject", "feedback": "Call it SUMMARY.md and mention the tests."})
    await ended(sub, turn["turnId"])

    turn = await prompt(host, s["id"], "Please revise the plan.")
    second = (await plan_requested(sub)).approval
    v2 = (sample / second.artifact_path).read_text()
    assert second.revises == first.id and second.title == "Write SUMMARY.md"
    assert v1 != v2 and "Call it SUMMARY.md and mention the tests." in v2 and "SUMMARY.md" not in v1
    assert "You are still in" not in v2  # the host's words after the feedback are not the user's (issue 31 §5)
    await host.call("plans.resolve", {"approvalId": second.id, "sessionId": s["id"], "turnId": turn["turnId"],
                                      "decision": "approve", "permissionMode": "accept-edits"})
    execution = await sub.wait_for(lambda e: isinstance(e, ev.TurnStarted) and e.origin == "execution")
    assert (await ended(sub, execution.turn_id)).reason == "completed"
    assert (sample / "SUMMARY.md").read_text().startswith("# Summary")  # headed after the file it writes
    assert not (sample / "NOTES.md").exists()


async def test_demo_answers_the_current_request_not_the_sessions_first(make_host, sample):
    """Issue 31 §5: every plan of a session quoted its first request ("You asked: …"), whatever was asked since."""
    host = make_host(provider=DemoProvider())
    s = await session(host, sample, mode="plan")
    sub = host.subscribe()
    turn = await prompt(host, s["id"], "add some notes")
    first = (await plan_requested(sub)).approval
    await host.call("plans.resolve", {"approvalId": first.id, "sessionId": s["id"], "turnId": turn["turnId"],
                                      "decision": "reject"})
    await ended(sub, turn["turnId"])
    turn = await prompt(host, s["id"], "write a changelog instead")
    second = (await plan_requested(sub)).approval
    assert "You asked: “write a changelog instead”" in (sample / second.artifact_path).read_text()
    await host.call("plans.resolve", {"approvalId": second.id, "sessionId": s["id"], "turnId": turn["turnId"],
                                      "decision": "reject"})
    await ended(sub, turn["turnId"])


async def test_the_demo_model_answers_a_summary_request_with_a_summary_and_no_call() -> None:
    """Issue 30: `pidesk compact` on a demo session recorded the demo's next step as the summary."""
    from pidesk.core.records import Message, TextBlock
    from pidesk.providers.base import ModelRequest, TextDelta, ToolCall

    def user(seq: int, text: str) -> Message:
        return Message(id=f"m{seq}", session_id="s", turn_id="t", seq=seq, role="user",
                       content=[TextBlock(text=text)], created_at="")

    request = ModelRequest(session_id="s", turn_id="t", system="", tools=[{"name": "Write"}],
                           messages=[user(1, "add a changelog"), user(2, "Write a summary…")], tool_choice="none")
    events = [e async for e in DemoProvider().stream(request)]
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    assert text.startswith("## Goal\nadd a changelog") and not any(isinstance(e, ToolCall) for e in events)


async def test_the_demo_model_counts_its_whole_input_and_never_quotes_the_hosts_note() -> None:
    """Issue 30, found using it: the demo model counted only the messages (a session never reached its
    window), and after a compaction its plan quoted the host's opening note as "You asked"."""
    from pidesk.core.records import Message, TextBlock, ToolCallBlock, ToolResultBlock
    from pidesk.providers.base import ModelRequest, ToolCall, UsageReport

    def user(seq: int, text: str) -> Message:
        return Message(id=f"m{seq}", session_id="s", turn_id="t", seq=seq, role="user",
                       content=[TextBlock(text=text)], created_at="")

    def answer(seq: int, name: str, output: str) -> list[Message]:
        call = ToolCallBlock(id=f"c{seq}", name=name, args={})
        result = ToolResultBlock(tool_call_id=f"c{seq}", name=name, ok=True, output=output)
        return [Message(id=f"m{seq}", session_id="s", turn_id="t", seq=seq, role="assistant", content=[call],
                        created_at=""),
                Message(id=f"m{seq}r", session_id="s", turn_id="t", seq=seq + 1, role="tool", content=[result],
                        created_at="")]

    tools = [{"name": "SubmitPlan", "description": "x" * 4000, "parameters": {}}, {"name": "Glob"}]
    # a compacted view: the host's opening note (seq 0), then the request kept verbatim, then the investigation
    messages = [user(0, "[The host's record of this session]"), user(7, "add a changelog"),
                *answer(8, "Glob", "README.md"), *answer(10, "Read", "# demo")]
    request = ModelRequest(session_id="s", turn_id="t", system="s" * 8000, tools=tools, messages=messages)
    events = [e async for e in DemoProvider().stream(request)]
    [usage] = [e for e in events if isinstance(e, UsageReport)]
    assert usage.prompt_tokens > 3000  # the system prompt and the tools, not only the messages
    [submit] = [e for e in events if isinstance(e, ToolCall)]
    assert submit.name == "SubmitPlan" and "You asked: “add a changelog”" in submit.args["markdown"]
