"""SQL for every index table, as small functions over a connection.

The host composes them inside one ``Database.tx()`` when a rule needs several
rows to change together (an approval, a turn end with its notification). Each
function maps rows to the records of ``core.records``; no SQL lives elsewhere.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any

import msgspec

from pidesk.core.modes import (
    ApprovalStatus,
    ExecutionState,
    Mode,
    NotificationKind,
    PermissionMode,
    PermissionStatus,
    PlanKind,
    SessionStatus,
    TurnOrigin,
    TurnReason,
    TurnState,
    plan_state,
)
from pidesk.core.records import (
    Attachment,
    AuditEntry,
    ForkedFrom,
    Notification,
    PermissionRequest,
    PlanApproval,
    QueueEntry,
    Schedule,
    ScheduleRun,
    Session,
    Turn,
    Usage,
)
from pidesk.core.transitions import advance
from pidesk.ids import new_id, now_iso

Row = tuple[Any, ...]

# ---- sessions ---------------------------------------------------------------------

_SESSION_COLS = (
    "s.id, s.title, s.project_path, s.root, s.mode, s.permission_mode, s.status, "
    "s.current_turn_id, s.forked_from, s.forked_through, s.created_at, s.updated_at, "
    "EXISTS (SELECT 1 FROM plan_approvals a WHERE a.session_id = s.id AND a.status = 'pending'), "
    "s.input_tokens, s.output_tokens, s.cache_tokens"
)


def _session(row: Row) -> Session:
    mode = Mode(row[4])
    return Session(
        id=row[0],
        title=row[1],
        project_path=row[2],
        root=row[3],
        mode=mode,
        permission_mode=PermissionMode(row[5]),
        status=SessionStatus(row[6]),
        plan_state=plan_state(mode, bool(row[12])),
        current_turn_id=row[7],
        forked_from=ForkedFrom(session_id=row[8], through_message_id=row[9]) if row[8] else None,
        created_at=row[10],
        updated_at=row[11],
        usage=Usage(input_tokens=row[13], output_tokens=row[14], cache_tokens=row[15]),
    )


def insert_session(db: sqlite3.Connection, s: Session, last_seq: int = 0, indexed_bytes: int = 0) -> None:
    db.execute(
        "INSERT INTO sessions (id, title, project_path, root, mode, permission_mode, status,"
        " current_turn_id, forked_from, forked_through, created_at, updated_at, last_seq,"
        " indexed_bytes) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
        (
            s.id, s.title, s.project_path, s.root, s.mode.value, s.permission_mode.value,
            s.status.value, s.current_turn_id,
            s.forked_from.session_id if s.forked_from else None,
            s.forked_from.through_message_id if s.forked_from else None,
            s.created_at, s.updated_at, last_seq, indexed_bytes,
        ),
    )


def get_session(db: sqlite3.Connection, session_id: str) -> Session | None:
    row = db.execute(f"SELECT {_SESSION_COLS} FROM sessions s WHERE s.id = ?", (session_id,)).fetchone()
    return _session(row) if row else None


def list_sessions(db: sqlite3.Connection, project_path: str | None = None) -> list[Session]:
    if project_path is None:
        rows = db.execute(f"SELECT {_SESSION_COLS} FROM sessions s ORDER BY s.created_at").fetchall()
    else:
        rows = db.execute(
            f"SELECT {_SESSION_COLS} FROM sessions s WHERE s.project_path = ? ORDER BY s.created_at",
            (project_path,),
        ).fetchall()
    return [_session(r) for r in rows]


def set_status(
    db: sqlite3.Connection, session_id: str, current: SessionStatus, target: SessionStatus,
    current_turn_id: str | None,
) -> bool:
    """Move the session's status along the table; False (no change) if it was not ``current``."""
    advance(current, target)
    cur = db.execute(
        "UPDATE sessions SET status = ?, current_turn_id = ?, updated_at = ? WHERE id = ? AND status = ?",
        (target.value, current_turn_id, now_iso(), session_id, current.value),
    )
    return cur.rowcount == 1


