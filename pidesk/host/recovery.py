"""Startup recovery: make the store consistent, then fail closed — before anything is served.

1. ``Store.reconcile``: finish interrupted deletes, restore orphaned sessions,
   index the transcript outbox, quarantine torn tails.
2. One transaction: pending approvals and permission requests → interrupted,
   queued/running executions → interrupted (the session stays in Agent), running
   turns → aborted (``PLAN_EXECUTION_INTERRUPTED`` for executions, else
   ``INTERRUPTED``), every session idle. Nothing is replayed.
3. Sessions with queued prompts are held until a client focuses them.
"""

from __future__ import annotations

from dataclasses import dataclass

from pidesk.core.errors import Code
from pidesk.core.events import TurnEnded
from pidesk.core.modes import TurnReason
from pidesk.host.parts import Parts
from pidesk.store import BootReport, repo


@dataclass(frozen=True)
class Recovery:
    boot: BootReport
    interrupted: dict[str, int]
    held_queues: list[str]
    ended_turns: list[TurnEnded]  # the turns recovery aborted, announced to event hooks once they load


def recover(parts: Parts) -> Recovery:
    boot = parts.store.reconcile()
    with parts.store.db.tx() as db:
        running = repo.running_turns(db)
        counts = repo.interrupt_everything(db)
        if any(counts.values()) or boot.restored_sessions or boot.quarantined:
            repo.audit(db, "host.recovered", None, None, **counts, restored=boot.restored_sessions,
                       quarantined=boot.quarantined)
    with parts.store.db.read() as db:
        held = repo.sessions_with_queue(db)
    parts.live.held_queues.update(held)
    ended = [
        TurnEnded(session_id=session_id, turn_id=turn_id, reason=TurnReason.ABORTED.value,
                  error_code=Code.PLAN_EXECUTION_INTERRUPTED.value if approval_id else Code.INTERRUPTED.value)
        for turn_id, session_id, approval_id in running
    ]
    return Recovery(boot, counts, held, ended)
