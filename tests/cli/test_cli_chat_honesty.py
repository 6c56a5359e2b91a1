"""pidesk chat says what happened (issue 31 §3): what a turn changed, a queued prompt when it runs, a
rejection's feedback, a goal's criteria as they are reported. The real Chat in-process (chat_rig.py)."""

from __future__ import annotations

import pytest

from pidesk.providers.scripted import ScriptedProvider
from tests.cli.chat_rig import chat_rig


@pytest.mark.asyncio
async def test_chat_says_what_a_turn_changed_and_echoes_a_queued_prompt_when_it_runs(make_host, project):
    """Issue 31 §3: after a turn that changed files, one line says how many and where to look; a prompt typed
    while a turn ran is shown again when it runs (it was queued silently)."""
    provider = ScriptedProvider([
        {"gate": "first", "toolCalls": [{"name": "Write", "args": {"path": "NOTES.md", "content": "a\nb\n"}}]},
        {"text": "Wrote it."}, {"text": "Second done."}])
    async with chat_rig(make_host(provider=provider), {"projectPath": str(project), "permissionMode": "auto"}) as rig:
        await rig.chat.submit("write notes")
        await provider.wait_reached("first")
        await rig.chat.submit("and then this")
        provider.release("first")
        await rig.screen.expect("[1 file changed +2 −0 · /diff shows them, /undo takes them back]")
        await rig.screen.expect("› and then this   (from the queue)")
        await rig.screen.expect("Second done.")


def test_a_rejections_feedback_is_echoed():
    """Issue 31 §3: the feedback a rejection sent the agent is on the line that says it was rejected."""
    from pidesk.cli.chat import resolved_line

    assert resolved_line({"kind": "plan", "status": "rejected", "feedback": "call it SUMMARY.md"}) == \
        "[plan rejected · feedback: call it SUMMARY.md]"
    assert resolved_line({"kind": "plan", "status": "rejected", "feedback": None}) == "[plan rejected]"


@pytest.mark.asyncio
async def test_reported_criteria_are_ticked_on_screen(make_host, project):
    """Issue 31 §3: a goal's criteria, ticked as the agent reports them."""
    provider = ScriptedProvider()
    async with chat_rig(make_host(provider=provider), {"projectPath": str(project)}) as rig:
        await rig.chat.on_event({"type": "tool.started", "sessionId": rig.session["id"], "turnId": "t_1",
                                 "toolCallId": "c", "name": "ReportCriteria", "args": {"results": [
                                     {"criterion": "NOTES.md exists", "outcome": "met", "evidence": "ls"},
                                     {"criterion": "it lists the files", "outcome": "unmet", "evidence": "no"}]}})
        await rig.screen.expect("✓ NOTES.md exists (met)")
        await rig.screen.expect("· it lists the files (unmet)")


@pytest.mark.asyncio
async def test_queue_lists_the_waiting_prompts_and_clear_drops_them(make_host, project):
    """Issue 31 §3: the prompts typed while a turn runs wait in a queue nobody could see from chat."""
    provider = ScriptedProvider([{"gate": "busy", "text": "first"}])
    async with chat_rig(make_host(provider=provider), {"projectPath": str(project)}) as rig:
        await rig.chat.submit("the first")
        await provider.wait_reached("busy")
        await rig.chat.submit("second   prompt")
        await rig.chat.submit("third")
        await rig.chat.submit("/queue")
        await rig.screen.expect("1. second prompt")
        await rig.screen.expect("2. third")
        await rig.chat.submit("/queue clear")
        await rig.screen.expect("[dropped 2 queued prompts]")
        await rig.chat.submit("/queue")
        await rig.screen.expect("[the queue is empty]")
        provider.release("busy")
        await rig.screen.expect("[turn completed]")
        assert (await rig.link.call("agent.queue.list", {"sessionId": rig.session["id"]}))["entries"] == []


def test_the_key_hints_fit_a_60_column_pane():
    """Issue 31 §3: the opening hints were one 95-character line, wrapped mid-word in a narrow tmux pane."""
    from pidesk.cli.chat import KEY_HINTS

    assert all(len(line) <= 60 for line in KEY_HINTS)
    assert "/help" in KEY_HINTS[1] and "Shift+Tab" in KEY_HINTS[0]


def test_every_decision_prompt_fits_a_60_column_pane():
    """Each step of every decision — a plan's approval (its confirmations, auto's warning, the context step,
    a rejection's feedback), a permission, an undo — as drawn with its widest choice, within 60 columns."""
    from pidesk.cli.chat import (
        CONTEXT_CHOICES,
        PERMISSION_CHOICES,
        PLAN_CHOICES,
        UNDO_CHOICES,
        Decision,
        decision_line,
    )

    goal = {"kind": "goal"}
    steps = [Decision("plan", goal, 0), Decision("plan", goal, 0, feedback=True),
             Decision("plan", goal, 0, choice="u", confirming_auto=True),
             Decision("plan", goal, 0, approving="accept-edits"), Decision("permission", {}, 0),
             Decision("undo", {}, 0)]
    steps += [Decision("plan", goal, 0, choice=c) for c in PLAN_CHOICES]
    steps += [Decision("plan", goal, 0, approving="accept-edits", choice=c) for c in CONTEXT_CHOICES]
    steps += [Decision("permission", {}, 0, choice=c) for c in PERMISSION_CHOICES]
    steps += [Decision("undo", {}, 0, choice=c) for c in UNDO_CHOICES]
    lines = [decision_line(step) for step in steps]
    assert len(set(lines)) == len(lines)  # each step says something of its own
    too_wide = [line for line in lines if len(line.rstrip()) > 60]
    assert not too_wide
