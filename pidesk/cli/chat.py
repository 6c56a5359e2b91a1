"""``pidesk chat``: a terminal client over the protocol.

Keys: Enter sends (while a turn runs the prompt is queued), Shift+Tab cycles
Agent → Plan → Goal while idle, Esc stops the running turn at its next boundary
(and does nothing while idle), Ctrl+C aborts it (and quits when nothing runs),
Ctrl+D on an empty line quits.
Commands: /agent /plan /goal (mode), /auto /ask /accept-edits (permission mode),
/pending (show a waiting plan or permission request again), /diff (what the last
turn that changed files changed, coloured like ``git diff``), /undo (revert that
turn, after a y/n prompt), /context (how full the model's window is, and what the
next request includes), /compact [instructions] (fold the conversation into the
model's summary now; idle only), /help, /quit.

Compaction (issue 30). A compaction — the host's, as the window fills, or /compact's,
or an execution approved with a compacted or fresh context — is one dim line where it
happened: ``── context compacted (auto): 96,120 → 4,310 tokens ──``. The host says it
twice (``message.appended`` with the compaction block, then ``context.compacted``): the
line is printed for whichever comes first, once per message id. While /compact runs the
status line says ``compacting`` and a prompt sent meanwhile is queued (the host starts it
after). The chat replays no history, so compactions before it started are not shown
(``pidesk sessions show`` lists them).

At start the chat prints, dimmed, what the session's next model request includes
(``session.context``: instruction files and skills, then one line per thing left
out); a host without the method prints nothing. Thinking blocks of an assistant
message are printed dimmed before its text (``(thinking redacted)`` for one the
vendor encrypted).

Decisions. A submitted plan is shown as Markdown with its path and hash; a
permission request with its tool and arguments, and for Write and Edit the diff
the call would make (and whether it overwrites an existing file). Then a
decision prompt: a approve (ask), e approve (accept-edits), u approve (auto),
r reject (with optional feedback); y allow once, s allow for this session,
n deny. A confirmed approval then asks what the execution sees of the
conversation: k keep it (Enter alone keeps it), c compact it into a summary
first, f fresh (the contract alone); the ``[plan approved · …]`` line says
which. ``/undo`` lists the files the revert restores and asks y/n: y reverts,
n, Esc or Ctrl+C keeps everything (and a turn starting meanwhile cancels it).

Invariants of a decision prompt (the keys decide what an agent may do):

- Type-ahead never answers it. Just before a prompt is drawn the terminal's
  input is flushed (``TCIFLUSH``) and every key already read from stdin is
  dropped: each key carries the *epoch* it was read in, and a prompt only takes
  keys of its own epoch or later. No timing window is involved.
- An answer is deliberate: the key selects (and says what it selected), Enter
  confirms; any other key clears the selection, so a stray Enter or a word
  typed into the prompt decides nothing. ``auto`` asks once more (y, Enter),
  because it lets every tool run unasked. The one exception is the context step
  after a confirmed approval: Enter alone keeps the context, the default, which
  changes nothing; compact and fresh each take their key, then Enter.
- Esc dismisses the prompt; the request stays pending in the host, the status
  line says so and ``/pending`` shows it again. Ctrl+C aborts the turn, as
  everywhere else.
- The same holds for ``/undo``'s y/n prompt: a revert also takes back what was
  changed by hand since, so only a key pressed after the prompt, then Enter,
  reverts. The host stays the authority: a busy session is refused there
  (``AGENT_BUSY``) and the refusal is shown as it comes.

Screen. The last line is the live status/prompt line (mode · permission mode ·
state › what you type); everything else is printed above it, never over it.
An assistant message is shown once, rendered as Markdown, when the host
appends it; while it streams, its newest words are previewed on the status
line, so nothing the agent writes is drawn and then erased. A turn that ends in
an error shows ``[turn error: CODE]`` and, under it, the host's ``errorMessage``
(the provider's status and message, the retries spent) when it gives one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import termios
import tty
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

from rich.console import Console
from rich.markdown import Markdown
from rich.text import Text

from pidesk.cli.link import HostAway
from pidesk.cli.say import compaction_line, sandbox_line, tool_line, window_line
from pidesk.core.errors import PideskError

MODES = ("agent", "plan", "goal")
SHIFT_TAB, ESC, CTRL_C, CTRL_D = "\x1b[Z", "\x1b", "\x03", "\x04"
ENTER = ("\r", "\n")
BACKSPACE = ("\x7f", "\b")
PLAN_CHOICES = {"a": "ask", "e": "accept-edits", "u": "auto", "r": "reject"}
PERMISSION_CHOICES = {"y": "allow once", "s": "allow for this session", "n": "deny"}
UNDO_CHOICES = {"y": "revert", "n": "keep everything"}
CONTEXT_CHOICES = {"k": "keep", "c": "compact", "f": "fresh"}  # what an approved execution sees (issue 30)


def last_undoable(turns: list[dict[str, Any]]) -> int | None:
    """The index, in ``session.changes``' list, of the newest turn whose changes still stand: a
    revert undoes its turn and every later one, and a revert of a revert puts back what that undid."""
    position = {t["turnId"]: i for i, t in enumerate(turns)}
    taken_back: set[str] = set()  # reverts a later revert undid
    i = len(turns) - 1
    while i >= 0:
        turn = turns[i]
        if not turn.get("revert"):
            if turn["files"]:
                return i
            i -= 1
        elif turn["turnId"] in taken_back or turn.get("revertOf") not in position:
            i -= 1
        elif turns[position[turn["revertOf"]]].get("revert"):
            taken_back.add(turn["revertOf"])
            i -= 1
        else:
            i = position[turn["revertOf"]] - 1  # that turn and all after it are undone
    return None
DIFF_LINES = 400  # lines of one file's diff shown in the terminal; `pidesk diff` prints it whole
HELP = """\
Keys: Enter sends (queued while a turn runs) · Shift+Tab cycles agent → plan → goal while idle ·
      Esc stops the running turn at its next boundary · Ctrl+C aborts it, or quits when idle ·
      Ctrl+D on an empty line quits
