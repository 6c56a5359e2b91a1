"""The durable per-session prompt queue (seed 003 §3 rules 2–3, acceptance 8).

Entries are rows with positions; ``push`` appends, ``prioritize`` moves one to
the head, ``remove`` drops one. After every turn end but an abort, the head entry
is released as a new turn (origin ``queued``) and deleted in that turn's start
transaction, so a crash can neither lose nor duplicate it. A queue restored at
boot is held until a client focuses its session. ``send_now`` on a running
session moves the entry to the head and stops the turn at its next boundary.
"""

from __future__ import annotations

from typing import Any

from pidesk.core.errors import NotFound
from pidesk.core.events import QueueChanged
from pidesk.core.modes import TurnOrigin
from pidesk.core.records import AttachmentBlock, Block, Draft, QueueEntry, TextBlock
from pidesk.host import validate
from pidesk.host.parts import Parts
from pidesk.host.turns import Turns
from pidesk.store import repo


class Queue:
    def __init__(self, parts: Parts, turns: Turns) -> None:
        self.p = parts
        self.turns = turns

    async def push(self, session_id: Any, text: Any, attachments: Any = None) -> QueueEntry:
        session = self.p.session(validate.ident(session_id, "sessionId"))
        body = validate.text(text, "text")
        files = self.p.stored_attachments(attachments)
        with self.p.store.db.tx() as db:
            if not repo.queue_entries(db, session.id):
                self.p.live.held_queues.discard(session.id)  # nothing restored is left to hold
            entry = repo.queue_push(db, session.id, body, files)
        self._publish(session.id)
        await self.release(session.id)
        return entry

    def entries(self, session_id: Any) -> list[QueueEntry]:
        session = self.p.session(validate.ident(session_id, "sessionId"))
        with self.p.store.db.read() as db:
            return repo.queue_entries(db, session.id)

    def remove(self, session_id: Any, entry_id: Any) -> None:
        session = self.p.session(validate.ident(session_id, "sessionId"))
        with self.p.store.db.tx() as db:
            removed = repo.queue_remove(db, session.id, validate.ident(entry_id, "entryId"))
        if not removed:
            raise NotFound(f"no queue entry {entry_id!r} in session {session.id}")
        if not self._publish(session.id):
            self.p.live.held_queues.discard(session.id)  # the hold was for the restored entries only

    def prioritize(self, session_id: Any, entry_id: Any) -> list[QueueEntry]:
        session = self.p.session(validate.ident(session_id, "sessionId"))
        with self.p.store.db.tx() as db:
            moved = repo.queue_to_head(db, session.id, validate.ident(entry_id, "entryId"))
        if not moved:
            raise NotFound(f"no queue entry {entry_id!r} in session {session.id}")
        return self._publish(session.id)

    async def send_now(self, session_id: Any, entry_id: Any) -> None:
        self.prioritize(session_id, entry_id)
        live = self.p.live.turns.get(session_id)
        if live is not None:
            live.stop_requested = True  # the head entry follows the graceful end
            return
        await self.release(session_id, force=True)

    async def release(self, session_id: str, *, force: bool = False) -> bool:
        """Start the head entry if the session is idle (and its queue not held, unless forced)."""
        if self.p.is_busy(session_id) or (session_id in self.p.live.held_queues and not force):
            return False
        with self.p.store.db.read() as db:
            entries = repo.queue_entries(db, session_id)
        if not entries:
            return False
        head = entries[0]
        content: list[Block] = [TextBlock(text=head.text)]
        content += [AttachmentBlock(**{f: getattr(a, f) for f in a.__struct_fields__}) for a in head.attachments]
        await self.turns.start(
            session_id, content, origin=TurnOrigin.QUEUED, consume_entry=head.id,
            draft=Draft(text=head.text, attachments=head.attachments),
        )
        return True

    async def unhold(self, session_id: str) -> None:
        if session_id in self.p.live.held_queues:
            self.p.live.held_queues.discard(session_id)
            await self.release(session_id)

    def _publish(self, session_id: str) -> list[QueueEntry]:
        with self.p.store.db.read() as db:
            entries = repo.queue_entries(db, session_id)
        self.p.bus.publish(QueueChanged(session_id=session_id, entries=entries))
        return entries
