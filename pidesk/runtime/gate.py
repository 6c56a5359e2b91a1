"""The step gate: at most a few turns do CPU work on the event loop at once.

One event loop serves the protocol and runs every turn. asyncio runs ready
callbacks first in, first out, so with 200 runnable turns an RPC waits behind a
step of each of them at every hop (socket read, dispatch, send): hundreds of
milliseconds. The gate bounds that queue. A turn holds a *slot* while it works —
building a model request, parsing the answer, persisting, authorizing and
running tools — and gives the slot up while it waits on something outside the
process: the network, a subprocess, a user's answer, a delegate. RPCs never take
a slot, so one waits behind at most ``slots`` steps.

Waiting is detected, not declared: ``Slot.wait_for`` keeps the slot for up to
``patience`` seconds while the awaited thing finishes (an instant local model, a
quick ``echo``, an fsync), and lets it go if it takes longer. The SDK's request
building and response parsing thus stay inside the gate when the network is
fast, and a slow model never holds a slot while it thinks. Waiters get slots in
arrival order (``asyncio.Semaphore`` is FIFO), so turns are served fairly.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from types import TracebackType
from typing import TypeVar

T = TypeVar("T")

DEFAULT_SLOTS = 2  # measured best for RPC latency under 200 busy sessions: docs/benchmarks-server.md
DEFAULT_PATIENCE = 0.002  # seconds a slot is kept while waiting on something that may be instant


class StepGate:
    def __init__(self, slots: int = DEFAULT_SLOTS, patience: float = DEFAULT_PATIENCE) -> None:
        if slots < 1:
            raise ValueError("a step gate needs at least one slot")
        self.slots = slots
        self.patience = patience
        self._semaphore = asyncio.Semaphore(slots)

    def slot(self) -> Slot:
        """A turn's handle on the gate: ``async with gate.slot() as slot: ...``."""
        return Slot(self._semaphore, self.patience)


class Slot:
    def __init__(self, semaphore: asyncio.Semaphore, patience: float) -> None:
        self._semaphore = semaphore
        self._patience = patience
        self._held = False

    async def __aenter__(self) -> Slot:
        await self._acquire()
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None,
    ) -> None:
        self._release()

    async def wait_for(self, awaitable: Awaitable[T], patience: float | None = None) -> T:
        """Await something outside the turn's own CPU work, giving the slot up if it takes long.

        Cancelling the caller cancels the awaited work and waits for it to unwind
        (a cancelled tool kills its process group before the turn goes on).
        """
        task = asyncio.ensure_future(awaitable)
        try:
            await asyncio.wait({task}, timeout=self._patience if patience is None else patience)
            if not task.done():
                self._release()
                await asyncio.wait({task})
                await self._acquire()
        except asyncio.CancelledError:
            task.cancel()
            await asyncio.wait({task})
            raise
        return task.result()

    async def _acquire(self) -> None:
        await self._semaphore.acquire()
        self._held = True

    def _release(self) -> None:
        if self._held:
            self._held = False
            self._semaphore.release()
