"""``pidesk chat``: a terminal client over the protocol.

Keys: Enter sends (while a turn runs the prompt is queued), Shift+Tab cycles
Agent → Plan → Goal while idle, Esc stops the running turn at its next boundary
(and does nothing while idle), Ctrl+C aborts it (and quits when nothing runs),
Ctrl+D on an empty line quits.
Commands: /agent /plan /goal (mode), /auto /ask /accept-edits (permission mode),
/pending (show a waiting plan or permission request again), /help, /quit.

Decisions. A submitted plan is shown as Markdown with its path and hash; a
permission request with its tool and arguments. Then a decision prompt:
a approve (ask), e approve (accept-edits), u approve (auto), r reject (with
optional feedback); y allow once, s allow for this session, n deny.

Invariants of a decision prompt (the keys decide what an agent may do):

- Type-ahead never answers it. Just before a prompt is drawn the terminal's
  input is flushed (``TCIFLUSH``) and every key already read from stdin is
  dropped: each key carries the *epoch* it was read in, and a prompt only takes
  keys of its own epoch or later. No timing window is involved.
- An answer is deliberate: the key selects (and says what it selected), Enter
  confirms; any other key clears the selection, so a stray Enter or a word
  typed into the prompt decides nothing. ``auto`` asks once more (y, Enter),
  because it lets every tool run unasked.
- Esc dismisses the prompt; the request stays pending in the host, the status
  line says so and ``/pending`` shows it again. Ctrl+C aborts the turn, as
  everywhere else.

Screen. The last line is the live status/prompt line (mode · permission mode ·
state › what you type); everything else is printed above it, never over it.
An assistant message is shown once, rendered as Markdown, when the host
appends it; while it streams, its newest words are previewed on the status
line, so nothing the agent writes is drawn and then erased.
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

from pidesk.core.errors import PideskError

MODES = ("agent", "plan", "goal")
SHIFT_TAB, ESC, CTRL_C, CTRL_D = "\x1b[Z", "\x1b", "\x03", "\x04"
ENTER = ("\r", "\n")
BACKSPACE = ("\x7f", "\b")
PLAN_CHOICES = {"a": "ask", "e": "accept-edits", "u": "auto", "r": "reject"}
PERMISSION_CHOICES = {"y": "allow once", "s": "allow for this session", "n": "deny"}
HELP = """\
Keys: Enter sends (queued while a turn runs) · Shift+Tab cycles agent → plan → goal while idle ·
      Esc stops the running turn at its next boundary · Ctrl+C aborts it, or quits when idle ·
      Ctrl+D on an empty line quits
Commands: /agent /plan /goal — mode · /ask /accept-edits /auto — permission mode ·
          /pending — show a waiting plan or permission request again · /help · /quit
