"""Issue 31 §4: the web UI's day-one rough edges, each driven as a person uses the page.

Layout items run at a phone's, a tablet's and a desktop's width (390, 768 and 1440 px) and
assert what shows: boxes inside the viewport or the panel that holds them, text not cut.
"""

from __future__ import annotations

import re

import pytest
from playwright.async_api import expect

pytestmark = pytest.mark.asyncio(loop_scope="session")

WIDTHS = {390: 844, 768: 1024, 1440: 900}
SHORT_PHONE = {"width": 390, "height": 664}  # a phone's page with the browser's bars showing

LONG_PLAN = "# Refactor the login form\n\n" + "".join(
    f"{n}. Change how field {n} validates: report as the user types, and add a test for it.\n" for n in range(1, 31))


def submit(markdown: str, title: str = "Refactor the login form") -> dict:
    return {"text": "Here is my plan.", "toolCalls": [{"name": "SubmitPlan", "args": {
        "title": title, "markdown": markdown, "question": "May I refactor it?"}}]}


async def inside(locator, container) -> None:
    """The element's box lies wholly inside the container's box (what the container shows of it)."""
    box = await locator.bounding_box()
    frame = await container.bounding_box()
    assert box is not None and frame is not None
    assert box["x"] >= frame["x"] - 0.5 and box["x"] + box["width"] <= frame["x"] + frame["width"] + 0.5, (box, frame)
    assert box["y"] >= frame["y"] - 0.5 and box["y"] + box["height"] <= frame["y"] + frame["height"] + 0.5, (box, frame)


async def not_cut(locator) -> None:
    """Its text shows whole: no ellipsis, nothing clipped at its right edge."""
    assert await locator.evaluate("e => e.scrollWidth <= Math.ceil(e.getBoundingClientRect().width) + 1"), \
        await locator.text_content()


# ---- 1. a new plan card shows its Approve and Reject at once ----------------------------------

@pytest.mark.parametrize("width", list(WIDTHS))
async def test_a_new_plan_card_comes_into_view_with_approve_and_reject_showing(ui, width):
    """A plan taller than the screen was shown from its top with its buttons below the fold; the
    card now shows its head and its Approve/Reject bar stays at the transcript's bottom edge."""
    await ui.page.set_viewport_size({"width": width, "height": WIDTHS[width]})
    s = await ui.session(mode="plan", title="Refactor the login form")
    ui.provider.enqueue(s["id"], {"text": "\n\n".join(f"Looked at part {n} of the form." for n in range(12)),
                                  "toolCalls": [{"name": "Read", "args": {"path": "README.md"}}]},
                        submit(LONG_PLAN))
    await ui.open(session=s["id"])
    page = ui.page
    await ui.send("Plan the refactor of the login form")
    card = page.locator(".approval.approval-pending")
    await expect(card.locator(".card-md h1")).to_have_text("Refactor the login form")
    transcript = page.locator("#transcript")
    for name in ("Approve", "Reject"):
        button = card.get_by_role("button", name=name, exact=True)
        await expect(button).to_be_in_viewport(ratio=1)
        await inside(button, transcript)
    await expect(card.locator(".card-title")).to_be_in_viewport(ratio=1)  # and the card from its head
    await inside(card.locator(".card-title"), transcript)
    if width == 390:
        await ui.screenshot("day-one-1-plan-card-390.png")
    # the bar sticks only while the card is on screen: the end of the card still reads in order
    await card.locator(".feedback").scroll_into_view_if_needed()
    await expect(card.locator(".feedback")).to_be_in_viewport(ratio=1)
    await card.get_by_role("button", name="Approve", exact=True).click()
    await expect(page.locator(".approval.approval-approved")).to_be_visible()


# ---- 2. the transcript follows the bottom, unless the reader scrolled up -------------------------

PARTS = "\n\n".join(f"## Part {n}\n\nWhat part {n} of the module does, in a sentence or two." for n in range(1, 13))


