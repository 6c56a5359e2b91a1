"""An open page and a host restarted under it, as a person leaves a tab open across `pidesk serve` runs."""

from __future__ import annotations

import pytest
from playwright.async_api import expect

from tests.ui.conftest import Ui, start_serve

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def test_an_open_page_recovers_by_itself_when_the_host_restarts_without_its_token_or_port(ui: Ui) -> None:
    """Issue 18 item 15: open tabs stayed "reconnecting…" forever, because the restarted host had a new
    port and a new token. The host keeps its token in the data dir and prefers its last port, so a
    host started again with neither `--token` nor `--port` is found by the page on its own."""
    s = await ui.session(title="kept across restarts")
    await ui.open(s["id"])
    await ui.stop()
    await expect(ui.page.locator("#conn")).to_have_text("reconnecting…")
    ui.task, url = await start_serve(ui.data_dir, ui.provider, token=None)  # as `pidesk serve` with no options
    assert url == ui.url, "the restarted host did not take its last port"
    await expect(ui.page.locator("#conn")).to_have_text("connected", timeout=15_000)
    await expect(ui.page.locator(".session-title", has_text="kept across restarts")).to_be_visible()
    await ui.send("hello again")
    await expect(ui.page.locator(".msg-assistant").last).to_contain_text("Done.")
    # Stopped again right after a turn, with the page's follow-up reads in flight: their DISCONNECTED
    # rejections are expected (the reconnect re-reads everything) and were uncaught page errors.
    await ui.stop()
    await expect(ui.page.locator("#conn")).to_have_text("reconnecting…")
