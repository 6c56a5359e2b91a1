"""The step gate: at most a few turns do CPU work on the event loop at once.

One event loop serves the protocol and runs every turn. asyncio runs ready
callbacks first in, first out, so with 200 runnable turns an RPC waits behind a
step of each of them at every hop (socket read, dispatch, send): hundreds of
milliseconds. The gate bounds that queue. A turn holds a *slot* while it works —
building a model request, parsing the answer, persisting, authorizing and
running tools — and RPCs never take one, so an RPC waits behind at most
``slots`` steps. Starting a turn is turn work too (``host/turns.py``): a prompt
takes a slot until it is durable, so a burst of prompts is let in a few at a
time rather than in one long iteration of the loop.

A turn also waits on things outside the process: the network, a subprocess, an
fsync, a user's answer, a delegate. It awaits them through ``Slot.wait_for``,
directly (no task, no timer), with its slot marked *away*. An away slot stays
its holder's for ``patience`` seconds, so what finishes quickly (an instant
local model, an ``echo``, an fsync) comes back to a held slot and the work that
follows — the SDK parsing the answer, say — stays inside the gate. After that,
a queued turn takes the slot over, and the away turn queues for a slot again
once its wait is over. A thinking model or a pending question therefore never
keeps other turns out, and one busy session pays nothing for the gate.

Queued turns get slots in arrival order, so turns are served fairly.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable
from types import TracebackType
from typing import TypeVar

T = TypeVar("T")

DEFAULT_SLOTS = 2  # measured best for RPC latency under 200 busy sessions: docs/benchmarks-server.md
DEFAULT_PATIENCE = 0.002  # seconds an away slot stays its holder's while others queue


class StepGate:
    def __init__(self, slots: int = DEFAULT_SLOTS, patience: float = DEFAULT_PATIENCE) -> None:
        if slots < 1:
            raise ValueError("a step gate needs at least one slot")
        self.slots = slots
        self.patience = patience
        self._free = slots
        self._queue: deque[asyncio.Future[None]] = deque()  # turns waiting for a slot, first come first served
        self._away: dict[Slot, float] = {}  # holders awaiting something, oldest first -> loop time they left
        self._timer: asyncio.TimerHandle | None = None  # when the oldest away slot may be taken over

    def slot(self) -> Slot:
        """A turn's handle on the gate: ``async with gate.slot() as slot: ...``."""
        return Slot(self)

    @property
    def queued(self) -> int:
        """Turns waiting for a slot."""
        return len(self._queue)

    async def take(self, taker: Slot) -> None:
        if self._free:
            self._free -= 1
        elif not self._take_over_expired():
            granted = asyncio.get_running_loop().create_future()
            self._queue.append(granted)
            self._arm()
            try:
                await granted
            except asyncio.CancelledError:
                if granted.done() and not granted.cancelled():  # granted as it was cancelled: pass it on
                    self.give()
                elif granted in self._queue:  # (a give may already have passed over it, as cancelled)
                    self._queue.remove(granted)
                raise
        taker.held = True

    def give(self) -> None:
        if not self._grant_first():
            self._free += 1

    def leave(self, slot: Slot) -> None:
        self._away[slot] = asyncio.get_running_loop().time()
        self._arm()

    def come_back(self, slot: Slot) -> None:
        self._away.pop(slot, None)

    def _grant_first(self) -> bool:
        while self._queue:
            granted = self._queue.popleft()
            if not granted.done():
                granted.set_result(None)  # the slot passes straight to the first in the queue
                return True
        return False

    def _take_over_expired(self) -> bool:
        """Take the oldest away slot if its holder has been away longer than ``patience``."""
        for slot, left in self._away.items():
            if asyncio.get_running_loop().time() - left < self.patience:
                return False
            del self._away[slot]
            slot.held = False  # the slot is the taker's now; its holder takes one again when its wait ends
            return True
        return False

    def _arm(self) -> None:
        """While turns queue and slots are away, wake up when the oldest away slot may be taken over."""
        if self._timer is not None or not self._queue or not self._away:
            return
        loop = asyncio.get_running_loop()
        self._timer = loop.call_at(next(iter(self._away.values())) + self.patience, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        while self._queue and self._take_over_expired():
            if not self._grant_first():
                self._free += 1
        self._arm()


class Slot:
    def __init__(self, gate: StepGate) -> None:
        self._gate = gate
        self.held = False

    async def __aenter__(self) -> Slot:
        await self._gate.take(self)
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None,
    ) -> None:
        if self.held:
            self.held = False
            self._gate.give()

    async def wait_for(self, awaitable: Awaitable[T]) -> T:
        """Await something outside the turn's own CPU work, with the slot away meanwhile."""
        if self.held:
            self._gate.leave(self)
        try:
            result = await awaitable
        finally:
            self._gate.come_back(self)
        if not self.held:  # taken over while away
            await self._gate.take(self)
        return result