async def settled_at_bottom(page) -> None:
    await page.wait_for_function(
        "() => { const t = document.querySelector('#transcript'); return t.scrollHeight - t.scrollTop - t.clientHeight < 2; }")


async def test_the_transcript_follows_new_text_unless_the_reader_scrolled_up(ui):
    s = await ui.session()
    ui.provider.enqueue(
        s["id"],
        {"text": PARTS, "gateAfter": "a", "toolCalls": [{"name": "Read", "args": {"path": "README.md"}}]},
        {"gate": "b", "text": "Second answer. " + "\n\n".join(f"Line {n} of the second answer." for n in range(30))
         + "\n\nEnd of the second answer.", "gateAfter": "c", "toolCalls": [{"name": "Read", "args": {"path": "src/app.py"}}]},
        {"gate": "d", "text": "\n\n".join(f"Closing line {n}." for n in range(30)) + "\n\nThe very last line."},
    )
    await ui.open(session=s["id"])
    page = ui.page
    await ui.send("Explain the module")
    await ui.provider.wait_reached("a")
    streaming = page.locator(".msg-assistant.streaming")
    await expect(streaming).to_contain_text("Part 12")
    await expect(streaming.locator(".caret")).to_be_in_viewport()  # followed while it streamed
    ui.provider.release("a")
    # the answer ends and its Markdown (headings: taller than the plain text) replaces the plain text
    await expect(page.locator(".msg-assistant .md h2", has_text="Part 12")).to_be_visible()
    await ui.provider.wait_reached("b")
    ui.provider.release("b")
    await ui.provider.wait_reached("c")
    await expect(page.locator(".msg-assistant.streaming")).to_contain_text("End of the second answer.")
    await expect(page.locator(".msg-assistant.streaming .caret")).to_be_in_viewport()  # still following

    # the reader goes back up to part 2: new content arrives below without moving it
    heading = page.locator(".msg-assistant .md h2", has_text=re.compile(r"^Part 2$"))
    await heading.scroll_into_view_if_needed()
    await expect(heading).to_be_in_viewport()
    before = await heading.bounding_box()
    ui.provider.release("c")
    await expect(page.locator('.tool[data-name="Read"]').nth(1)).to_have_class(re.compile(r"\btool-ok\b"))
    await ui.provider.wait_reached("d")
    after = await heading.bounding_box()
    assert abs(after["y"] - before["y"]) < 2, (before, after)
    await expect(page.locator(".tool").nth(1)).not_to_be_in_viewport()

    # back at the bottom, it follows again
    await page.locator("#transcript").hover()
    await page.mouse.wheel(0, 100_000)
    await settled_at_bottom(page)
    ui.provider.release("d")
    last = page.locator(".msg-assistant", has_text="The very last line.")
    await expect(last).to_be_visible()
    await expect(last.get_by_text("The very last line.")).to_be_in_viewport(ratio=1)


# ---- 3. sidebar titles a person can tell apart ----------------------------------------------------

@pytest.mark.parametrize("width", list(WIDTHS))
async def test_sidebar_titles_are_cut_with_a_tooltip_and_stay_distinguishable(ui, width):
    page = ui.page
    await page.set_viewport_size({"width": width, "height": WIDTHS[width]})
    typed = await ui.session(title="Refactor the login form so it validates every field as you type")
    submitted = await ui.session(title="Refactor the login form so it validates every field on submit")
    twin_a = await ui.session(title="ui test")
    twin_b = await ui.session(title="ui test")
    await ui.open(session=typed["id"])
    if width < 700:
        await page.locator("#sidebar-toggle").click()
    sidebar = page.locator("#sidebar")
    await expect(sidebar).to_be_visible()
    for s, tail in ((typed, "as you type"), (submitted, "on submit")):
        item = page.locator(f'.session-item[data-session="{s["id"]}"]')
        await expect(item).to_have_attribute("title", s["title"])  # the whole title on hover
        differs = item.get_by_text(tail, exact=True)
        await expect(differs).to_be_visible()
        await not_cut(differs)
        await inside(differs, item)
    seen = []
    for s in (twin_a, twin_b):
        item = page.locator(f'.session-item[data-session="{s["id"]}"]')
        started = item.locator(".session-started")
        await expect(started).to_have_text(re.compile(rf"^\d\d:\d\d · {s['id'][-6:]}$"))
        await not_cut(started)
        await inside(started, sidebar)
        await expect(item).to_have_attribute("title", re.compile(rf"^ui test\nstarted .*{s['id']}$"))
        seen.append(await started.text_content())
    assert seen[0] != seen[1]
    if width == 768:
        await ui.screenshot("day-one-3-sidebar-768.png")


