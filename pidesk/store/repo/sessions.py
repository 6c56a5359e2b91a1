"""Sessions, their message index rows, and turns."""

from __future__ import annotations

import sqlite3
from typing import Any

from pidesk.core.modes import (
    Mode,
    PermissionMode,
    SessionStatus,
    TurnOrigin,
    TurnReason,
    TurnState,
    plan_state,
)
from pidesk.core.records import (
    ForkedFrom,
    Session,
    Turn,
    Usage,
)
from pidesk.core.transitions import advance
from pidesk.ids import now_iso
from pidesk.store.repo.keyset import keyset

Row = tuple[Any, ...]


# ---- sessions ---------------------------------------------------------------------

_SESSION_COLS = (
    "s.id, s.title, s.project_path, s.root, s.mode, s.permission_mode, s.status, "
    "s.current_turn_id, s.forked_from, s.forked_through, s.created_at, s.updated_at, "
    "EXISTS (SELECT 1 FROM plan_approvals a WHERE a.session_id = s.id AND a.status = 'pending'), "
    "s.input_tokens, s.output_tokens, s.cache_tokens, s.cache_read_tokens, s.cache_write_tokens"
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
        usage=Usage(input_tokens=row[13], output_tokens=row[14], cache_tokens=row[15], cache_read_tokens=row[16],
                    cache_write_tokens=row[17]),
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


def list_sessions(db: sqlite3.Connection, project_path: str | None = None, *, limit: int = -1,
                  after: tuple[str, str] | None = None, newest_first: bool = False) -> list[Session]:
    """Sessions in creation order (``newest_first``: the other way), those of ``project_path`` only
    when given; at most ``limit`` (-1: all), starting past the session whose (created_at, id) is
    ``after``."""
    mine = ([], []) if project_path is None else (["s.project_path = ?"], [project_path])
    clause, args = keyset("s.", *mine, after, newest_first, limit)
    return [_session(r) for r in db.execute(f"SELECT {_SESSION_COLS} FROM sessions s {clause}", args).fetchall()]


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


def message_spans(db: sqlite3.Connection, session_id: str) -> list[tuple[str, int, int]]:
    """(id, offset, length) of every indexed message of a session: where its transcript holds it."""
    return [(r[0], r[1], r[2]) for r in db.execute(
        "SELECT id, offset, length FROM messages WHERE session_id = ? ORDER BY seq", (session_id,))]


def count_sessions(db: sqlite3.Connection) -> int:
    return int(db.execute("SELECT count(*) FROM sessions").fetchone()[0])


# ---- messages (index rows; content lives in the transcript) -------------------------


def insert_message_rows(db: sqlite3.Connection, rows: list[tuple[str, str, str | None, int, str, int, int, str]]) -> None:
    """rows: (id, session_id, turn_id, seq, role, offset, length, created_at).

    As many rows go in one statement as SQLite takes parameters for: ``executemany``
    would run one step per row, and each step hands the GIL to another thread (the
    write-behind index commits hundreds of rows while the appending threads run).
    """
    per_statement = max(1, db.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER) // 8)
    for start in range(0, len(rows), per_statement):
        chunk = rows[start : start + per_statement]
        db.execute(
            "INSERT OR IGNORE INTO messages (id, session_id, turn_id, seq, role, offset, length, created_at) VALUES "
            + ",".join(["(?,?,?,?,?,?,?,?)"] * len(chunk)),
            [value for row in chunk for value in row],
        )


def advance_watermark(db: sqlite3.Connection, session_id: str, last_seq: int, indexed_bytes: int) -> None:
    advance_watermarks(db, {session_id: (last_seq, indexed_bytes)})


def advance_watermarks(db: sqlite3.Connection, marks: dict[str, tuple[int, int]]) -> None:
    """Raise each session's (last_seq, indexed_bytes) to at least the given values, in one statement."""
    items = list(marks.items())
    per_statement = max(1, db.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER) // 3)
    for start in range(0, len(items), per_statement):
        chunk = items[start : start + per_statement]
        db.execute(
            "WITH marks(id, last_seq, indexed_bytes) AS (VALUES " + ",".join(["(?,?,?)"] * len(chunk)) + ")"
            " UPDATE sessions SET"
            " last_seq = max(last_seq, (SELECT m.last_seq FROM marks m WHERE m.id = sessions.id)),"
            " indexed_bytes = max(indexed_bytes, (SELECT m.indexed_bytes FROM marks m WHERE m.id = sessions.id))"
            " WHERE id IN (SELECT id FROM marks)",
            [value for session_id, (seq, end) in chunk for value in (session_id, seq, end)],
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
    " input_tokens, output_tokens, cache_tokens, cache_read_tokens, cache_write_tokens, error_message"
)


def _turn(row: Row) -> Turn:
    return Turn(
        id=row[0], session_id=row[1], seq=row[2], origin=TurnOrigin(row[3]), state=TurnState(row[4]),
        reason=TurnReason(row[5]) if row[5] else None, error_code=row[6], started_at=row[7],
        ended_at=row[8], usage=Usage(input_tokens=row[9], output_tokens=row[10], cache_tokens=row[11],
                                     cache_read_tokens=row[12], cache_write_tokens=row[13]),
        error_message=row[14],
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


def end_turn_row(db: sqlite3.Connection, turn_id: str, reason: TurnReason, error_code: str | None,
                 error_message: str | None = None) -> bool:
    """Move a running turn to ended; False (and no change) if it already ended."""
    advance(TurnState.RUNNING, TurnState.ENDED)
    cur = db.execute(
        "UPDATE turns SET state = 'ended', reason = ?, error_code = ?, error_message = ?, ended_at = ?"
        " WHERE id = ? AND state = 'running'",
        (reason.value, error_code, error_message, now_iso(), turn_id),
    )
    return cur.rowcount == 1


def add_usage(db: sqlite3.Connection, turn_id: str, usage: Usage) -> None:
    """Count tokens on the turn and on its session, in the caller's transaction."""
    counts = (usage.input_tokens, usage.output_tokens, usage.cache_tokens, usage.cache_read_tokens,
              usage.cache_write_tokens)
    columns = ("input_tokens = input_tokens + ?, output_tokens = output_tokens + ?, cache_tokens = cache_tokens + ?,"
               " cache_read_tokens = cache_read_tokens + ?, cache_write_tokens = cache_write_tokens + ?")
    db.execute(f"UPDATE turns SET {columns} WHERE id = ?", (*counts, turn_id))
    db.execute(f"UPDATE sessions SET {columns} WHERE id = (SELECT session_id FROM turns WHERE id = ?)",
               (*counts, turn_id))


def add_session_usage(db: sqlite3.Connection, session_id: str, usage: Usage) -> None:
    """Count tokens spent outside any turn (``session.compact``'s summary request) on the session."""
    db.execute("UPDATE sessions SET input_tokens = input_tokens + ?, output_tokens = output_tokens + ?,"
               " cache_tokens = cache_tokens + ?, cache_read_tokens = cache_read_tokens + ?,"
               " cache_write_tokens = cache_write_tokens + ? WHERE id = ?",
               (usage.input_tokens, usage.output_tokens, usage.cache_tokens, usage.cache_read_tokens,
                usage.cache_write_tokens, session_id))


def set_context_tokens(db: sqlite3.Connection, session_id: str, tokens: int) -> None:
    """The input size of the session's last model request (or, after a compaction, the estimate of its next)."""
    db.execute("UPDATE sessions SET context_tokens = ? WHERE id = ?", (tokens, session_id))


def context_tokens(db: sqlite3.Connection, session_id: str) -> int:
    """The input size of the session's last model request (0: none yet)."""
    row = db.execute("SELECT context_tokens FROM sessions WHERE id = ?", (session_id,)).fetchone()
    return int(row[0]) if row else 0


def running_turns(db: sqlite3.Connection) -> list[Row]:
    """(turn id, session id, approval id) of every turn still marked running."""
    return db.execute("SELECT id, session_id, approval_id FROM turns WHERE state = 'running'").fetchall()
