"""Event fan-out: every event gets the next host-wide ``seq`` and reaches every subscriber.

Publishing never blocks and never fails: each subscriber has its own unbounded
queue, so a slow client cannot hold up the host. Events are published only
after what they announce is durable.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

from pidesk.core.events import AnyEvent


class Subscription:
    def __init__(self, bus: EventBus) -> None:
        self._bus = bus
        self._queue: asyncio.Queue[tuple[int, AnyEvent]] = asyncio.Queue()

    def _put(self, seq: int, event: AnyEvent) -> None:
        self._queue.put_nowait((seq, event))

    async def next(self) -> tuple[int, AnyEvent]:
        return await self._queue.get()

    def pending(self) -> list[tuple[int, AnyEvent]]:
        """Every event delivered and not yet read, without waiting."""
        items = []
        while not self._queue.empty():
            items.append(self._queue.get_nowait())
        return items

    async def wait_for(self, predicate: Callable[[AnyEvent], bool], timeout: float = 10.0) -> AnyEvent:
        """The next event matching ``predicate`` (events before it are consumed)."""
        async with asyncio.timeout(timeout):
            while True:
                _seq, event = await self._queue.get()
                if predicate(event):
                    return event

    def __aiter__(self) -> AsyncIterator[tuple[int, AnyEvent]]:
        return self

    async def __anext__(self) -> tuple[int, AnyEvent]:
        return await self.next()

    def close(self) -> None:
        self._bus._subscribers.discard(self)


class EventBus:
    def __init__(self) -> None:
        self.seq = 0
        self._subscribers: set[Subscription] = set()
        self.listeners: list[Callable[[int, AnyEvent], None]] = []  # in-process observers (event hooks)

    def subscribe(self) -> Subscription:
        sub = Subscription(self)
        self._subscribers.add(sub)
        return sub

    def publish(self, event: AnyEvent) -> int:
        self.seq += 1
        for sub in self._subscribers:
            sub._put(self.seq, event)
        for listener in self.listeners:
            listener(self.seq, event)
        return self.seq