Commands: /agent /plan /goal — mode · /ask /accept-edits /auto — permission mode ·
          /pending — show a waiting plan or permission request again ·
          /diff — what the last turn that changed files changed ·
          /undo — revert that turn (asks first; hand edits since then are reverted too) ·
          /context — how full the model's window is, and what the next request includes ·
          /compact [instructions] — fold the conversation into the model's summary now ·
          /queue — the prompts waiting their turn (held after a restart, too) · /queue clear — drop them ·
          /help · /quit
Decisions: press the key, then Enter to confirm (auto asks once more) · Esc leaves it pending ·
           an approval then asks what the execution sees: [k] keep the conversation (Enter),
           [c] compact it into a summary first, [f] fresh: the plan alone"""


@dataclass
class Decision:
    """A decision prompt on screen: what it decides, and what has been selected so far."""

    kind: Literal["plan", "permission", "undo"]
    item: dict[str, Any]
    epoch: int  # keys read before this epoch were typed before the prompt: never an answer
    choice: str | None = None
    confirming_auto: bool = False
    approving: str | None = None  # the permission mode of a confirmed approval, now choosing its context
    feedback: bool = False  # a confirmed reject, now reading optional feedback …
    text: str = ""  # … typed here (the prompt being written stays in Chat.buffer)


HISTORY = 20  # messages a resumed chat shows first
KEY_HINTS = ("Enter sends · Shift+Tab mode · Esc stop · Ctrl+C abort/quit",
             "/help /pending /diff /undo /context /compact /queue /quit")


class Chat:
    def __init__(self, link: Any, session: dict[str, Any], console: Console) -> None:
        self.link = link
        self.session = session
        self.console = console
        self.buffer = ""
        self.turn_id: str | None = session.get("currentTurnId")
        self.done = asyncio.Event()
        self.away = False  # the host went away and the link is reconnecting (issue 31 §2)
        self.echo_turn: str | None = None  # a queued prompt's turn: its prompt is echoed when it runs
        self.keys: asyncio.Queue[tuple[int, str]] = asyncio.Queue()
        self.epoch = 0
        self.tty_fd: int | None = None
        self.streamed = ""
        self.plan: dict[str, Any] | None = None  # the pending plan (plans.get), shown or not
        self.permissions: dict[str, dict[str, Any]] = {}  # pending permission requests by id
        self.dismissed: set[str] = set()  # ids whose prompt Esc put away
        self.decision: Decision | None = None
        self.compacting: asyncio.Task[None] | None = None  # /compact's session.compact, while it runs
        self.compactions: set[str] = set()  # message ids of the compactions shown (each is announced twice)

    # ---- output --------------------------------------------------------------------

    def prompt_line(self) -> str:
        room = max(self.console.width - 1, 20)
        decision = self.decision
        if decision is not None:
            return fit(decision_line(decision), decision.text, room)
        state = ("reconnecting" if self.away else "running" if self.turn_id
                 else "compacting" if self.compacting is not None else "idle")
        waiting = ""
        if self.plan is not None:
            waiting = f" · {self.plan['kind']} waiting: /pending"
        elif self.permissions:
            waiting = " · permission waiting: /pending"
        head = f"{self.session['mode']} · {self.session['permissionMode']} · {state}{waiting}"
        if self.streamed.strip():  # the newest words of the message being written
            tail = " ".join(self.streamed.split())
            space = room - len(head) - len(self.buffer) - 10
            if space > 8:
                head += f" · “{tail}”" if len(tail) <= space else f" · “…{tail[-(space - 1):]}”"
        return fit(f"{head} › ", self.buffer, room)

    def redraw(self) -> None:
        self.console.file.write("\r\x1b[K" + self.prompt_line())
        self.console.file.flush()

    def say(self, text: str, style: str | None = None) -> None:
        self.console.file.write("\r\x1b[K")
        self.console.print(text, style=style, markup=False, highlight=False)
        self.redraw()

    def show_markdown(self, text: str) -> None:
        self.console.file.write("\r\x1b[K")
        self.console.print(Markdown(text))
        self.redraw()

    def print_diff(self, diff: str) -> None:
        """A unified diff coloured like ``git diff`` (the caller clears the status line and redraws it)."""
        if diff == "binary":
            self.console.print("  (binary file)", style="dim", markup=False, highlight=False)
            return
        lines = diff.splitlines()
        for line in lines[:DIFF_LINES]:
            self.console.print(Text(line, style=diff_style(line) or ""), soft_wrap=True)
        if len(lines) > DIFF_LINES:
            self.console.print(f"  … {len(lines) - DIFF_LINES} more lines (`pidesk diff` prints them all)",
                               style="dim", markup=False, highlight=False)

    async def show_sandbox(self) -> None:
        """Issue 28: which sandbox Bash runs in, one line: dim while it confines, loud when it does not."""
        sandbox = (await self.link.call("host.hello", {"protocolVersion": 1, "client": "chat"})).get("sandbox")
        if sandbox is None:  # an older host: nothing to say
            return
        style = "dim" if sandbox["available"] else "bold red" if sandbox["mode"] != "off" else "bold yellow"
        self.console.print(sandbox_line(sandbox), style=style, markup=False, highlight=False)

    async def show_context(self) -> None:
        """Issue 16 §1: what the session's next model request includes, one dim line (+ one per warning).

        Printed at start, before the status line is first drawn."""
        try:
            context = await self.link.call("session.context", {"sessionId": self.session["id"]})
        except PideskError as exc:
            if exc.code != "METHOD_NOT_FOUND":  # an older host has no such method: nothing to say
                self.console.print(f"context: {exc.code}: {exc.message}", style="red", markup=False, highlight=False)
            return
        for line in context_lines(context):
            self.console.print(line, style="dim", markup=False, highlight=False)

    async def show_window(self) -> None:
        """``/context``: how full the model's window is (``window``, issue 30), then the start-up context lines."""
        context = await self.link.call("session.context", {"sessionId": self.session["id"]})
        window = context.get("window")
        lines = ([window_line(window)] if window else []) + context_lines(context)
        self.say("\n".join(lines), "dim")

    def show_compaction(self, message_id: str, compaction: dict[str, Any]) -> None:
        """One dim line where the model's view was cut (once per compaction: the host announces it twice)."""
        if message_id in self.compactions:
            return
        self.compactions.add(message_id)
        self.say(compaction_line(compaction), "dim")

    def show_outcome(self, name: str, ok: bool, code: str | None, tail: str = "") -> None:
        """``  ✓ Read (4 ms)`` / ``  ✗ WRITE_DISABLED_IN_PLAN Write`` — how a tool call ended."""
        mark = "✓" if ok else f"✗ {code or 'failed'}"
        self.say(f"  {mark} {name}{tail}", "green" if ok else "red")

    async def show_history(self, limit: int = HISTORY) -> None:
        """A resumed session's last ``limit`` messages (issue 31 §3), as they were shown live: prompts, answers,
        each tool call's outcome on one line, compactions."""
        got = await self.link.call("session.get", {"sessionId": self.session["id"], "limit": limit})
        if got["hasMore"]:
            self.say(f"── the last {len(got['messages'])} messages (pidesk sessions show "
                     f"{self.session['id']} --limit N for more) ──", "dim")
        for message in got["messages"]:
            content = message["content"]
            if message["role"] == "assistant":
                self.show_message(content)
                for block in content:
                    if block.get("type") == "toolCall":
                        self.say(tool_line(block["name"], block["args"]), "dim")
            elif message["role"] == "tool":
                for block in content:
                    if block.get("type") == "toolResult":
                        self.show_outcome(block["name"], block["ok"], block.get("errorCode"))
            elif content and content[0].get("type") == "compaction":
                self.show_compaction(message["id"], content[0])
            else:
                text = " ".join(b["text"] for b in content if b.get("type") == "text").strip()
                if text:
                    self.say(f"› {text}", "bold cyan")

    # ---- events ---------------------------------------------------------------------

    async def follow(self) -> None:
        async for event in self.link.events():
            if event["type"].startswith("link."):
                await self.on_link(event)
            elif event_session(event) == self.session["id"]:
                await self.on_event(event)

    async def on_link(self, event: dict[str, Any]) -> None:
        """The host went away and came back (or did not): say so, and show again what is true now."""
        kind = event["type"]
        if kind == "link.lost":
            self.away = True
            self.say("[host stopped — reconnecting…]", "yellow")
        elif kind == "link.restored":
            self.away = False
            try:
                self.session = (await self.link.call("session.get", {"sessionId": self.session["id"],
                                                                     "limit": 1}))["session"]
                await self.link.call("session.focus", {"sessionId": self.session["id"]})
            except PideskError as exc:
                self.say(f"[reconnected, but the session is gone: {exc.message}]", "red")
                self.done.set()
                return
            self.turn_id = self.session.get("currentTurnId")
            self.streamed = ""
            self.say("[reconnected]", "dim")
            await self.show_pending(quiet=True)  # a plan or permission prompt still waiting is asked again
        elif kind == "link.failed":
            self.say(f"[the host is gone: {event.get('reason')}. Start it again (pidesk serve, or any pidesk "
                     "command) and run pidesk chat --session " + self.session["id"] + "]", "red")
            self.done.set()
        self.redraw()

    async def on_event(self, event: dict[str, Any]) -> None:
        kind = event["type"]
        if kind == "session.updated":
            self.session = event["session"]
            self.redraw()
        elif kind == "turn.started":
            self.turn_id = event["turnId"]
            if event.get("origin") == "queued":
                self.echo_turn = event["turnId"]  # its prompt is shown when it is stored: typed earlier
            if self.decision is not None and self.decision.kind == "undo":
                self.decision = None  # the host refuses a revert while a turn runs
                self.say("[undo cancelled: a turn started]", "dim")
                self.next_decision()
            self.redraw()
        elif kind == "message.delta":
            self.streamed += event["text"]
            self.redraw()
        elif kind == "message.appended" and event["message"]["role"] == "assistant":
            self.streamed = ""
            self.show_message(event["message"]["content"])
        elif kind == "message.appended":
            message = event["message"]
            if message["role"] == "user" and message.get("turnId") == self.echo_turn:
                self.echo_turn = None
                text = " ".join(b["text"] for b in message["content"] if b.get("type") == "text").strip()
                self.say(f"› {text}   (from the queue)", "bold cyan")
            for block in message["content"]:
                if block.get("type") == "compaction":
                    self.show_compaction(message["id"], block)
        elif kind == "context.compacted":
            self.show_compaction(event["messageId"], event)
        elif kind == "tool.started":
            self.say(tool_line(event["name"], event["args"]), "dim")
            if event["name"] == "ReportCriteria":  # a goal's criteria, ticked as they are reported
                for result in event["args"].get("results") or []:
                    if isinstance(result, dict):
                        mark = {"met": "✓", "unmet": "·", "blocked": "✗"}.get(str(result.get("outcome")), "?")
                        self.say(f"  {mark} {result.get('criterion')} ({result.get('outcome')})",
                                 "green" if mark == "✓" else "red" if mark == "✗" else "dim")
        elif kind == "tool.finished":
            self.show_outcome(event["name"], event["ok"], event.get("errorCode"), f" ({event['durationMs']} ms)")
        elif kind == "turn.retrying":  # the model request waits to be sent again: when, and why
            self.say(f"[retrying in {event['waitS']:g} s ({event['attempt']}/{event['of']}): {event['reason']}]",
                     "yellow")
        elif kind == "turn.ended":
            self.turn_end(event)
            await self.show_usage(event["turnId"])
            await self.show_changed(event["turnId"])
        elif kind == "plan.requested":
            await self.show_plan(event["approval"]["id"])
        elif kind == "plan.resolved":
            approval = event["approval"]
            if self.plan is not None and self.plan["id"] == approval["id"]:
                self.plan = None
            self.hide(approval["id"])
            self.say(resolved_line(approval), "bold")
            self.next_decision()
        elif kind == "permission.requested":
            request = event["request"]
            self.permissions[request["id"]] = request
            if self.decision is None:
                self.show_permission(request)
        elif kind == "permission.resolved":
            request = event["request"]
            self.permissions.pop(request["id"], None)
            self.hide(request["id"])
            self.next_decision()
        elif kind == "queue.changed":
            if event["entries"]:
                self.say(f"[queued: {len(event['entries'])}]", "dim")

    def show_message(self, content: list[dict[str, Any]]) -> None:
        """An assistant message, in its blocks' order: thinking dimmed, text as Markdown."""
        text: list[str] = []

        def flush() -> None:
            joined = "".join(text).strip()
            text.clear()
            if joined:
                self.show_markdown(joined)

        for block in content:
            if block.get("type") == "text":
                text.append(block["text"])
            elif block.get("type") == "thinking":
                flush()
                if block.get("redacted"):
                    self.say("(thinking redacted)", "dim")
                elif str(block.get("text") or "").strip():
                    self.say(str(block["text"]).strip(), "dim")
        flush()
        self.redraw()

    def turn_end(self, event: dict[str, Any]) -> None:
        if self.streamed.strip():  # a message cut short never gets appended: keep what was said
            leftover, self.streamed = self.streamed.strip(), ""
            self.say(leftover)
        self.streamed = ""
        self.turn_id = None
        # nothing can answer a request of a turn that ended
        if self.plan is not None and self.plan["turnId"] == event["turnId"]:
            self.hide(self.plan["id"])
            self.plan = None
        for request_id, request in list(self.permissions.items()):
            if request["turnId"] == event["turnId"]:
                del self.permissions[request_id]
                self.hide(request_id)
        code = f": {event['errorCode']}" if event.get("errorCode") else ""
        self.say(f"[turn {event['reason']}{code}]", "bold")
        if event.get("errorMessage"):  # the cause in words: the provider's status and message, retries spent
            self.say(f"  {event['errorMessage']}", "red")

    async def show_queue(self, *, clear: bool = False) -> None:
        """``/queue``: the prompts waiting for the session (a held queue says so); ``/queue clear`` drops them."""
        sid = self.session["id"]
        entries = (await self.link.call("agent.queue.list", {"sessionId": sid}))["entries"]
        if not entries:
            self.say("[the queue is empty]", "dim")
            return
        if clear:
            for entry in entries:
                await self.link.call("agent.queue.remove", {"sessionId": sid, "entryId": entry["id"]})
            self.say(f"[dropped {len(entries)} queued prompt{'s' if len(entries) != 1 else ''}]", "dim")
            return
        for n, entry in enumerate(entries, 1):
            self.say(f"  {n}. {' '.join(entry['text'].split())[:100]}", "dim")
        self.say("[/queue clear drops them]", "dim")

    async def show_changed(self, turn_id: str) -> None:
        """``[2 files changed +5 −1 · /diff shows them]`` after a turn that changed files (issue 31 §3)."""
        try:
            changes = await self.link.call("session.changes", {"sessionId": self.session["id"], "turnId": turn_id})
        except PideskError:
            return  # (a host without checkpoints, or a turn from before them)
        files = [f for t in changes.get("turns", []) for f in t["files"]]
        if files:
            added, removed = sum(f["additions"] for f in files), sum(f["deletions"] for f in files)
            self.say(f"[{len(files)} file{'s' if len(files) != 1 else ''} changed +{added} −{removed} · "
                     "/diff shows them, /undo takes them back]", "dim")

    async def show_usage(self, turn_id: str) -> None:
        """The turn's tokens, dimmed, with its cache reads and writes apart (issue 30); nothing when none
        were counted (a model that reports no usage)."""
        try:
            turns = (await self.link.call("session.turns", {"sessionId": self.session["id"], "limit": 5}))["turns"]
        except PideskError:
            return
        usage = next((t.get("usage") for t in turns if t["id"] == turn_id), None) or {}
        if any(usage.get(k) for k in ("inputTokens", "outputTokens")):
            self.say("  " + usage_line(usage), "dim")

    # ---- decision prompts -----------------------------------------------------------

    async def show_plan(self, approval_id: str) -> None:
        try:
            full = await self.link.call("plans.get", {"approvalId": approval_id})
        except PideskError as exc:
            self.say(f"{exc.code}: {exc.message}", "red")
            return
        if full["status"] != "pending":
            return
        self.plan = full
        self.dismissed.discard(full["id"])
        self.console.file.write("\r\x1b[K")
        self.console.rule(f"{full['kind']}: {full['title']}")
        self.console.print(Markdown(full["markdown"]))
        for criterion in full.get("criteria") or []:
            self.console.print(f"  ☐ {criterion}", markup=False, highlight=False)
        self.console.print(f"{full['artifactPath']} · sha256 {full['artifactSha256'][:12]} · "
                           f"{full['artifactSize']} bytes", style="dim", markup=False, highlight=False)
        self.console.print(full["question"], style="bold", markup=False, highlight=False)
        self.open_decision("plan", full)

    def show_permission(self, request: dict[str, Any]) -> None:
        self.dismissed.discard(request["id"])
        self.console.file.write("\r\x1b[K")
        if request.get("escalated"):  # a command asking to leave the sandbox: said apart, in red
            args = request["args"]
            self.console.print("permission: run OUTSIDE the sandbox (network, files beyond the project)",
                               style="bold red", markup=False, highlight=False)
            self.console.print(f"  why: {str(args.get('justification') or '').strip() or '(no reason given)'}",
                               style="red", markup=False, highlight=False)
            self.console.print(f"  $ {args.get('command', '')}", markup=False, highlight=False)
            self.open_decision("permission", request)
            return
        self.console.print(f"permission: {request['tool']} {json.dumps(request['args'])[:200]}", style="yellow",
                           markup=False, highlight=False)
        preview = request.get("preview") or {}
        if preview.get("diff"):  # Write and Edit: the change the call would make, as the file is now
            self.print_diff(preview["diff"])
        if preview.get("overwrites"):
            self.console.print(f"  {request['tool']} overwrites an existing file", style="bold yellow",
                               markup=False, highlight=False)
        self.open_decision("permission", request)

    def open_decision(self, kind: Literal["plan", "permission", "undo"], item: dict[str, Any]) -> None:
        """Drop every key typed so far, then draw the prompt (one step of the loop: no key is read between).

        Flushing before drawing, not after, so that a key pressed on seeing the prompt is never flushed.
        """
        self.epoch += 1
        self.discard_typeahead()
        self.decision = Decision(kind, item, self.epoch)
        self.redraw()

    def discard_typeahead(self) -> None:
        if self.tty_fd is not None:
            with contextlib.suppress(termios.error):
                termios.tcflush(self.tty_fd, termios.TCIFLUSH)  # typed, not yet read
        while not self.keys.empty():  # read, not yet handled
            self.keys.get_nowait()

    def hide(self, item_id: str) -> None:
        self.dismissed.discard(item_id)
        if self.decision is not None and self.decision.item["id"] == item_id:
            self.decision = None
            self.redraw()

    def next_decision(self) -> None:
        """Show the next pending request nobody put away, if no prompt is on screen."""
        if self.decision is not None:
            return
        waiting = [self.plan] if self.plan is not None else []
        waiting += list(self.permissions.values())
        for item in waiting:
            if item["id"] not in self.dismissed:
                if item is self.plan:
                    self.open_decision("plan", item)
                else:
                    self.show_permission(item)
                return

    async def show_pending(self, quiet: bool = False) -> None:
        """``/pending``: ask the host what waits for this session and show it again."""
        sid = self.session["id"]
        approvals = (await self.link.call("plans.pending", {"sessionId": sid}))["approvals"]
        requests = (await self.link.call("permissions.pending", {"sessionId": sid}))["requests"]
        self.permissions = {r["id"]: r for r in requests}
        self.dismissed.clear()
        if approvals:
            await self.show_plan(approvals[0]["id"])
        elif requests:
            self.plan = None
            self.show_permission(requests[0])
        else:
            self.plan = None
            if not quiet:
                self.say("nothing is waiting for a decision", "dim")

    async def on_decision_key(self, decision: Decision, key: str) -> None:
        if key == ESC and decision.kind == "undo":
            self.cancel_undo()
            return
        if key == ESC:
            self.decision = None
            self.dismissed.add(decision.item["id"])
            what = "plan" if decision.kind == "plan" else "permission request"
            self.say(f"[{what} still pending — /pending shows it again]", "dim")
            return
        if decision.feedback:
            if key in ENTER:
                self.decision = None
                await self.resolve_plan(decision.item, "reject", feedback=decision.text.strip() or None)
            elif key in BACKSPACE:
                decision.text = decision.text[:-1]
            elif key.isprintable():
                decision.text += key
            self.redraw()
            return
        choices = {"plan": PLAN_CHOICES, "permission": PERMISSION_CHOICES, "undo": UNDO_CHOICES}[decision.kind]
        if decision.confirming_auto:
            choices = {"y": "yes"}
        elif decision.approving is not None:
            choices = CONTEXT_CHOICES
        if key in ENTER:
            if decision.choice is not None or decision.approving is not None:  # (Enter alone keeps the context)
                await self.confirm(decision)
        elif key.lower() in choices:
            decision.choice = key.lower()
        else:  # anything else clears the selection (and takes auto back to the question)
            decision.choice, decision.confirming_auto = None, False
        self.redraw()

    async def confirm(self, decision: Decision) -> None:
        choice = decision.choice
        if decision.kind == "undo":
            if choice == "y":
                self.decision = None
                await self.revert(decision.item)
                self.next_decision()
            else:
                self.cancel_undo()
        elif decision.kind == "permission":
            self.decision = None
            await self.resolve_permission(decision.item, choice or "n")
            self.next_decision()
        elif decision.approving is not None:
            self.decision = None
            await self.resolve_plan(decision.item, "approve", permission_mode=decision.approving,
                                    context=CONTEXT_CHOICES[choice or "k"])
        elif decision.confirming_auto:
            decision.choice, decision.confirming_auto, decision.approving = None, False, "auto"
        elif choice == "u":
            decision.choice, decision.confirming_auto = None, True
        elif choice == "r":
            decision.choice, decision.feedback = None, True
        else:
            decision.choice, decision.approving = None, PLAN_CHOICES[choice or "a"]

    async def resolve_plan(self, approval: dict[str, Any], decision: str, *, permission_mode: str | None = None,
                           context: str | None = None, feedback: str | None = None) -> None:
        params = {"approvalId": approval["id"], "sessionId": approval["sessionId"], "turnId": approval["turnId"],
                  "decision": decision}
        if permission_mode:
            params["permissionMode"] = permission_mode
        if context:
            params["context"] = context
        if feedback:
            params["feedback"] = feedback
        self.plan = None  # decided here: not "waiting" any more, whatever the host answers
        try:
            await self.link.call("plans.resolve", params)
        except PideskError as exc:
            self.say(f"{exc.code}: {exc.message}", "red")

    async def resolve_permission(self, request: dict[str, Any], key: str) -> None:
        decision, remember = {"y": ("allow", None), "s": ("allow", "session"), "n": ("deny", None)}[key]
        self.permissions.pop(request["id"], None)
        params = {"requestId": request["id"], "sessionId": request["sessionId"], "turnId": request["turnId"],
                  "decision": decision}
        if remember:
            params["remember"] = remember
        try:
            await self.link.call("permissions.resolve", params)
        except PideskError as exc:
            self.say(f"{exc.code}: {exc.message}", "red")
        else:  # the answer stays on screen (issue 31 §3): the prompt itself is gone
            answered = {"y": "allowed once", "s": "allowed for this session", "n": "denied"}[key]
            self.say(f"[{request['tool']}: {answered}]", "green" if key != "n" else "red")
        self.redraw()

    # ---- input ----------------------------------------------------------------------

    async def on_key(self, key: str, epoch: int | None = None) -> None:
        """One key, read from stdin in ``epoch`` (the current one if not given)."""
        epoch = self.epoch if epoch is None else epoch
        decision = self.decision
        if decision is not None and key != CTRL_C:
            if epoch >= decision.epoch:  # older keys were typed before the prompt was shown
                await self.on_decision_key(decision, key)
        elif key == CTRL_C and decision is not None and decision.kind == "undo":
            self.cancel_undo()  # nothing runs: Ctrl+C at this prompt cancels it, it does not quit
        elif key == CTRL_C:
            if self.decision is not None:
                self.dismissed.add(self.decision.item["id"])
                self.decision = None
            if self.turn_id is None:
                self.done.set()
            else:
                await self.link.call("agent.abort", {"sessionId": self.session["id"], "smart": True})
                self.redraw()
        elif key == CTRL_D and not self.buffer:
            self.done.set()
        elif key == SHIFT_TAB:
            await self.cycle_mode()
        elif key == ESC:
            if self.turn_id is not None:
                await self.link.call("agent.stop", {"sessionId": self.session["id"]})
                self.say("[stopping at the next boundary]", "dim")
        elif key in ENTER:
            text, self.buffer = self.buffer, ""
            await self.submit(text)
        elif key in BACKSPACE:
            self.buffer = self.buffer[:-1]
            self.redraw()
        elif key.isprintable():
            self.buffer += key
            self.redraw()

    async def submit(self, text: str) -> None:
        text = text.strip()
        if not text:
            self.redraw()
            return
        self.say(f"› {text}", "bold cyan")
        sid = self.session["id"]
        try:
            if text in ("/agent", "/plan", "/goal"):
                self.session = await self.link.call("session.setMode", {"sessionId": sid, "mode": text[1:]})
                self.say(f"[mode: {self.session['mode']}]", "dim")
            elif text in ("/ask", "/auto", "/accept-edits"):
                self.session = await self.link.call("session.setPermissionMode",
                                                    {"sessionId": sid, "permissionMode": text[1:]})
                self.say(f"[permission mode: {self.session['permissionMode']}]", "dim")
            elif text == "/pending":
                await self.show_pending()
            elif text == "/diff":
                await self.show_last_changes()
            elif text == "/undo":
                await self.ask_undo()
            elif text == "/context":
                await self.show_window()
            elif text in ("/queue", "/queue clear"):
                await self.show_queue(clear=text.endswith("clear"))
            elif text == "/compact" or text.startswith("/compact "):
                self.compact(text.removeprefix("/compact").strip())
            elif text == "/help":
                self.say(HELP, "dim")
            elif text == "/quit":
                self.done.set()
            elif is_command(text):
                self.say(f"unknown command {text} — /help lists the commands", "red")
            elif self.turn_id is not None or self.compacting is not None:  # the host starts it when idle
                await self.link.call("agent.queue.push", {"sessionId": sid, "text": text})
            else:
                started = await self.link.call("agent.prompt", {"sessionId": sid, "text": text})
                self.turn_id = started["turnId"]
        except HostAway:
            if not is_command(text):
                self.buffer = text  # kept: Enter sends it once the host is back
            self.say("[not sent: the host is away, reconnecting — your text is kept]", "yellow")
        except PideskError as exc:
            self.say(f"{exc.code}: {exc.message}", "red")
        self.redraw()

    # ---- /diff and /undo (issue 17) ------------------------------------------------

    async def changed_turns(self) -> tuple[list[dict[str, Any]], str | None]:
        """session.changes: every turn (and revert) of the session, oldest first, and the host's note."""
        result = await self.link.call("session.changes", {"sessionId": self.session["id"]})
        return list(result["turns"]), result.get("note")

    async def show_last_changes(self) -> None:
        """``/diff``: the newest turn (or revert) that changed files, each file's diff coloured."""
        turns, note = await self.changed_turns()
        last = next((t for t in reversed(turns) if t["files"]), None)
        if last is None:
            self.say("no turn of this session has changed a file" + (f" ({note})" if note else ""), "dim")
            return
        what = "the revert" if last.get("revert") else "turn"
        newest = " (the last turn)" if last is turns[-1] else " (the last one that changed files)"
        self.console.file.write("\r\x1b[K")
        self.console.rule(f"{what} {last['turnId']}{newest}", style="dim")
        for file in last["files"]:
            self.console.print(Text.assemble((f"{file['status']} {file['path']} ", "bold"),
                                             (f"+{file['additions']}", "green"), " ",
                                             (f"-{file['deletions']}", "red")), soft_wrap=True)
            self.print_diff(file["diff"])
        if note:
            self.console.print(note, style="dim", markup=False, highlight=False)
        self.redraw()

    async def ask_undo(self) -> None:
        """``/undo``: find the last turn that changed files, list what reverting it restores, then ask."""
        if self.turn_id is not None:
            self.say("a turn is running: /undo once it has ended (Esc stops it, Ctrl+C aborts it)", "red")
            return
        turns, note = await self.changed_turns()
        index = last_undoable(turns)
        if index is None:
            self.say("no turn of this session has changed a file: nothing to undo" + (f" ({note})" if note else ""),
                     "dim")
            return
        target, later = turns[index], turns[index + 1:]
        paths = sorted({f["path"] for t in turns[index:] for f in t["files"]})
        self.console.file.write("\r\x1b[K")
        self.console.print(f"/undo reverts the workspace to its state before turn {target['turnId']}"
                           + (f", undoing it and {len(later)} later change{'s' if len(later) != 1 else ''}"
                              if later else "") + ". Files restored:", style="bold", markup=False, highlight=False)
        for path in paths:
            self.console.print(f"  {path}", markup=False, highlight=False)
        self.console.print("Files changed by hand (or by another session in this project) since then are reverted "
                           "too; files ignored by .gitignore and .pi/ are never touched.", style="yellow",
                           markup=False, highlight=False)
        self.open_decision("undo", {"id": f"undo:{target['turnId']}", "turnId": target["turnId"],
                                    "later": [t["turnId"] for t in later]})

    def cancel_undo(self) -> None:
        self.decision = None
        self.say("[undo cancelled: nothing reverted]", "dim")
        self.next_decision()

    async def revert(self, item: dict[str, Any]) -> None:
        try:
            result = await self.link.call("session.revert", {"sessionId": self.session["id"],
                                                             "turnId": item["turnId"]})
        except PideskError as exc:
            if exc.code == "AGENT_BUSY":
                self.say(f"[not undone: {exc.message}]", "red")
            else:
                self.say(f"{exc.code}: {exc.message}", "red")
            return
        files = result["files"]
        self.say(f"[reverted {len(files)} file{'s' if len(files) != 1 else ''}"
                 + (": " + ", ".join(files) if files else "") + "]", "bold")
        kept = result.get("notRestored", [])
        if kept:
            self.say(f"[left as they are, too large to checkpoint: {', '.join(kept)}]", "yellow")
        self.say(f"/undo again undoes the turn before · pidesk revert {self.session['id']} --turn "
                 f"{result['revertId']} takes this revert back", "dim")

    # ---- /compact (issue 30) ---------------------------------------------------------

    def compact(self, instructions: str) -> None:
        """``/compact [instructions]``: the host summarises the conversation now, in a task of the chat's own
        (the model may take a while; keys keep working). The host decides whether it may: busy is refused."""
        if self.compacting is not None:
            self.say("a compaction is under way already", "red")
            return
        params = {"sessionId": self.session["id"]} | ({"instructions": instructions} if instructions else {})
        self.compacting = asyncio.create_task(self._compact(params))

    async def _compact(self, params: dict[str, Any]) -> None:
        try:
            result = await self.link.call("session.compact", params)
        except PideskError as exc:
            what = exc.message if exc.code == "AGENT_BUSY" else f"{exc.code}: {exc.message}"
            self.say(f"[not compacted: {what}]", "red")
        except Exception as exc:  # the link failed: this task owns the call, so it says so (nobody awaits it)
            self.say(f"[not compacted: {type(exc).__name__}: {exc}]", "red")
        else:  # compacted: the compaction's own line says so (its event)
            if not result.get("compacted"):
                self.say("[nothing to compact: nothing was said since the session began or was last compacted]",
                         "dim")
        finally:
            self.compacting = None
            self.redraw()

    async def stop_compacting(self) -> None:
        """On quitting: the chat's /compact task ends with it (the host finishes or drops the compaction)."""
        task = self.compacting
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def cycle_mode(self) -> None:
        if self.turn_id is not None:
            self.say("the mode can change only while idle", "red")
            return
        target = MODES[(MODES.index(self.session["mode"]) + 1) % len(MODES)]
        try:
            self.session = await self.link.call("session.setMode", {"sessionId": self.session["id"], "mode": target})
        except PideskError as exc:
            self.say(f"{exc.code}: {exc.message}", "red")
        self.redraw()


