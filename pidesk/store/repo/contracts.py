"""Plan/Goal approval rows, permission requests and session grants."""

from __future__ import annotations

import json
import sqlite3

from pidesk.core.modes import (
    ApprovalStatus,
    ExecutionState,
    PermissionMode,
    PermissionStatus,
    PlanKind,
)
from pidesk.core.records import (
    PermissionRequest,
    PlanApproval,
)
from pidesk.core.policy import is_escalation
from pidesk.core.transitions import advance
from pidesk.ids import now_iso
from pidesk.store.repo.sessions import Row


# ---- plan approvals -----------------------------------------------------------------

_APPROVAL_COLS = (
    "id, kind, session_id, turn_id, tool_call_id, title, question, criteria, artifact_path,"
    " artifact_sha256, artifact_size, status, deadline, permission_mode, execution_id,"
    " execution_state, revises, feedback, created_at, resolved_at, context"
)


def _approval(row: Row) -> PlanApproval:
    return PlanApproval(
        id=row[0], kind=PlanKind(row[1]), session_id=row[2], turn_id=row[3], tool_call_id=row[4],
        title=row[5], question=row[6], criteria=json.loads(row[7]) if row[7] is not None else None,
        artifact_path=row[8], artifact_sha256=row[9], artifact_size=row[10],
        status=ApprovalStatus(row[11]), deadline=row[12],
        permission_mode=PermissionMode(row[13]) if row[13] else None, execution_id=row[14],
        execution_state=ExecutionState(row[15]), revises=row[16], feedback=row[17],
        created_at=row[18], resolved_at=row[19], context=row[20],
    )


def insert_approval(db: sqlite3.Connection, a: PlanApproval) -> None:
    db.execute(
        f"INSERT INTO plan_approvals ({_APPROVAL_COLS}) VALUES ({','.join('?' * 21)})",
        (
            a.id, a.kind.value, a.session_id, a.turn_id, a.tool_call_id, a.title, a.question,
            json.dumps(a.criteria) if a.criteria is not None else None, a.artifact_path,
            a.artifact_sha256, a.artifact_size, a.status.value, a.deadline,
            a.permission_mode.value if a.permission_mode else None, a.execution_id,
            a.execution_state.value, a.revises, a.feedback, a.created_at, a.resolved_at, a.context,
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
    context: str = "keep",
) -> bool:
    """pending -> ``status``; False (no change) if the row was no longer pending."""
    advance(ApprovalStatus.PENDING, status)
    execution_state = ExecutionState.QUEUED if execution_id else ExecutionState.NONE
    cur = db.execute(
        "UPDATE plan_approvals SET status = ?, permission_mode = ?, execution_id = ?,"
        " execution_state = ?, feedback = ?, resolved_at = ?, context = ? WHERE id = ? AND status = 'pending'",
        (
            status.value, permission_mode.value if permission_mode else None, execution_id,
            execution_state.value, feedback, now_iso(), context, approval_id,
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


def abort_queued_executions(db: sqlite3.Connection, *, turn_id: str | None = None,
                            session_id: str | None = None) -> list[str]:
    """Executions still queued, approved in ``turn_id`` (or in ``session_id``), become aborted;
    returns their approval ids. A queued execution whose submitting turn was aborted would
    otherwise wait for a dispatch that never comes, and keep its session busy forever."""
    column, value = ("turn_id", turn_id) if turn_id is not None else ("session_id", session_id)
    ids = [r[0] for r in db.execute(
        f"SELECT id FROM plan_approvals WHERE {column} = ? AND execution_state = 'queued'", (value,)
    )]
    for approval_id in ids:
        set_execution_state(db, approval_id, ExecutionState.QUEUED, ExecutionState.ABORTED)
    return ids


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

_REQUEST_COLS = "id, session_id, turn_id, tool_call_id, tool, args, status, created_at, resolved_at, preview"


def _request(row: Row) -> PermissionRequest:
    args = json.loads(row[5])
    return PermissionRequest(
        id=row[0], session_id=row[1], turn_id=row[2], tool_call_id=row[3], tool=row[4],
        args=args, status=PermissionStatus(row[6]), created_at=row[7], resolved_at=row[8],
        preview=json.loads(row[9]) if row[9] else None, escalated=is_escalation(row[4], args),
    )


def insert_request(db: sqlite3.Connection, r: PermissionRequest) -> None:
    db.execute(
        f"INSERT INTO permission_requests ({_REQUEST_COLS}) VALUES (?,?,?,?,?,?,?,?,?,?)",
        (r.id, r.session_id, r.turn_id, r.tool_call_id, r.tool, json.dumps(r.args), r.status.value,
         r.created_at, r.resolved_at, json.dumps(r.preview) if r.preview is not None else None),
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
