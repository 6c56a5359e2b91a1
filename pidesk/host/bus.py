"""Event fan-out: every event gets the next host-wide ``seq`` and reaches every subscriber.

Publishing never blocks and never fails. Each subscriber has its own queue. An
in-process subscriber's queue is unbounded; a client connection's is bounded
(``Subscription.bound``): a subscriber that falls more than ``max_events`` events,
or ``max_bytes`` bytes of events (their encoded size), behind is dropped — its
queue is emptied, it leaves the bus, ``on_drop`` is called and its next read
raises ``FellBehind``. So a client that stops reading costs the host a bounded
amount of memory, and the host never waits for it. Events are published only
after what they announce is durable. A client connection's events are behind
until the client confirms reading them: those it was sent and has not confirmed
(its ``downstream``, e.g. a WebSocket's window) count toward the bound with those
waiting in the queue.

An event's weight is estimated from its strings when it is published (cheap: no
encoding in the publisher's step), and its JSON is encoded once, lazily, by the
first client connection that sends it (``next_encoded``), then shared: a large
event (a 10 MB Write's arguments) costs the event loop one encoding, in a step of
its own, not one per client inside the turn that published it.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Protocol

import msgspec

from pidesk.core.events import AnyEvent, TurnRetrying
from pidesk.core.sizes import json_size
from pidesk.providers.base import Retrying

log = logging.getLogger("pidesk.bus")
_encoder = msgspec.json.Encoder()
LARGE_EVENT = 1 << 20  # bytes: an event this large is encoded in an event-loop step of its own


class _Encoded:
    """One published event and, once a client asked for it, its JSON (shared by every subscriber)."""

    __slots__ = ("event", "_json")

    def __init__(self, event: AnyEvent) -> None:
        self.event = event
        self._json: bytes | None = None

    def encoded(self) -> bytes:
        if self._json is None:
            self._json = _encoder.encode(self.event)
        return self._json


class Downstream(Protocol):
    """Events taken from a subscription and not yet confirmed read by its client (and their bytes)."""

    @property
    def events(self) -> int: ...

    @property
    def nbytes(self) -> int: ...


class FellBehind(Exception):
    """The subscriber fell too far behind and was dropped: re-read the state to catch up."""


class Subscription:
    def __init__(self, bus: EventBus) -> None:
        self._bus = bus
        self._items: deque[tuple[int, _Encoded, int]] = deque()  # (seq, the event and its JSON, its weight)
        self._bytes = 0
        self._last_weight = 0  # of the event taken last
        self._ready = asyncio.Event()
        self.max_events: int | None = None
        self.max_bytes: int | None = None
        self.dropped = False
        self.on_drop: Callable[[], None] | None = None  # called (once) when the bus drops this subscriber
        self.downstream: Downstream | None = None  # behind too: taken, not yet confirmed read

    def bound(self, max_events: int, max_bytes: int) -> Subscription:
        """Drop this subscriber once more than ``max_events`` events or ``max_bytes`` bytes are behind:
        waiting in it, or taken and not confirmed read (``downstream``)."""
        self.max_events, self.max_bytes = max_events, max_bytes
        self._bus._weighed.add(self)
        return self

    def _put(self, seq: int, event: _Encoded, weight: int) -> bool:
        """Queue one event; False when that would put this subscriber past its bound."""
        events, size = len(self._items), self._bytes
        if self.downstream is not None:
            events += self.downstream.events
            size += self.downstream.nbytes
        if events and ((self.max_events is not None and events >= self.max_events)
                       or (self.max_bytes is not None and size + weight > self.max_bytes)):
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

    def _take(self) -> tuple[int, _Encoded]:
        seq, event, weight = self._items.popleft()
        self._bytes -= weight
        self._last_weight = weight
        return seq, event

    async def _next(self) -> tuple[int, _Encoded]:
        while not self._items:
            if self.dropped:
                raise FellBehind("this subscriber fell too far behind the host's events; re-read the state")
            self._ready.clear()
            await self._ready.wait()
        return self._take()

    async def next(self) -> tuple[int, AnyEvent]:
        seq, event = await self._next()
        return seq, event.event

    async def next_encoded(self) -> tuple[int, bytes]:
        """The next event as its JSON (``{"type": …, …}``, without ``seq``), encoded once for every client."""
        seq, event = await self._next()
        if self._last_weight > LARGE_EVENT:
            await asyncio.sleep(0)  # encode it in a step of its own, once what is waiting (a probe) has run
        return seq, event.encoded()

    def pending(self) -> list[tuple[int, AnyEvent]]:
        """Every event delivered and not yet read, without waiting."""
        items = []
        while self._items:
            seq, event = self._take()
            items.append((seq, event.event))
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
        shared = _Encoded(event)
        weight = json_size(event) if self._weighed else 0
        behind = [sub for sub in self._subscribers if not sub._put(self.seq, shared, weight)]
        for sub in behind:
            sub._drop()
        for listener in self.listeners:
            listener(self.seq, event)
        return self.seq


def retrying_event(session_id: str, turn_id: str, retry: Retrying) -> TurnRetrying:
    """``turn.retrying``: a turn's model request is sent again after a wait (the provider's ``Retrying``)."""
    return TurnRetrying(session_id=session_id, turn_id=turn_id, attempt=retry.attempt, of=retry.of,
                        wait_s=retry.wait_s, reason=retry.reason)
