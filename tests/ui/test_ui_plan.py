"""The Plan flow in a real browser: enter Plan with the chip, submit, approve with accept-edits, execution runs."""

from __future__ import annotations

import pytest
from playwright.async_api import expect

pytestmark = pytest.mark.asyncio(loop_scope="session")

PLAN_MD = """# Write NOTES.md

The project has a README and one module.

## Steps

1. Write `NOTES.md` with a short description of the project.
2. Change nothing else.
"""


async def test_plan_flow_enter_submit_approve_execute(ui):
    s = await ui.session()
    ui.provider.enqueue(
        s["id"],
        {"text": "Let me look at the project first.", "toolCalls": [{"name": "Read", "args": {"path": "README.md"}}]},
        {"text": "Here is my plan.", "toolCalls": [{"name": "SubmitPlan", "args": {
            "title": "Write NOTES.md", "markdown": PLAN_MD, "question": "May I write NOTES.md?"}}]},
        {"text": "Carrying out the approved plan.",
         "toolCalls": [{"name": "Write", "args": {"path": "NOTES.md", "content": "# Notes\n\nA demo project.\n"}}]},
        {"text": "Done: **NOTES.md** is written, as the plan said."},
    )
    await ui.open(session=s["id"])
    page = ui.page
    chip = page.locator("#mode-chip")
    await expect(chip).to_have_text("Agent")
    await chip.click()
    await expect(chip).to_have_text("Plan")
    await expect(page.locator(".mode-badge")).to_have_text("Plan mode")
    await expect(page.locator("#may-do")).to_contain_text("no file writes or edits")

    await ui.send("Write a NOTES.md for this project")
    card = page.locator(".approval.approval-pending")
    await expect(card).to_be_visible()
    pending = (await ui.call("plans.pending", {"sessionId": s["id"]}))["approvals"]
    assert len(pending) == 1
    approval = pending[0]
    await expect(card.locator(".sha")).to_have_text(approval["artifactSha256"][:12])
    await expect(card.locator(".artifact-path")).to_have_text(approval["artifactPath"])
    await expect(card.locator(".question")).to_have_text("May I write NOTES.md?")
    await expect(card.locator(".card-md h1")).to_have_text("Write NOTES.md")
    await expect(page.locator(".plan-badge")).to_have_text("awaiting approval")
    await expect(page.locator('.tool[data-name="Read"]')).to_have_class(_cls("tool-ok"))
    await expect(card.locator(".approve-perm")).to_have_value("ask")
    await ui.screenshot("plan-approval.png")

    await card.locator(".approve-perm").select_option("accept-edits")
    await expect(card.locator(".may-do")).to_contain_text("Edits files without asking")
    await card.get_by_role("button", name="Approve").click()

    done = page.locator(".approval.approval-approved")
    await expect(done.locator(".exec-completed")).to_have_text("execution completed")
    await expect(done.locator(".card-outcome")).to_contain_text("Accept edits")
    await expect(page.locator('.tool[data-name="Write"]')).to_have_class(_cls("tool-ok"))
    await expect(page.locator(".msg-assistant .md strong", has_text="NOTES.md")).to_be_visible()
    await expect(page.locator(".msg-host .msg-who")).to_have_text("Host · execution")
    await expect(page.locator(".mode-badge")).to_have_text("Agent mode")
    await expect(page.locator(".perm-badge")).to_have_text("permissions: accept-edits")
    assert (ui.project / "NOTES.md").read_text() == "# Notes\n\nA demo project.\n"
    await ui.screenshot("transcript.png")


def _cls(name):
    import re

    return re.compile(rf"(^|\s){name}(\s|$)")