CONFIRM = "Enter confirms · or change ›"


def decision_line(decision: Decision) -> str:
    """The prompt of a decision; every variant fits a 60-column pane (issue 31 §3)."""
    if decision.feedback:
        return "feedback for the agent (Enter sends, may be empty) › "
    if decision.kind == "undo":
        if decision.choice == "y":
            return f"revert these files? {CONFIRM} y"
        if decision.choice == "n":
            return f"keep everything? {CONFIRM} n"
        return "revert? [y] yes [n] no, + Enter · Esc cancels › "
    if decision.kind == "plan":
        if decision.approving is not None:
            return context_question(decision)
        if decision.confirming_auto:
            return f"auto: all tools run unasked. Sure? [y]+Enter, else back › {decision.choice or ''}"
        if decision.choice == "r":
            return f"reject (feedback next)? {CONFIRM} r"
        if decision.choice is not None:
            return f"approve with {PLAN_CHOICES[decision.choice]}? {CONFIRM} {decision.choice}"
        return "approve? [a] ask [e] accept-edits [u] auto [r] reject › "
    if decision.choice is not None:
        return f"{PERMISSION_CHOICES[decision.choice]}? {CONFIRM} {decision.choice}"
    return "allow? [y] once [s] this session [n] deny · Esc later › "


