"""The Schedules panel: create an Agent schedule, run it and watch the run finish, delete after a confirmation;
Plan and Goal are not offered (every unattended run of one is refused), and a CLI-made one shows its refusal."""

from __future__ import annotations

import pytest
from playwright.async_api import expect

pytestmark = pytest.mark.asyncio(loop_scope="session")


@pytest.mark.provider_script([{"gate": "scheduled", "text": "Scheduled work done."}])
async def test_schedules_panel_validates_refreshes_and_confirms_delete(ui):
    """Issue 18 item 17: a stale cron error stayed after a successful create, next/last run did not refresh,
    Delete had no confirmation, and Plan/Goal were offered though every such run fails."""
    await ui.open(project=str(ui.project))
    page = ui.page
    await page.get_by_role("button", name="Schedules", exact=True).click()
    dialog = page.get_by_role("dialog", name="Schedules")
    await expect(dialog).to_be_visible()
    await expect(dialog.locator(".sched-empty")).to_have_text("No schedules yet.")
    await expect(dialog.locator(".sched-project")).to_have_text(str(ui.project))
    mode = dialog.get_by_label("Mode")
    await expect(mode.locator("option[value=plan]")).to_be_disabled()
    await expect(mode.locator("option[value=goal]")).to_be_disabled()
    await expect(mode.locator("option[value=plan]")).to_have_text("Plan — needs a person to approve")

    await dialog.get_by_label("Name").fill("Nightly review")
    await dialog.get_by_label("Cron").fill("61 9 * * *")
    await dialog.get_by_label("Prompt").fill("Review the open changes")
    await dialog.get_by_role("button", name="Create schedule").click()
    await expect(dialog.locator(".sched-refused .sched-result-code")).to_have_text("INVALID_PARAMS")
    await dialog.get_by_label("Cron").fill("0 9 * * 1-5")
    await dialog.get_by_role("button", name="Create schedule").click()
    await expect(dialog.locator(".sched-result")).to_contain_text("“Nightly review” created.")
    await expect(dialog.locator(".sched-refused")).to_have_count(0)

    row = dialog.locator(".sched-row", has_text="Nightly review")
    await expect(row.locator(".sched-cron")).to_have_text("0 9 * * 1-5")
    await expect(row.locator(".mini-mode")).to_have_text("Agent")
    await expect(row.locator(".sched-last")).to_have_text("never")
    await row.get_by_role("button", name="Run now").click()
    await expect(row.locator(".sched-status")).to_have_text("running")
    await ui.provider.wait_reached("scheduled")
    ui.provider.release("scheduled")
    await expect(row.locator(".sched-status")).to_have_text("ok")  # without closing and reopening the panel

    await row.get_by_role("button", name="Delete").click()
    confirm = row.locator(".sched-confirm")
    await expect(confirm).to_contain_text("Delete “Nightly review”?")
    assert len((await ui.call("schedules.list"))["schedules"]) == 1
    await confirm.get_by_role("button", name="Cancel").click()
    await expect(row.get_by_role("button", name="Run now")).to_be_visible()
    await row.get_by_role("button", name="Delete").click()
    await row.locator(".sched-confirm").get_by_role("button", name="Delete").click()
    await expect(dialog.locator(".sched-row")).to_have_count(0)
    assert (await ui.call("schedules.list"))["schedules"] == []


async def test_a_plan_schedule_made_elsewhere_shows_its_refusal(ui):
    await ui.call("schedules.create", {"name": "Plan review", "cron": "0 9 * * 1-5", "projectPath": str(ui.project),
                                       "prompt": "Review", "mode": "plan"})
    await ui.open(project=str(ui.project))
    page = ui.page
    await page.get_by_role("button", name="Schedules", exact=True).click()
    dialog = page.get_by_role("dialog", name="Schedules")
    row = dialog.locator(".sched-row", has_text="Plan review")
    await expect(row.locator(".mini-mode")).to_have_text("Plan")
    await row.get_by_role("button", name="Run now").click()
    await expect(dialog.locator(".sched-result-code")).to_have_text("PLAN_REQUIRES_INTERACTIVE_SESSION")
    await expect(row.locator(".sched-code")).to_have_text("PLAN_REQUIRES_INTERACTIVE_SESSION")
    await ui.screenshot("schedules.png")
    await dialog.get_by_role("button", name="Close").click()
    await expect(dialog).to_be_hidden()