# ---- 4. the schedules dialog fits the screen --------------------------------------------------------

@pytest.mark.parametrize("width", list(WIDTHS))
async def test_the_schedules_dialog_fits_without_sideways_scrolling(ui, width):
    page = ui.page
    await page.set_viewport_size({"width": width, "height": WIDTHS[width]})
    await ui.call("schedules.create", {"name": "Nightly review of the open changes", "cron": "0 9 * * 1-5",
                                       "projectPath": str(ui.project), "prompt": "Review the open changes and summarise them"})
    await ui.open(project=str(ui.project))
    await page.get_by_role("button", name="Schedules", exact=True).click()
    dialog = page.get_by_role("dialog", name="Schedules")
    await expect(dialog.locator(".sched-row")).to_have_count(1)
    box = await dialog.bounding_box()
    assert box["x"] >= 0 and box["x"] + box["width"] <= width, box
    assert await dialog.evaluate("d => d.scrollWidth <= d.clientWidth"), "the dialog scrolls sideways"
    row = dialog.locator(".sched-row")
    controls = [dialog.get_by_role("button", name="Close"), row.get_by_role("button", name="Run now"),
                row.get_by_role("button", name="Delete"), dialog.get_by_label("Name"), dialog.get_by_label("Cron"),
                dialog.get_by_label("Mode"), dialog.get_by_label("Permissions"), dialog.get_by_label("Prompt"),
                dialog.get_by_role("button", name="Create schedule")]
    for control in controls:
        await control.scroll_into_view_if_needed()
        await expect(control).to_be_in_viewport(ratio=1)
        await inside(control, dialog)
    if width == 768:
        await dialog.get_by_role("button", name="Close").scroll_into_view_if_needed()
        await ui.screenshot("day-one-4-schedules-768.png")


# ---- 5. a phone keeps the active tab and a permission card's answers in view ---------------------

async def test_on_a_phone_the_active_tab_and_the_permission_answers_stay_in_view(ui, tmp_path):
    page = ui.page
    for name in ("alpha-service", "beta-web-frontend", "delta-infra", "epsilon-docs"):  # tabs sort before "project"
        (tmp_path / name).mkdir()
        await ui.call("session.create", {"projectPath": str(tmp_path / name), "title": f"work in {name}"})
    s = await ui.session(title="write the module")
    body = "\n".join(f"print('line {n}')" for n in range(80))
    ui.provider.enqueue(s["id"], {"text": "Writing it.", "toolCalls": [{"name": "Write", "args": {"path": "src/app.py", "content": body}}]})
    await page.set_viewport_size({"width": 1440, "height": 900})
    await ui.open(session=s["id"])
    tab = page.get_by_role("tab", name="project", exact=True)
    await expect(tab).to_have_attribute("aria-selected", "true")
    await page.set_viewport_size(SHORT_PHONE)  # narrowed with the page open
    await expect(tab).to_be_in_viewport(ratio=1)
    await inside(tab, page.locator("#tabs"))
    await ui.open(session=s["id"])  # and opened on the phone
    await expect(tab).to_be_in_viewport(ratio=1)
    await inside(tab, page.locator("#tabs"))

    await ui.send("write src/app.py")
    card = page.locator(".perm-card")
    await expect(card.locator(".perm-diff")).to_be_visible()
    for name in ("Allow once", "Allow for this session", "Deny"):
        await expect(card.get_by_role("button", name=name)).to_be_in_viewport(ratio=1)
    await expect(page.locator("#send")).to_be_in_viewport(ratio=1)  # the composer is not pushed off either
    await expect(page.locator("#may-do")).to_be_in_viewport(ratio=1)
    await ui.screenshot("day-one-5-phone-permission-390.png")
    await card.get_by_role("button", name="Allow once").click()
    await expect(page.locator(".perm-card")).to_have_count(0)


