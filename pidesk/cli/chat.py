"""``pidesk chat``: a terminal client over the protocol.

Keys: Enter sends (while a turn runs the prompt is queued), Shift+Tab cycles
Agent → Plan → Goal while idle, Esc stops the turn at its next boundary,
Ctrl+C aborts it (and quits when nothing runs), Ctrl+D on an empty line quits.
Commands: /agent /plan /goal, /auto /ask /accept-edits, /quit.
A submitted plan is shown as Markdown with its path and hash, then one key
decides: a approve (ask), e approve (accept-edits), u approve (auto), r reject
(with optional feedback). A permission request: y allow once, s allow for this
session, n deny.
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
from typing import Any

from rich.console import Console
from rich.markdown import Markdown

from pidesk.core.errors import PideskError

MODES = ("agent", "plan", "goal")
SHIFT_TAB, ESC, CTRL_C, CTRL_D = "\x1b[Z", "\x1b", "\x03", "\x04"


class Chat:
    def __init__(self, link: Any, session: dict[str, Any], console: Console) -> None:
        self.link = link
        self.session = session
        self.console = console
        self.buffer = ""
        self.turn_id: str | None = None
        self.approval: dict[str, Any] | None = None
        self.permission: dict[str, Any] | None = None
        self.feedback_for: dict[str, Any] | None = None
        self.done = asyncio.Event()
        self.streaming = False

    # ---- output --------------------------------------------------------------------

    def prompt_line(self) -> str:
        if self.approval is not None:
            return "approve? [a] ask  [e] accept-edits  [u] auto  [r] reject › "
        if self.permission is not None:
            return "allow? [y] once  [s] for this session  [n] deny › "
        if self.feedback_for is not None:
            return f"feedback (Enter to skip) › {self.buffer}"
        state = "running" if self.turn_id else "idle"
        return f"{self.session['mode']} · {self.session['permissionMode']} · {state} › {self.buffer}"

    def redraw(self) -> None:
        self.console.file.write("\r\x1b[K" + self.prompt_line())
        self.console.file.flush()

    def say(self, text: str, style: str | None = None) -> None:
        self.console.file.write("\r\x1b[K")
        self.console.print(text, style=style, markup=False, highlight=False)
        self.redraw()

    # ---- events ---------------------------------------------------------------------

    async def follow(self) -> None:
        async for event in self.link.events():
            if event.get("sessionId", (event.get("session") or event.get("approval") or
                                       event.get("request") or {}).get("sessionId")) != self.session["id"]:
                continue
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
            if not self.streaming:
                self.console.file.write("\r\x1b[K")
                self.streaming = True
            self.console.file.write(event["text"])
            self.console.file.flush()
        elif kind == "message.appended" and self.streaming:
            self.streaming = False
            self.console.file.write("\n")
            self.redraw()
        elif kind == "tool.started":
            self.say(f"▸ {event['name']} {json.dumps(event['args'])[:100]}", "dim")
        elif kind == "tool.finished":
            mark = "✓" if event["ok"] else f"✗ {event.get('errorCode') or 'failed'}"
            self.say(f"  {mark} {event['name']} ({event['durationMs']} ms)", "green" if event["ok"] else "red")
        elif kind == "turn.ended":
            self.turn_id = None
            code = f": {event['errorCode']}" if event.get("errorCode") else ""
            self.say(f"[turn {event['reason']}{code}]", "bold")
        elif kind == "plan.requested":
            await self.show_plan(event["approval"])
        elif kind == "plan.resolved":
            self.approval = None
            self.say(f"[{event['approval']['kind']} {event['approval']['status']}]", "bold")
        elif kind == "permission.requested":
            self.permission = event["request"]
            self.say(f"permission: {event['request']['tool']} {json.dumps(event['request']['args'])[:200]}", "yellow")
        elif kind == "permission.resolved":
            self.permission = None
            self.redraw()
        elif kind == "queue.changed":
            if event["entries"]:
                self.say(f"[queued: {len(event['entries'])}]", "dim")

    async def show_plan(self, approval: dict[str, Any]) -> None:
        full = await self.link.call("plans.get", {"approvalId": approval["id"]})
        self.console.file.write("\r\x1b[K")
        self.console.rule(f"{full['kind']}: {full['title']}")
        self.console.print(Markdown(full["markdown"]))
        if full.get("criteria"):
            for criterion in full["criteria"]:
                self.console.print(f"  ☐ {criterion}")
        self.console.print(f"{full['artifactPath']} · sha256 {full['artifactSha256'][:12]} · {full['artifactSize']} bytes",
                           style="dim")
        self.console.print(full["question"], style="bold")
        self.approval = full
        self.redraw()

    # ---- input ----------------------------------------------------------------------

    async def on_key(self, key: str) -> None:
        if self.approval is not None:
            await self.decide_plan(key)
        elif self.permission is not None:
            await self.decide_permission(key)
        elif key == CTRL_C:
            if self.turn_id is None:
                self.done.set()
            else:
                await self.link.call("agent.abort", {"sessionId": self.session["id"], "smart": True})
        elif key == CTRL_D and not self.buffer:
            self.done.set()
        elif key == SHIFT_TAB and self.feedback_for is None:
            await self.cycle_mode()
        elif key == ESC:
            await self.link.call("agent.stop", {"sessionId": self.session["id"]})
            self.say("[stopping at the next boundary]", "dim")
        elif key in ("\r", "\n"):
            text, self.buffer = self.buffer, ""
            await self.submit(text)
        elif key in ("\x7f", "\b"):
            self.buffer = self.buffer[:-1]
            self.redraw()
        elif key.isprintable():
            self.buffer += key
            self.redraw()

    async def submit(self, text: str) -> None:
        if self.feedback_for is not None:
            approval, self.feedback_for = self.feedback_for, None
            await self.resolve(approval, "reject", feedback=text.strip() or None)
            return
        text = text.strip()
        if not text:
            self.redraw()
            return
        self.say(f"› {text}", "bold cyan")
        try:
            if text in ("/agent", "/plan", "/goal"):
                self.session = await self.link.call("session.setMode", {"sessionId": self.session["id"],
                                                                        "mode": text[1:]})
            elif text in ("/ask", "/auto", "/accept-edits"):
                self.session = await self.link.call("session.setPermissionMode",
                                                    {"sessionId": self.session["id"], "permissionMode": text[1:]})
            elif text == "/quit":
                self.done.set()
            elif self.turn_id is not None:
                await self.link.call("agent.queue.push", {"sessionId": self.session["id"], "text": text})
            else:
                started = await self.link.call("agent.prompt", {"sessionId": self.session["id"], "text": text})
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

    async def decide_plan(self, key: str) -> None:
        assert self.approval is not None
        choice = {"a": "ask", "e": "accept-edits", "u": "auto"}.get(key.lower())
        if choice is not None:
            await self.resolve(self.approval, "approve", permission_mode=choice)
        elif key.lower() == "r":
            self.feedback_for, self.approval = self.approval, None
            self.redraw()

    async def resolve(self, approval: dict[str, Any], decision: str, **extra: Any) -> None:
        params = {"approvalId": approval["id"], "sessionId": approval["sessionId"], "turnId": approval["turnId"],
                  "decision": decision}
        if extra.get("permission_mode"):
            params["permissionMode"] = extra["permission_mode"]
        if extra.get("feedback"):
            params["feedback"] = extra["feedback"]
        self.approval = None
        try:
            await self.link.call("plans.resolve", params)
        except PideskError as exc:
            self.say(f"{exc.code}: {exc.message}", "red")

    async def decide_permission(self, key: str) -> None:
        assert self.permission is not None
        decision = {"y": ("allow", None), "s": ("allow", "session"), "n": ("deny", None)}.get(key.lower())
        if decision is None:
            return
        request, self.permission = self.permission, None
        params = {"requestId": request["id"], "sessionId": request["sessionId"], "turnId": request["turnId"],
                  "decision": decision[0]}
        if decision[1]:
            params["remember"] = decision[1]
        try:
            await self.link.call("permissions.resolve", params)
        except PideskError as exc:
            self.say(f"{exc.code}: {exc.message}", "red")


async def read_keys(chat: Chat) -> None:
    """Feed keys from stdin (raw mode when it is a terminal) to the chat until it is done."""
    loop = asyncio.get_running_loop()
    keys: asyncio.Queue[str] = asyncio.Queue()
    fd = sys.stdin.fileno()
    pending = b""

    def readable() -> None:
        nonlocal pending
        data = os.read(fd, 1024)
        if not data:
            keys.put_nowait(CTRL_D)
            return
        pending += data
        text = pending.decode("utf-8", errors="ignore")
        pending = b""
        for key in split_keys(text):
            keys.put_nowait(key)

    loop.add_reader(fd, readable)
    try:
        while not chat.done.is_set():
            getter = asyncio.ensure_future(keys.get())
            finished = asyncio.ensure_future(chat.done.wait())
            done, _ = await asyncio.wait({getter, finished}, return_when=asyncio.FIRST_COMPLETED)
            finished.cancel()
            if getter in done:
                await chat.on_key(getter.result())
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
def raw_terminal() -> Iterator[None]:
    if not sys.stdin.isatty():
        yield
        return
    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    tty.setcbreak(fd, termios.TCSANOW)  # not TCSAFLUSH: keys typed early must not be lost
    attrs = termios.tcgetattr(fd)
    attrs[3] &= ~termios.ISIG  # Ctrl+C arrives as a key, not a signal
    termios.tcsetattr(fd, termios.TCSANOW, attrs)
    try:
        yield
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
        console.print("Enter sends · Shift+Tab mode · Esc stop · Ctrl+C abort/quit · /plan /goal /agent",
                      style="dim")
        follower = asyncio.create_task(chat.follow())
        try:
            with raw_terminal():  # before the first prompt is drawn, so no key meets a cooked terminal
                chat.redraw()
                await read_keys(chat)
        finally:
            follower.cancel()
            console.print()
