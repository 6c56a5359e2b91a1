"""Issue 30 from the command line: ``--context-limit``, ``/compact`` and ``/context`` in ``pidesk chat``,
the compaction line, the approval's context key, ``plans approve --context`` and ``pidesk compact`` —
real ``pidesk`` subprocesses (a pty for chat, a real ``pidesk serve`` where the item is about a running
host) and, where a turn must be held while a key is pressed, the real ``Chat`` in-process (chat_rig.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pidesk.providers.scripted import ScriptedProvider
from tests.cli.chat_rig import chat_rig
from tests.cli.test_cli_chat import CONTEXT_QUESTION, PLAN_QUESTION, Terminal, chat, scripted
from tests.cli.test_cli_truths import ok, pidesk, serving, wait_for, watching

LONG = "x" * 8_000  # ~2,000 tokens: three of them fill a 6,000-token window (the prompt and tools take ~1.6k)
LOOK = {"toolCalls": [{"name": "Read", "args": {"path": "README.md"}}]}
SUBMIT_PLAN = {"toolCalls": [{"name": "SubmitPlan", "args": {
    "title": "Add notes", "markdown": "# Plan\n\n1. Write NOTES.md\n", "question": "Shall I write it?"}}]}


def events(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines()]


def history(data_dir: Path, session_id: str) -> list[str]:
    """``pidesk sessions show``'s content column, as JSON: what a person reads of the transcript."""
    return [m["content"] for m in json.loads(ok("sessions", "show", session_id, "--json", data_dir=data_dir))]


def only_session(data_dir: Path) -> str:
    [session] = json.loads(ok("sessions", "list", "--json", data_dir=data_dir))
    return str(session["id"])


def test_a_context_limit_under_1000_tokens_is_refused_before_anything_starts(project, data_dir):
    """Issue 30: `--context-limit` is the model's window; a figure no request could fit in is a usage error
    of the flag itself (exit 2, saying what it takes), for each command that takes it; nothing is created."""
    for command in (["run", str(project), "look"], ["chat", str(project)], ["serve", "--no-open"]):
        done = pidesk(*command, "--context-limit", "999", data_dir=data_dir)
        assert done.returncode == 2, done.stderr
        assert "Invalid value for '--context-limit': 999 is too small" in done.stderr
        assert "at least 1000" in done.stderr and "Traceback" not in done.stderr
    assert not data_dir.exists()


def test_run_context_limit_is_the_embedded_hosts_window(project, data_dir, tmp_path):
    """Issue 30: `pidesk run --context-limit 6000` gives the host a 6,000-token window: three long answers in
    one turn fill it past 85 %, so the view is compacted mid-turn — a `context.compacted` line in `--json`,
    a dim line in the plain output and in `sessions show`. The same run without the flag (the scripted
    model's window is 128,000 tokens) compacts nothing."""
    model = scripted(tmp_path, {"text": f"a {LONG}", **LOOK}, {"text": f"b {LONG}", **LOOK},
                     {"text": f"c {LONG}", **LOOK}, {"text": "done"})
    done = pidesk("run", str(project), "look", "--model", model, "--json", data_dir=data_dir)
    assert done.returncode == 0, done.stderr
    assert [e for e in events(done.stdout) if e["type"] == "context.compacted"] == []
    ok("sessions", "delete", only_session(data_dir), data_dir=data_dir)

    done = pidesk("run", str(project), "look", "--model", model, "--json", "--context-limit", "6000",
                  data_dir=data_dir)
    assert done.returncode == 0, done.stderr
    [compacted] = [e for e in events(done.stdout) if e["type"] == "context.compacted"]
    assert compacted["reason"] == "auto" and compacted["tokensBefore"] > 0.85 * 6000 > compacted["tokensAfter"]
    line = f"── context compacted (auto): {compacted['tokensBefore']:,} → {compacted['tokensAfter']:,} tokens ──"
    assert line in history(data_dir, only_session(data_dir))
    ok("sessions", "delete", only_session(data_dir), data_dir=data_dir)

    plain = ok("run", str(project), "look", "--model", model, "--context-limit", "6000", data_dir=data_dir)
    assert plain.count("── context compacted (auto): ") == 1 and plain.rstrip().endswith("[turn completed]")