def context_question(decision: Decision) -> str:
    """The context step of a confirmed approval: what the execution sees of the conversation."""
    kind = decision.item.get("kind", "plan")
    if decision.choice == "k":
        return f"keep the whole conversation? {CONFIRM} k"
    if decision.choice == "c":
        return f"compact the conversation? {CONFIRM} c"
    if decision.choice == "f":
        return f"start from the {kind} alone? {CONFIRM} f"
    return f"{decision.approving} · context? [k]eep (Enter) [c]ompact [f]resh › "


def resolved_line(approval: dict[str, Any]) -> str:
    """``[plan approved · accept-edits · context: fresh]``, ``[plan rejected]`` — the plan.resolved line."""
    parts = [f"{approval['kind']} {approval['status']}"]
    if approval["status"] == "approved":
        if approval.get("permissionMode"):
            parts.append(approval["permissionMode"])
        if approval.get("context"):  # (a host before issue 30 does not say)
            parts.append(f"context: {approval['context']}")
    elif approval.get("feedback"):  # the feedback the agent gets, echoed (issue 31 §3)
        parts.append(f"feedback: {approval['feedback']}")
    return "[" + " · ".join(parts) + "]"


def diff_style(line: str) -> str | None:
    """``git diff``'s colours: file headers bold, hunk headers cyan, additions green, deletions red."""
    if line.startswith(("diff ", "--- ", "+++ ", "index ", "new file", "deleted file")):
        return "bold"
    if line.startswith("@@"):
        return "cyan"
    if line.startswith("+"):
        return "green"
    if line.startswith("-"):
        return "red"
    return None