# ---- 6. a finished execution's chip goes when a new plan starts ---------------------------------

async def test_the_execution_completed_chip_goes_when_a_new_plan_starts(ui):
    s = await ui.session(mode="plan")
    ui.provider.enqueue(s["id"], submit("# Write NOTES.md\n\n1. Write it.\n", "Write NOTES.md"),
                        {"text": "Writing.", "toolCalls": [{"name": "Write", "args": {"path": "NOTES.md", "content": "notes\n"}}]},
                        {"text": "Done."})
    await ui.open(session=s["id"])
    page = ui.page
    await ui.send("Write a NOTES.md")
    card = page.locator(".approval.approval-pending")
    await card.locator(".approve-perm").select_option("accept-edits")
    await card.get_by_role("button", name="Approve").click()
    chip = page.locator(".session-head .exec-badge")
    await expect(chip).to_have_text("execution completed")
    await expect(page.locator(".status-badge")).to_have_text("idle")
    await page.locator("#mode-chip").click()  # Plan: a new plan starts
    await expect(page.locator(".mode-badge")).to_have_text("Plan mode")
    await expect(chip).to_have_count(0)
    await page.reload()
    await expect(page.locator(".mode-badge")).to_have_text("Plan mode")
    await expect(page.locator(".approval.approval-approved")).to_be_visible()
    await expect(chip).to_have_count(0)
    # the card itself keeps its history
    await expect(page.locator(".approval.approval-approved .exec-completed")).to_have_text("execution completed")


# ---- 7. an identical revision says so ------------------------------------------------------------

async def test_an_identical_revision_says_no_changes(ui):
    plan = "# Tidy the README\n\n1. Rewrite the title line.\n"
    s = await ui.session(mode="plan")
    ui.provider.enqueue(s["id"], submit(plan, "Tidy the README"), submit(plan, "Tidy the README"))
    await ui.open(session=s["id"])
    page = ui.page
    await ui.send("Tidy the README")
    first = page.locator(".approval.approval-pending")
    await first.locator(".feedback").fill("Are you sure?")
    await first.get_by_role("button", name="Reject").click()
    await expect(page.locator(".approval.approval-rejected")).to_be_visible()
    await ui.send("Please revise it")
    second = page.locator(".approval.approval-pending")
    await expect(second.locator(".artifact-rev")).to_have_text("revision")
    await expect(second.locator(".card-same")).to_have_text(
        "No changes since the previous revision: the agent resubmitted the same plan.")
    await expect(second).not_to_contain_text("+0")
    await expect(second.locator(".card-diff summary")).to_have_count(0)


# ---- 8. popovers close on a click outside ---------------------------------------------------------