def end_activity(db: sqlite3.Connection, session_id: str, turn_id: str) -> None:
    """The session's turn ended: back to idle from running or waiting_permission."""
    db.execute(
        "UPDATE sessions SET status = 'idle', current_turn_id = NULL, updated_at = ?"
        " WHERE id = ? AND current_turn_id = ?",
        (now_iso(), session_id, turn_id),
    )


def update_session(db: sqlite3.Connection, session_id: str, **fields: str | None) -> None:
    columns = ", ".join(f"{name} = ?" for name in fields)
    db.execute(
        f"UPDATE sessions SET {columns}, updated_at = ? WHERE id = ?",
        (*fields.values(), now_iso(), session_id),
    )


def delete_session(db: sqlite3.Connection, session_id: str) -> None:
    db.execute("DELETE FROM sessions WHERE id = ?", (session_id,))


def session_watermarks(db: sqlite3.Connection) -> dict[str, tuple[int, int]]:
    """session id -> (last indexed seq, indexed transcript bytes)."""
    return {r[0]: (r[1], r[2]) for r in db.execute("SELECT id, last_seq, indexed_bytes FROM sessions")}


def count_sessions(db: sqlite3.Connection) -> int:
    return int(db.execute("SELECT count(*) FROM sessions").fetchone()[0])


# ---- messages (index rows; content lives in the transcript) -------------------------


def insert_message_rows(db: sqlite3.Connection, rows: list[tuple[str, str, str | None, int, str, int, int, str]]) -> None:
    """rows: (id, session_id, turn_id, seq, role, offset, length, created_at)."""
    db.executemany(
        "INSERT OR IGNORE INTO messages (id, session_id, turn_id, seq, role, offset, length, created_at)"
        " VALUES (?,?,?,?,?,?,?,?)",
        rows,
    )


def advance_watermark(db: sqlite3.Connection, session_id: str, last_seq: int, indexed_bytes: int) -> None:
    db.execute(
        "UPDATE sessions SET last_seq = max(last_seq, ?), indexed_bytes = max(indexed_bytes, ?)"
        " WHERE id = ?",
        (last_seq, indexed_bytes, session_id),
    )


def message_page(db: sqlite3.Connection, session_id: str, before_seq: int | None, limit: int) -> list[Row]:
    """(id, seq, offset, length) of the newest ``limit`` messages below ``before_seq``, ascending."""
    bound = before_seq if before_seq is not None else 2**62
    rows = db.execute(
        "SELECT id, seq, offset, length FROM messages WHERE session_id = ? AND seq < ?"
        " ORDER BY seq DESC LIMIT ?",
        (session_id, bound, limit),
    ).fetchall()
    rows.reverse()
    return rows


def message_location(db: sqlite3.Connection, session_id: str, message_id: str) -> Row | None:
    """(seq, offset, length) of one message of a session."""
    row = db.execute(
        "SELECT seq, offset, length FROM messages WHERE session_id = ? AND id = ?", (session_id, message_id)
    ).fetchone()
    return tuple(row) if row else None


def delete_messages_from(db: sqlite3.Connection, session_id: str, seq: int, offset: int) -> None:
    """Drop index rows from ``seq`` on (a smart stop cut the transcript at ``offset``)."""
    db.execute("DELETE FROM messages WHERE session_id = ? AND seq >= ?", (session_id, seq))
    db.execute(
        "UPDATE sessions SET last_seq = ?, indexed_bytes = ? WHERE id = ?", (seq - 1, offset, session_id)
    )


def count_messages(db: sqlite3.Connection, session_id: str) -> int:
    return int(db.execute("SELECT count(*) FROM messages WHERE session_id = ?", (session_id,)).fetchone()[0])


# ---- turns ------------------------------------------------------------------------

_TURN_COLS = (
    "id, session_id, seq, origin, state, reason, error_code, started_at, ended_at,"
    " input_tokens, output_tokens, cache_tokens"
)


