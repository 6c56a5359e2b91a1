"""The prompt queue, notifications, the append-only audit log, and schedules."""

from __future__ import annotations

import json
import sqlite3
from typing import Any

import msgspec

from pidesk.core.modes import (
    Mode,
    NotificationKind,
    PermissionMode,
)
from pidesk.core.records import (
    Attachment,
    AuditEntry,
    Notification,
    QueueEntry,
    Schedule,
    ScheduleRun,
)
from pidesk.ids import new_id, now_iso
from pidesk.store.repo.sessions import Row
from pidesk.store.repo.keyset import keyset


# ---- queue ------------------------------------------------------------------------


def _entry(row: Row) -> QueueEntry:
    return QueueEntry(
        id=row[0], session_id=row[1], position=row[2], text=row[3],
        attachments=msgspec.json.decode(row[4], type=list[Attachment]), created_at=row[5],
    )


def queue_entries(db: sqlite3.Connection, session_id: str) -> list[QueueEntry]:
    rows = db.execute(
        "SELECT id, session_id, position, text, attachments, created_at FROM queue"
        " WHERE session_id = ? ORDER BY position",
        (session_id,),
    )
    return [_entry(r) for r in rows]


def queue_push(db: sqlite3.Connection, session_id: str, text: str, attachments: list[Attachment]) -> QueueEntry:
    position = db.execute(
        "SELECT coalesce(max(position), 0) + 1 FROM queue WHERE session_id = ?", (session_id,)
    ).fetchone()[0]
    entry = QueueEntry(
        id=new_id("q"), session_id=session_id, position=position, text=text,
        attachments=attachments, created_at=now_iso(),
    )
    db.execute(
        "INSERT INTO queue VALUES (?,?,?,?,?,?)",
        (entry.id, session_id, position, text, msgspec.json.encode(attachments).decode(), entry.created_at),
    )
    return entry


def queue_remove(db: sqlite3.Connection, session_id: str, entry_id: str) -> bool:
    return db.execute("DELETE FROM queue WHERE session_id = ? AND id = ?", (session_id, entry_id)).rowcount == 1


def queue_to_head(db: sqlite3.Connection, session_id: str, entry_id: str) -> bool:
    head = db.execute("SELECT coalesce(min(position), 1) - 1 FROM queue WHERE session_id = ?", (session_id,)).fetchone()[0]
    cur = db.execute("UPDATE queue SET position = ? WHERE session_id = ? AND id = ?", (head, session_id, entry_id))
    return cur.rowcount == 1


def sessions_with_queue(db: sqlite3.Connection) -> list[str]:
    return [r[0] for r in db.execute("SELECT DISTINCT session_id FROM queue")]


def count_queued(db: sqlite3.Connection) -> int:
    return int(db.execute("SELECT count(*) FROM queue").fetchone()[0])


# ---- notifications ----------------------------------------------------------------

_NOTE_COLS = "id, session_id, turn_id, kind, created_at, seen_at"


def _note(row: Row) -> Notification:
    return Notification(
        id=row[0], session_id=row[1], turn_id=row[2], kind=NotificationKind(row[3]),
        created_at=row[4], seen_at=row[5],
    )


def insert_notification(db: sqlite3.Connection, session_id: str, turn_id: str, kind: NotificationKind) -> Notification:
    note = Notification(
        id=new_id("n"), session_id=session_id, turn_id=turn_id, kind=kind, created_at=now_iso(), seen_at=None
    )
    db.execute(
        f"INSERT INTO notifications ({_NOTE_COLS}) VALUES (?,?,?,?,?,?)",
        (note.id, session_id, turn_id, kind.value, note.created_at, None),
    )
    return note


def notifications(db: sqlite3.Connection, unseen_only: bool, *, limit: int = -1,
                  after: tuple[str, str] | None = None, newest_first: bool = False) -> list[Notification]:
    """Notifications by (created_at, id) (``newest_first``: the other way), the unseen ones only when
    ``unseen_only``; at most ``limit`` (-1: all), starting past the one whose (created_at, id) is ``after``."""
    clause, args = keyset("", ["seen_at IS NULL"] if unseen_only else [], [], after, newest_first, limit)
    return [_note(r) for r in db.execute(f"SELECT {_NOTE_COLS} FROM notifications {clause}", args)]


def prune_notifications(db: sqlite3.Connection, before: str, limit: int) -> int:
    """Delete at most ``limit`` notifications created before ``before`` (an ISO time), oldest first; how many."""
    return db.execute(
        "DELETE FROM notifications WHERE rowid IN"
        " (SELECT rowid FROM notifications WHERE created_at < ? ORDER BY created_at LIMIT ?)", (before, limit),
    ).rowcount


