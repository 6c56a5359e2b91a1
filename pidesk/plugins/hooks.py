"""Host event plugins: Python packages that watch what the host does.

A plugin registers an entry point in the ``pidesk.plugins`` group::

    # the plugin's pyproject.toml
    [project.entry-points."pidesk.plugins"]
    notify = "pidesk_notify:plugin"

The entry point names an object — an instance, a module, or a class (which is
instantiated with no arguments) — with any of:

    name: str                                      # shown by plugins.list; default: the entry point's name
    async def on_event(event: dict) -> None        # every host event, as a wire payload

``event`` is the ``event`` notification's params from PROTOCOL.md: a dict with
``"type"`` (``"turn.started"``, ``"tool.finished"``, …), the event's camelCase
fields and ``"seq"``. One more type is made for plugins: once per started turn,
whatever its end (completed, aborted, errored, approval expired, recovered after
a crash), ::

    {"type": "session:turnEnded", "sessionId": "…", "turnId": "…",
     "reason": "completed" | "aborted" | "error" | …, "errorCode": "…" | None}

The host builds it from the turn's ``turn.ended`` event with ``turn_ended_payload``
and delivers it right after that event.

Guarantees and limits, for plugin authors and for the host:

- Each plugin gets events one at a time, in the order the host delivered them,
  on its own worker task; each gets its own deep copy of the payload.
- A plugin that raises, or runs longer than ``timeout`` (5 s) on one event, is
  logged and that event is dropped for it; it keeps receiving later events.
  Nothing a plugin does reaches the host or another plugin — except blocking
  the event loop, so ``on_event`` must await, never block.
- A plugin that falls ``queue_limit`` events behind loses the newest ones (counted).
- A plugin that cannot be loaded (import error, or an ``on_event`` that is not an
  ``async def``) is listed disabled, with its error.
- ``deliver`` never blocks and never raises; ``close`` gives pending events one
  ``timeout`` to finish, then cancels the workers.
"""

from __future__ import annotations

import asyncio
import copy
import importlib.metadata
import inspect
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

log = logging.getLogger("pidesk.plugins.hooks")

ENTRY_POINT_GROUP: Final = "pidesk.plugins"
TURN_ENDED: Final = "session:turnEnded"
DEFAULT_TIMEOUT: Final = 5.0
DEFAULT_QUEUE_LIMIT: Final = 10_000
_LOGGED_FAILURES: Final = 5  # per plugin; later failures are counted, not logged

Handler = Callable[[dict[str, Any]], Awaitable[None]]


class EventPlugin(Protocol):
    """The documented shape of a plugin; both members are optional at run time."""

    name: str

    async def on_event(self, event: dict[str, Any]) -> None: ...


class EntryPointLike(Protocol):
    name: str

    def load(self) -> Any: ...


def turn_ended_payload(turn_ended: Mapping[str, Any]) -> dict[str, Any]:
    """The ``session:turnEnded`` payload for one ``turn.ended`` event payload."""
    if turn_ended.get("type") != "turn.ended":
        raise ValueError(f"turn_ended_payload needs a turn.ended event payload, got type {turn_ended.get('type')!r}")
    return {
        "type": TURN_ENDED,
        "sessionId": turn_ended["sessionId"],
        "turnId": turn_ended["turnId"],
        "reason": turn_ended["reason"],
        "errorCode": turn_ended.get("errorCode"),
    }


@dataclass(eq=False)
class _Hook:
    name: str
    handler: Handler | None
    error: str | None = None  # why it is disabled
    failures: int = 0
    dropped: int = 0
    queue: asyncio.Queue[dict[str, Any]] = field(default_factory=asyncio.Queue)
    worker: asyncio.Task[None] | None = None

    @property
    def enabled(self) -> bool:
        return self.error is None


