"""The Schedules panel: create a Plan schedule, see it listed, Run now is refused, Delete removes it."""

from __future__ import annotations

import pytest
from playwright.async_api import expect

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def test_schedules_panel_create_run_now_refused_and_delete(ui):
    await ui.open(project=str(ui.project))
    page = ui.page
    await page.get_by_role("button", name="Schedules", exact=True).click()
    dialog = page.get_by_role("dialog", name="Schedules")
    await expect(dialog).to_be_visible()
    await expect(dialog.locator(".sched-empty")).to_have_text("No schedules yet.")
    await expect(dialog.locator(".sched-project")).to_have_text(str(ui.project))
    await expect(dialog.locator(".sched-note")).to_contain_text("Plan and Goal schedules are refused at run time")

    await dialog.get_by_label("Name").fill("Nightly review")
    await dialog.get_by_label("Cron").fill("0 9 * * 1-5")
    await dialog.get_by_label("Mode").select_option("plan")
    await dialog.get_by_label("Permissions").select_option("ask")
    await dialog.get_by_label("Prompt").fill("Review the open changes")
    await dialog.get_by_role("button", name="Create schedule").click()

    row = dialog.locator(".sched-row", has_text="Nightly review")
    await expect(row).to_have_count(1)
    await expect(row.locator(".sched-cron")).to_have_text("0 9 * * 1-5")
    await expect(row.locator(".mini-mode")).to_have_text("Plan")
    await expect(row.locator(".sched-last")).to_have_text("never")
    [schedule] = (await ui.call("schedules.list"))["schedules"]
    assert (schedule["name"], schedule["mode"], schedule["projectPath"]) == ("Nightly review", "plan", str(ui.project))

    await row.get_by_role("button", name="Run now").click()
    await expect(dialog.locator(".sched-result-code")).to_have_text("PLAN_REQUIRES_INTERACTIVE_SESSION")
    await expect(row.locator(".sched-code")).to_have_text("PLAN_REQUIRES_INTERACTIVE_SESSION")
    await ui.screenshot("schedules.png")

    await row.get_by_role("button", name="Delete").click()
    await expect(dialog.locator(".sched-row")).to_have_count(0)
    await expect(dialog.locator(".sched-empty")).to_be_visible()
    assert (await ui.call("schedules.list"))["schedules"] == []
    await dialog.get_by_role("button", name="Close").click()
    await expect(dialog).to_be_hidden()