def context_lines(context: dict[str, Any]) -> list[str]:
    """``session.context`` as the chat prints it: the context line, then one line per thing left out."""
    return [context_line(context)] + [f"  ⚠ {warning}" for warning in context.get("warnings") or []]


def usage_line(usage: dict[str, Any]) -> str:
    """``12,345 in · 400 out · cache 10,000 read · 1,000 written`` (the cache parts only when there are any)."""
    parts = [f"{usage.get('inputTokens', 0):,} in", f"{usage.get('outputTokens', 0):,} out"]
    cache = [f"{usage[k]:,} {word}" for k, word in (("cacheReadTokens", "read"), ("cacheWriteTokens", "written"))
             if usage.get(k)]
    return " · ".join(parts) + (" · cache " + " · ".join(cache) if cache else "")


def context_line(context: dict[str, Any]) -> str:
    """``Context: ../AGENTS.md, AGENTS.md · skills: deploy`` — files in the order the request includes them."""
    files = [f["path"] for f in context.get("files") or []]
    names = [f"global {os.path.basename(p)}" if os.path.isabs(p) else p for p in files]
    line = "Context: " + (", ".join(names) if names else "no AGENTS.md")
    skills = [s["name"] for s in context.get("skills") or []]
    if skills:
        line += " · skills: " + ", ".join(skills)
    return line


