"""Context compaction in the web UI (issue 30): the divider a compaction leaves in the transcript, the
header's context meter and Compact button, and the approval card's choice of context for the execution."""

from __future__ import annotations

import re

import pytest
from playwright.async_api import expect

pytestmark = pytest.mark.asyncio(loop_scope="session")

PLAN_MD = """# Write NOTES.md

## Steps

1. Write `NOTES.md` with a short description of the project.
"""


def _cls(name: str) -> re.Pattern[str]:
    return re.compile(rf"(^|\s){re.escape(name)}(\s|$)")


async def test_compact_button_leaves_a_divider_with_the_summary_and_the_meter_counts_it(ui):
    """Compact folds the conversation into the model's summary: a folded divider (not a user bubble)
    says so with the token figures, opens to the summary, and the meter's tooltip counts the compaction.
    Asked again with nothing new said, the host has nothing to compact and the page says so."""
    s = await ui.session()
    ui.provider.enqueue(s["id"], {"text": "Notes are written.", "usage": {"inputTokens": 2300, "outputTokens": 12}},
                        {"summary": "## Goal\nWe wrote notes for the project."})
    await ui.open(session=s["id"])
    page = ui.page
    await ui.send("write some notes")
    await expect(page.locator(".msg-assistant .md")).to_have_text(["Notes are written."])
    meter = page.locator(".context-meter")
    await expect(meter).to_have_text("context 2% · 2.3k / 128k")
    await expect(meter).to_have_attribute("title", re.compile("Not compacted yet"))

    await page.get_by_role("button", name="Compact", exact=True).click()
    divider = page.locator("details.compaction")
    await expect(divider.locator("summary")).to_have_text(re.compile(r"^Context compacted \(manual\) · [\d,]+ → [\d,]+ tokens$"))
    await expect(page.locator(".msg-user")).to_have_count(1)  # the prompt; the compaction is no bubble
    summary = divider.locator(".compaction-summary")
    await expect(summary).to_be_hidden()
    await divider.locator("summary").click()
    await expect(summary.locator("h2")).to_have_text("Goal")  # the host's Markdown, as assistant text gets
    await expect(summary).to_contain_text("We wrote notes for the project.")
    await expect(meter).to_have_attribute("title", re.compile("Compacted once so far"))
    await expect(page.locator(".compact-now")).to_be_enabled()
    await ui.screenshot("compaction.png")

    await page.get_by_role("button", name="Compact", exact=True).click()
    await expect(page.locator(".toast-info")).to_contain_text("Nothing to compact")
    await expect(divider).to_have_count(1)
    window = (await ui.call("session.context", {"sessionId": s["id"]}))["window"]
    assert window["compactions"] == 1

    await ui.open(session=s["id"])  # read back from session.get: the same divider, still no bubble
    await expect(page.locator("details.compaction summary")).to_have_text(re.compile(r"^Context compacted \(manual\)"))
    await expect(page.locator(".msg-user")).to_have_count(1)


async def test_compact_is_disabled_while_a_turn_runs_and_a_refusal_is_explained(ui):
    """While a turn runs the button is disabled and says why; a compaction the host refuses anyway
    (AGENT_BUSY: a turn started after the page last looked) comes back as a toast with the host's words."""
    s = await ui.session()
    ui.provider.enqueue(s["id"], {"text": "First answer."}, {"gate": "hold", "text": "Second answer."})
    await ui.open(session=s["id"])
    page = ui.page
    await ui.send("first")
    await expect(page.locator(".msg-assistant .md")).to_have_text(["First answer."])
    button = page.locator(".compact-now")
    await expect(button).to_be_enabled()

    await ui.send("second")
    await ui.provider.wait_reached("hold")
    await expect(button).to_be_disabled()
    await expect(button).to_have_attribute("title", re.compile("The session is busy"))
    # what the host answers a page that still thinks the session idle
    await page.evaluate("""() => {
        const b = document.querySelector('.compact-now');
        b.disabled = false;
        b.click();
    }""")
    await expect(page.locator(".toast-error")).to_contain_text("AGENT_BUSY")
    await expect(page.locator(".toast-error")).to_contain_text("the session is busy")
    ui.provider.release("hold")
    await expect(page.locator(".msg-assistant .md")).to_have_text(["First answer.", "Second answer."])
    await expect(button).to_be_enabled()
    await expect(page.locator("details.compaction")).to_have_count(0)