def _turn(row: Row) -> Turn:
    return Turn(
        id=row[0], session_id=row[1], seq=row[2], origin=TurnOrigin(row[3]), state=TurnState(row[4]),
        reason=TurnReason(row[5]) if row[5] else None, error_code=row[6], started_at=row[7],
        ended_at=row[8], usage=Usage(input_tokens=row[9], output_tokens=row[10], cache_tokens=row[11]),
    )


def insert_turn(
    db: sqlite3.Connection, turn_id: str, session_id: str, origin: TurnOrigin, approval_id: str | None,
    queue_entry: str | None = None,
) -> Turn:
    seq = db.execute("SELECT coalesce(max(seq), 0) + 1 FROM turns WHERE session_id = ?", (session_id,)).fetchone()[0]
    db.execute(
        "INSERT INTO turns (id, session_id, seq, origin, state, started_at, approval_id, queue_entry)"
        " VALUES (?,?,?,?,'running',?,?,?)",
        (turn_id, session_id, seq, origin.value, now_iso(), approval_id, queue_entry),
    )
    turn = get_turn(db, turn_id)
    assert turn is not None
    return turn


def get_turn(db: sqlite3.Connection, turn_id: str) -> Turn | None:
    row = db.execute(f"SELECT {_TURN_COLS} FROM turns WHERE id = ?", (turn_id,)).fetchone()
    return _turn(row) if row else None


def turn_approval_id(db: sqlite3.Connection, turn_id: str) -> str | None:
    row = db.execute("SELECT approval_id FROM turns WHERE id = ?", (turn_id,)).fetchone()
    return row[0] if row else None


def list_turns(db: sqlite3.Connection, session_id: str, limit: int) -> list[Turn]:
    rows = db.execute(
        f"SELECT {_TURN_COLS} FROM turns WHERE session_id = ? ORDER BY seq DESC LIMIT ?", (session_id, limit)
    ).fetchall()
    return [_turn(r) for r in reversed(rows)]


def end_turn_row(db: sqlite3.Connection, turn_id: str, reason: TurnReason, error_code: str | None) -> bool:
    """Move a running turn to ended; False (and no change) if it already ended."""
    advance(TurnState.RUNNING, TurnState.ENDED)
    cur = db.execute(
        "UPDATE turns SET state = 'ended', reason = ?, error_code = ?, ended_at = ?"
        " WHERE id = ? AND state = 'running'",
        (reason.value, error_code, now_iso(), turn_id),
    )
    return cur.rowcount == 1


def add_usage(db: sqlite3.Connection, turn_id: str, usage: Usage) -> None:
    """Count tokens on the turn and on its session, in the caller's transaction."""
    counts = (usage.input_tokens, usage.output_tokens, usage.cache_tokens)
    db.execute(
        "UPDATE turns SET input_tokens = input_tokens + ?, output_tokens = output_tokens + ?,"
        " cache_tokens = cache_tokens + ? WHERE id = ?",
        (*counts, turn_id),
    )
    db.execute(
        "UPDATE sessions SET input_tokens = input_tokens + ?, output_tokens = output_tokens + ?,"
        " cache_tokens = cache_tokens + ? WHERE id = (SELECT session_id FROM turns WHERE id = ?)",
        (*counts, turn_id),
    )


def running_turns(db: sqlite3.Connection) -> list[Row]:
    """(turn id, session id, approval id) of every turn still marked running."""
    return db.execute("SELECT id, session_id, approval_id FROM turns WHERE state = 'running'").fetchall()


# ---- plan approvals -----------------------------------------------------------------

_APPROVAL_COLS = (
    "id, kind, session_id, turn_id, tool_call_id, title, question, criteria, artifact_path,"
    " artifact_sha256, artifact_size, status, deadline, permission_mode, execution_id,"
    " execution_state, revises, feedback, created_at, resolved_at"
)


