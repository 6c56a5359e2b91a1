"""Crash tests, seed 003 §4: session rows, deletes, mode fields and fork snapshots.

Each test runs a child (crash_driver.py) that SIGKILLs itself at one named
persistence point, then opens a fresh Host on the same data directory and
checks that nothing acknowledged was lost, duplicated or replayed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from crash_harness import assert_fail_closed, audit_actions, crash, rows, sha256, transcript
from scenario import ended, prompt, state

from pidesk.core.errors import NotFound


def _content(messages: list[dict[str, Any]]) -> list[tuple[int, str, Any]]:
    return [(m["seq"], m["role"], m["content"]) for m in messages]


@pytest.mark.asyncio
@pytest.mark.parametrize("temporary", [False, True], ids=["project", "temporary"])
async def test_seed003_s4_session_transcript_without_row_is_restored_once_at_boot(
    temporary: bool, data_dir: Path, project: Path, provider: Any, make_host: Any
) -> None:
    acks = crash("create_session", data_dir, project, "session.after_transcript", temporary=temporary)

    host = make_host()
    restored = host.recovery.boot.restored_sessions
    assert len(restored) == 1 and restored[0] != acks["kept"]
    sid = restored[0]
    listed = await host.call("session.list")
    assert sorted(s["id"] for s in listed["sessions"]) == sorted([acks["kept"], sid])
    got = await state(host, sid)
    s = got["session"]
    assert (s["status"], s["currentTurnId"], got["messages"]) == ("idle", None, [])
    if temporary:  # a path-less session keeps its own scratch root and no projectPath
        assert s["projectPath"] is None
        assert Path(s["root"]) == data_dir / "scratch" / sid and Path(s["root"]).is_dir()
        assert (s["mode"], s["title"]) == ("agent", "scratch work")
    else:
        assert s["projectPath"] == s["root"] == str(project.resolve())
        assert (s["mode"], s["planState"], s["title"]) == ("plan", "planning", "restored")
    assert "session.restored" in audit_actions(host, sid)
    assert_fail_closed(host, provider)

    sub = host.subscribe()
    started = await prompt(host, sid, "the restored session works")
    await ended(sub, started["turnId"])
    assert [m["seq"] for m in (await state(host, sid))["messages"]] == [1, 2]

    await host.close()
    again = make_host()
    assert again.recovery.boot.restored_sessions == []
    assert len((await again.call("session.list"))["sessions"]) == 2


@pytest.mark.asyncio
async def test_seed003_s4_delete_killed_after_rename_is_finished_at_boot(
    data_dir: Path, project: Path, provider: Any, make_host: Any
) -> None:
    acks = crash("delete_session", data_dir, project, "session.delete.after_rename")
    doomed, kept = acks["doomed"], acks["kept"]
    assert transcript(data_dir, doomed).with_suffix(".jsonl.deleted").exists()  # the crash's tombstone

    host = make_host()
    assert host.recovery.boot.finished_deletes == [doomed]
    with pytest.raises(NotFound):
        await state(host, doomed)
    assert [p.name for p in (data_dir / "transcripts").iterdir() if p.name.startswith(doomed)] == []
    for table in ("sessions", "turns", "messages", "notifications"):
        column = "id" if table == "sessions" else "session_id"
        assert rows(host, f"SELECT 1 FROM {table} WHERE {column} = ?", doomed) == []
    assert [s["id"] for s in (await host.call("session.list"))["sessions"]] == [kept]
    assert sha256(transcript(data_dir, kept)) == acks["keptSha"]
    assert [m["role"] for m in (await state(host, kept))["messages"]] == ["user", "assistant"]
    assert_fail_closed(host, provider)


@pytest.mark.asyncio
async def test_seed003_s4_user_mode_and_permission_change_survive_a_later_crash(
    data_dir: Path, project: Path, provider: Any, make_host: Any
) -> None:
    acks = crash("mode_change", data_dir, project, "turn.after_start")

    host = make_host()
    s = (await state(host, acks["session"]))["session"]
    assert (s["mode"], s["permissionMode"], s["planState"]) == ("plan", "auto", "planning")
    actions = audit_actions(host, acks["session"])
    assert actions.count("mode.changed") == 1 and actions.count("permission_mode.changed") == 1
    turns = (await host.call("session.turns", {"sessionId": acks["session"]}))["turns"]
    assert [(t["reason"], t["errorCode"]) for t in turns] == [("aborted", "INTERRUPTED")]
    assert_fail_closed(host, provider)


@pytest.mark.asyncio
async def test_seed003_s4_agent_entered_plan_mode_survives_a_crash_before_its_tool_row_is_indexed(
    data_dir: Path, project: Path, provider: Any, make_host: Any
) -> None:
    acks = crash("agent_mode_change", data_dir, project, "message.after_transcript", nth=3)

    host = make_host()
    got = await state(host, acks["session"])
    assert (got["session"]["mode"], got["session"]["planState"]) == ("plan", "planning")
    details = [json.loads(d) for (d,) in rows(host, "SELECT detail FROM audit WHERE action = 'mode.changed'")]
    assert details == [{"cause": "agent", "frm": "agent", "to": "plan"}]
    assert host.recovery.boot.indexed_from_outbox >= 1  # the killed line, and any rows still written behind
    assert [m["role"] for m in got["messages"]] == ["user", "assistant", "tool"]
    assert got["messages"][2]["content"][0]["name"] == "EnterPlanMode"
    assert_fail_closed(host, provider)


@pytest.mark.asyncio
async def test_seed003_s4_fork_then_crash_leaves_child_whole_and_source_byte_identical(
    data_dir: Path, project: Path, provider: Any, make_host: Any
) -> None:
    acks = crash("fork_then_crash", data_dir, project, "turn.after_start")
    source = acks["source"]
    assert sha256(transcript(data_dir, source)) == acks["sourceSha"]

    host = make_host()
    src = await state(host, source)
    assert [m["id"] for m in src["messages"]] == acks["sourceMessages"]
    whole, partial = await state(host, acks["whole"]), await state(host, acks["partial"])
    assert _content(whole["messages"]) == _content(src["messages"])
    assert _content(partial["messages"]) == _content(src["messages"][:2])  # inclusive of the selected message
    for child in (whole, partial):
        assert {m["id"] for m in child["messages"]}.isdisjoint(acks["sourceMessages"])
        assert {m["turnId"] for m in child["messages"]} == {None}
        assert child["session"]["status"] == "idle"
    assert whole["session"]["forkedFrom"] == {"sessionId": source, "throughMessageId": None}
    assert partial["session"]["forkedFrom"] == {"sessionId": source, "throughMessageId": acks["sourceMessages"][1]}
    turns = (await host.call("session.turns", {"sessionId": acks["whole"]}))["turns"]
    assert [(t["reason"], t["errorCode"]) for t in turns] == [("aborted", "INTERRUPTED")]
    source_turns = (await host.call("session.turns", {"sessionId": source}))["turns"]
    assert [t["reason"] for t in source_turns] == ["completed", "completed"]
    assert_fail_closed(host, provider)


@pytest.mark.asyncio
async def test_seed003_s4_fork_killed_before_its_index_row_is_restored_whole_never_partial(
    data_dir: Path, project: Path, provider: Any, make_host: Any
) -> None:
    acks = crash("fork_crash_midway", data_dir, project, "session.after_transcript")
    source = acks["source"]
    assert sha256(transcript(data_dir, source)) == acks["sourceSha"]

    host = make_host()
    restored = host.recovery.boot.restored_sessions
    assert len(restored) == 1
    child = await state(host, restored[0])
    src = await state(host, source)
    assert [m["id"] for m in src["messages"]] == acks["sourceMessages"]
    assert _content(child["messages"]) == _content(src["messages"][:2])
    assert child["session"]["forkedFrom"] == {"sessionId": source, "throughMessageId": acks["through"]}
    assert child["session"]["status"] == "idle"
    assert len((await host.call("session.list"))["sessions"]) == 2
    assert_fail_closed(host, provider)
