"""Issue 18 ("The clients, as a person uses them"): the web UI items, each driven as a person does."""

from __future__ import annotations

import asyncio
import re

import pytest
from playwright.async_api import expect

pytestmark = pytest.mark.asyncio(loop_scope="session")

PLAN = {"text": "Here is my plan.", "toolCalls": [{"name": "SubmitPlan", "args": {
    "title": "Write NOTES.md", "markdown": "# Write NOTES.md\n\n1. Write it.\n", "question": "May I write NOTES.md?"}}]}


async def idle(ui, session_id: str, timeout: float = 10.0) -> None:
    """Poll the host until the session is idle (a condition the page in front of the user does not show)."""
    async with asyncio.timeout(timeout):
        while (await ui.call("session.get", {"sessionId": session_id, "limit": 1}))["session"]["status"] != "idle":
            await asyncio.sleep(0.05)


def cls(name: str) -> re.Pattern[str]:
    return re.compile(rf"(^|\s){re.escape(name)}(\s|$)")


async def test_an_execution_whose_only_write_was_denied_does_not_say_completed(ui):
    """Issue 18 item 14: a green "execution completed" appeared after the only Write was denied (TOOL_DENIED);
    the card now says "completed with 1 denied call" and lists the denied call."""
    s = await ui.session(mode="plan")
    ui.provider.enqueue(
        s["id"], PLAN,
        {"text": "Carrying out the plan.",
         "toolCalls": [{"name": "Write", "args": {"path": "NOTES.md", "content": "# Notes\n"}}]},
        {"text": "I could not write the file."},
    )
    await ui.open(session=s["id"])
    page = ui.page
    await ui.send("Write a NOTES.md")
    card = page.locator(".approval.approval-pending")
    await card.get_by_role("button", name="Approve").click()
    await page.locator(".perm-card").get_by_role("button", name="Deny").click()

    done = page.locator(".approval.approval-approved")
    badge = done.locator(".card-head .badge").last
    await expect(badge).to_have_text("execution completed with 1 denied call")
    await expect(badge).not_to_have_class(cls("exec-completed"))
    await expect(done.locator(".exec-summary li")).to_have_text([re.compile(r"Denied\s+Write\s+NOTES\.md")])
    await expect(page.locator(".exec-badge")).to_have_text("execution completed with 1 denied call")
    await page.reload()
    await expect(page.locator(".approval.approval-approved .card-head .badge").last).to_have_text(
        "execution completed with 1 denied call")
    assert not (ui.project / "NOTES.md").exists()


async def _fits(page) -> None:
    """No sideways scroll, and every composer button lies inside the viewport."""
    width = await page.evaluate("window.innerWidth")
    assert await page.evaluate("document.documentElement.scrollWidth") <= width
    assert await page.evaluate("document.body.scrollWidth") <= width
    for button in ("#send", "#stop", "#abort", "#mode-chip"):
        box = await page.locator(button).bounding_box()
        assert box is not None, button
        assert box["x"] >= 0 and box["x"] + box["width"] <= width, (button, box, width)


async def test_the_page_fits_a_phone_a_tablet_and_a_desktop(ui):
    """Issue 18 item 11: at 420 px the sidebar took half the screen, the composer was one character wide and
    Send/Stop were cut off; below ~700 px the sidebar now hides behind a button and the composer wraps."""
    other = await ui.session(title="an older session")
    s = await ui.session(title="Refactor the login form so it validates as you type")
    ui.provider.enqueue(s["id"], {"gate": "hold", "text": "Working on it."})
    await ui.open(session=s["id"])
    page = ui.page
    await ui.send("Refactor the login form so every field validates as the user types, with messages under each")
    await ui.provider.wait_reached("hold")
    await ui.send("then add tests for it")
    await expect(page.locator(".queue-entry")).to_have_count(1)
    await expect(page.locator("#abort")).to_be_visible()

    for width, height, shot in ((390, 844, "narrow.png"), (768, 1024, "tablet.png"), (1440, 900, "wide.png")):
        await page.set_viewport_size({"width": width, "height": height})
        await _fits(page)
        if width < 700:
            await expect(page.locator("#sidebar")).to_be_hidden()
            await expect(page.locator("#sidebar-toggle")).to_be_visible()
            assert (await page.locator("#input").bounding_box())["width"] >= width * 0.7  # not one character wide
        else:
            await expect(page.locator("#sidebar")).to_be_visible()
            await expect(page.locator("#sidebar-toggle")).to_be_hidden()
        await ui.screenshot(shot)

    await page.set_viewport_size({"width": 390, "height": 844})
    await page.locator("#sidebar-toggle").click()
    await expect(page.locator("#sidebar")).to_be_visible()
    await _fits(page)
    await ui.screenshot("narrow-sessions.png")
    await page.locator(f'.session-item[data-session="{other["id"]}"]').click()
    await expect(page.locator("#sidebar")).to_be_hidden()
    await expect(page.locator(".title-row h1")).to_have_text("an older session")
    ui.provider.release("hold")


