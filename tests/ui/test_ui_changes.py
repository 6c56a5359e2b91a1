"""The web UI's review and undo (issue 17): per-turn change lines, the Changes panel, revert, previews."""

from __future__ import annotations

import asyncio
import json

import pytest
from playwright.async_api import expect

pytestmark = pytest.mark.asyncio(loop_scope="session")

def write(path: str, content: str, text: str = "") -> dict:
    return {"text": text, "toolCalls": [{"name": "Write", "args": {"path": path, "content": content}}]}

async def test_issue17_a_finished_turn_says_what_it_changed_and_the_panel_reverts_it_after_a_confirmation(ui):
    """Issue 17: a finished turn shows "N files changed +a −b"; the Changes panel shows each file's diff
    coloured; Revert asks first, listing the files and saying hand edits are reverted too; the files
    come back and the revert is listed, undoable."""
    s = await ui.session(permission_mode="auto")
    long_file = "".join(f"line {n}\n" for n in range(200))
    ui.provider.enqueue(s["id"],
                        write("README.md", "# demo project\n\nNow with a usage section.\n", "Updating the readme."),
                        {"toolCalls": [{"name": "Bash", "args": {"command": "mkdir -p src/util && printf 'def helper():\\n    return 1\\n' > src/util/helper.py && rm src/app.py"}}]},
                        write("data/long.txt", long_file),
                        {"text": "Done: readme, helper, data."})
    await ui.open(session=s["id"])
    page = ui.page
    await ui.send("Tidy the project")
    line = page.locator(".turn-changes")
    await expect(line).to_have_text("4 files changed +203 −2")
    await ui.screenshot("changes-turn.png")

    await line.get_by_role("button").click()
    dialog = page.locator(".changes-dialog")
    await expect(dialog).to_be_visible()
    readme = dialog.locator('.changes-file[data-path="README.md"]')
    await expect(readme.locator(".changes-status")).to_have_text("modified")
    await expect(readme.locator(".diff-add")).to_have_text(["+Now with a usage section."])
    await expect(readme.locator(".diff-del")).to_have_text(["-A small project for the UI tests."])
    await expect(dialog.locator('.changes-file[data-path="src/app.py"] .changes-status')).to_have_text("deleted")
    long = dialog.locator('.changes-file[data-path="data/long.txt"]')
    assert await long.evaluate("el => el.open") is False  # a long diff starts folded
    await ui.screenshot("changes-panel.png")

    (ui.project / "README.md").write_text("edited by hand\n")
    await dialog.get_by_role("button", name="Revert to before this turn").click()
    confirm = dialog.locator(".changes-confirm")
    await expect(confirm.locator(".changes-files li")).to_have_text(
        ["README.md", "data/long.txt", "src/app.py", "src/util/helper.py"])
    await expect(confirm).to_contain_text("Files changed by hand since then")
    await ui.screenshot("changes-revert-confirm.png")
    assert (ui.project / "README.md").read_text() == "edited by hand\n"  # nothing before the confirmation
    await confirm.get_by_role("button", name="Revert", exact=True).click()
    await expect(dialog.locator(".changes-turn.is-revert")).to_have_count(1)
    assert (ui.project / "README.md").read_text() == "# demo project\n\nA small project for the UI tests.\n"
    assert (ui.project / "src" / "app.py").exists() and not (ui.project / "src" / "util").exists()
    await expect(dialog.locator(".changes-turn.is-revert .changes-revert")).to_have_text("Undo this revert")

async def test_issue17_the_write_permission_card_shows_the_diff_and_flags_the_overwrite(ui):
    """Issue 17: a Write over an existing file asks with the diff of what it replaces and says it
    overwrites the file; after it runs, the turn's change line appears."""
    s = await ui.session()
    ui.provider.enqueue(s["id"], write("README.md", "# demo project\n\nA second line.\n", "Adding a line."),
                        {"text": "Added."})
    await ui.open(session=s["id"])
    page = ui.page
    await ui.send("Add a line to the readme")
    card = page.locator(".perm-card")
    await expect(card.locator(".perm-overwrites")).to_contain_text("overwrites the file")
    await expect(card.locator(".diff-line.diff-add")).to_have_text(["+A second line."])
    await expect(card.locator(".diff-line.diff-del")).to_have_text(["-A small project for the UI tests."])
    await ui.screenshot("permission-diff.png")
    await card.get_by_role("button", name="Allow once").click()
    await expect(page.locator(".turn-changes")).to_have_text("1 file changed +1 −1")

