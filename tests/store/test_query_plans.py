"""Statements that run on every focus, list, delete or boot search an index; none scans a
table that grows with every turn (messages, turns, notifications, permission requests,
scheduled runs).

Each operation runs through its real ``repo`` function on a migrated index; every statement
SQLite executes meanwhile (its trace, with the values bound) is asked for its query plan.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from pidesk.store import repo
from pidesk.store.db import Database

GROWING = ("messages", "turns", "notifications", "permission_requests", "schedule_runs", "turn_changes")


def scans_of(path: Path, operation: Callable[[sqlite3.Connection], object]) -> list[str]:
    """The plan lines of ``operation``'s statements that scan a growing table (a scan of a
    partial index is fine: it holds only the rows the statement is after)."""
    database = Database(path)
    database.migrate()
    conn = database.conn
    partial = {name for name, sql in conn.execute("SELECT name, sql FROM sqlite_master WHERE type = 'index'")
               if sql and " WHERE " in sql.upper()}
    executed: list[str] = []
    conn.set_trace_callback(executed.append)
    try:
        conn.execute("BEGIN")
        operation(conn)
        conn.execute("ROLLBACK")
    finally:
        conn.set_trace_callback(None)
    statements = [s for s in executed if s.split(None, 1)[0].upper() in {"SELECT", "UPDATE", "DELETE", "WITH"}]
    assert statements, "the operation ran no statement"
    found = []
    for statement in statements:
        names = {alias: table for table, alias in re.findall(rf"\b({'|'.join(GROWING)})\s+(?:AS\s+)?(\w+)", statement)}
        for *_, detail in conn.execute("EXPLAIN QUERY PLAN " + statement):
            words = detail.split()
            if words[0] != "SCAN" or words[-1] in partial:
                continue
            if names.get(words[1], words[1]) in GROWING:
                found.append(f"{detail}  <-  {statement}")
    database.close()
    return found


OPERATIONS: dict[str, Callable[[sqlite3.Connection], object]] = {
    "list unseen notifications": lambda db: repo.notifications(db, unseen_only=True),
    "mark a session's notifications seen": lambda db: repo.mark_seen(db, session_id="s_1"),
    "delete a session (its rows cascade)": lambda db: repo.delete_session(db, "s_1"),
    "startup recovery": repo.interrupt_everything,
    "scheduled runs interrupted at boot": repo.interrupt_runs,
    "a page of messages": lambda db: repo.message_page(db, "s_1", None, 200),
    "a message by id": lambda db: repo.message_location(db, "s_1", "m_1"),
    "a session's turns": lambda db: repo.list_turns(db, "s_1", 50),
    "the running turns": repo.running_turns,
    "an aborted turn's waits": lambda db: repo.interrupt_turn_waits(db, "t_1"),
    "pending permission requests": lambda db: repo.pending_requests(db),
    "a session's pending permission requests": lambda db: repo.pending_requests(db, "s_1"),
    "pending approvals": lambda db: repo.approvals(db, pending=True),
    "a session's approvals": lambda db: repo.approvals(db, session_id="s_1"),
    "queued executions": lambda db: repo.queued_executions(db),
    "an open contract": lambda db: repo.has_open_contract(db, "s_1"),
    "the sessions list": lambda db: repo.list_sessions(db),
    "a session's audit": lambda db: repo.audit_entries(db, "s_1", 100),
    "a page of a session's changes": lambda db: repo.change_items(db, "s_1", ("2026-01-01T00:00:00.000Z", "t_1"), 100),
    "a session's changes": lambda db: repo.change_items(db, "s_1"),
    "one turn's changes": lambda db: repo.change_item(db, "s_1", "t_1"),
    "a turn's prompt": lambda db: repo.first_user_messages(db, "s_1", ["t_1"]),
}


@pytest.mark.parametrize("operation", OPERATIONS, ids=OPERATIONS)
def test_an_operation_that_runs_often_scans_no_table_that_grows_with_every_turn(tmp_path: Path, operation: str):
    assert scans_of(tmp_path / "index.db", OPERATIONS[operation]) == []


@pytest.mark.parametrize("project", [None, "/p"])
def test_a_page_of_sessions_is_read_in_index_order_not_sorted(tmp_path: Path, project: str | None):
    """Issue 29 item 7: a page of session.list reads its rows in (created_at, id) order from an index —
    no sort of the whole table (at 10,000 sessions each list sorted them all)."""
    database = Database(tmp_path / "index.db")
    database.migrate()
    executed: list[str] = []
    database.conn.set_trace_callback(executed.append)
    repo.list_sessions(database.conn, project, limit=50, after=("2026-01-01T00:00:00.000Z", "s_x"), newest_first=True)
    database.conn.set_trace_callback(None)
    [statement] = [s for s in executed if s.startswith("SELECT")]
    plan = [row[-1] for row in database.conn.execute("EXPLAIN QUERY PLAN " + statement)]
    assert any("USING INDEX sessions_" in line or "USING COVERING INDEX sessions_" in line for line in plan), plan
    assert not any("TEMP B-TREE" in line for line in plan), plan
    database.close()
