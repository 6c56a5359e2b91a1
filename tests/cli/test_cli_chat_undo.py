"""``pidesk chat``'s /undo prompt and its start-up context line, pinned in-process against a real host.

As in test_cli_chat_decisions.py: the real ``Chat`` over an ``EmbeddedLink`` to a real host, its stdin a
real pseudo-terminal, so type-ahead can be put exactly where it can be when the prompt is drawn, and a
second session of the same project can be held mid-turn while this one answers the prompt.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from rich.console import Console

from pidesk.cli.chat import Chat
from pidesk.cli.link import EmbeddedLink
from pidesk.core.errors import Code, PideskError
from pidesk.providers.scripted import ScriptedProvider
from tests.cli.chat_rig import Rig, Screen, chat_rig

WRITE_NOTES = {"toolCalls": [{"name": "Write", "args": {"path": "NOTES.md", "content": "notes\n"}}]}


@pytest_asyncio.fixture
async def rig(make_host: Any, project: Path) -> AsyncIterator[Rig]:
    """A chat in accept-edits whose one turn so far wrote NOTES.md; Ctrl+C arrives as a key."""
    provider = ScriptedProvider()
    params = {"projectPath": str(project), "permissionMode": "accept-edits"}
    async with chat_rig(make_host(provider=provider), params, keys_signal=False) as rig:
        rig.provider = provider
        provider.enqueue(rig.session["id"], WRITE_NOTES, {"text": "Written."})
        await rig.chat.submit("write the notes")
        await rig.screen.expect("[turn completed]")
        assert (project / "NOTES.md").exists()
        yield rig


@pytest.mark.asyncio
async def test_keys_typed_before_the_undo_prompt_never_answer_it(rig: Rig, project: Path) -> None:
    """Issue 17 (the /undo prompt under the plan prompt's rules): a revert also takes back hand edits, so
    `y` Enter typed ahead must not confirm it. Type-ahead still in the terminal, read into the chat's queue,
    or read before and handled after the prompt is ignored; `y` pressed at the prompt, then Enter, reverts."""
    chat, screen = rig.chat, rig.screen
    stale = chat.epoch
    os.write(rig.master, b"y\r")  # typed, not yet read
    for key in "y\r":  # read by the stdin reader, not yet handled
        chat.keys.put_nowait((chat.epoch, key))
    await chat.submit("/undo")
    await screen.expect("revert? [y] yes [n] no")
    assert chat.keys.empty()
    for key in "y\r":  # read before the prompt, handled after it
        await chat.on_key(key, stale)
    assert chat.decision is not None and chat.decision.choice is None
    assert (project / "NOTES.md").exists()
    rig.start_reading()
    os.write(rig.master, b"y")
    await screen.expect("revert these files? Enter confirms")
    assert (project / "NOTES.md").exists()
    os.write(rig.master, b"\r")
    await screen.expect("[reverted 1 file: NOTES.md]")
    assert not (project / "NOTES.md").exists()


@pytest.mark.asyncio
async def test_esc_and_ctrl_c_cancel_the_undo_prompt(rig: Rig, project: Path) -> None:
    """Issue 17: Esc or Ctrl+C at the /undo prompt keeps every file (and Ctrl+C does not quit the chat)."""
    chat, screen = rig.chat, rig.screen
    rig.start_reading()
    for key in (b"\x1b", b"\x03"):
        await chat.submit("/undo")
        await screen.expect("revert? [y] yes [n] no")
        os.write(rig.master, key)
        await screen.expect("[undo cancelled: nothing reverted]")
        assert chat.decision is None and not chat.done.is_set()
    assert (project / "NOTES.md").read_text() == "notes\n"


@pytest.mark.asyncio
async def test_agent_busy_is_shown_plainly(rig: Rig, project: Path) -> None:
    """Issue 17: the host refuses a revert while any session of the project runs (AGENT_BUSY). The chat shows
    the refusal as such ("not undone: …" with the host's reason), and nothing is reverted."""
    chat, screen, link = rig.chat, rig.screen, rig.link
    other = await link.call("session.create", {"projectPath": str(project)})
    rig.provider.enqueue(other["id"], {"gate": "other", "text": "held"})
    rig.start_reading()
    await chat.submit("/undo")
    await screen.expect("revert? [y] yes [n] no")
    await link.call("agent.prompt", {"sessionId": other["id"], "text": "hold"})
    await rig.provider.wait_reached("other")
    os.write(rig.master, b"y")
    await screen.expect("revert these files? Enter confirms")
    os.write(rig.master, b"\r")
    await screen.expect(f"[not undone: session {other['id']} is running in the same project; revert once it is idle]")
    assert (project / "NOTES.md").read_text() == "notes\n"
    rig.provider.release("other")


class OlderHost(EmbeddedLink):
    """A host from before issue 16: it has no ``session.context`` (the wire's answer to any unknown method)."""

    async def call(self, method: str, params: dict[str, Any] | None = None) -> Any:
        if method == "session.context":
            raise PideskError(f"unknown method {method!r}", Code.METHOD_NOT_FOUND)
        return await super().call(method, params)


@pytest.mark.asyncio
async def test_an_older_host_without_session_context_prints_nothing(make_host: Any, project: Path) -> None:
    """Issue 16 §1: against a host without session.context the chat says nothing about context (no error
    line); against one with it, the context line."""
    (project / "AGENTS.md").write_text("Rules.\n")
    host = make_host()
    for link, shown in ((OlderHost(host), ""), (EmbeddedLink(host), "Context: AGENTS.md\n")):
        session = await link.call("session.create", {"projectPath": str(project)})
        screen = Screen()
        await Chat(link, session, Console(file=screen, width=100)).show_context()
        assert screen.getvalue() == shown
        await link.__aexit__(None, None, None)


@pytest.mark.asyncio
async def test_undo_in_a_new_chat_skips_turns_an_earlier_revert_undid(rig: Rig, project: Path) -> None:
    """Issue 17: /undo offers the newest turn whose changes still stand, as the host's list says —
    not a turn a revert (made by another chat, the CLI or the web UI) already undid; and after a
    revert of that revert, the turn stands again and is offered."""
    sid = rig.session["id"]
    turns = (await rig.chat.link.call("session.changes", {"sessionId": sid}))["turns"]
    first = turns[-1]["turnId"]
    undone = await rig.chat.link.call("session.revert", {"sessionId": sid, "turnId": first})  # as elsewhere
    await rig.chat.submit("/undo")
    await rig.screen.expect("nothing to undo")
    await rig.chat.link.call("session.revert", {"sessionId": sid, "turnId": undone["revertId"]})
    await rig.chat.submit("/undo")
    await rig.screen.expect(f"state before turn {first}")
