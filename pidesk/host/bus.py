"""Event fan-out: every event gets the next host-wide ``seq`` and reaches every subscriber.

Publishing never blocks and never fails. Each subscriber has its own queue. An
in-process subscriber's queue is unbounded; a client connection's is bounded
(``Subscription.bound``): a subscriber that falls more than ``max_events`` events,
or ``max_bytes`` bytes of events (their encoded size), behind is dropped — its
queue is emptied, it leaves the bus, ``on_drop`` is called and its next read
raises ``FellBehind``. So a client that stops reading costs the host a bounded
amount of memory, and the host never waits for it. Events are published only
after what they announce is durable.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable

import msgspec

from pidesk.core.events import AnyEvent

log = logging.getLogger("pidesk.bus")
_encoder = msgspec.json.Encoder()


class FellBehind(Exception):
    """The subscriber fell too far behind and was dropped: re-read the state to catch up."""


class Subscription:
    def __init__(self, bus: EventBus) -> None:
        self._bus = bus
        self._items: deque[tuple[int, AnyEvent, int]] = deque()  # (seq, event, its weight in bytes)
        self._bytes = 0
        self._ready = asyncio.Event()
        self.max_events: int | None = None
        self.max_bytes: int | None = None
        self.dropped = False
        self.on_drop: Callable[[], None] | None = None  # called (once) when the bus drops this subscriber

    def bound(self, max_events: int, max_bytes: int) -> Subscription:
        """Drop this subscriber once more than ``max_events`` events or ``max_bytes`` bytes wait in it."""
        self.max_events, self.max_bytes = max_events, max_bytes
        self._bus._weighed.add(self)
        return self

    def _put(self, seq: int, event: AnyEvent, weight: int) -> bool:
        """Queue one event; False when that would put this subscriber past its bound."""
        if self._items and ((self.max_events is not None and len(self._items) >= self.max_events)
                            or (self.max_bytes is not None and self._bytes + weight > self.max_bytes)):
            return False
        self._items.append((seq, event, weight))
        self._bytes += weight
        self._ready.set()
        return True

    def _drop(self) -> None:
        self.dropped = True
        self._items.clear()
        self._bytes = 0
        self._ready.set()
        self.close()
        if self.on_drop is not None:
            try:
                self.on_drop()
            except Exception:  # publishing never fails because of one subscriber
                log.exception("a dropped subscriber's callback failed")

    def _take(self) -> tuple[int, AnyEvent]:
        seq, event, weight = self._items.popleft()
        self._bytes -= weight
        return seq, event

    async def next(self) -> tuple[int, AnyEvent]:
        while not self._items:
            if self.dropped:
                raise FellBehind("this subscriber fell too far behind the host's events; re-read the state")
            self._ready.clear()
            await self._ready.wait()
        return self._take()

    def pending(self) -> list[tuple[int, AnyEvent]]:
        """Every event delivered and not yet read, without waiting."""
        items = []
        while self._items:
            items.append(self._take())
        return items

    async def wait_for(self, predicate: Callable[[AnyEvent], bool], timeout: float = 10.0) -> AnyEvent:
        """The next event matching ``predicate`` (events before it are consumed)."""
        async with asyncio.timeout(timeout):
            while True:
                _seq, event = await self.next()
                if predicate(event):
                    return event

    def __aiter__(self) -> AsyncIterator[tuple[int, AnyEvent]]:
        return self

    async def __anext__(self) -> tuple[int, AnyEvent]:
        return await self.next()

    def close(self) -> None:
        self._bus._subscribers.discard(self)
        self._bus._weighed.discard(self)


class EventBus:
    def __init__(self) -> None:
        self.seq = 0
        self._subscribers: set[Subscription] = set()
        self._weighed: set[Subscription] = set()  # bounded subscribers: events are weighed only for them
        self.listeners: list[Callable[[int, AnyEvent], None]] = []  # in-process observers (event hooks)

    def subscribe(self) -> Subscription:
        sub = Subscription(self)
        self._subscribers.add(sub)
        return sub

    def publish(self, event: AnyEvent) -> int:
        self.seq += 1
        weight = len(_encoder.encode(event)) if self._weighed else 0
        behind = [sub for sub in self._subscribers if not sub._put(self.seq, event, weight)]
        for sub in behind:
            sub._drop()
        for listener in self.listeners:
            listener(self.seq, event)
        return self.seq