Decisions: press the key, then Enter to confirm (auto asks once more) · Esc leaves it pending"""


@dataclass
class Decision:
    """A decision prompt on screen: what it decides, and what has been selected so far."""

    kind: Literal["plan", "permission"]
    item: dict[str, Any]
    epoch: int  # keys read before this epoch were typed before the prompt: never an answer
    choice: str | None = None
    confirming_auto: bool = False
    feedback: bool = False  # a confirmed reject, now reading optional feedback …
    text: str = ""  # … typed here (the prompt being written stays in Chat.buffer)


class Chat:
    def __init__(self, link: Any, session: dict[str, Any], console: Console) -> None:
        self.link = link
        self.session = session
        self.console = console
        self.buffer = ""
        self.turn_id: str | None = session.get("currentTurnId")
        self.done = asyncio.Event()
        self.keys: asyncio.Queue[tuple[int, str]] = asyncio.Queue()
        self.epoch = 0
        self.tty_fd: int | None = None
        self.streamed = ""
        self.plan: dict[str, Any] | None = None  # the pending plan (plans.get), shown or not
        self.permissions: dict[str, dict[str, Any]] = {}  # pending permission requests by id
        self.dismissed: set[str] = set()  # ids whose prompt Esc put away
        self.decision: Decision | None = None

    # ---- output --------------------------------------------------------------------

    def prompt_line(self) -> str:
        room = max(self.console.width - 1, 20)
        decision = self.decision
        if decision is not None:
            return fit(decision_line(decision), decision.text, room)
        state = "running" if self.turn_id else "idle"
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

    # ---- events ---------------------------------------------------------------------

    async def follow(self) -> None:
        async for event in self.link.events():
            if event_session(event) == self.session["id"]:
                await self.on_event(event)

    async def on_event(self, event: dict[str, Any]) -> None:
        kind = event["type"]
        if kind == "session.updated":
            self.session = event["session"]
            self.redraw()
        elif kind == "turn.started":
            self.turn_id = event["turnId"]
            self.redraw()
        elif kind == "message.delta":
            self.streamed += event["text"]
            self.redraw()
        elif kind == "message.appended" and event["message"]["role"] == "assistant":
            self.streamed = ""
            text = "".join(b["text"] for b in event["message"]["content"] if b.get("type") == "text").strip()
            if text:
                self.show_markdown(text)
            else:
                self.redraw()
        elif kind == "tool.started":
            self.say(f"▸ {event['name']} {json.dumps(event['args'])[:100]}", "dim")
        elif kind == "tool.finished":
            mark = "✓" if event["ok"] else f"✗ {event.get('errorCode') or 'failed'}"
            self.say(f"  {mark} {event['name']} ({event['durationMs']} ms)", "green" if event["ok"] else "red")
        elif kind == "turn.ended":
            self.turn_end(event)
        elif kind == "plan.requested":
            await self.show_plan(event["approval"]["id"])
        elif kind == "plan.resolved":
            approval = event["approval"]
            if self.plan is not None and self.plan["id"] == approval["id"]:
                self.plan = None
            self.hide(approval["id"])
            self.say(f"[{approval['kind']} {approval['status']}]", "bold")
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
        self.console.print(f"permission: {request['tool']} {json.dumps(request['args'])[:200]}", style="yellow",
                           markup=False, highlight=False)
        self.open_decision("permission", request)

    def open_decision(self, kind: Literal["plan", "permission"], item: dict[str, Any]) -> None:
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
        choices = PLAN_CHOICES if decision.kind == "plan" else PERMISSION_CHOICES
        if decision.confirming_auto:
            choices = {"y": "yes"}
        if key in ENTER:
            if decision.choice is not None:
                await self.confirm(decision)
        elif key.lower() in choices:
            decision.choice = key.lower()
        else:  # anything else clears the selection (and takes auto back to the question)
            decision.choice, decision.confirming_auto = None, False
        self.redraw()

    async def confirm(self, decision: Decision) -> None:
        choice = decision.choice
        if decision.kind == "permission":
            self.decision = None
            await self.resolve_permission(decision.item, choice or "n")
            self.next_decision()
        elif decision.confirming_auto:
            self.decision = None
            await self.resolve_plan(decision.item, "approve", permission_mode="auto")
        elif choice == "u":
            decision.choice, decision.confirming_auto = None, True
        elif choice == "r":
            decision.choice, decision.feedback = None, True
        else:
            self.decision = None
            await self.resolve_plan(decision.item, "approve", permission_mode=PLAN_CHOICES[choice or "a"])

    async def resolve_plan(self, approval: dict[str, Any], decision: str, *, permission_mode: str | None = None,
                           feedback: str | None = None) -> None:
        params = {"approvalId": approval["id"], "sessionId": approval["sessionId"], "turnId": approval["turnId"],
                  "decision": decision}
        if permission_mode:
            params["permissionMode"] = permission_mode
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
        self.redraw()

    # ---- input ----------------------------------------------------------------------

    async def on_key(self, key: str, epoch: int | None = None) -> None:
        """One key, read from stdin in ``epoch`` (the current one if not given)."""
        epoch = self.epoch if epoch is None else epoch
        decision = self.decision
        if decision is not None and key != CTRL_C:
            if epoch >= decision.epoch:  # older keys were typed before the prompt was shown
                await self.on_decision_key(decision, key)
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
            elif text == "/help":
                self.say(HELP, "dim")
            elif text == "/quit":
                self.done.set()
            elif is_command(text):
                self.say(f"unknown command {text} — /help lists the commands", "red")
            elif self.turn_id is not None:
                await self.link.call("agent.queue.push", {"sessionId": sid, "text": text})
            else:
                started = await self.link.call("agent.prompt", {"sessionId": sid, "text": text})
                self.turn_id = started["turnId"]
        except PideskError as exc:
            self.say(f"{exc.code}: {exc.message}", "red")
        self.redraw()

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


def decision_line(decision: Decision) -> str:
    """The prompt of a decision; every line fits 80 columns."""
    if decision.feedback:
        return "reject · feedback for the agent (Enter sends, may be empty) › "
    if decision.kind == "plan":
        if decision.confirming_auto:
            return f"auto lets every tool run unasked. Sure? [y] + Enter · other keys go back › {decision.choice or ''}"
        if decision.choice == "r":
            return "reject? Enter confirms (then optional feedback) · another key changes › r"
        if decision.choice is not None:
            mode = PLAN_CHOICES[decision.choice]
            return f"approve with {mode}? Enter confirms · another key changes › {decision.choice}"
        return "approve? [a] ask [e] accept-edits [u] auto [r] reject, + Enter · Esc later › "
    if decision.choice is not None:
        return f"{PERMISSION_CHOICES[decision.choice]}? Enter confirms · another key changes › {decision.choice}"
    return "allow? [y] once [s] for this session [n] deny, + Enter · Esc later › "


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


async def run_chat(link: Any, project: str | None, session_id: str | None) -> None:
    console = Console(highlight=False)
    async with link:
        if session_id is not None:
            session = (await link.call("session.get", {"sessionId": session_id, "limit": 1}))["session"]
        else:
            session = await link.call("session.create", {"projectPath": project} if project else {})
        await link.call("session.focus", {"sessionId": session["id"]})
        chat = Chat(link, session, console)
        console.print(f"pidesk chat · session {session['id']} · {session['root']}", style="bold")
        console.print("Enter sends · Shift+Tab mode · Esc stop · Ctrl+C abort/quit · /help /pending /quit",
                      style="dim")
        follower = asyncio.create_task(chat.follow())
        try:
            with raw_terminal() as fd:  # before the first prompt is drawn, so no key meets a cooked terminal
                chat.tty_fd = fd
                chat.redraw()
                if session_id is not None:
                    await chat.show_pending(quiet=True)
                await read_keys(chat)
        finally:
            follower.cancel()
            console.print()
