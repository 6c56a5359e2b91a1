"""The context line (issue 16 §1): the web UI names the instruction files and skills the next request includes."""

from __future__ import annotations

import pytest
from playwright.async_api import expect

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def test_the_context_line_names_the_files_and_follows_a_change_between_turns(ui):
    """Issue 16 §1: "Context: ../AGENTS.md, …" under the header, a bad skill counted as left out, and a
    file the agent writes shown once its turn has ended (the files are re-read between turns)."""
    repo = ui.project.parent
    (repo / ".git").mkdir()
    (repo / "AGENTS.md").write_text("Repository rules.\n")
    bad = ui.project / ".pi" / "skills" / "broken"
    bad.mkdir(parents=True)
    (bad / "SKILL.md").write_text("no front matter here\n")
    good = ui.project / ".claude" / "skills" / "deploy"
    good.mkdir(parents=True)
    (good / "SKILL.md").write_text("---\nname: deploy\ndescription: Ship a release.\n---\n")
    s = await ui.session(permission_mode="accept-edits")
    ui.provider.enqueue(s["id"], {"toolCalls": [{"name": "Write", "args": {"path": "AGENTS.md", "content": "App.\n"}}]},
                        {"text": "Added the project's AGENTS.md."})
    await ui.open(session=s["id"])
    line = ui.page.locator("#context-line")
    await expect(line).to_have_text("Context: ../AGENTS.md · skills: deploy ⚠ 1 left out")
    await expect(line.locator(".context-warn")).to_have_attribute(
        "title", "skill .pi/skills/broken/SKILL.md skipped: SKILL.md must start with a '---' line "
                 "(YAML front matter with name and description)")
    await ui.send("add an AGENTS.md")
    await expect(ui.page.locator(".msg-assistant").last).to_contain_text("Added the project's AGENTS.md.")
    await expect(line).to_have_text("Context: ../AGENTS.md, AGENTS.md · skills: deploy ⚠ 1 left out")
    await ui.screenshot("context-line.png")