def submit_plan(markdown: str) -> dict:
    return {"toolCalls": [{"name": "SubmitPlan", "args": {
        "title": "Tidy the README", "markdown": markdown, "question": "Shall I tidy the README?"}}]}


async def test_reject_offers_revise_now_which_sends_the_feedback_turn(ui):
    """Issue 18 item 13: after Reject the card was a dead end; it now says the agent will revise and
    "Revise now" sends the feedback turn, whose revision arrives as a new card."""
    s = await ui.session(mode="plan")
    ui.provider.enqueue(s["id"], {"text": "A first plan."} | submit_plan("# Tidy\n\n1. Rewrite the title.\n"),
                        {"text": "Revised."} | submit_plan("# Tidy\n\n1. Keep the title.\n"))
    await ui.open(session=s["id"])
    page = ui.page
    await ui.send("Tidy the README")
    first = page.locator(".approval.approval-pending")
    await first.locator(".feedback").fill("Keep the title line.")
    await first.get_by_role("button", name="Reject").click()

    rejected = page.locator(".approval.approval-rejected")
    await expect(rejected.locator(".revise")).to_contain_text("revises the plan with your feedback")
    await rejected.get_by_role("button", name="Revise now").click()
    second = page.locator(".approval.approval-pending")
    await expect(second.locator(".artifact-rev")).to_have_text("revision")
    await expect(rejected.get_by_role("button", name="Revise now")).to_have_count(0)
    await expect(rejected.locator(".revise-note")).to_contain_text("revised this plan")
    await expect(page.locator(".msg-user .user-text").last).to_have_text(
        "Please revise the plan with my feedback: Keep the title line.")
    assert ui.provider.calls(s["id"]) == 2


async def test_an_abort_holds_the_queue_and_resume_runs_it(ui):
    """Issue 18 item 13: after Abort the queue silently waited; it now shows "Held" with Resume (and Send now)."""
    s = await ui.session()
    ui.provider.enqueue(s["id"], {"text": "Working on the first.", "gateAfter": "hold"},
                        {"text": "Second done."}, {"text": "Third done."})
    await ui.open(session=s["id"])
    page = ui.page
    await ui.send("first")
    await ui.provider.wait_reached("hold")
    await ui.send("second")
    await ui.send("third")
    queue = page.locator("#queue")
    await expect(queue.locator(".queue-text")).to_have_text(["second", "third"])
    await expect(queue.locator(".queue-held")).to_have_count(0)
    await page.locator("#abort").click()

    await expect(queue.locator(".queue-held")).to_have_text("Held — nothing runs until you resume")
    await expect(queue.locator(".queue-entry").first.get_by_role("button", name="Send now")).to_be_visible()
    await ui.screenshot("held-queue.png")
    await queue.get_by_role("button", name="Resume").click()
    await expect(page.locator(".msg-assistant .md").last).to_have_text("Third done.")
    await expect(page.locator(".msg-user .user-text")).to_have_text(["first", "second", "third"])
    await expect(queue).to_be_hidden()


async def test_stop_while_a_plan_waits_says_so_and_offers_abort(ui):
    """Issue 18 item 13: Stop while a plan awaited approval said "Stopping at the next step…" and nothing
    happened; it now explains that the plan is still waiting and offers Abort."""
    s = await ui.session(mode="plan")
    ui.provider.enqueue(s["id"], {"text": "A plan."} | submit_plan("# Tidy\n\n1. Rewrite the title.\n"))
    await ui.open(session=s["id"])
    page = ui.page
    await ui.send("Tidy the README")
    await expect(page.locator(".approval.approval-pending")).to_be_visible()
    await page.get_by_role("button", name="Stop", exact=True).click()

    note = page.locator(".toast", has_text="still waiting for your decision")
    await expect(note).to_be_visible()
    await note.get_by_role("button", name="Abort the turn").click()
    await expect(page.locator(".approval.approval-interrupted")).to_be_visible()
    await expect(page.locator(".status-badge")).to_have_text("idle")


