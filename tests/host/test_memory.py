"""What the host keeps in memory must not grow with the history of its sessions.

A running turn spends most of its life waiting — on a tool, on a step-gate slot, on a
person's answer to an Ask or a plan. Under the 10-minute load soak every session always
had a turn in flight, and each one kept its session's whole transcript decoded in memory,
so the host's RSS rose with every turn and never levelled off (docs/reliability.md, "Load").
What a host keeps of a session is its model view (host/views.py, issue 33 §2): bounded by the
window and by the views' LRU (tests/host/test_views.py, tests/runtime/test_view_state.py), and
counted apart here — a turn, waiting or ended, holds nothing beyond it.
"""

from __future__ import annotations

import gc

import pytest

from pidesk.core.records import Message
from tests.scenario import all_ended, permission_requested, prompt, session, tool

pytestmark = pytest.mark.asyncio

SESSIONS = 3
TURNS = 10


def live_messages(session_ids: set[str], host) -> int:
    """Messages of these sessions alive in the host, less those its kept views hold."""
    gc.collect()
    alive = {id(o) for o in gc.get_objects() if isinstance(o, Message) and o.session_id in session_ids}
    kept = {id(m) for view in host.compactions.views._views.values() if view.state is not None
            for m in [*view.state.messages, *([view.state.cut] if view.state.cut else [])]}
    return len(alive - kept)


async def test_a_turn_waiting_on_a_person_holds_no_more_messages_the_longer_its_session_has_run(
        host, provider, project):
    sids = [(await session(host, project))["id"] for _ in range(SESSIONS)]  # permission mode ask
    sub = host.subscribe()

    async def run_turns(count: int) -> None:
        for _ in range(count):
            await all_ended(sub, [(await prompt(host, sid))["turnId"] for sid in sids])

    async def held_while_waiting() -> int:
        """Messages alive while every session has a turn waiting for a permission answer."""
        for sid in sids:
            provider.enqueue(sid, tool("Bash", command="true"))
        turns = [(await prompt(host, sid))["turnId"] for sid in sids]
        requests = [(await permission_requested(sub)).request for _ in sids]
        sub.pending()  # events already read by a client
        provider.requests.clear()  # the scripted model's own record of what it was sent
        held = live_messages(set(sids), host)
        for request in requests:
            await host.call("permissions.resolve", {"requestId": request.id, "sessionId": request.session_id,
                                                    "turnId": request.turn_id, "decision": "deny"})
        await all_ended(sub, turns)
        return held

    await run_turns(TURNS)
    after_short_history = await held_while_waiting()
    await run_turns(2 * TURNS)
    after_long_history = await held_while_waiting()

    assert after_long_history <= after_short_history, (
        f"waiting turns held {after_short_history} messages after {TURNS} turns per session, "
        f"{after_long_history} after {3 * TURNS + 1}: memory grows with every turn")
    sub.pending()
    provider.requests.clear()
    assert live_messages(set(sids), host) == 0  # every turn has ended: nothing of theirs is kept but the views
