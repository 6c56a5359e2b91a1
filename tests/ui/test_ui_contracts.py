"""Plan rejection with feedback and a revision shown as a diff; the Goal flow with its criteria."""

from __future__ import annotations

import re

import pytest
from playwright.async_api import expect

pytestmark = pytest.mark.asyncio(loop_scope="session")

V1 = """# Tidy the README

1. Rewrite the title line.
2. Add a usage section.
3. Remove the old badge.
"""
V2 = """# Tidy the README

1. Keep the title line as it is.
2. Add a usage section.
3. Remove the old badge.
4. Link the license.
"""


def submit_plan(markdown: str) -> dict:
    return {"toolCalls": [{"name": "SubmitPlan", "args": {
        "title": "Tidy the README", "markdown": markdown, "question": "Shall I tidy the README?"}}]}


async def test_reject_with_feedback_then_revision_shows_a_diff(ui):
    s = await ui.session(mode="plan")
    ui.provider.enqueue(s["id"], {"text": "A first plan."} | submit_plan(V1),
                        {"text": "Revised as you asked."} | submit_plan(V2))
    await ui.open(session=s["id"])
    page = ui.page
    await expect(page.locator("#mode-chip")).to_have_text("Plan")
    await ui.send("Tidy the README")

    first = page.locator(".approval.approval-pending")
    await expect(first.locator(".card-md h1")).to_have_text("Tidy the README")
    await first.locator(".feedback").fill("Keep the title line.")
    await first.get_by_role("button", name="Reject").click()

    rejected = page.locator(".approval.approval-rejected")
    await expect(rejected.locator(".feedback-quote")).to_have_text("Keep the title line.")
    submit_row = page.locator('.tool[data-name="SubmitPlan"]').first
    await expect(submit_row.locator(".tool-code")).to_have_text("PLAN_REJECTED")
    await expect(submit_row.locator(".tool-explain")).to_contain_text("rejected")
    await expect(page.locator(".plan-badge")).to_have_text("planning")
    await expect(page.locator("#mode-chip")).to_be_enabled()

    await ui.send("Please revise it")
    second = page.locator(".approval.approval-pending")
    await expect(second.locator(".artifact-rev")).to_have_text("revision")
    diff = second.locator(".card-diff")
    await expect(diff).to_have_attribute("open", "")
    await expect(diff.locator("summary")).to_contain_text("+2")
    await expect(diff.locator("summary")).to_contain_text("−1")
    await expect(diff.locator(".diff-del")).to_have_text(re.compile("Rewrite the title line"))
    await expect(diff.locator(".diff-add").first).to_have_text(re.compile("Keep the title line as it is"))
    await expect(diff.locator(".diff-add").nth(1)).to_have_text(re.compile("Link the license"))
    approvals = (await ui.call("plans.list", {"sessionId": s["id"]}))["approvals"]
    assert [a["status"] for a in approvals] == ["rejected", "pending"]
    assert approvals[1]["revises"] == approvals[0]["id"] and approvals[0]["feedback"] == "Keep the title line."
    seen = " ".join(repr(m.content) for m in ui.provider.requests[-1].messages)
    assert "Keep the title line." in seen  # the agent saw the feedback
    await second.scroll_into_view_if_needed()
    await ui.screenshot("plan-revision.png")


async def test_goal_flow_with_criteria(ui):
    criteria = ["NOTES.md exists at the project root", "NOTES.md mentions the README"]
    s = await ui.session()
    ui.provider.enqueue(
        s["id"],
        {"text": "Here is the goal.", "toolCalls": [{"name": "SubmitGoal", "args": {
            "title": "A NOTES.md for this project",
            "markdown": "# Goal: NOTES.md\n\n## Acceptance criteria\n\n- " + "\n- ".join(criteria)
                        + "\n\n## Boundaries\n\n- Only NOTES.md changes.\n",
            "question": "Approve this goal?", "criteria": criteria}}]},
        {"text": "Writing the notes.", "toolCalls": [{"name": "Write", "args": {
            "path": "NOTES.md", "content": "# Notes\n\nSee the README.\n"}}]},
        {"text": "Both criteria hold.", "toolCalls": [{"name": "ReportCriteria", "args": {"results": [
            {"criterion": c, "outcome": "met", "evidence": "NOTES.md was written in this turn"} for c in criteria]}}]},
    )
    await ui.open(session=s["id"])
    page = ui.page
    chip = page.locator("#mode-chip")
    await chip.click()
    await chip.click()
    await expect(chip).to_have_text("Goal")
    await expect(page.locator(".mode-badge")).to_have_text("Goal mode")
    await ui.send("Give this project a NOTES.md")

    card = page.locator(".approval.approval-pending")
    await expect(card.locator(".kind")).to_have_text("Goal")
    await expect(card.locator(".criteria li")).to_have_text(criteria)
    await expect(card.locator(".approve-perm")).to_have_value("ask")
    await ui.screenshot("goal-approval.png")
    await card.get_by_role("button", name="Approve").click()

    # Agent mode with permission "ask": the Write asks first
    perm = page.locator(".perm-card")
    await expect(perm.locator(".perm-tool")).to_have_text("Write")
    await perm.get_by_role("button", name="Allow once").click()
    report = page.locator('.tool[data-name="ReportCriteria"]')
    await expect(report.locator(".crit-badge")).to_have_text(["met", "met"])
    await expect(page.locator(".approval.approval-approved .exec-completed")).to_have_text("execution completed")
    await expect(page.locator(".exec-badge")).to_have_text("execution completed")
    assert (ui.project / "NOTES.md").exists()


@pytest.mark.host_config(approval_timeout=1.0)
async def test_an_expired_plan_stays_visible_and_forks_from_its_result(ui):
    s = await ui.session(mode="plan")
    ui.provider.enqueue(s["id"], {"text": "A plan nobody will answer."} | submit_plan(V1))
    await ui.open(session=s["id"])
    page = ui.page
    await ui.send("Tidy the README")
    await expect(page.locator(".approval.approval-pending")).to_be_visible()

    expired = page.locator(".approval.approval-expired")
    await expect(expired.locator(".card-stale")).to_contain_text("expired")
    await expect(page.locator('.tool[data-name="SubmitPlan"] .tool-code')).to_have_text("PLAN_APPROVAL_TIMEOUT")
    await expect(page.locator(".plan-badge")).to_have_text("planning")
    await expired.get_by_role("button", name="Fork from here").click()

    await expect(page.locator(".title-row h1")).to_have_text("ui test (fork)")
    child = next(x for x in (await ui.call("session.list"))["sessions"] if x["forkedFrom"])
    messages = (await ui.call("session.get", {"sessionId": child["id"]}))["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool"]
    assert messages[-1]["content"][0]["errorCode"] == "PLAN_APPROVAL_TIMEOUT"
    assert child["mode"] == "plan"