def _approval(row: Row) -> PlanApproval:
    return PlanApproval(
        id=row[0], kind=PlanKind(row[1]), session_id=row[2], turn_id=row[3], tool_call_id=row[4],
        title=row[5], question=row[6], criteria=json.loads(row[7]) if row[7] is not None else None,
        artifact_path=row[8], artifact_sha256=row[9], artifact_size=row[10],
        status=ApprovalStatus(row[11]), deadline=row[12],
        permission_mode=PermissionMode(row[13]) if row[13] else None, execution_id=row[14],
        execution_state=ExecutionState(row[15]), revises=row[16], feedback=row[17],
        created_at=row[18], resolved_at=row[19],
    )


def insert_approval(db: sqlite3.Connection, a: PlanApproval) -> None:
    db.execute(
        f"INSERT INTO plan_approvals ({_APPROVAL_COLS}) VALUES ({','.join('?' * 20)})",
        (
            a.id, a.kind.value, a.session_id, a.turn_id, a.tool_call_id, a.title, a.question,
            json.dumps(a.criteria) if a.criteria is not None else None, a.artifact_path,
            a.artifact_sha256, a.artifact_size, a.status.value, a.deadline,
            a.permission_mode.value if a.permission_mode else None, a.execution_id,
            a.execution_state.value, a.revises, a.feedback, a.created_at, a.resolved_at,
        ),
    )


def get_approval(db: sqlite3.Connection, approval_id: str) -> PlanApproval | None:
    row = db.execute(f"SELECT {_APPROVAL_COLS} FROM plan_approvals WHERE id = ?", (approval_id,)).fetchone()
    return _approval(row) if row else None


def approvals(db: sqlite3.Connection, *, session_id: str | None = None, pending: bool = False) -> list[PlanApproval]:
    clauses, params = [], []
    if session_id is not None:
        clauses.append("session_id = ?")
        params.append(session_id)
    if pending:
        clauses.append("status = 'pending'")
    where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
    rows = db.execute(f"SELECT {_APPROVAL_COLS} FROM plan_approvals {where} ORDER BY created_at, rowid", params)
    return [_approval(r) for r in rows]


def latest_approval(db: sqlite3.Connection, session_id: str, kind: PlanKind) -> str | None:
    row = db.execute(
        "SELECT id FROM plan_approvals WHERE session_id = ? AND kind = ? ORDER BY created_at DESC, rowid DESC LIMIT 1",
        (session_id, kind.value),
    ).fetchone()
    return row[0] if row else None


def settle_approval(
    db: sqlite3.Connection,
    approval_id: str,
    status: ApprovalStatus,
    *,
    permission_mode: PermissionMode | None = None,
    execution_id: str | None = None,
    feedback: str | None = None,
) -> bool:
    """pending -> ``status``; False (no change) if the row was no longer pending."""
    advance(ApprovalStatus.PENDING, status)
    execution_state = ExecutionState.QUEUED if execution_id else ExecutionState.NONE
    cur = db.execute(
        "UPDATE plan_approvals SET status = ?, permission_mode = ?, execution_id = ?,"
        " execution_state = ?, feedback = ?, resolved_at = ? WHERE id = ? AND status = 'pending'",
        (
            status.value, permission_mode.value if permission_mode else None, execution_id,
            execution_state.value, feedback, now_iso(), approval_id,
        ),
    )
    return cur.rowcount == 1


def set_execution_state(
    db: sqlite3.Connection, approval_id: str, expected: ExecutionState, state: ExecutionState
) -> bool:
    advance(expected, state)
    cur = db.execute(
        "UPDATE plan_approvals SET execution_state = ? WHERE id = ? AND execution_state = ?",
        (state.value, approval_id, expected.value),
    )
    return cur.rowcount == 1


def queued_executions(db: sqlite3.Connection, session_id: str | None = None) -> list[PlanApproval]:
    where = "execution_state = 'queued'" + (" AND session_id = ?" if session_id else "")
    rows = db.execute(
        f"SELECT {_APPROVAL_COLS} FROM plan_approvals WHERE {where} ORDER BY resolved_at",
        (session_id,) if session_id else (),
    )
    return [_approval(r) for r in rows]