def fit(head: str, typed: str, room: int) -> str:
    """One terminal line (a wrapped line could not be redrawn in place): the end of what is typed wins."""
    if len(head) + len(typed) <= room:
        return head + typed
    if len(head) > room - 10:
        head = head[:room - 11] + "… › "
    return head + typed[max(len(head) + len(typed) - room, 0):]


def event_session(event: dict[str, Any]) -> str | None:
    """The session an event is about: Session objects carry ``id``, everything else ``sessionId``."""
    if "sessionId" in event:
        return str(event["sessionId"])
    if event.get("type") == "session.updated":
        return str(event["session"]["id"])
    for key in ("approval", "request", "notification"):
        if isinstance(event.get(key), dict):
            return str(event[key].get("sessionId"))
    return None


def is_command(text: str) -> bool:
    return text.startswith("/") and " " not in text and "/" not in text[1:]


async def read_keys(chat: Chat, fd: int | None = None) -> None:
    """Feed keys from ``fd`` (stdin; raw mode when it is a terminal) to the chat until it is done.

    Each key is stamped with the chat's epoch at the moment it is read, so a decision
    prompt drawn later can tell it was typed before the prompt existed.
    """
    loop = asyncio.get_running_loop()
    fd = sys.stdin.fileno() if fd is None else fd

    def readable() -> None:
        data = os.read(fd, 1024)
        if not data:
            chat.keys.put_nowait((chat.epoch, CTRL_D))
            return
        for key in split_keys(data.decode("utf-8", errors="ignore")):
            chat.keys.put_nowait((chat.epoch, key))

    loop.add_reader(fd, readable)
    try:
        while not chat.done.is_set():
            getter = asyncio.ensure_future(chat.keys.get())
            finished = asyncio.ensure_future(chat.done.wait())
            done, _ = await asyncio.wait({getter, finished}, return_when=asyncio.FIRST_COMPLETED)
            finished.cancel()
            if getter in done:
                epoch, key = getter.result()
                await chat.on_key(key, epoch)
            else:
                getter.cancel()
    finally:
        loop.remove_reader(fd)