async def test_approving_with_start_fresh_sends_context_fresh_and_shows_the_fresh_divider(ui):
    """The approval card offers the execution's context beside its permissions (Keep by default);
    "Start fresh" reaches the host, and the execution opens with the "fresh context" divider."""
    s = await ui.session(mode="plan")
    ui.provider.enqueue(
        s["id"],
        {"text": "Here is my plan.", "toolCalls": [{"name": "SubmitPlan", "args": {
            "title": "Write NOTES.md", "markdown": PLAN_MD, "question": "May I write NOTES.md?"}}]},
        {"text": "Working from the contract alone."},
    )
    await ui.open(session=s["id"])
    page = ui.page
    await ui.send("Write a NOTES.md for this project")
    card = page.locator(".approval.approval-pending")
    choice = card.locator(".approve-context")
    await expect(choice).to_have_value("keep")
    await expect(card.locator(".decide-context")).to_contain_text("Context for the execution")
    await expect(choice.locator("option")).to_have_text(
        ["Keep the conversation (default)", "Compact it first", "Start fresh"])
    await choice.select_option(label="Start fresh")
    await expect(card.locator(".context-hint")).to_contain_text("starts at the approved contract alone")
    await card.get_by_role("button", name="Approve").click()

    done = page.locator(".approval.approval-approved")
    await expect(done.locator(".exec-completed")).to_have_text("execution completed")
    await expect(done.locator(".card-outcome")).to_have_text(
        "Approved. The execution runs in Agent mode with permissions Ask, starting from a fresh context.")
    divider = page.locator("details.compaction.compaction-fresh")
    await expect(divider.locator("summary")).to_contain_text("Execution started with a fresh context")
    await divider.locator("summary").click()
    await expect(divider.locator(".compaction-why")).to_contain_text("the model sees the approved contract")
    await expect(divider.locator(".compaction-summary")).to_have_count(0)  # a fresh start has no summary
    await expect(page.locator(".msg-assistant .md").last).to_have_text("Working from the contract alone.")
    [approval] = (await ui.call("plans.list", {"sessionId": s["id"]}))["approvals"]
    assert (approval["status"], approval["context"]) == ("approved", "fresh")


async def test_the_meter_shows_the_share_of_the_window_the_last_request_used(ui):
    """A turn whose request the provider counted at 64,000 input tokens fills half the default
    128,000-token window; the turn's own usage line, cache reads apart, sits under its answer once it ends."""
    s = await ui.session()
    ui.provider.enqueue(s["id"], {"text": "A long read.",
                                  "usage": {"inputTokens": 64000, "outputTokens": 5, "cacheTokens": 12300}})
    await ui.open(session=s["id"])
    page = ui.page
    # before any request: the estimate of the next one (the system prompt and the tools, ~1.6k tokens)
    await expect(page.locator(".context-meter")).to_have_text(re.compile(r"^context 1% · 1\.\dk / 128k$"))
    await ui.send("read everything")
    meter = page.locator(".context-meter")
    await expect(meter).to_have_text("context 50% · 64k / 128k")
    await expect(meter).not_to_have_class(_cls("meter-high"))
    await expect(meter).to_have_attribute("title", re.compile("64,000 of 128,000 tokens"))
    await expect(page.locator(".turn-usage")).to_have_text("64,000 in · 5 out · cache 12,300 read")


async def test_a_full_window_turns_the_meter_amber_and_the_next_turn_compacts_by_itself(ui):
    """Past 85 % of the window the meter is amber; the next request compacts on its own (reason auto)
    and the meter drops back."""
    s = await ui.session()
    ui.provider.enqueue(s["id"], {"text": "A very long read.", "usage": {"inputTokens": 120000, "outputTokens": 5}},
                        {"summary": "We read everything."}, {"text": "Carrying on from the summary."})
    await ui.open(session=s["id"])
    page = ui.page
    await ui.send("read everything")
    meter = page.locator(".context-meter")
    await expect(meter).to_have_text("context 94% · 120k / 128k")
    await expect(meter).to_have_class(_cls("meter-high"))

    await ui.send("and now?")
    divider = page.locator("details.compaction")
    await expect(divider.locator("summary")).to_have_text(re.compile(r"^Context compacted \(auto\) · [\d,]+ → [\d,]+ tokens$"))
    await expect(page.locator(".msg-assistant .md").last).to_have_text("Carrying on from the summary.")
    await expect(meter).not_to_have_class(_cls("meter-high"))
    await expect(meter).to_have_attribute("title", re.compile("Compacted once so far"))
    await divider.locator("summary").click()
    await expect(divider.locator(".compaction-why")).to_contain_text("The latest request stays in view word for word.")
    await expect(divider.locator(".compaction-summary")).to_have_text("We read everything.")
