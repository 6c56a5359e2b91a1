"""Crash tests, seed 003 §4: two-step message persistence, smart Stop cuts, torn tails.

A message is an fsynced transcript line first and an index row second; a crash
between leaves the line in the outbox, which boot indexes exactly once. A smart
Stop cuts the transcript first and drops the index rows second; boot finishes
the cut. A torn tail is quarantined and reported, never silently dropped.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from crash_harness import ATTACHMENT, assert_fail_closed, audit_actions, crash, rows, transcript
from scenario import ended, prompt, session, state


@pytest.mark.asyncio
async def test_seed003_s4_user_line_fsynced_before_its_index_row_is_indexed_exactly_once_after_crash(
    data_dir: Path, project: Path, provider: Any, make_host: Any
) -> None:
    acks = crash("user_message", data_dir, project, "message.after_transcript")
    sid = acks["session"]
    raw = transcript(data_dir, sid).read_bytes()
    assert ATTACHMENT["data"].encode() not in raw  # transient base64 is never a persistence field

    host = make_host()
    assert host.recovery.boot.indexed_from_outbox >= 1  # the killed line, and any rows still written behind
    messages = (await state(host, sid))["messages"]
    assert [m["id"] for m in messages[:2]] == acks["first"]
    assert [(m["seq"], m["role"]) for m in messages] == [(1, "user"), (2, "assistant"), (3, "user")]
    expected_attachment = {"type": "attachment", **{k: v for k, v in ATTACHMENT.items() if k != "data"}}
    assert messages[2]["content"] == [{"type": "text", "text": "second, with a screenshot"}, expected_attachment]
    turns = (await host.call("session.turns", {"sessionId": sid}))["turns"]
    assert [(t["reason"], t["errorCode"]) for t in turns] == [("completed", None), ("aborted", "INTERRUPTED")]
    assert messages[2]["turnId"] == turns[1]["id"]
    assert_fail_closed(host, provider)

    await host.close()
    again = make_host()
    assert again.recovery.boot.indexed_from_outbox == 0
    assert rows(again, "SELECT count(*) FROM messages WHERE session_id = ?", sid) == [(3,)]
    sub = again.subscribe()
    started = await prompt(again, sid, "third")
    await ended(sub, started["turnId"])
    assert [m["seq"] for m in (await state(again, sid))["messages"]] == [1, 2, 3, 4, 5]


@pytest.mark.asyncio
@pytest.mark.parametrize("nth, roles", [(2, ["user", "assistant"]), (3, ["user", "assistant", "tool"])],
                         ids=["assistant_row", "tool_row"])
async def test_seed003_s4_assistant_and_tool_lines_fsynced_before_their_index_rows_are_indexed_after_crash(
    nth: int, roles: list[str], data_dir: Path, project: Path, provider: Any, make_host: Any
) -> None:
    acks = crash("tool_message", data_dir, project, "message.after_transcript", nth=nth)

    host = make_host()
    assert host.recovery.boot.indexed_from_outbox >= 1  # the killed line, and any rows still written behind
    messages = (await state(host, acks["session"]))["messages"]
    assert [m["role"] for m in messages] == roles
    assert messages[0]["id"] == acks["message"]
    (call,) = messages[1]["content"]
    assert (call["type"], call["name"], call["args"]) == ("toolCall", "Read", {"path": "README.md"})
    if nth == 3:
        (result,) = messages[2]["content"]
        assert (result["type"], result["name"], result["ok"]) == ("toolResult", "Read", True)
        assert "demo project" in result["output"] and result["toolCallId"] == call["id"]
    turns = (await host.call("session.turns", {"sessionId": acks["session"]}))["turns"]
    assert [(t["id"], t["reason"], t["errorCode"]) for t in turns] == [(acks["turn"], "aborted", "INTERRUPTED")]
    assert_fail_closed(host, provider)


@pytest.mark.asyncio
async def test_seed003_s4_smart_stop_killed_after_the_cut_drops_the_root_user_row_at_boot(
    data_dir: Path, project: Path, provider: Any, make_host: Any
) -> None:
    acks = crash("smart_stop", data_dir, project, "smartstop.after_truncate")
    sid = acks["session"]
    assert transcript(data_dir, sid).read_bytes().count(b"\n") == 1  # only the header survived the cut

    host = make_host()
    assert host.recovery.boot.dropped_index_rows == 1
    got = await state(host, sid)
    assert got["messages"] == []
    assert rows(host, "SELECT id FROM messages WHERE id = ?", acks["message"]) == []
    turns = (await host.call("session.turns", {"sessionId": sid}))["turns"]
    assert [(t["id"], t["reason"], t["errorCode"]) for t in turns] == [(acks["turn"], "aborted", None)]
    assert (await host.call("notifications.list"))["notifications"] == []
    assert "turn.aborted" in audit_actions(host, sid)
    assert_fail_closed(host, provider)

    sub = host.subscribe()
    started = await prompt(host, sid, "the right prompt")
    await ended(sub, started["turnId"])
    assert [(m["seq"], m["role"]) for m in (await state(host, sid))["messages"]] == [(1, "user"), (2, "assistant")]


TORN_TAILS = {
    "half_a_line": b'{"t":"message","id":"m_torn","sessionId":"s_x","turnId":null,"seq":3,"ro',
    "garbage_then_a_line": b'\x00\x00garbage\n{"t":"message"}\n',
}


@pytest.mark.asyncio
@pytest.mark.parametrize("tail", TORN_TAILS.values(), ids=TORN_TAILS.keys())
async def test_seed003_s4_torn_transcript_tail_is_quarantined_reported_and_audited(
    tail: bytes, data_dir: Path, project: Path, make_host: Any
) -> None:
    host = make_host()
    s = await session(host, project)
    sub = host.subscribe()
    started = await prompt(host, s["id"], "hello")
    await ended(sub, started["turnId"])
    good = (await state(host, s["id"]))["messages"]
    await host.close()
    path = transcript(data_dir, s["id"])
    good_bytes = path.read_bytes()
    with open(path, "ab") as f:
        f.write(tail)

    again = make_host()
    (quarantined,) = again.recovery.boot.quarantined
    quarantine = Path(quarantined)
    assert quarantine.parent == path.parent and quarantine.name.startswith(f"{s['id']}.jsonl.quarantine-")
    assert quarantine.read_bytes() == tail
    assert path.read_bytes() == good_bytes
    assert (await state(again, s["id"]))["messages"] == good
    assert "transcript.quarantined" in audit_actions(again, s["id"])

    sub = again.subscribe()
    started = await prompt(again, s["id"], "still works")
    await ended(sub, started["turnId"])
    assert [m["seq"] for m in (await state(again, s["id"]))["messages"]] == [1, 2, 3, 4]


@pytest.mark.asyncio
async def test_seed003_s4_outbox_line_then_torn_tail_indexes_the_line_and_quarantines_only_the_tail(
    data_dir: Path, project: Path, provider: Any, make_host: Any
) -> None:
    acks = crash("user_message", data_dir, project, "message.after_transcript")
    path = transcript(data_dir, acks["session"])
    tail = b'{"t":"message","id":"m_torn","se'
    with open(path, "ab") as f:
        f.write(tail)

    host = make_host()
    assert host.recovery.boot.indexed_from_outbox >= 1  # the killed line, and any rows still written behind
    (quarantined,) = host.recovery.boot.quarantined
    assert Path(quarantined).read_bytes() == tail
    assert [m["role"] for m in (await state(host, acks["session"]))["messages"]] == ["user", "assistant", "user"]
    assert "transcript.quarantined" in audit_actions(host, acks["session"])
    assert_fail_closed(host, provider)


async def _orphan_with_torn_tail(data_dir: Path, project: Path) -> tuple[str, bytes]:
    crash("create_session", data_dir, project, "session.after_transcript")
    (orphan,) = [p for p in (data_dir / "transcripts").glob("*.jsonl") if b'"title":"restored"' in p.read_bytes()]
    tail = b'{"t":"message","id":"m_torn"'
    with open(orphan, "ab") as f:
        f.write(tail)
    return orphan.name[: -len(".jsonl")], tail


@pytest.mark.asyncio
async def test_seed003_s4_orphan_transcript_with_torn_tail_is_restored_and_its_tail_quarantined(
    data_dir: Path, project: Path, provider: Any, make_host: Any
) -> None:
    sid, tail = await _orphan_with_torn_tail(data_dir, project)

    host = make_host()
    assert host.recovery.boot.restored_sessions == [sid]
    (quarantined,) = host.recovery.boot.quarantined
    assert Path(quarantined).read_bytes() == tail
    assert (await state(host, sid))["messages"] == []
    (detail,) = rows(host, "SELECT detail FROM audit WHERE action = 'host.recovered'")
    assert json.loads(detail[0])["quarantined"] == [quarantined]
    assert_fail_closed(host, provider)


@pytest.mark.asyncio
async def test_seed003_s4_orphan_transcript_torn_tail_is_in_the_sessions_audit_trail(
    data_dir: Path, project: Path, make_host: Any
) -> None:
    sid, _tail = await _orphan_with_torn_tail(data_dir, project)

    host = make_host()
    assert host.recovery.boot.restored_sessions == [sid]
    assert "transcript.quarantined" in audit_actions(host, sid)


@pytest.mark.asyncio
async def test_issue30_a_compaction_killed_after_its_message_is_kept_once_and_never_asked_again(
    data_dir: Path, project: Path, provider: Any, make_host: Any
) -> None:
    """Issue 30 (a persistence point: the compaction's message). Killed right after it was written: the
    reopened host holds it once, builds the same compacted view from it, asks the model nothing at boot,
    and counts it; the next turn's request opens with its summary."""
    acks = crash("compaction", data_dir, project, "compaction.after_append")
    sid = acks["session"]
    host = make_host()
    assert_fail_closed(host, provider)
    history = (await state(host, sid))["messages"]
    blocks = [b for m in history for b in m["content"] if b["type"] == "compaction"]
    assert [(b["reason"], b["summary"]) for b in blocks] == [("manual", "SUMMARY: two requests were answered")]
    assert [m["seq"] for m in history] == list(range(1, len(history) + 1))
    assert (await host.call("session.context", {"sessionId": sid}))["window"]["compactions"] == 1
    sub = host.subscribe()
    await ended(sub, (await prompt(host, sid, "third request"))["turnId"])
    opening, asked = [m.text() for m in provider.requests[-1].messages]
    assert "SUMMARY: two requests were answered" in opening and asked == "third request"