def test_chat_context_and_compact(project, data_dir, tmp_path):
    """Issue 30: `/context` says how full the window is (of the `--context-limit` given) and what the next
    request includes; `/compact INSTRUCTIONS` has the model summarise the conversation now — one dim line,
    printed once though the host announces it twice — after which `/context` counts it; `/compact` with
    nothing new since says so."""
    model = scripted(tmp_path, {"text": "Hello to you."}, {"summary": "The user greeted me."})
    term = Terminal([sys.executable, "-m", "pidesk", "chat", str(project), "--data-dir", str(data_dir),
                     "--model", model, "--context-limit", "50000"])
    term.expect_status("agent · ask · idle ›")
    term.type("/context\r")
    term.expect("context: ")  # (before any request: the host's estimate, the system prompt and tools)
    term.expect(" / 50,000 tokens (")
    term.expect("%) · no compaction yet")
    term.expect("Context: no AGENTS.md")
    term.type("hello\r")
    term.expect("Hello to you.")
    term.expect("[turn completed]")
    term.type("/compact keep the greeting\r")
    term.expect("── context compacted (manual): ")
    term.expect_status("agent · ask · idle ›")
    term.type("/context\r")
    term.expect(" / 50,000 tokens (")
    term.expect("· 1 compaction")
    assert not term.seen.startswith("s")
    term.type("/compact\r")
    term.expect("[nothing to compact: nothing was said since the session began or was last compacted]")
    term.type("/help\r")
    term.expect("/compact [instructions]")
    term.type("\x04")
    assert term.close() == 0
    assert sum("── context compacted (manual): " in line for line in term.screen()) == 1
    session_id = json.loads(ok("sessions", "list", "--json", data_dir=data_dir))[0]["id"]
    assert any(line.startswith("── context compacted (manual): ") for line in history(data_dir, session_id))


@pytest.mark.asyncio
async def test_compact_while_a_turn_runs_is_refused_and_changes_nothing(make_host, project):
    """Issue 30: the host refuses `session.compact` while the session is busy (AGENT_BUSY); the chat says so
    on one line (red), the turn carries on, and no compaction is recorded."""
    provider = ScriptedProvider([{"gate": "held", "text": "working"}])
    async with chat_rig(make_host(provider=provider), {"projectPath": str(project)}) as rig:
        await rig.chat.submit("the task")
        await provider.wait_reached("held")
        await rig.chat.submit("/compact")
        await rig.screen.expect("[not compacted: the session is busy; compact it once it is idle]")
        provider.release("held")
        await rig.screen.expect("[turn completed]")
        messages = (await rig.link.call("session.get", {"sessionId": rig.session["id"]}))["messages"]
        assert [b["type"] for m in messages for b in m["content"]] == ["text", "text"]


def test_chat_approval_f_starts_the_execution_with_a_fresh_context(project, data_dir, tmp_path):
    """Issue 30: after the permission key and Enter, a second key chooses what the execution sees; `f` Enter
    approves with context fresh: the confirmation line says so, the execution opens with the fresh-context
    line, and the approval records it."""
    term = chat(project, data_dir, scripted(tmp_path, LOOK, SUBMIT_PLAN, {"text": "Executing from the plan."}))
    term.expect_status("agent · ask · idle ›")
    term.type("/plan\r")
    term.expect_status("plan · ask · idle ›")
    term.type("plan the notes\r")
    term.expect_status(PLAN_QUESTION)
    term.type("e\r")
    term.expect_status("accept-edits " + CONTEXT_QUESTION)
    term.type("f")
    term.expect_status("start from the plan alone? Enter confirms · or change › f")
    term.type("\r")
    term.expect("[plan approved · accept-edits · context: fresh]")
    term.expect("── execution starts with a fresh context ──")
    term.expect("Executing from the plan.")
    term.expect("[turn completed]")
    term.type("\x04")
    assert term.close() == 0
    session_id = only_session(data_dir)
    [approval] = json.loads(ok("plans", "list", "--session", session_id, "--json", data_dir=data_dir))
    assert (approval["status"], approval["permissionMode"], approval["context"]) == ("approved", "accept-edits",
                                                                                       "fresh")
    assert history(data_dir, session_id).count("── execution starts with a fresh context ──") == 1


