"""The web UI's turn card says why a turn failed (issue 16 §4): the turn's errorMessage under its code,
live from turn.ended and again after a reload (from session.turns)."""

from __future__ import annotations

import pytest
from playwright.async_api import expect

pytestmark = pytest.mark.asyncio(loop_scope="session")

WORDS = ("openai answered HTTP 401: Incorrect API key provided: Bearer [redacted] — check the API key "
         "and its permissions")


async def test_a_failed_turn_shows_the_providers_words_live_and_after_a_reload(ui):
    """Issue 16 §4: the card said only 'Turn failed PROVIDER_UNAUTHORIZED'; the provider's words
    (the key blanked out by the provider layer) were built and dropped."""
    s = await ui.session()
    ui.provider.enqueue(s["id"], {"error": "PROVIDER_UNAUTHORIZED", "detail": WORDS})
    await ui.open(session=s["id"])
    page = ui.page
    await ui.send("go")
    note = page.locator(".turn-note.note-error")
    await expect(note.locator("code")).to_have_text("PROVIDER_UNAUTHORIZED")
    await expect(note.locator(".turn-note-message")).to_have_text(WORDS)
    await page.reload()
    await expect(page.locator(".turn-note.note-error .turn-note-message")).to_have_text(WORDS)


async def test_a_retry_wait_says_when_and_why_then_gives_way_to_the_answer(ui):
    """Issue 30 §5: while a model request waits to be sent again, the working line says so — "Retrying in
    3 s (2/10)" and the provider's reason — instead of a silent spinner; the answer replaces it."""
    s = await ui.session()
    ui.provider.enqueue(s["id"], {"retrying": {"attempt": 2, "of": 10, "waitS": 3,
                                               "reason": "openai answered HTTP 503: the server is busy"},
                                  "gate": "after-retry", "text": "Answered after all."})
    await ui.open(session=s["id"])
    page = ui.page
    await ui.send("go")
    working = page.locator("#working-text")
    await expect(working).to_have_text("Retrying in 3 s (2/10): openai answered HTTP 503: the server is busy")
    ui.provider.release("after-retry")
    await expect(page.locator(".msg-assistant").last).to_contain_text("Answered after all.")
    await expect(page.locator("#working")).to_be_hidden()
