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
