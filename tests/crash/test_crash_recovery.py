"""Crash tests, seed 003 §4 "startup recovery" and DESIGN's migrations rule.

Recovery runs before anything is served and is idempotent: killed midway and
run again, it reaches the state one uninterrupted run reaches, and a further
run changes nothing. A migration is one transaction with its ``user_version``
bump: killed or failing midway, the previous schema stays authoritative, a
failure refuses startup naming the migration, and the next open completes it.
"""

from __future__ import annotations

import shutil
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from crash_harness import assert_fail_closed, crash, rows, snapshot, transcript
from scenario import session, state

from pidesk.config import HostConfig
from pidesk.core.errors import StartupRefused
from pidesk.faults import Faults
from pidesk.host import Host
from pidesk.providers.scripted import ScriptedProvider
from pidesk.store.migrations import MIGRATIONS as ALL_MIGRATIONS

V1_TABLES = {"sessions", "turns", "messages", "permission_requests", "grants"}
V2_TABLES = V1_TABLES | {"plan_approvals"}
V3_TABLES = V2_TABLES | {"queue", "notifications", "audit"}
V6_TABLES = V3_TABLES | {"schedules", "schedule_runs"}
V14_TABLES = V6_TABLES | {"turn_changes"}
LATEST_TABLES = V14_TABLES
LATEST = len(ALL_MIGRATIONS)
MIGRATIONS = {"m002_plan_approvals": (1, V1_TABLES), "m003_queue_notifications_audit": (2, V2_TABLES),
              "m004_turn_queue_entry": (3, V3_TABLES), "m005_session_usage": (4, V3_TABLES),
              "m006_schedules": (5, V3_TABLES), "m007_indexes_for_growing_tables": (6, V6_TABLES),
              "m008_cache_read_write_usage": (7, V6_TABLES), "m009_turn_error_message": (8, V6_TABLES),
              "m010_permission_preview": (9, V6_TABLES), "m011_session_list_order": (10, V6_TABLES),
               "m012_context_window": (11, V6_TABLES), "m013_notification_pages": (12, V6_TABLES),
               "m014_turn_changes": (13, V6_TABLES)}


def test_every_migration_is_in_the_crash_matrix() -> None:
    """A migration added without a kill test inside it is a persistence point nobody checked."""
    assert list(MIGRATIONS) == [m.__name__ for m in ALL_MIGRATIONS[1:]]


def _schema(data_dir: Path) -> tuple[int, set[str]]:
    with closing(sqlite3.connect(data_dir / "index.db")) as db:
        version = db.execute("PRAGMA user_version").fetchone()[0]
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    return version, tables - {"sqlite_sequence"}


@pytest.mark.asyncio
@pytest.mark.parametrize("migration", MIGRATIONS, ids=MIGRATIONS)
async def test_design_migration_killed_midway_leaves_previous_schema_and_next_open_completes_it(
    migration: str, data_dir: Path, project: Path, provider: Any, make_host: Any
) -> None:
    previous, tables = MIGRATIONS[migration]
    crash("open_only", data_dir, project, f"migration.{migration}")
    assert _schema(data_dir) == (previous, tables)

    host = make_host()
    assert host.store.schema_version == LATEST
    assert _schema(data_dir) == (LATEST, LATEST_TABLES)
    s = await session(host, project)
    assert (await state(host, s["id"]))["session"]["status"] == "idle"
    assert_fail_closed(host, provider)