async def test_the_session_menu_renames_and_deletes_with_a_confirmation(ui):
    """Issue 18 item 12: sessions could be neither renamed nor deleted from the page; the ⋯ menu renames in
    place and deletes after a confirmation, saying plainly when the session is busy (AGENT_BUSY)."""
    keep = await ui.session(title="keep me")
    busy = await ui.session(title="Untitled work")
    ui.provider.enqueue(busy["id"], {"gate": "hold", "text": "Still busy."})
    await ui.open(session=busy["id"])
    page = ui.page
    await ui.send("work for a while")
    await ui.provider.wait_reached("hold")
    item = page.locator(".session-li", has=page.locator(f'[data-session="{busy["id"]}"]'))

    await item.get_by_role("button", name="More for Untitled work").click()
    menu = item.locator(".session-menu")
    await expect(menu.get_by_role("menuitem")).to_have_text(["Rename", "Delete…"])
    await ui.screenshot("session-menu.png")
    await menu.get_by_role("menuitem", name="Rename").click()
    box = item.get_by_role("textbox", name="Session title")
    await expect(box).to_be_focused()
    await box.fill("The login bug")
    await box.press("Enter")
    await expect(item.locator(".session-title")).to_have_text("The login bug")
    await expect(page.locator(".title-row h1")).to_have_text("The login bug")
    await expect(page.locator("#abort")).to_be_visible()  # Enter in the rename box did not touch the turn
    assert (await ui.call("session.get", {"sessionId": busy["id"]}))["session"]["title"] == "The login bug"

    await item.get_by_role("button", name="More for The login bug").click()
    await item.get_by_role("menuitem", name="Delete…").click()
    confirm = item.locator(".session-menu.confirm")
    await expect(confirm).to_contain_text("Delete “The login bug”?")
    await confirm.get_by_role("button", name="Delete").click()
    await expect(confirm.locator(".menu-error")).to_contain_text("is busy")
    assert len((await ui.call("session.list"))["sessions"]) == 2

    ui.provider.release("hold")
    await expect(page.locator(".status-badge")).to_have_text("idle")
    await confirm.get_by_role("button", name="Delete").click()
    await expect(page.locator(f'.session-item[data-session="{busy["id"]}"]')).to_have_count(0)
    assert [s["id"] for s in (await ui.call("session.list"))["sessions"]] == [keep["id"]]

    other = page.locator(".session-li", has=page.locator(f'[data-session="{keep["id"]}"]'))
    await other.get_by_role("button", name="More for keep me").click()
    await other.get_by_role("menuitem", name="Delete…").click()
    await other.get_by_role("button", name="Cancel").click()
    await expect(other.locator(".session-menu")).to_have_count(0)
    assert len((await ui.call("session.list"))["sessions"]) == 1


async def test_many_sessions_get_a_filter_box(ui):
    """Issue 18 item 12: a long list of sessions had no way to find one; from eight on a filter box appears."""
    for name in ("alpha report", "beta fix", "gamma docs", "alpha tests", "delta", "epsilon", "zeta"):
        await ui.session(title=name)
    await ui.open(project=str(ui.project))
    page = ui.page
    await expect(page.locator(".session-item[data-session]")).to_have_count(7)
    await expect(page.locator("#session-filter")).to_be_hidden()
    await ui.session(title="eta")
    await expect(page.locator(".session-item[data-session]")).to_have_count(8)
    await page.locator("#session-filter").fill("ALPHA")
    await expect(page.locator(".session-item[data-session] .session-title")).to_have_text(
        ["alpha tests", "alpha report"])
    await page.locator("#session-filter").fill("nothing like it")
    await expect(page.locator(".filter-empty")).to_have_text("No session matches “nothing like it”.")
    await page.locator("#session-filter").press("Escape")
    await expect(page.locator(".session-item[data-session]")).to_have_count(8)


# The browser's Notification API, recording what the page shows (headless Chromium shows nothing).
FAKE_NOTIFICATION = """
window.__shown = [];
class RecordingNotification {
  static permission = 'default';
  static async requestPermission() { RecordingNotification.permission = 'granted'; return 'granted'; }
  constructor(title, options) { this.title = title; this.onclick = null; window.__shown.push(this); }
  close() {}
}
window.Notification = RecordingNotification;
"""


