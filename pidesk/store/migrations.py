"""The index schema as ordered, named migrations.

Each migration runs in its own ``BEGIN IMMEDIATE`` transaction together with the
``PRAGMA user_version`` bump, so a migration that fails — or a process killed
midway — leaves the previous schema authoritative. Never edit a migration that
has shipped; add the next one.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

Migration = Callable[[sqlite3.Connection], None]
MIGRATIONS: list[Migration] = []


def migration(fn: Migration) -> Migration:
    MIGRATIONS.append(fn)
    return fn


def run_script(db: sqlite3.Connection, script: str) -> None:
    """Run a multi-statement script inside the caller's transaction.

    ``executescript`` would COMMIT first; splitting on complete statements keeps
    the whole migration in one transaction (trigger bodies included).
    """
    statement = ""
    for line in script.splitlines(keepends=True):
        statement += line
        if sqlite3.complete_statement(statement):
            db.execute(statement)
            statement = ""
    if statement.strip():
        raise ValueError(f"incomplete SQL statement in migration: {statement!r}")


@migration
def m001_sessions_turns_messages(db: sqlite3.Connection) -> None:
    run_script(
        db,
        """
        CREATE TABLE sessions (
            id TEXT PRIMARY KEY,
            title TEXT NOT NULL,
            project_path TEXT,
            root TEXT NOT NULL,
            mode TEXT NOT NULL DEFAULT 'agent',
            permission_mode TEXT NOT NULL DEFAULT 'ask',
            status TEXT NOT NULL DEFAULT 'idle',
            current_turn_id TEXT,
            forked_from TEXT,
            forked_through TEXT,
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL,
            last_seq INTEGER NOT NULL DEFAULT 0,
            indexed_bytes INTEGER NOT NULL DEFAULT 0
        );
        CREATE INDEX sessions_project ON sessions(project_path);
        CREATE TABLE turns (
            id TEXT PRIMARY KEY,
            session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
            seq INTEGER NOT NULL,
            origin TEXT NOT NULL,
            state TEXT NOT NULL,
            reason TEXT,
            error_code TEXT,
            started_at TEXT NOT NULL,
            ended_at TEXT,
            input_tokens INTEGER NOT NULL DEFAULT 0,
            output_tokens INTEGER NOT NULL DEFAULT 0,
            cache_tokens INTEGER NOT NULL DEFAULT 0,
            approval_id TEXT
        );
        CREATE INDEX turns_session ON turns(session_id, seq);
        CREATE INDEX turns_running ON turns(state) WHERE state = 'running';
        CREATE TABLE messages (
            id TEXT PRIMARY KEY,
            session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
            turn_id TEXT,
            seq INTEGER NOT NULL,
            role TEXT NOT NULL,
            offset INTEGER NOT NULL,
            length INTEGER NOT NULL,
            created_at TEXT NOT NULL,
            UNIQUE (session_id, seq)
        );
        CREATE TABLE permission_requests (
            id TEXT PRIMARY KEY,
            session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
            turn_id TEXT NOT NULL,
            tool_call_id TEXT NOT NULL,
            tool TEXT NOT NULL,
            args TEXT NOT NULL,
            status TEXT NOT NULL,
            created_at TEXT NOT NULL,
            resolved_at TEXT
        );
        CREATE INDEX permission_requests_pending ON permission_requests(status)
            WHERE status = 'pending';
        CREATE TABLE grants (
            session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
            tool TEXT NOT NULL,
            created_at TEXT NOT NULL,
            PRIMARY KEY (session_id, tool)
        );
        """
    )


@migration
def m002_plan_approvals(db: sqlite3.Connection) -> None:
    run_script(
        db,
        """
        CREATE TABLE plan_approvals (
            id TEXT PRIMARY KEY,
            kind TEXT NOT NULL,
            session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
            turn_id TEXT NOT NULL,
            tool_call_id TEXT NOT NULL,
            title TEXT NOT NULL,
            question TEXT NOT NULL,
            criteria TEXT,
            artifact_path TEXT NOT NULL,
            artifact_sha256 TEXT NOT NULL,
            artifact_size INTEGER NOT NULL,
            status TEXT NOT NULL,
            deadline TEXT NOT NULL,
            permission_mode TEXT,
            execution_id TEXT UNIQUE,
            execution_state TEXT NOT NULL DEFAULT 'none',
            revises TEXT,
            feedback TEXT,
            created_at TEXT NOT NULL,
            resolved_at TEXT
        );
        CREATE INDEX plan_approvals_session ON plan_approvals(session_id, created_at);
        CREATE INDEX plan_approvals_pending ON plan_approvals(status) WHERE status = 'pending';
        CREATE INDEX plan_approvals_execution ON plan_approvals(execution_state)
            WHERE execution_state IN ('queued', 'running');
        """
    )


@migration
def m003_queue_notifications_audit(db: sqlite3.Connection) -> None:
    run_script(
        db,
        """
        CREATE TABLE queue (
            id TEXT PRIMARY KEY,
            session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
            position INTEGER NOT NULL,
            text TEXT NOT NULL,
            attachments TEXT NOT NULL,
            created_at TEXT NOT NULL
        );
        CREATE INDEX queue_session ON queue(session_id, position);
        CREATE TABLE notifications (
            id TEXT PRIMARY KEY,
            session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
            turn_id TEXT NOT NULL UNIQUE,
            kind TEXT NOT NULL,
            created_at TEXT NOT NULL,
            seen_at TEXT
        );
        CREATE TABLE audit (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            session_id TEXT,
            turn_id TEXT,
            action TEXT NOT NULL,
            detail TEXT NOT NULL,
            created_at TEXT NOT NULL
        );
        CREATE INDEX audit_session ON audit(session_id, id);
        CREATE TRIGGER audit_append_only_update BEFORE UPDATE ON audit
            BEGIN SELECT RAISE(ABORT, 'audit is append-only'); END;
        CREATE TRIGGER audit_append_only_delete BEFORE DELETE ON audit
            BEGIN SELECT RAISE(ABORT, 'audit is append-only'); END;
        """
    )


@migration
def m004_turn_queue_entry(db: sqlite3.Connection) -> None:
    """The queue entry a turn is consuming, so a crash between its start and its prompt's
    line can neither lose the entry nor run it twice (recovery decides from the transcript)."""
    db.execute("ALTER TABLE turns ADD COLUMN queue_entry TEXT")


@migration
def m005_session_usage(db: sqlite3.Connection) -> None:
    """Usage counters on the session row, so reading a session does not sum its turns."""
    for column in ("input_tokens", "output_tokens", "cache_tokens"):
        db.execute(f"ALTER TABLE sessions ADD COLUMN {column} INTEGER NOT NULL DEFAULT 0")
    db.execute(
        "UPDATE sessions SET"
        " input_tokens = (SELECT coalesce(sum(input_tokens), 0) FROM turns WHERE session_id = sessions.id),"
        " output_tokens = (SELECT coalesce(sum(output_tokens), 0) FROM turns WHERE session_id = sessions.id),"
        " cache_tokens = (SELECT coalesce(sum(cache_tokens), 0) FROM turns WHERE session_id = sessions.id)"
    )


@migration
def m006_schedules(db: sqlite3.Connection) -> None:
    run_script(
        db,
        """
        CREATE TABLE schedules (
            id TEXT PRIMARY KEY,
            name TEXT NOT NULL,
            cron TEXT NOT NULL,
            project_path TEXT NOT NULL,
            prompt TEXT NOT NULL,
            mode TEXT NOT NULL,
            permission_mode TEXT NOT NULL,
            enabled INTEGER NOT NULL DEFAULT 1,
            next_run_at TEXT NOT NULL,
            created_at TEXT NOT NULL
        );
        CREATE TABLE schedule_runs (
            id TEXT PRIMARY KEY,
            schedule_id TEXT NOT NULL REFERENCES schedules(id) ON DELETE CASCADE,
            at TEXT NOT NULL,
            status TEXT NOT NULL,
            error_code TEXT,
            session_id TEXT,
            turn_id TEXT,
            created_at TEXT NOT NULL
        );
        CREATE INDEX schedule_runs_schedule ON schedule_runs(schedule_id, created_at);
        """,
    )


@migration
def m007_indexes_for_growing_tables(db: sqlite3.Connection) -> None:
    """Indexes for statements that scanned tables growing with every turn: the unseen
    notifications (listed by the UI), a session's unseen ones (marked seen when it is
    focused), the cascade that deletes a session's notifications and permission
    requests, and the scheduled runs still running at boot. At 50k rows each these
    took 5-23 ms; with them, well under one."""
    run_script(
        db,
        """
        CREATE INDEX notifications_session ON notifications(session_id, seen_at);
        CREATE INDEX notifications_unseen ON notifications(created_at) WHERE seen_at IS NULL;
        CREATE INDEX permission_requests_session ON permission_requests(session_id);
        CREATE INDEX schedule_runs_running ON schedule_runs(status) WHERE status = 'running';
        """,
    )


@migration
def m008_cache_read_write_usage(db: sqlite3.Connection) -> None:
    """Cache reads and cache writes counted apart, on turns and sessions (issue 16 §3): a write
    costs more than plain input, a read a tenth of it. ``cache_tokens`` stays their sum; rows
    from before are left at 0 for both (which of the two they were was never recorded)."""
    for table in ("turns", "sessions"):
        for column in ("cache_read_tokens", "cache_write_tokens"):
            db.execute(f"ALTER TABLE {table} ADD COLUMN {column} INTEGER NOT NULL DEFAULT 0")


@migration
def m009_turn_error_message(db: sqlite3.Connection) -> None:
    """Why an ``error`` turn failed, for a person: the provider's status and message, the
    connection failure, the retries spent (PROTOCOL.md "Additions": Turn.errorMessage).
    Turns that ended before it have none."""
    db.execute("ALTER TABLE turns ADD COLUMN error_message TEXT")


@migration
def m010_permission_preview(db: sqlite3.Connection) -> None:
    """A Write or Edit request's preview (its diff), computed once when it is asked and kept with it:
    recomputed for every ``permissions.pending`` and ``session.get`` it froze the host for seconds on a
    big file (issue 29). JSON; requests from before have none."""
    db.execute("ALTER TABLE permission_requests ADD COLUMN preview TEXT")


@migration
def m011_session_list_order(db: sqlite3.Connection) -> None:
    """``session.list`` pages by (created_at, id), for all sessions and for one project's (issue 29/33:
    at 10,000 sessions every list sorted the whole table)."""
    db.execute("CREATE INDEX sessions_created ON sessions(created_at, id)")
    db.execute("CREATE INDEX sessions_project_created ON sessions(project_path, created_at, id)")


@migration
def m012_context_window(db: sqlite3.Connection) -> None:
    """The model's window as the session last used it (issue 30): ``context_tokens`` the input size of
    its last model request (the provider's count where it gave one); and the context an approval asked
    for its execution (``keep``, ``compact``, ``fresh``). (How many compactions a session had is read
    from its transcript, where each is a message: a count here could disagree after a crash.)"""
    db.execute("ALTER TABLE sessions ADD COLUMN context_tokens INTEGER NOT NULL DEFAULT 0")
    db.execute("ALTER TABLE plan_approvals ADD COLUMN context TEXT NOT NULL DEFAULT 'keep'")


@migration
def m013_notification_pages(db: sqlite3.Connection) -> None:
    """``notifications.list`` pages newest first by (created_at, id), all of them or the unseen ones, and
    old ones are pruned by created_at (issue 33: at 100,000 every list read and sent the whole table). The
    unseen index gains the id and replaces m007's."""
    run_script(
        db,
        """
        CREATE INDEX notifications_created ON notifications(created_at, id);
        DROP INDEX notifications_unseen;
        CREATE INDEX notifications_unseen ON notifications(created_at, id) WHERE seen_at IS NULL;
        """,
    )


@migration
def m014_turn_changes(db: sqlite3.Connection) -> None:
    """What each turn (and each revert) changed in the workspace, one row each (issue 33 §1):
    ``session.changes`` read the checkpoint journal and ran git for every turn of the session on
    each call (21-26 s at 1,000 turns, under the project's lock). ``files`` is JSON — ``[{path,
    status, additions, deletions, binary?, tooLarge?, diff?}]``, ``diff`` only where it is not
    git's to make (a sentence) — or NULL: not worked out yet (a revert found in the journal), done
    when it is first read. ``before_tree``/``after_tree`` are the shadow repository's trees a
    file's diff is made from. Turns from before have no row: the first read works theirs out
    from the journal. (Named m014: m013 is another change's; each only adds.)"""
    run_script(
        db,
        """
        CREATE TABLE turn_changes (
            id TEXT PRIMARY KEY,
            session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
            at TEXT NOT NULL,
            revert_of TEXT,
            prompt TEXT,
            before_tree TEXT,
            after_tree TEXT,
            files TEXT
        );
        CREATE INDEX turn_changes_session ON turn_changes(session_id, at, id);
        CREATE INDEX turns_session_started ON turns(session_id, started_at, id);
        """,
    )