@pytest.mark.asyncio
async def test_the_context_key_selects_another_key_clears_it_and_c_compacts_first(make_host, project):
    """Issue 30: at the context step `c` only selects (the approval is still pending), another key clears
    the selection without deciding, and `c` Enter approves with context compact: the planning conversation
    is summarised before the execution's first request (one line, its reason manual)."""
    provider = ScriptedProvider([LOOK, SUBMIT_PLAN, {"text": "Executing."}])
    async with chat_rig(make_host(provider=provider), {"projectPath": str(project), "mode": "plan"}) as rig:
        chat_, screen, master = rig.chat, rig.screen, rig.master
        rig.start_reading()
        await chat_.submit("plan the notes")
        await screen.expect("approve? [a] ask")
        os.write(master, b"a\r")
        await screen.expect("ask · context? [k]eep (Enter) [c]ompact [f]resh ›")
        os.write(master, b"c")
        await screen.expect("compact the conversation? Enter confirms")
        os.write(master, b"x")
        await screen.expect("ask · context? [k]eep (Enter)")
        pending = (await rig.link.call("plans.pending", {"sessionId": rig.session["id"]}))["approvals"]
        assert [a["status"] for a in pending] == ["pending"]
        os.write(master, b"c")
        await screen.expect("compact the conversation? Enter confirms")
        os.write(master, b"\r")
        await screen.expect("[plan approved · ask · context: compact]")
        await screen.expect("── context compacted (manual): ")
        await screen.expect("Executing.")
        await screen.expect("[turn completed]")
        assert screen.getvalue().count("── context compacted (manual): ") == 1
        [approval] = (await rig.link.call("plans.list", {"sessionId": rig.session["id"]}))["approvals"]
        assert (approval["permissionMode"], approval["context"]) == ("ask", "compact")


def test_a_running_host_keeps_its_window_and_plans_approve_takes_a_context(project, data_dir, tmp_path):
    """Issue 30: `pidesk serve --context-limit 6000` is the window a chat attached to it reports; `chat` and
    `run` given another say once, dimly, that it does not apply; `plans approve --context fresh` approves
    a plan waiting in that host with a fresh context and says so, and the execution opens with it."""
    script = tmp_path / "plan.json"
    script.write_text(json.dumps({"responses": [SUBMIT_PLAN, {"text": "Executed."}]}))
    model = f"scripted/{script}"
    with serving(data_dir, "--model", model, "--context-limit", "6000"):
        attached = pidesk("run", str(project), "hi", "--context-limit", "9000", "--permission", "auto",
                          data_dir=data_dir)
        note = "--context-limit 9000 does not apply: the running host at http://127.0.0.1:"
        assert attached.stderr.count(note) == 1 and "pidesk serve --context-limit N" in attached.stderr
        ok("sessions", "delete", only_session(data_dir), data_dir=data_dir)

        term = Terminal([sys.executable, "-m", "pidesk", "chat", str(project), "--data-dir", str(data_dir),
                         "--context-limit", "9000"])
        term.expect(note)
        term.expect_status("agent · ask · idle ›")
        term.type("/context\r")
        term.expect(" / 6,000 tokens (")
        term.type("\x04")
        assert term.close() == 0
        assert json.loads(ok("sessions", "list", "--json", data_dir=data_dir)) == []  # (unused: not left behind)

        session = json.loads(ok("sessions", "new", str(project), "--mode", "plan", "--json", data_dir=data_dir))
        with watching(data_dir) as ws:
            ok("queue", "push", session["id"], "plan the notes", data_dir=data_dir)
            approval_id = wait_for(ws, "plan.requested")["approval"]["id"]
            approved = ok("plans", "approve", approval_id, "--permission", "auto", "--context", "fresh",
                          data_dir=data_dir)
            assert approved.startswith(f"approved plan {approval_id} “Add notes”\nexecution x_")
            assert "context fresh: it starts fresh from the plan alone" in approved
            wait_for(ws, "execution.changed", approvalId=approval_id, executionState="completed")
        [approval] = json.loads(ok("plans", "list", "--session", session["id"], "--json", data_dir=data_dir))
        assert approval["context"] == "fresh"
        shown = history(data_dir, session["id"])
        assert shown.index("── execution starts with a fresh context ──") < shown.index("Executed.")


