"""Notifications: what finished while nobody watched — listed in pages, marked seen, pruned when old.

A turn that ends ``completed`` or ``failed`` while its session is not visible gets a notification
(``turns.py``). They grow with every such turn and nothing else removes them, so:

- ``notifications.list {unseenOnly?, limit?, cursor?}`` pages as ``paging`` says (newest first,
  ``nextCursor``); without ``limit`` and ``cursor``, every one oldest first, as before paging;
  ``unseenOnly`` lists the unseen ones only, either way.
- Retention: a notification older than ``HostConfig.notification_retention_days`` (30 by
  default) is deleted, seen or not — when a serving host starts and every ``PRUNE_EVERY``
  seconds after, ``PRUNE_BATCH`` rows a transaction with the event loop given a turn between,
  so a backlog of a million costs many short steps, never one long one. Deleting is not
  announced: a client that shows an old unseen one keeps it until it reads the list again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from pidesk.core.errors import InvalidParams
from pidesk.core.records import Notification
from pidesk.host import paging, validate
from pidesk.host.parts import Parts
from pidesk.ids import iso, utcnow
from pidesk.store import repo

log = logging.getLogger("pidesk.notifications")
PRUNE_EVERY = 3600.0  # s between prunes of a serving host
PRUNE_BATCH = 500  # notifications deleted per transaction


class Notifications:
    def __init__(self, parts: Parts, clock: Callable[[], datetime] = utcnow) -> None:
        self.p = parts
        self.clock = clock

    async def list(self, unseen_only: Any = None, limit: Any = None, cursor: Any = None) -> paging.Ready:
        if unseen_only is not None and not isinstance(unseen_only, bool):
            raise InvalidParams("unseenOnly must be true or false")
        unseen = bool(unseen_only)

        def read(after: paging.Key | None, count: int, newest_first: bool) -> list[Notification]:
            with self.p.store.db.read() as db:
                return repo.notifications(db, unseen, limit=count, after=after, newest_first=newest_first)

        notes, next_cursor = await paging.listing(read, _key, limit, cursor, "notifications.list")
        return paging.Ready(notifications=notes, nextCursor=next_cursor)

    def mark_seen(self, ids: Any = None, session_id: Any = None) -> None:
        if ids is not None and (not isinstance(ids, list) or not all(isinstance(i, str) for i in ids)):
            raise InvalidParams("ids must be a list of notification ids")
        if session_id is not None:
            session_id = self.p.session(validate.ident(session_id, "sessionId")).id
        with self.p.store.db.tx() as db:
            repo.mark_seen(db, ids=ids, session_id=session_id)

    async def prune(self) -> int:
        """Delete the notifications older than the retention period, a batch at a time; how many."""
        before = iso(self.clock() - timedelta(days=self.p.config.notification_retention_days))
        pruned = 0
        while True:
            with self.p.store.db.tx(durable=False) as db:  # (lost to a crash: pruned again next time)
                deleted = repo.prune_notifications(db, before, PRUNE_BATCH)
            pruned += deleted
            if deleted < PRUNE_BATCH:
                return pruned
            await asyncio.sleep(0)

    async def run_forever(self) -> None:
        while True:
            try:
                pruned = await self.prune()
                if pruned:
                    log.info("pruned %d notifications older than %g days", pruned,
                             self.p.config.notification_retention_days)
            except Exception:
                log.exception("old notifications could not be pruned")
            await asyncio.sleep(PRUNE_EVERY)


def _key(note: Notification) -> paging.Key:
    return note.created_at, note.id