@pytest.mark.parametrize("migration", MIGRATIONS, ids=MIGRATIONS)
def test_design_failing_migration_refuses_startup_naming_it_and_keeps_the_old_schema(
    migration: str, data_dir: Path, provider: ScriptedProvider
) -> None:
    previous, tables = MIGRATIONS[migration]
    failing = HostConfig(data_dir=data_dir, faults=Faults(frozenset({f"migration.{migration}"}), "raise"))
    with pytest.raises(StartupRefused) as refused:
        Host.open(failing, provider)
    message = str(refused.value)
    assert f"migration {previous + 1} ({migration}) failed" in message
    assert f"left at schema {previous}" in message
    assert _schema(data_dir) == (previous, tables)

    with closing(sqlite3.connect(data_dir / "index.db")) as db, db:  # data an older host left behind
        db.execute("INSERT INTO sessions (id, title, root, created_at, updated_at) VALUES"
                   " ('s_old', 'old', '/tmp', '2026-01-01T00:00:00Z', '2026-01-01T00:00:00Z')")
    with pytest.raises(StartupRefused):
        Host.open(failing, provider)
    assert _schema(data_dir) == (previous, tables)
    with closing(sqlite3.connect(data_dir / "index.db")) as db:
        assert db.execute("SELECT id, title FROM sessions").fetchall() == [("s_old", "old")]

    host = Host.open(HostConfig(data_dir=data_dir), provider)
    try:
        assert host.store.schema_version == LATEST and _schema(data_dir) == (LATEST, LATEST_TABLES)
        assert rows(host, "SELECT id, title FROM sessions") == [("s_old", "old")]
    finally:
        host.store.close()


@pytest.mark.asyncio
@pytest.mark.parametrize("where", ["after_first_reconcile_step", "inside_interrupt_transaction"])
async def test_seed003_s4_startup_recovery_killed_midway_is_idempotent(
    where: str, tmp_path: Path, data_dir: Path, project: Path, provider: Any, make_host: Any
) -> None:
    acks = crash("messy_crash", data_dir, project, "message.after_transcript", nth=4)
    with open(transcript(data_dir, acks["r"]), "ab") as f:  # and a torn write: two reconcile steps
        f.write(b'{"t":"message","id":"m_torn"')
    twin = tmp_path / "twin"
    shutil.copytree(data_dir, twin)  # the same crash, recovered once without interruption
    crash("recovery_killed", data_dir, project, "none", where=where)

    host = make_host()
    boot = host.recovery.boot  # what the killed run had not yet committed: one reconcile step, or none
    left = boot.indexed_from_outbox + len(boot.quarantined)
    assert (left > 0) if where == "after_first_reconcile_step" else (left == 0)
    assert host.recovery.interrupted == {"approvals": 1, "executions": 0, "turns": 3, "permissions": 0}
    twin_provider = ScriptedProvider()
    twin_host = Host.open(HostConfig(data_dir=twin), twin_provider)
    try:
        assert snapshot(host, data_dir) == snapshot(twin_host, twin)
        assert_fail_closed(twin_host, twin_provider)
    finally:
        await twin_host.close()
    assert_fail_closed(host, provider)

    approval = await host.call("plans.get", {"approvalId": acks["approval"]})
    assert approval["status"] == "interrupted"
    assert (await state(host, acks["p"]))["session"]["planState"] == "planning"
    assert [e["id"] for e in (await host.call("agent.queue.list", {"sessionId": acks["r"]}))["entries"]] == [
        acks["entry"]]
    assert host.recovery.held_queues == [acks["r"]]
    q = await state(host, acks["q"])
    assert [m["role"] for m in q["messages"]] == ["user"]
    for sid in (acks["p"], acks["q"], acks["r"]):
        turns = (await host.call("session.turns", {"sessionId": sid}))["turns"]
        assert [(t["reason"], t["errorCode"]) for t in turns] == [("aborted", "INTERRUPTED")]

    before = snapshot(host, data_dir)
    await host.close()
    again = make_host()
    assert again.recovery.interrupted == {"approvals": 0, "executions": 0, "turns": 0, "permissions": 0}
    boot = again.recovery.boot
    assert (boot.restored_sessions, boot.indexed_from_outbox, boot.dropped_index_rows, boot.quarantined) == (
        [], 0, 0, [])
    assert snapshot(again, data_dir) == before
    assert_fail_closed(again, provider)
