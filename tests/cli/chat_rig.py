"""The real ``Chat`` over an ``EmbeddedLink`` to a real host, its stdin a real pseudo-terminal.

Tests that must put type-ahead exactly where it can be when a prompt is drawn (still in the
terminal, read into the chat's queue, or taken off it but handled after the prompt) drive the
chat in-process with this rig instead of through a subprocess: the model holds at a gate while
the keys are placed. ``Screen`` is the chat's terminal output with a bounded wait for text.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import pty
import termios
import tty
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from rich.console import Console

from pidesk.cli.chat import Chat, read_keys
from pidesk.cli.link import EmbeddedLink


class Screen(io.StringIO):
    """The chat's terminal output, with a bounded wait for text to appear after a mark."""

    def __init__(self) -> None:
        super().__init__()
        self.changed = asyncio.Event()
        self.mark = 0

    def write(self, text: str) -> int:
        self.changed.set()
        return super().write(text)

    async def expect(self, text: str, timeout: float = 10.0) -> None:
        async with asyncio.timeout(timeout):
            while text not in self.getvalue()[self.mark:]:
                self.changed.clear()
                await self.changed.wait()
        self.mark = self.getvalue().index(text, self.mark) + len(text)


@dataclass
class Rig:
    chat: Chat
    link: EmbeddedLink
    session: dict[str, Any]
    screen: Screen
    master: int  # write keys here: they reach the chat's terminal
    slave: int
    reader: asyncio.Task[None] | None = None
    provider: Any = None  # the test's ScriptedProvider, where a fixture hands it on

    def start_reading(self) -> None:
        """From now on the chat reads its terminal, as ``pidesk chat`` does."""
        self.reader = asyncio.create_task(read_keys(self.chat, self.slave))


@contextlib.asynccontextmanager
async def chat_rig(host: Any, session_params: dict[str, Any], *, keys_signal: bool = True) -> AsyncIterator[Rig]:
    """A chat on a new session of ``host`` (``session.create`` with ``session_params``), following its
    events; ``keys_signal=False`` turns ISIG off as the raw terminal does (Ctrl+C arrives as a key)."""
    master, slave = pty.openpty()
    tty.setcbreak(slave)
    if not keys_signal:
        attrs = termios.tcgetattr(slave)
        attrs[3] &= ~termios.ISIG
        termios.tcsetattr(slave, termios.TCSANOW, attrs)
    screen = Screen()
    link = EmbeddedLink(host)
    session = await link.call("session.create", session_params)
    chat = Chat(link, session, Console(file=screen, width=100))
    chat.tty_fd = slave
    follower = asyncio.create_task(chat.follow())
    rig = Rig(chat, link, session, screen, master, slave)
    try:
        yield rig
    finally:
        chat.done.set()
        if rig.reader is not None:
            await asyncio.wait_for(rig.reader, 5)
        follower.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await follower
        await link.__aexit__(None, None, None)
        os.close(master)
        os.close(slave)
