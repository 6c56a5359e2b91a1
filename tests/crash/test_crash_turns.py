"""Crash tests, seed 003 §4: turn rows, aborts, notifications, the durable queue, permissions.

Startup recovery aborts a turn left running (``INTERRUPTED``) and never replays
it; a terminal decision committed before the crash stands as decided; the
notification row commits with the terminal update; a queued prompt is neither
lost nor duplicated, and a restored queue waits for a client to focus it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from crash_harness import assert_fail_closed, crash, rows
from scenario import ended, state

from pidesk.core import events as ev
from pidesk.core.errors import Conflict


async def _turns(host: Any, session_id: str) -> list[tuple[str, str, str | None]]:
    turns = (await host.call("session.turns", {"sessionId": session_id}))["turns"]
    return [(t["origin"], t["reason"], t["errorCode"]) for t in turns]


def _user_texts(messages: list[dict[str, Any]]) -> list[str]:
    return [b["text"] for m in messages if m["role"] == "user" for b in m["content"] if b["type"] == "text"]


@pytest.mark.asyncio
async def test_seed003_s4_turn_row_started_then_crash_is_aborted_interrupted_and_never_replayed(
    data_dir: Path, project: Path, provider: Any, make_host: Any
) -> None:
    acks = crash("turn_start", data_dir, project, "turn.after_start")

    host = make_host()
    assert host.recovery.interrupted["turns"] == 1
    assert await _turns(host, acks["session"]) == [("interactive", "aborted", "INTERRUPTED")]
    got = await state(host, acks["session"])
    assert got["messages"] == [] and got["session"]["status"] == "idle"
    assert (await host.call("notifications.list"))["notifications"] == []
    assert "host.recovered" in [a for (a,) in rows(host, "SELECT action FROM audit")]
    assert_fail_closed(host, provider)


@pytest.mark.asyncio
async def test_seed003_s4_abort_decided_before_crash_stays_aborted_not_restated_as_interrupted(
    data_dir: Path, project: Path, provider: Any, make_host: Any
) -> None:
    acks = crash("abort_turn", data_dir, project, "abort.after_decision")

    host = make_host()
    assert host.recovery.interrupted["turns"] == 0  # the decision was already durable
    assert await _turns(host, acks["session"]) == [("interactive", "aborted", None)]
    messages = (await state(host, acks["session"]))["messages"]
    assert [m["id"] for m in messages] == [acks["message"]]
    assert (await host.call("notifications.list"))["notifications"] == []  # never for an abort
    assert_fail_closed(host, provider)


NOTIFYING = {
    "unseen_completed": ({}, [("task.completed", None)], ("interactive", "completed", None)),
    "unseen_failed": ({"error": "PROVIDER_ERROR"}, [("task.failed", None)], ("interactive", "error", "PROVIDER_ERROR")),
    "visible_completed": ({"visible": True}, [], ("interactive", "completed", None)),
}


@pytest.mark.asyncio
@pytest.mark.parametrize("options, notes, turn", NOTIFYING.values(), ids=NOTIFYING.keys())
async def test_seed003_s4_notification_row_commits_with_the_terminal_update_exactly_once(
    options: dict[str, Any], notes: list[tuple[str, None]], turn: tuple[str, str, str | None],
    data_dir: Path, project: Path, provider: Any, make_host: Any
) -> None:
    acks = crash("queued_prompt", data_dir, project, "turn.after_end", **options)

    host = make_host()
    assert host.recovery.interrupted["turns"] == 0
    assert await _turns(host, acks["session"]) == [turn]
    listed = (await host.call("notifications.list", {"unseenOnly": True}))["notifications"]
    assert [(n["kind"], n["seenAt"]) for n in listed] == notes
    assert {n["turnId"] for n in listed} <= {acks["turn"]}
    assert_fail_closed(host, provider)

    await host.close()
    again = make_host()
    assert rows(again, "SELECT kind FROM notifications") == [(kind,) for kind, _ in notes]


@pytest.mark.asyncio
async def test_seed003_s4_queued_prompt_survives_crash_held_until_focus_then_starts_exactly_once(
    data_dir: Path, project: Path, provider: Any, make_host: Any
) -> None:
    acks = crash("queued_prompt", data_dir, project, "turn.after_end")
    sid = acks["session"]

    host = make_host()
    assert host.recovery.held_queues == [sid]
    queue = (await host.call("agent.queue.list", {"sessionId": sid}))["entries"]
    assert [(e["id"], e["text"]) for e in queue] == [(acks["entry"], acks["entryText"])]
    await host.call("session.get", {"sessionId": sid})
    await host.call("session.focus", {"sessionId": None})
    assert_fail_closed(host, provider)  # held: nothing started without the owner attaching

    sub = host.subscribe()
    await host.call("session.focus", {"sessionId": sid})
    started = await sub.wait_for(lambda e: isinstance(e, ev.TurnStarted))
    assert isinstance(started, ev.TurnStarted) and started.origin == "queued"
    await ended(sub, started.turn_id)
    await host.call("session.focus", {"sessionId": sid})
    assert host.parts.live.turns == {}
    assert (await host.call("agent.queue.list", {"sessionId": sid}))["entries"] == []
    assert _user_texts((await state(host, sid))["messages"]) == ["first job", acks["entryText"]]
    assert [o for o, _r, _c in await _turns(host, sid)] == ["interactive", "queued"]
    assert len(provider.requests) == 1


@pytest.mark.asyncio
async def test_seed003_s4_queued_prompts_user_line_in_outbox_is_indexed_once_and_not_requeued(
    data_dir: Path, project: Path, provider: Any, make_host: Any
) -> None:
    acks = crash("queued_prompt", data_dir, project, "message.after_transcript", nth=3)
    sid = acks["session"]

    host = make_host()
    assert host.recovery.boot.indexed_from_outbox >= 1  # the killed line, and any rows still written behind
    assert host.recovery.held_queues == []
    assert (await host.call("agent.queue.list", {"sessionId": sid}))["entries"] == []
    assert _user_texts((await state(host, sid))["messages"]) == ["first job", acks["entryText"]]
    assert await _turns(host, sid) == [("interactive", "completed", None), ("queued", "aborted", "INTERRUPTED")]
    await host.call("session.focus", {"sessionId": sid})
    assert_fail_closed(host, provider)


@pytest.mark.asyncio
async def test_seed003_s4_queued_prompt_is_not_lost_when_its_turn_start_is_interrupted(
    data_dir: Path, project: Path, provider: Any, make_host: Any
) -> None:
    acks = crash("queued_prompt", data_dir, project, "turn.after_start", nth=2)
    sid = acks["session"]

    host = make_host()
    queued = [e["text"] for e in (await host.call("agent.queue.list", {"sessionId": sid}))["entries"]]
    delivered = _user_texts((await state(host, sid))["messages"])[1:]
    assert queued + delivered == [acks["entryText"]]


@pytest.mark.asyncio
async def test_seed003_s4_pending_permission_is_interrupted_by_restart_and_its_command_never_runs(
    data_dir: Path, project: Path, provider: Any, make_host: Any
) -> None:
    acks = crash("permission_pending", data_dir, project, "session.after_transcript", nth=2)

    host = make_host()
    assert rows(host, "SELECT status FROM permission_requests WHERE id = ?", acks["request"]) == [("interrupted",)]
    assert await _turns(host, acks["session"]) == [("interactive", "aborted", "INTERRUPTED")]
    assert (await host.call("permissions.pending"))["requests"] == []
    with pytest.raises(Conflict) as refused:
        await host.call("permissions.resolve", {"requestId": acks["request"], "sessionId": acks["session"],
                                                "turnId": acks["turn"], "decision": "allow"})
    assert refused.value.code == "TURN_ENDED"
    assert not (project / "ran.txt").exists()
    assert_fail_closed(host, provider)