async def test_unseen_finished_turns_count_in_the_title_and_notify_when_asked(ui):
    """Issue 18 item 16: beyond the unread dot nothing told a person in another tab; the page title counts
    unseen finished turns ("(2) …") and, once opted in, each one raises a browser notification."""
    await ui.context.add_init_script(FAKE_NOTIFICATION)
    here = await ui.session(title="here")
    away = await ui.session(title="away")
    await ui.open(session=here["id"])
    page = ui.page
    await expect(page).to_have_title("here · pidesk")
    await page.get_by_label("Notify me when a turn finishes").check()
    await expect(page.get_by_label("Notify me when a turn finishes")).to_be_checked()

    await ui.call("agent.prompt", {"sessionId": away["id"], "text": "one"})
    await expect(page).to_have_title("(1) here · pidesk")
    await idle(ui, away["id"])
    await ui.call("agent.prompt", {"sessionId": away["id"], "text": "two"})
    await expect(page).to_have_title("(2) here · pidesk")
    assert await page.evaluate("window.__shown.map((n) => n.title)") == ["Turn finished: away", "Turn finished: away"]

    await ui.call("agent.prompt", {"sessionId": here["id"], "text": "seen here"})  # finishes in front of the user
    await expect(page.locator(".msg-assistant .md")).to_have_text(["Done."])
    assert await page.evaluate("window.__shown.length") == 2
    await page.evaluate("window.__shown[1].onclick()")
    await expect(page.locator(".title-row h1")).to_have_text("away")
    await expect(page).to_have_title("away · pidesk")


async def test_add_project_refuses_a_missing_folder_where_it_was_typed(ui, tmp_path):
    """Issue 18 item 17: "+ Project" with a missing directory was accepted and failed only on the first send."""
    other = tmp_path / "other"
    other.mkdir()
    await ui.open(project=str(ui.project))
    page = ui.page
    await page.get_by_role("button", name="+ Project").click()
    box = page.get_by_label("project folder")
    await box.fill(str(tmp_path / "no-such-folder"))
    await box.press("Enter")
    await expect(page.locator("#add-project-error")).to_contain_text("is not a directory")
    await expect(page.locator(".tab")).to_have_text(["project"])
    await box.fill(str(other) + "/")
    await expect(page.locator("#add-project-error")).to_be_hidden()
    await box.press("Enter")
    await expect(page.locator(".tab.active")).to_have_text("other")
    await expect(box).to_be_hidden()


async def test_a_write_shows_its_file_content_as_text_not_json(ui):
    """Issue 18 item 18: Write details and the permission card showed raw JSON with `\\n` (or one squashed line);
    the content now reads as the file will."""
    content = "# Notes\n\nline two\n    indented line\n"
    s = await ui.session()
    ui.provider.enqueue(s["id"], {"text": "Writing.", "toolCalls": [{"name": "Write", "args": {
        "path": "NOTES.md", "content": content}}]}, {"text": "Written."})
    await ui.open(session=s["id"])
    page = ui.page
    await ui.send("write the notes")
    card = page.locator(".perm-card")
    await expect(card.locator(".perm-path")).to_have_text("NOTES.md")
    # the host's preview (issue 17): the new file as added lines, each line as it will read
    shown = await card.locator(".perm-diff").inner_text()
    for line in content.splitlines():
        assert f"+{line}" in shown.splitlines() or f"+ {line}" in shown.splitlines(), (line, shown)
    assert "\\n" not in shown and "overwrites" not in await card.inner_text()
    await card.get_by_role("button", name="Allow once").click()

    row = page.locator('.tool[data-name="Write"]')
    await expect(row).to_have_class(cls("tool-ok"))
    await row.locator("summary").click()
    assert await row.locator(".tool-content").text_content() == content
    await expect(row.locator(".tool-path")).to_have_text("NOTES.md")
    assert "\\n" not in await row.locator(".tool-detail").text_content()
    assert (ui.project / "NOTES.md").read_text() == content


async def test_a_tool_duration_reads_the_same_after_a_reload(ui):
    """Issue 18 item 19: tool durations changed after a reload (1 ms -> "≈23 ms", guessed from message times);
    the page now shows the host's measure (tool.finished.durationMs, kept in the result block) both times."""
    s = await ui.session()
    ui.provider.enqueue(s["id"], {"text": "Reading.", "toolCalls": [{"name": "Read", "args": {"path": "README.md"}},
                                                                    {"name": "Glob", "args": {"pattern": "**/*"}}]},
                        {"text": "Read it."})
    await ui.open(session=s["id"])
    page = ui.page
    await ui.send("read the readme")
    await expect(page.locator(".msg-assistant .md").last).to_have_text("Read it.")
    durations = page.locator(".tool .tool-dur")
    await expect(durations).to_have_count(2)
    await expect(durations.first).not_to_have_text("")
    live = await durations.all_text_contents()
    stored = [b["durationMs"] for m in (await ui.call("session.get", {"sessionId": s["id"]}))["messages"]
              for b in m["content"] if b["type"] == "toolResult"]
    assert live == [f"{ms} ms" for ms in stored]
    await page.reload()
    await expect(page.locator("#messages")).not_to_have_class(cls("loading"))
    await expect(durations).to_have_text(live)
