"""The Bash sandbox in the page: which one is in force (the header's badge, from host.hello), and a
command that asks to run outside it (an escalated permission request: its own red card)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from playwright.async_api import expect

from pidesk.config import SandboxSettings
from tests.sandboxing import require_sandbox

pytestmark = pytest.mark.asyncio(loop_scope="session")

RED = "rgb(200, 55, 45)"  # --bad
NO_BWRAP = Path("/nonexistent-pidesk-ui-test-bin")  # a PATH for commands with no bwrap on it


def cls(name: str) -> re.Pattern[str]:
    return re.compile(rf"(^|\s){re.escape(name)}(\s|$)")


def bash(command: str, text: str = "") -> dict:
    return {"text": text, "toolCalls": [{"name": "Bash", "args": {"command": command}}]}


def escalated(command: str, justification: str | None, text: str = "I need to leave the sandbox.") -> dict:
    args: dict = {"command": command, "escalate": True}
    if justification is not None:
        args["justification"] = justification
    return {"text": text, "toolCalls": [{"name": "Bash", "args": args}]}


@pytest.mark.parametrize("network", [
    pytest.param(False, id="no-network"),
    pytest.param(True, id="network", marks=pytest.mark.host_config(sandbox=SandboxSettings(enabled=True, network=True))),
])
async def test_the_header_says_bash_runs_sandboxed(ui, network):
    require_sandbox()
    sandbox = (await ui.call("host.hello", {"protocolVersion": 1}))["sandbox"]
    assert (sandbox["mode"], sandbox["available"], sandbox["network"]) == ("bwrap", True, network)
    await ui.open()
    badge = ui.page.locator("#sandbox")
    await expect(badge).to_have_text("sandboxed")
    await expect(badge).to_have_class(cls("sandbox-on"))
    await expect(badge).to_have_attribute(
        "title", f"Bash runs in a bubblewrap sandbox: writes only in the project, {'network on' if network else 'no network'}")


@pytest.mark.host_config(sandbox=SandboxSettings(enabled=False))
async def test_a_host_with_the_sandbox_off_says_so_in_warning_colours(ui):
    assert (await ui.call("host.hello", {"protocolVersion": 1}))["sandbox"]["mode"] == "off"
    await ui.open()
    page = ui.page
    badge = page.locator("#sandbox")
    await expect(badge).to_have_text("sandbox off")
    await expect(badge).to_have_class(cls("sandbox-off"))
    await expect(badge).to_have_attribute("title", re.compile("full power.*host’s token.*network"))
    await expect(badge).to_have_css("background-color", "rgb(240, 179, 60)")
    await badge.click()  # no hover on a phone: a tap says the same
    await expect(page.locator(".toast-info")).to_contain_text("Bash runs with your full power")


@pytest.mark.host_config(sandbox=SandboxSettings(enabled=True), tool_env={"PATH": str(NO_BWRAP)})
async def test_a_sandbox_that_cannot_start_is_a_red_badge_that_says_why(ui):
    sandbox = (await ui.call("host.hello", {"protocolVersion": 1}))["sandbox"]
    assert (sandbox["mode"], sandbox["available"]) == ("bwrap", False)
    assert "install bubblewrap" in sandbox["detail"]
    await ui.open()
    badge = ui.page.locator("#sandbox")
    await expect(badge).to_have_text("sandbox unavailable")
    await expect(badge).to_have_class(cls("sandbox-unavailable"))
    await expect(badge).to_have_attribute("title", f"Every Bash command fails: {sandbox['detail']}")
    await expect(badge).to_have_css("background-color", RED)


@pytest.mark.parametrize("width", [390, 768, 1440])
@pytest.mark.host_config(sandbox=SandboxSettings(enabled=True), tool_env={"PATH": str(NO_BWRAP)})
async def test_the_longest_badge_fits_the_header_at_every_width(ui, width):
    await ui.page.set_viewport_size({"width": width, "height": 800})
    await ui.open()
    page = ui.page
    badge = page.locator("#sandbox")
    await expect(badge).to_have_text("sandbox unavailable")
    await expect(badge).to_be_in_viewport(ratio=1)
    fits = await page.evaluate("""() => {
      const bar = document.querySelector('.topbar');
      const shown = [...bar.children].filter((c) => c.getClientRects().length && getComputedStyle(c).display !== 'none');
      const boxes = shown.map((c) => c.getBoundingClientRect());
      const overlaps = boxes.slice(1).some((b, i) => b.left < boxes[i].right - 0.5);
      return { scroll: document.documentElement.scrollWidth, bar: bar.scrollWidth, overlaps,
               right: Math.max(...boxes.map((b) => b.right)), lines: Math.round(document.querySelector('#sandbox').getBoundingClientRect().height) };
    }""")
    assert fits["scroll"] <= width and fits["bar"] <= width and fits["right"] <= width, fits
    assert not fits["overlaps"], fits
    assert fits["lines"] <= 24, fits  # one line, not wrapped
    await expect(page.locator("#schedules-button")).to_be_in_viewport(ratio=1)
    await expect(page.locator("#add-project")).to_be_in_viewport(ratio=1)


async def test_an_escalated_call_under_auto_asks_in_a_red_card_and_runs_once_allowed(ui):
    require_sandbox()
    s = await ui.session(permission_mode="auto")
    ui.provider.enqueue(s["id"], escalated("echo escalated-ran > out.txt", "needs to write outside"),
                        {"text": "Ran it outside."})
    await ui.open(session=s["id"])
    page = ui.page
    await ui.send("write the marker")

    card = page.locator(".perm-card")
    await expect(card).to_have_class(cls("perm-escalated"))
    await expect(card.get_by_role("heading", name="Run outside the sandbox?")).to_be_visible()
    await expect(card.locator(".perm-why")).to_have_text("needs to write outside")
    await expect(card.locator(".perm-command")).to_have_text("$ echo escalated-ran > out.txt")
    await expect(card).to_have_css("border-left-color", RED)
    await expect(card.locator(".perm-title")).to_have_css("color", RED)
    await expect(card.get_by_role("button")).to_have_text(["Allow once", "Allow for this session", "Deny"])
    await expect(page.locator('.tool[data-name="Bash"]')).to_have_class(cls("tool-waiting"))
    await expect(page.locator('.tool[data-name="Bash"] .tool-outside')).to_have_text("outside sandbox")
    assert not (ui.project / "out.txt").exists()
    await ui.screenshot("escalation.png")
    await card.get_by_role("button", name="Allow once").click()

    await expect(page.locator(".perm-card")).to_have_count(0)
    await expect(page.locator('.tool[data-name="Bash"]')).to_have_class(cls("tool-ok"))
    await expect(page.locator(".msg-assistant .md", has_text="Ran it outside.")).to_be_visible()
    assert (ui.project / "out.txt").read_text() == "escalated-ran\n"


async def test_denying_an_escalation_runs_nothing_and_a_missing_reason_says_so(ui):
    require_sandbox()
    s = await ui.session(permission_mode="auto")
    ui.provider.enqueue(s["id"], escalated("echo escalated-ran > out.txt", None), {"text": "Understood."})
    await ui.open(session=s["id"])
    page = ui.page
    await ui.send("write the marker")

    card = page.locator(".perm-card.perm-escalated")
    await expect(card.locator(".perm-why")).to_have_text("(no reason given)")
    await card.get_by_role("button", name="Deny").click()

    row = page.locator('.tool[data-name="Bash"]')
    await expect(row.locator(".tool-code")).to_have_text("TOOL_DENIED")
    await expect(row.locator(".tool-explain")).to_have_text("You denied this tool call.")
    await expect(page.locator(".msg-assistant .md", has_text="Understood.")).to_be_visible()
    await expect(page.locator(".perm-card")).to_have_count(0)
    assert not (ui.project / "out.txt").exists()


async def test_a_plain_request_keeps_its_card_and_a_justification_is_shown_as_text(ui):
    require_sandbox()
    s = await ui.session()  # ask: the plain command asks too
    why = '<b>x</b> & <img src=x onerror="document.title=1">'
    ui.provider.enqueue(s["id"], bash("echo plain", "First a plain one."), escalated("echo outside", why),
                        {"text": "Both asked."})
    await ui.open(session=s["id"])
    page = ui.page
    await ui.send("go")

    card = page.locator(".perm-card")
    await expect(card.locator(".perm-args")).to_have_text("$ echo plain")
    await expect(card).not_to_have_class(cls("perm-escalated"))
    await expect(card.locator(".perm-head")).to_have_text("!The agent wants to use Bash")
    await expect(card.locator(".perm-why")).to_have_count(0)
    await expect(card).not_to_have_css("border-left-color", RED)
    await card.get_by_role("button", name="Allow once").click()

    await expect(card.locator(".perm-command")).to_have_text("$ echo outside")
    await expect(card).to_have_class(cls("perm-escalated"))
    await expect(card.locator(".perm-why")).to_have_text(why)
    await expect(card.locator(".perm-why b, .perm-why img")).to_have_count(0)
    await card.get_by_role("button", name="Allow once").click()
    await expect(page.locator(".msg-assistant .md", has_text="Both asked.")).to_be_visible()
    row = page.locator('.tool[data-name="Bash"]').nth(1)
    await row.locator("summary").click()
    await expect(row.locator(".tool-why")).to_have_text(why)


async def test_at_390_px_the_escalation_card_buttons_show_without_horizontal_scrolling(ui):
    require_sandbox()
    await ui.page.set_viewport_size({"width": 390, "height": 844})
    s = await ui.session(permission_mode="auto")
    long_command = "pip install --index-url https://pypi.org/simple/ requests==2.32.3 " + "x" * 120
    ui.provider.enqueue(s["id"], escalated(long_command, "pip needs the network to download the package " * 4))
    await ui.open(session=s["id"])
    page = ui.page
    await ui.send("install requests")

    card = page.locator(".perm-card.perm-escalated")
    await expect(card.locator(".perm-why")).to_be_visible()
    for name in ("Allow once", "Allow for this session", "Deny"):
        await expect(card.get_by_role("button", name=name)).to_be_in_viewport(ratio=1)
    widths = await page.evaluate("() => [document.documentElement.scrollWidth, document.querySelector('#permissions').scrollWidth]")
    assert max(widths) <= 390, widths
    await card.get_by_role("button", name="Deny").click()
    await expect(page.locator(".perm-card")).to_have_count(0)