def mark_seen(db: sqlite3.Connection, *, ids: list[str] | None = None, session_id: str | None = None) -> int:
    now = now_iso()
    if ids is not None:
        marks = ",".join("?" * len(ids))
        sql = f"UPDATE notifications SET seen_at = ? WHERE seen_at IS NULL AND id IN ({marks})"
        return db.execute(sql, (now, *ids)).rowcount
    if session_id is not None:
        sql = "UPDATE notifications SET seen_at = ? WHERE seen_at IS NULL AND session_id = ?"
        return db.execute(sql, (now, session_id)).rowcount
    return db.execute("UPDATE notifications SET seen_at = ? WHERE seen_at IS NULL", (now,)).rowcount


# ---- audit ------------------------------------------------------------------------


def audit(db: sqlite3.Connection, action: str, session_id: str | None, turn_id: str | None = None, **detail: Any) -> None:
    db.execute(
        "INSERT INTO audit (session_id, turn_id, action, detail, created_at) VALUES (?,?,?,?,?)",
        (session_id, turn_id, action, json.dumps(detail, sort_keys=True), now_iso()),
    )


def audit_entries(db: sqlite3.Connection, session_id: str | None, limit: int) -> list[AuditEntry]:
    where, params = ("WHERE session_id = ?", [session_id]) if session_id else ("", [])
    rows = db.execute(
        f"SELECT id, session_id, turn_id, action, detail, created_at FROM audit {where} ORDER BY id DESC LIMIT ?",
        (*params, limit),
    ).fetchall()
    return [
        AuditEntry(id=r[0], session_id=r[1], turn_id=r[2], action=r[3], detail=json.loads(r[4]), created_at=r[5])
        for r in reversed(rows)
    ]


# ---- schedules ----------------------------------------------------------------------------


def _schedule(db: sqlite3.Connection, row: Row) -> Schedule:
    last = db.execute(
        "SELECT id, at, status, error_code, session_id FROM schedule_runs WHERE schedule_id = ?"
        " ORDER BY created_at DESC, rowid DESC LIMIT 1",
        (row[0],),
    ).fetchone()
    return Schedule(
        id=row[0], name=row[1], cron=row[2], project_path=row[3], prompt=row[4], mode=Mode(row[5]),
        permission_mode=PermissionMode(row[6]), enabled=bool(row[7]), next_run_at=row[8],
        last_run=ScheduleRun(id=last[0], at=last[1], status=last[2], error_code=last[3], session_id=last[4])
        if last else None,
    )


_SCHEDULE_COLS = "id, name, cron, project_path, prompt, mode, permission_mode, enabled, next_run_at"


def insert_schedule(db: sqlite3.Connection, s: Schedule) -> None:
    db.execute(
        f"INSERT INTO schedules ({_SCHEDULE_COLS}, created_at) VALUES (?,?,?,?,?,?,?,?,?,?)",
        (s.id, s.name, s.cron, s.project_path, s.prompt, s.mode.value, s.permission_mode.value, int(s.enabled),
         s.next_run_at, now_iso()),
    )


def get_schedule(db: sqlite3.Connection, schedule_id: str) -> Schedule | None:
    row = db.execute(f"SELECT {_SCHEDULE_COLS} FROM schedules WHERE id = ?", (schedule_id,)).fetchone()
    return _schedule(db, row) if row else None


def list_schedules(db: sqlite3.Connection) -> list[Schedule]:
    rows = db.execute(f"SELECT {_SCHEDULE_COLS} FROM schedules ORDER BY created_at, rowid").fetchall()
    return [_schedule(db, r) for r in rows]


def delete_schedule(db: sqlite3.Connection, schedule_id: str) -> bool:
    return db.execute("DELETE FROM schedules WHERE id = ?", (schedule_id,)).rowcount == 1


def set_next_run(db: sqlite3.Connection, schedule_id: str, next_run_at: str) -> None:
    db.execute("UPDATE schedules SET next_run_at = ? WHERE id = ?", (next_run_at, schedule_id))


def insert_run(db: sqlite3.Connection, schedule_id: str, at: str, status: str, error_code: str | None = None,
               session_id: str | None = None, turn_id: str | None = None) -> str:
    run_id = new_id("r")
    db.execute(
        "INSERT INTO schedule_runs (id, schedule_id, at, status, error_code, session_id, turn_id, created_at)"
        " VALUES (?,?,?,?,?,?,?,?)",
        (run_id, schedule_id, at, status, error_code, session_id, turn_id, now_iso()),
    )
    return run_id


def finish_run(db: sqlite3.Connection, run_id: str, status: str, error_code: str | None,
               turn_id: str | None = None) -> None:
    db.execute(
        "UPDATE schedule_runs SET status = ?, error_code = ?, turn_id = coalesce(?, turn_id) WHERE id = ?",
        (status, error_code, turn_id, run_id),
    )


def interrupt_runs(db: sqlite3.Connection) -> int:
    """A run still marked running at boot ended with the process: failed, never replayed."""
    return db.execute(
        "UPDATE schedule_runs SET status = 'failed', error_code = 'INTERRUPTED' WHERE status = 'running'"
    ).rowcount
