"""``pidesk chat`` decision prompts against type-ahead, pinned without timing.

Whether a key typed ahead is still unread, read but unhandled, or handled when a
prompt appears depends on scheduling, so the pty tests in test_cli_chat.py cannot
force each case. Here the real ``Chat`` runs over an ``EmbeddedLink`` to a real
host, its stdin a real pseudo-terminal (``chat_rig.py``), and the model holds at a
gate: the keys are put exactly where type-ahead can be when the prompt is drawn.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from pidesk.providers.scripted import ScriptedProvider
from tests.cli.chat_rig import chat_rig
from tests.sandboxing import require_sandbox

SUBMIT_PLAN = {"gate": "plan", "toolCalls": [{"name": "SubmitPlan", "args": {
    "title": "Add notes", "markdown": "# Plan\n\n1. Write NOTES.md\n", "question": "Shall I write it?"}}]}


@pytest.mark.asyncio
async def test_keys_typed_before_a_plan_prompt_never_answer_it(make_host: Any, project: Path) -> None:
    """Issue 18 item 1: keys typed before the plan prompt was drawn answered it (`u` approved with auto).
    Three places type-ahead can be when the prompt is drawn, each pinned here: still in the terminal
    (`u` Enter `y` Enter: flushed), read into the chat's queue (`a` Enter: dropped), and taken off the
    queue but handled after the prompt (`a` Enter stamped with the old epoch: ignored). Then the key
    pressed after the prompt, and Enter, decides."""
    provider = ScriptedProvider([SUBMIT_PLAN])
    async with chat_rig(make_host(provider=provider), {"projectPath": str(project), "mode": "plan"}) as rig:
        chat, link, session, screen, master = rig.chat, rig.link, rig.session, rig.screen, rig.master
        await chat.submit("plan the notes")
        await provider.wait_reached("plan")
        stale = chat.epoch
        os.write(master, b"u\ry\r")  # typed, not yet read
        for key in "a\r":  # read by the stdin reader, not yet handled
            chat.keys.put_nowait((chat.epoch, key))
        provider.release("plan")
        await screen.expect("approve? [a] ask")
        assert chat.keys.empty()
        for key in "a\r":  # read before the prompt, handled after it
            await chat.on_key(key, stale)
        assert chat.decision is not None and chat.decision.choice is None
        rig.start_reading()
        os.write(master, b"e")
        await screen.expect("approve with accept-edits? Enter confirms")
        pending = (await link.call("plans.pending", {"sessionId": session["id"]}))["approvals"]
        assert [a["status"] for a in pending] == ["pending"]
        os.write(master, b"\r")
        await screen.expect("accept-edits · context? [k]eep (Enter)")
        os.write(master, b"\r")
        await screen.expect("[plan approved · accept-edits · context: keep]")
        history = (await link.call("plans.list", {"sessionId": session["id"]}))["approvals"]
        assert [(a["status"], a["permissionMode"]) for a in history] == [("approved", "accept-edits")]


@pytest.mark.asyncio
async def test_keys_typed_before_a_permission_prompt_never_answer_it(make_host: Any, project: Path) -> None:
    """Issue 18 item 1: `y` Enter typed before a permission prompt was drawn allowed the Write it asked
    about. Type-ahead in the terminal and in the chat's queue is dropped; `n` pressed after, and Enter,
    denies."""
    provider = ScriptedProvider([{"gate": "write", "toolCalls": [
        {"name": "Write", "args": {"path": "NOTES.md", "content": "notes\n"}}]}])
    async with chat_rig(make_host(provider=provider), {"projectPath": str(project)}) as rig:
        chat, link, session, screen, master = rig.chat, rig.link, rig.session, rig.screen, rig.master
        await chat.submit("write the notes")
        await provider.wait_reached("write")
        stale = chat.epoch
        os.write(master, b"y\r")
        for key in "s\r":
            chat.keys.put_nowait((chat.epoch, key))
        provider.release("write")
        await screen.expect("allow? [y] once")
        assert chat.keys.empty()
        for key in "y\r":
            await chat.on_key(key, stale)
        assert chat.decision is not None and chat.decision.choice is None
        rig.start_reading()
        os.write(master, b"n")
        await screen.expect("deny? Enter confirms")
        os.write(master, b"\r")
        await screen.expect("[turn completed]")
        assert not (project / "NOTES.md").exists()
        requests = (await link.call("permissions.pending", {"sessionId": session["id"]}))["requests"]
        assert requests == []


@pytest.mark.asyncio
async def test_an_escalation_is_said_apart_with_its_reason_and_answered_like_any_permission(
        make_host: Any, project: Path) -> None:
    """Issue 28: a command asking to leave the sandbox is said apart — why, and the command — even under
    auto, and `y` Enter runs it."""
    require_sandbox()
    provider = ScriptedProvider([{"toolCalls": [{"name": "Bash", "args": {
        "command": "echo escalated > ran.txt", "escalate": True, "justification": "it must reach the package index"}}]},
        {"text": "installed"}])
    async with chat_rig(make_host(provider=provider), {"projectPath": str(project), "permissionMode": "auto"}) as rig:
        await rig.chat.submit("install it")
        await rig.screen.expect("run OUTSIDE the sandbox")
        await rig.screen.expect("why: it must reach the package index")
        await rig.screen.expect("$ echo escalated > ran.txt")
        await rig.screen.expect("allow? [y] once")
        rig.start_reading()
        os.write(rig.master, b"y")
        await rig.screen.expect("allow once? Enter confirms")
        os.write(rig.master, b"\r")
        await rig.screen.expect("[Bash: allowed once]")  # the answer stays on screen (issue 31 §3)
        await rig.screen.expect("[turn completed]")
        assert (project / "ran.txt").read_text() == "escalated\n"