async def test_a_file_too_large_to_checkpoint_says_so_in_the_panel_and_after_a_revert(ui):
    """Issue 29 item 6: a turn that made a file over the 10 MiB checkpoint cap lists it as too large to
    checkpoint, open, with the sentence saying a revert leaves it; the revert's toast names it."""
    s = await ui.session(permission_mode="auto")
    ui.provider.enqueue(s["id"],
                        {"toolCalls": [{"name": "Bash", "args": {"command": "head -c 11000000 /dev/zero > big.bin"}}]},
                        write("notes.md", "one\n"),
                        {"text": "Done."})
    await ui.open(session=s["id"])
    page = ui.page
    await ui.send("Make a big file")
    line = page.locator(".turn-changes")
    await expect(line).to_contain_text("2 files changed")
    await line.get_by_role("button").click()
    big = page.locator('.changes-dialog .changes-file[data-path="big.bin"]')
    await expect(big.locator(".changes-too-large")).to_have_text("too large to checkpoint")
    await expect(big).to_contain_text("over the 10.0 MiB checkpoint limit")
    assert await big.evaluate("el => el.open") is True
    await page.locator(".changes-dialog").get_by_role("button", name="Revert to before this turn").click()
    await page.locator(".changes-confirm").get_by_role("button", name="Revert", exact=True).click()
    await expect(page.locator(".toast")).to_contain_text("left as they are (too large to checkpoint): big.bin")
    assert (ui.project / "big.bin").stat().st_size == 11000000 and not (ui.project / "notes.md").exists()

async def test_issue31_33_the_panel_names_turns_by_prompt_and_time_and_a_turns_end_asks_for_that_turn_only(ui):
    """Issue 31 §4: the Changes panel names each turn by its prompt's first line and its time, not by an id.
    Issue 33 §1: the page reads a session's changes as a list (paged, no diffs) when it shows the session,
    and after a turn ends asks session.changes for that turn alone, without diffs — never the whole session
    again; a turn shown in the panel without diffs gets them then."""
    s = await ui.session(permission_mode="auto")
    sid = s["id"]
    ui.provider.enqueue(sid, write("NOTES.md", "# Notes\n\nFirst.\n"), {"text": "Noted."})
    await ui.call("agent.prompt", {"sessionId": sid, "text": "Add the notes file\nwith a second line"})
    for _ in range(200):  # (the first turn runs over HTTP before the page opens)
        turns = (await ui.call("session.turns", {"sessionId": sid}))["turns"]
        if turns and turns[0]["state"] == "ended":
            break
        await asyncio.sleep(0.05)
    first = turns[0]["id"]
    asked: list[dict] = []

    def sent(payload: str | bytes) -> None:
        frames = json.loads(payload)
        for frame in frames if isinstance(frames, list) else [frames]:
            if frame.get("method") == "session.changes":
                asked.append(frame["params"])

    ui.page.on("websocket", lambda ws: ws.on("framesent", sent))
    ui.provider.enqueue(sid, write("README.md", "# demo project\n\nTidied.\n"), {"text": "Tidied."})
    await ui.open(session=sid)
    page = ui.page
    await expect(page.locator(f'.turn-changes[data-turn="{first}"]')).to_have_text("1 file changed +3 −0")
    opening = list(asked)
    assert opening and all("turnId" not in p and p.get("limit") for p in opening)  # the list, in pages
    await ui.send("Tidy the readme")
    await expect(page.locator(".turn-changes")).to_have_count(2)
    second = [t["id"] for t in (await ui.call("session.turns", {"sessionId": sid}))["turns"] if t["id"] != first][0]
    await expect(page.locator(f'.turn-changes[data-turn="{second}"]')).to_have_text("1 file changed +1 −1")
    assert asked[len(opening):] == [{"sessionId": sid, "turnId": second, "diff": False}]  # that turn alone

    await page.locator(f'.turn-changes[data-turn="{first}"]').get_by_role("button").click()
    dialog = page.locator(".changes-dialog")
    heads = dialog.locator(".changes-turn-head .changes-turn-title")
    await expect(heads).to_have_text(["“Add the notes file”", "“Tidy the readme”"])
    listed = (await ui.call("session.changes", {"sessionId": sid, "limit": 10}))["turns"]
    for turn in listed:
        shown = dialog.locator(f'.changes-turn[data-turn="{turn["turnId"]}"] time')
        await expect(shown).to_have_attribute("datetime", turn["at"])
        local = await page.evaluate("at => { const d = new Date(at); const p = (n) => String(n).padStart(2, '0');"
                                    " return `${p(d.getHours())}:${p(d.getMinutes())}`; }", turn["at"])
        await expect(shown).to_have_text(local)
        await expect(dialog.locator(f'.changes-turn[data-turn="{turn["turnId"]}"] .changes-turn-head')
                     ).not_to_contain_text(turn["turnId"])  # named, not by an id
    # the first turn came in the list, without diffs: shown, it asks for them
    await expect(dialog.locator(f'.changes-turn[data-turn="{first}"] .diff-add')).to_have_text(
        ["+# Notes", "+", "+First."])
    assert {"sessionId": sid, "turnId": first} in asked
    assert not [p for p in asked[len(opening):] if "turnId" not in p]  # never the whole session again
    await ui.screenshot("changes-panel-named.png")
