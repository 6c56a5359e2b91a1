"""Startup recovery: make the store consistent, then fail closed — before anything is served.

0. Kill the tool process groups a crashed host left running (its watchdog missed
   them), as the store recorded them: only a leader with the recorded start time
   (``tools/watchdog.py``, ``kill_recorded``). They are gone before recovery goes on.
1. ``Store.reconcile``: finish interrupted deletes, restore orphaned sessions,
   index the transcript outbox, quarantine torn tails.
2. One transaction: pending approvals and permission requests → interrupted,
   queued/running executions → interrupted (the session stays in Agent), running
   turns → aborted (``PLAN_EXECUTION_INTERRUPTED`` for executions, else
   ``INTERRUPTED``), every session idle. Nothing is replayed.
3. Sessions with queued prompts are held until a client focuses them.
4. A revert a crash interrupted (its marker, ``store/checkpoints.py``) is audited
   ``workspace.revert_interrupted`` with its files; each stands as it was or as restored.
"""

from __future__ import annotations

from dataclasses import dataclass

from pidesk.core.errors import Code
from pidesk.core.events import TurnEnded
from pidesk.core.modes import TurnReason
from pidesk.host.parts import Parts
from pidesk.store import BootReport, repo
from pidesk.store.checkpoints import clear_interrupted_reverts, interrupted_reverts
from pidesk.tools.watchdog import kill_recorded


@dataclass(frozen=True)
class Recovery:
    boot: BootReport
    interrupted: dict[str, int]
    held_queues: list[str]
    ended_turns: list[TurnEnded]  # the turns recovery aborted, announced to event hooks once they load


def recover(parts: Parts) -> Recovery:
    groups = parts.store.process_groups
    killed = kill_recorded((g.pgid, g.start, g.boot_id) for g in groups.recorded())
    boot = parts.store.reconcile()
    boot.killed_process_groups = killed
    reverts = interrupted_reverts(parts.store.data_dir)
    with parts.store.db.tx() as db:
        for note in reverts:  # each file stands as it was or as restored; the user reverts again
            repo.audit(db, "workspace.revert_interrupted", note.get("session"), None, turn=note.get("turn"),
                       revert_id=note.get("revertId"), files=note.get("files", []))
        running = repo.running_turns(db)
        counts = repo.interrupt_everything(db)
        if any(counts.values()) or boot.restored_sessions or boot.quarantined or killed:
            repo.audit(db, "host.recovered", None, None, **counts, restored=boot.restored_sessions,
                       quarantined=boot.quarantined, killed_process_groups=killed)
    groups.clear()  # (after the audit: a crash before it kills them again, or finds them gone)
    clear_interrupted_reverts(parts.store.data_dir)  # (after the audit too: reported at least once)
    with parts.store.db.read() as db:
        held = repo.sessions_with_queue(db)
    parts.live.held_queues.update(held)
    ended = [
        TurnEnded(session_id=session_id, turn_id=turn_id, reason=TurnReason.ABORTED.value,
                  error_code=Code.PLAN_EXECUTION_INTERRUPTED.value if approval_id else Code.INTERRUPTED.value)
        for turn_id, session_id, approval_id in running
    ]
    return Recovery(boot, counts, held, ended)