def split_keys(text: str) -> Iterator[str]:
    """Characters, with Shift+Tab (ESC [ Z) and other escape sequences kept whole."""
    i = 0
    while i < len(text):
        if text.startswith(SHIFT_TAB, i):
            yield SHIFT_TAB
            i += len(SHIFT_TAB)
        elif text[i] == ESC and i + 1 < len(text) and text[i + 1] == "[":
            end = i + 2
            while end < len(text) and not text[end].isalpha():
                end += 1
            i = end + 1  # other escape sequences (arrows …) are ignored
        else:
            yield text[i]
            i += 1


@contextlib.contextmanager
def raw_terminal() -> Iterator[int | None]:
    """cbreak mode without signals; yields the terminal's fd (None when stdin is not one)."""
    if not sys.stdin.isatty():
        yield None
        return
    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    tty.setcbreak(fd, termios.TCSANOW)  # not TCSAFLUSH: keys typed early must not be lost
    attrs = termios.tcgetattr(fd)
    attrs[3] &= ~termios.ISIG  # Ctrl+C arrives as a key, not a signal
    termios.tcsetattr(fd, termios.TCSANOW, attrs)
    try:
        yield fd
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


async def run_chat(link: Any, project: str | None, session_id: str | None, latest: bool = False) -> None:
    """``latest`` (``--continue``): resume the project's newest session, if it has one."""
    console = Console(highlight=False)
    async with link:
        if latest and session_id is None:
            newest = (await link.call("session.list", {"limit": 1} | ({"projectPath": project} if project else {})))
            session_id = newest["sessions"][0]["id"] if newest["sessions"] else None
        if session_id is not None:
            session = (await link.call("session.get", {"sessionId": session_id, "limit": 1}))["session"]
        else:
            session = await link.call("session.create", {"projectPath": project} if project else {})
        await link.call("session.focus", {"sessionId": session["id"]})
        chat = Chat(link, session, console)
        console.print(f"pidesk chat · session {session['id']} · {session['root']}", style="bold")
        if project is None and session_id is None:
            console.print("No PROJECT given: this session works in a scratch folder of its own (nothing of yours is "
                          "touched; Plan and Goal need a project). Give one: pidesk chat PATH", style="dim")
        for line in KEY_HINTS:  # (each within 60 columns: a narrow tmux pane wraps nothing)
            console.print(line, style="dim")
        await chat.show_sandbox()
        await chat.show_context()
        follower = asyncio.create_task(chat.follow())
        try:
            with raw_terminal() as fd:  # before the first prompt is drawn, so no key meets a cooked terminal
                chat.tty_fd = fd
                if session_id is not None:
                    await chat.show_history()  # (it draws the prompt line too: the terminal is the chat's by now)
                chat.redraw()
                if session_id is not None:
                    await chat.show_pending(quiet=True)
                await read_keys(chat)
        finally:
            follower.cancel()
            await chat.stop_compacting()
            console.print()
            if session_id is None:
                await _drop_if_unused(link, session["id"])


async def _drop_if_unused(link: Any, session_id: str) -> None:
    """A session this chat made and never sent a prompt to (issue 31 §3) is not left behind in the list."""
    with contextlib.suppress(PideskError):
        got = await link.call("session.get", {"sessionId": session_id, "limit": 1})
        if not got["messages"] and not got["queue"] and got["session"]["status"] == "idle":
            await link.call("session.delete", {"sessionId": session_id})