async def test_popovers_and_menus_close_on_a_click_outside(ui):
    s = await ui.session(title="menu test")
    await ui.open(session=s["id"])
    page = ui.page
    head = page.locator("#session-head")

    await page.locator(".session-li", has_text="menu test").get_by_role("button", name="More for menu test").click()
    await expect(page.get_by_role("menu")).to_be_visible()
    await head.click()
    await expect(page.get_by_role("menu")).to_have_count(0)

    await page.get_by_role("button", name="+ Project").click()
    await expect(page.locator("#add-project-input")).to_be_visible()
    await page.locator("#add-project-input").fill("/somewhere")
    await head.click()
    await expect(page.locator("#add-project-input")).to_be_hidden()
    await page.get_by_role("button", name="+ Project").click()
    await expect(page.locator("#add-project-input")).to_have_value("/somewhere")  # what was typed is kept
    await head.click()

    await page.get_by_role("button", name="Schedules", exact=True).click()
    dialog = page.get_by_role("dialog", name="Schedules")
    await expect(dialog).to_be_visible()
    await dialog.get_by_label("Name").click()  # a click inside keeps it open
    await expect(dialog).to_be_visible()
    await page.mouse.click(5, 810)  # the shade around it
    await expect(dialog).to_be_hidden()

    await page.set_viewport_size({"width": 390, "height": 844})
    await page.locator("#sidebar-toggle").click()
    await expect(page.locator("#sidebar")).to_be_visible()
    await page.mouse.click(370, 500)  # the page beside the sidebar
    await expect(page.locator("#sidebar")).to_be_hidden()


# ---- 9. a page without its token says how to open it ---------------------------------------------

async def test_a_page_without_its_token_says_how_to_open_the_printed_address(ui):
    page = ui.page
    port = ui.url.rsplit(":", 1)[1]
    await page.goto(f"{ui.url}/")
    await expect(page.locator("#banner")).to_have_text(
        "This page was opened without the host’s token, so it cannot connect: open the address "
        "`pidesk serve` printed (it ends in ?token=…).")
    help_ = page.get_by_role("region", name="How to connect")
    await expect(help_.get_by_role("heading")).to_have_text("This page needs the host’s token")
    await expect(help_.locator(".locked-line")).to_have_text(f"pidesk serving at http://127.0.0.1:{port}/?token=…")
    await expect(help_).to_contain_text("--log-safe")
    await expect(page.locator("#conn")).to_have_text("no token")
    await expect(page.locator("#input")).to_be_disabled()
    await expect(page.locator("#messages")).not_to_have_class(re.compile(r"\bloading\b"))
    await ui.screenshot("day-one-9-no-token.png")

    await page.goto(f"{ui.url}/?token=not-the-token")
    await expect(page.locator("#conn")).to_have_text("the token was rejected")
    await expect(page.locator("#banner")).to_contain_text("The host refused this page’s token")
    await expect(help_.get_by_role("heading")).to_have_text("This is not the host’s token")
    await expect(help_).to_contain_text("--new-token")

    await ui.open()  # the printed address works
    await expect(page.locator("#banner")).to_be_hidden()
    await expect(page.locator("#input")).to_be_enabled()
    # the browser logs the refused probe (401) as a console error: expected here
    ui.errors[:] = [e for e in ui.errors if "401" not in e]


# ---- 10. the sidebar reads sessions a page at a time ----------------------------------------------

async def test_the_sidebar_pages_the_session_list_and_keeps_live_sessions(ui):
    made = [await ui.session(title=f"session {n:03}") for n in range(130)]
    oldest, newest = made[0], made[-1]
    await ui.open(session=oldest["id"])  # older than the first page: it still opens, and shows
    page = ui.page
    items = page.locator(".session-item[data-session]")
    await expect(page.locator(".title-row h1")).to_have_text("session 000")
    await expect(page.locator(f'.session-item[data-session="{oldest["id"]}"]')).to_have_attribute("aria-current", "true")
    await expect(items).to_have_count(101)  # the newest 100, and the one open
    await expect(items.first).to_have_text(re.compile(r"^session 129"))
    more = page.get_by_role("button", name="Show older sessions")
    await expect(more).to_be_visible()

    await ui.session(title="made while the page is open")  # live: on top at once
    await expect(items.first).to_have_text(re.compile(r"^made while the page is open"))
    await expect(items).to_have_count(102)

    await page.locator("#sessions").hover()
    await page.mouse.wheel(0, 100_000)  # scrolling to the end reads the next page
    await expect(items).to_have_count(131)
    await expect(more).to_have_count(0)
    await expect(items.last).to_have_text(re.compile(r"^session 000"))
    assert newest["id"] in [await i.get_attribute("data-session") for i in await items.all()][:3]
