"""session.rename, a title from the first prompt, and projects.check (issue 18 items 12 and 17, at the host)."""

from __future__ import annotations

import pytest

from pidesk.core import events as ev
from pidesk.core.errors import PideskError
from tests.scenario import ended, prompt, session

pytestmark = pytest.mark.asyncio


async def test_an_untitled_session_is_named_by_its_first_prompt(host, project):
    """Issue 18 item 12: `pidesk run` sessions were all titled after the folder; the first prompt names them."""
    s = await session(host, project)
    assert s["title"] == project.name
    sub = host.subscribe()
    turn = await prompt(host, s["id"], "Fix the failing\n  login test in src/app.py")
    updated = await sub.wait_for(lambda e: isinstance(e, ev.SessionUpdated) and e.session.title != project.name)
    assert updated.session.title == "Fix the failing login test in src/app.py"
    await ended(sub, turn["turnId"])
    await prompt(host, s["id"], "and now something else")
    assert (await host.call("session.get", {"sessionId": s["id"]}))["session"]["title"] == (
        "Fix the failing login test in src/app.py")


async def test_a_queued_first_prompt_names_the_session_and_a_long_one_is_clipped(host, project):
    s = await session(host, project)
    await host.call("agent.queue.push", {"sessionId": s["id"], "text": "word " * 40})
    title = (await host.call("session.get", {"sessionId": s["id"]}))["session"]["title"]
    assert len(title) == 60 and title.endswith("…") and title.startswith("word word")


async def test_a_given_title_is_kept(host, project):
    s = await session(host, project, title="release notes")
    await prompt(host, s["id"], "Write the release notes")
    assert (await host.call("session.get", {"sessionId": s["id"]}))["session"]["title"] == "release notes"


async def test_rename_works_while_busy_and_validates_the_title(host, project, provider):
    """Issue 18 item 12: session.rename {sessionId, title} -> Session; never AGENT_BUSY; 1-200 characters."""
    s = await session(host, project, title="old")
    provider.enqueue(s["id"], {"gate": "hold", "text": "working"})
    sub = host.subscribe()
    turn = await prompt(host, s["id"], "go")
    await provider.wait_reached("hold")
    renamed = await host.call("session.rename", {"sessionId": s["id"], "title": "  The login bug  "})
    assert renamed["title"] == "The login bug" and renamed["status"] == "running"
    for bad in ("", "   ", "x" * 201, 5):
        with pytest.raises(PideskError) as error:
            await host.call("session.rename", {"sessionId": s["id"], "title": bad})
        assert error.value.code == "INVALID_PARAMS"
    assert (await host.call("session.rename", {"sessionId": s["id"], "title": "y" * 200}))["title"] == "y" * 200
    provider.release("hold")
    await ended(sub, turn["turnId"])
    audit = [e for e in (await host.call("audit.list", {"sessionId": s["id"]}))["entries"]
             if e["action"] == "session.renamed"]
    assert [e["detail"]["to"] for e in audit] == ["The login bug", "y" * 200]


async def test_projects_check_says_why_a_folder_cannot_be_a_project(host, project, tmp_path):
    """Issue 18 item 17: "+ Project" with a missing directory was accepted and failed only on the first send."""
    assert await host.call("projects.check", {"path": str(project)}) == {"ok": True, "path": str(project.resolve())}
    missing = await host.call("projects.check", {"path": str(tmp_path / "nowhere")})
    assert missing["ok"] is False and "is not a directory" in missing["reason"]
    relative = await host.call("projects.check", {"path": "src/app"})
    assert relative["ok"] is False and "absolute" in relative["reason"]


async def test_a_refused_first_prompt_leaves_the_title(host, project):
    """A prompt the host refuses changes nothing, the session's title included."""
    s = await session(host, project)
    bad = [{"kind": "file", "name": "a", "mime": "text/plain", "size": 1, "ref": "sha256:" + "0" * 64}]
    with pytest.raises(PideskError):
        await host.call("agent.prompt", {"sessionId": s["id"], "text": "Rename me", "attachments": bad})
    assert (await host.call("session.get", {"sessionId": s["id"]}))["session"]["title"] == project.name