def has_open_contract(db: sqlite3.Connection, session_id: str) -> bool:
    """A pending approval or a queued/running execution makes the session busy."""
    row = db.execute(
        "SELECT 1 FROM plan_approvals WHERE session_id = ? AND (status = 'pending'"
        " OR execution_state IN ('queued', 'running')) LIMIT 1",
        (session_id,),
    ).fetchone()
    return row is not None


# ---- permission requests and grants ------------------------------------------------

_REQUEST_COLS = "id, session_id, turn_id, tool_call_id, tool, args, status, created_at, resolved_at"


def _request(row: Row) -> PermissionRequest:
    return PermissionRequest(
        id=row[0], session_id=row[1], turn_id=row[2], tool_call_id=row[3], tool=row[4],
        args=json.loads(row[5]), status=PermissionStatus(row[6]), created_at=row[7], resolved_at=row[8],
    )


def insert_request(db: sqlite3.Connection, r: PermissionRequest) -> None:
    db.execute(
        f"INSERT INTO permission_requests ({_REQUEST_COLS}) VALUES (?,?,?,?,?,?,?,?,?)",
        (r.id, r.session_id, r.turn_id, r.tool_call_id, r.tool, json.dumps(r.args), r.status.value,
         r.created_at, r.resolved_at),
    )


def get_request(db: sqlite3.Connection, request_id: str) -> PermissionRequest | None:
    row = db.execute(f"SELECT {_REQUEST_COLS} FROM permission_requests WHERE id = ?", (request_id,)).fetchone()
    return _request(row) if row else None


def pending_requests(db: sqlite3.Connection, session_id: str | None = None) -> list[PermissionRequest]:
    where = "status = 'pending'" + (" AND session_id = ?" if session_id else "")
    rows = db.execute(
        f"SELECT {_REQUEST_COLS} FROM permission_requests WHERE {where} ORDER BY created_at",
        (session_id,) if session_id else (),
    )
    return [_request(r) for r in rows]


def settle_request(db: sqlite3.Connection, request_id: str, status: PermissionStatus) -> bool:
    advance(PermissionStatus.PENDING, status)
    cur = db.execute(
        "UPDATE permission_requests SET status = ?, resolved_at = ? WHERE id = ? AND status = 'pending'",
        (status.value, now_iso(), request_id),
    )
    return cur.rowcount == 1


def insert_grant(db: sqlite3.Connection, session_id: str, tool: str) -> None:
    db.execute("INSERT OR IGNORE INTO grants VALUES (?,?,?)", (session_id, tool, now_iso()))


def has_grant(db: sqlite3.Connection, session_id: str, tool: str) -> bool:
    return db.execute("SELECT 1 FROM grants WHERE session_id = ? AND tool = ?", (session_id, tool)).fetchone() is not None


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


def notifications(db: sqlite3.Connection, unseen_only: bool) -> list[Notification]:
    where = "WHERE seen_at IS NULL" if unseen_only else ""
    return [_note(r) for r in db.execute(f"SELECT {_NOTE_COLS} FROM notifications {where} ORDER BY created_at, rowid")]


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


# ---- startup recovery ---------------------------------------------------------------


def interrupt_everything(db: sqlite3.Connection) -> dict[str, int]:
    """Fail closed after a restart: nothing pending, queued or running survives, nothing is replayed.

    A running turn that was consuming a queue entry settles the entry by its transcript:
    if the prompt's line made it, the entry is spent; if not, it stays queued.
    """
    now = now_iso()
    db.execute(
        "DELETE FROM queue WHERE id IN (SELECT t.queue_entry FROM turns t WHERE t.state = 'running'"
        " AND t.queue_entry IS NOT NULL AND EXISTS (SELECT 1 FROM messages m WHERE m.turn_id = t.id))"
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
