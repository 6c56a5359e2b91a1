"""Startup recovery: fail closed, in one transaction, before anything is served."""

from __future__ import annotations

import sqlite3

from pidesk.ids import now_iso


# ---- startup recovery ---------------------------------------------------------------


def interrupt_everything(db: sqlite3.Connection) -> dict[str, int]:
    """Fail closed after a restart: nothing pending, queued or running survives, nothing is replayed.

    A running turn that was consuming a queue entry settles the entry by its transcript:
    if the prompt's line made it, the entry is spent; if not, it stays queued. The prompt
    is looked for only when the entry is still queued (the host removes it as soon as the
    prompt lands, so only a crash in that window leaves one), and only among that
    session's messages: ``messages`` has no index on ``turn_id``, and scanning all of
    them for every running turn made recovery grow with the whole history (1k such
    turns over 16k messages took 0.8 s; bench/boot.py). The subquery names
    ``q.session_id`` so that SQLite runs it after the queue lookup, not for every turn.
    """
    now = now_iso()
    db.execute(
        "DELETE FROM queue WHERE id IN (SELECT q.id FROM turns t JOIN queue q ON q.id = t.queue_entry"
        " WHERE t.state = 'running'"
        " AND EXISTS (SELECT 1 FROM messages m WHERE m.session_id = q.session_id AND m.turn_id = t.id))"
    )
    counts = {
        "approvals": db.execute(
            "UPDATE plan_approvals SET status = 'interrupted', resolved_at = ? WHERE status = 'pending'", (now,)
        ).rowcount,
        "executions": db.execute(
            "UPDATE plan_approvals SET execution_state = 'interrupted'"
            " WHERE execution_state IN ('queued', 'running')"
        ).rowcount,
        "turns": db.execute(
            "UPDATE turns SET state = 'ended', reason = 'aborted', ended_at = ?,"
            " error_code = CASE WHEN approval_id IS NULL THEN 'INTERRUPTED' ELSE 'PLAN_EXECUTION_INTERRUPTED' END"
            " WHERE state = 'running'",
            (now,),
        ).rowcount,
        "permissions": db.execute(
            "UPDATE permission_requests SET status = 'interrupted', resolved_at = ? WHERE status = 'pending'", (now,)
        ).rowcount,
    }
    db.execute(
        "UPDATE sessions SET status = 'idle', current_turn_id = NULL, updated_at = ?"
        " WHERE status != 'idle' OR current_turn_id IS NOT NULL",
        (now,),
    )
    return counts


def interrupt_turn_waits(db: sqlite3.Connection, turn_id: str) -> tuple[list[str], list[str]]:
    """An aborted turn's pending permission requests and approval become interrupted; returns their ids."""
    now = now_iso()
    requests = [r[0] for r in db.execute(
        "SELECT id FROM permission_requests WHERE turn_id = ? AND status = 'pending'", (turn_id,)
    )]
    db.execute(
        "UPDATE permission_requests SET status = 'interrupted', resolved_at = ? WHERE turn_id = ? AND status = 'pending'",
        (now, turn_id),
    )
    approvals_ = [r[0] for r in db.execute(
        "SELECT id FROM plan_approvals WHERE turn_id = ? AND status = 'pending'", (turn_id,)
    )]
    db.execute(
        "UPDATE plan_approvals SET status = 'interrupted', resolved_at = ? WHERE turn_id = ? AND status = 'pending'",
        (now, turn_id),
    )
    return requests, approvals_