class EventHooks:
    """Delivers host events to the loaded plugins, each isolated on its own worker task."""

    def __init__(
        self,
        plugins: list[object] | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        queue_limit: int = DEFAULT_QUEUE_LIMIT,
    ) -> None:
        self.timeout = timeout
        self.queue_limit = queue_limit
        self._hooks: list[_Hook] = [_hook(plugin, None) for plugin in plugins or []]
        self._closed = False

    @classmethod
    def from_entry_points(
        cls,
        *,
        entry_points: Callable[..., Iterable[EntryPointLike]] = importlib.metadata.entry_points,
        timeout: float = DEFAULT_TIMEOUT,
        queue_limit: int = DEFAULT_QUEUE_LIMIT,
    ) -> EventHooks:
        """Load every ``pidesk.plugins`` entry point; one that fails to load is kept, disabled, with its error."""
        hooks = cls(timeout=timeout, queue_limit=queue_limit)
        for ep in entry_points(group=ENTRY_POINT_GROUP):
            try:
                loaded = ep.load()
                if inspect.isclass(loaded):
                    loaded = loaded()
            except Exception as exc:
                log.exception("event plugin %r could not be loaded", ep.name)
                hooks._hooks.append(_Hook(ep.name, None, error=f"failed to load: {type(exc).__name__}: {exc}"))
                continue
            hooks._hooks.append(_hook(loaded, ep.name))
        return hooks

    def deliver(self, event: Mapping[str, Any]) -> None:
        """Queue ``event`` (a wire payload with ``"type"``) for every plugin; never blocks or raises."""
        if self._closed:
            return
        for hook in self._hooks:
            if hook.handler is None or not hook.enabled:
                continue
            if hook.queue.qsize() >= self.queue_limit:
                hook.dropped += 1
                if hook.dropped == 1:
                    log.warning("event plugin %r is %d events behind; dropping new events for it",
                                hook.name, self.queue_limit)
                continue
            hook.queue.put_nowait(copy.deepcopy(dict(event)))
            if hook.worker is None:
                hook.worker = asyncio.create_task(self._work(hook, hook.handler), name=f"event plugin {hook.name}")

    async def drain(self) -> None:
        """Wait until every event delivered so far has been handled (or has failed) by every plugin."""
        await asyncio.gather(*(hook.queue.join() for hook in self._hooks if hook.worker is not None))

    def listing(self) -> list[dict[str, Any]]:
        """``plugins.list`` entries: name, enabled, and ``error`` / ``failures`` / ``dropped`` when there are any."""
        entries = []
        for hook in self._hooks:
            entry: dict[str, Any] = {"name": hook.name, "enabled": hook.enabled}
            if hook.error is not None:
                entry["error"] = hook.error
            if hook.failures:
                entry["failures"] = hook.failures
            if hook.dropped:
                entry["dropped"] = hook.dropped
            entries.append(entry)
        return entries

    async def close(self) -> None:
        """Stop taking events; give the queued ones one ``timeout``, then cancel the workers."""
        self._closed = True
        workers = {hook: hook.worker for hook in self._hooks if hook.worker is not None}
        if not workers:
            return
        drained = asyncio.gather(*(hook.queue.join() for hook in workers))
        done, _ = await asyncio.wait({drained}, timeout=self.timeout)
        if not done:
            drained.cancel()
        for worker in workers.values():
            worker.cancel()
        _, stuck = await asyncio.wait(set(workers.values()), timeout=self.timeout)
        for hook, worker in workers.items():
            hook.worker = None
            if worker in stuck:  # it swallowed the cancellation; nothing more can be done from here
                log.error("event plugin %r did not stop when cancelled; abandoning it", hook.name)

    async def _work(self, hook: _Hook, handler: Handler) -> None:
        while True:
            event = await hook.queue.get()
            deadline = asyncio.timeout(self.timeout)
            try:
                async with deadline:
                    await handler(event)
            except asyncio.CancelledError:
                if _being_cancelled():
                    raise  # close() is stopping this worker
                self._failed(hook, event, "raised CancelledError", None)  # the plugin's own, not ours
            except Exception as exc:
                if deadline.expired():
                    self._failed(hook, event, f"took longer than {self.timeout:g} s", None)
                else:
                    self._failed(hook, event, "raised", exc)
            finally:
                hook.queue.task_done()

    def _failed(self, hook: _Hook, event: Mapping[str, Any], what: str, exc: Exception | None) -> None:
        hook.failures += 1
        if hook.failures <= _LOGGED_FAILURES:
            log.warning("event plugin %r %s on a %s event", hook.name, what, event.get("type"), exc_info=exc)
            if hook.failures == _LOGGED_FAILURES:
                log.warning("event plugin %r: further failures are counted in plugins.list, not logged", hook.name)


def _hook(plugin: object, default_name: str | None) -> _Hook:
    given = getattr(plugin, "name", None)
    name = given if isinstance(given, str) and given else default_name or _type_name(plugin)
    handler = getattr(plugin, "on_event", None)
    if handler is None:
        return _Hook(name, None)
    if not inspect.iscoroutinefunction(handler):
        return _Hook(name, None, error="on_event must be an async function: async def on_event(event) -> None")
    return _Hook(name, handler)


def _being_cancelled() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def _type_name(plugin: object) -> str:
    if inspect.ismodule(plugin):
        return plugin.__name__
    return type(plugin).__name__