def test_compact_command_summarises_an_idle_session_with_the_model_given(project, data_dir, tmp_path):
    """Issue 30: `pidesk compact SESSION --instructions …` (an embedded host with `--model`) has the model
    summarise the session now and prints the compaction line and the summary; again, nothing to compact."""
    ok("run", str(project), "hello", "--model", scripted(tmp_path, {"text": "Hello to you."}), data_dir=data_dir)
    session_id = only_session(data_dir)
    summarising = tmp_path / "summary.json"  # (each process replays a session's script from its start)
    summarising.write_text(json.dumps({"responses": [{"summary": "The user said hello; I answered."}]}))
    model = f"scripted/{summarising}"
    done = ok("compact", session_id, "--instructions", "keep the greeting", "--model", model, data_dir=data_dir)
    first, summary = done.splitlines()
    assert first.startswith("── context compacted (manual): ") and summary == "The user said hello; I answered."
    again = json.loads(ok("compact", session_id, "--model", model, "--json", data_dir=data_dir))
    assert again == {"compacted": False, "sessionId": session_id}
    assert "nothing to compact" in ok("compact", session_id, "--model", model, data_dir=data_dir)
    assert sum(line.startswith("── context compacted (manual): ") for line in history(data_dir, session_id)) == 1


@pytest.mark.asyncio
async def test_a_retry_wait_is_a_line_saying_when_and_why(make_host, project):
    """Issue 30 §5: while the model request waits to be sent again, the chat says so — "retrying in 3 s
    (2/10)" and the provider's words — rather than sitting silent; the answer follows."""
    provider = ScriptedProvider([{"retrying": {"attempt": 2, "of": 10, "waitS": 3,
                                               "reason": "anthropic answered HTTP 529: Overloaded"},
                                  "text": "Answered after all."}])
    async with chat_rig(make_host(provider=provider), {"projectPath": str(project)}) as rig:
        await rig.chat.submit("hello")
        await rig.screen.expect("[retrying in 3 s (2/10): anthropic answered HTTP 529: Overloaded]")
        await rig.screen.expect("Answered after all.")
        await rig.screen.expect("[turn completed]")


@pytest.mark.asyncio
async def test_each_turn_ends_with_its_tokens_cache_reads_and_writes_apart(make_host, project):
    """Issue 30 §4: after a turn, chat shows what it cost — input, output, and the cache's reads and
    writes apart (a write costs more than plain input, a read a tenth of it)."""
    provider = ScriptedProvider([{"text": "Read it all.", "usage": {"inputTokens": 12345, "outputTokens": 400,
                                                                    "cacheReadTokens": 10000, "cacheWriteTokens": 1000}}])
    async with chat_rig(make_host(provider=provider), {"projectPath": str(project)}) as rig:
        await rig.chat.submit("hello")
        await rig.screen.expect("[turn completed]")
        await rig.screen.expect("12,345 in · 400 out · cache 10,000 read · 1,000 written")

