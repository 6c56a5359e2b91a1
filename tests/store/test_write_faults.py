"""Disk errors at a transcript write or fsync: nothing unacknowledged stays, nothing acknowledged is lost."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from pidesk.core.errors import PideskError, StoreError
from pidesk.core.modes import Mode, PermissionMode, PlanState, SessionStatus
from pidesk.core.records import Session, TextBlock
from pidesk.faults import Faults
from pidesk.ids import now_iso
from pidesk.store import Store
from tests.scenario import prompt, session, state


@dataclass(frozen=True)
class FailNth(Faults):
    """Fail the nth hit of a point once, as a disk would on one unlucky write."""

    nth: int = 1
    counts: dict[str, int] = field(default_factory=dict, compare=False)

    def hit(self, point: str) -> None:
        if point in self.points:
            self.counts[point] = self.counts.get(point, 0) + 1
            if self.counts[point] == self.nth:
                super().hit(point)


def new_store(tmp_path: Path, faults: Faults) -> tuple[Store, str]:
    store = Store(tmp_path / "data", faults)
    now = now_iso()
    store.create_session(Session(
        id="s_1", title="t", project_path=None, root=str(tmp_path), mode=Mode.AGENT,
        permission_mode=PermissionMode.ASK, status=SessionStatus.IDLE, plan_state=PlanState.INACTIVE,
        current_turn_id=None, forked_from=None, created_at=now, updated_at=now))
    return store, "s_1"


@pytest.mark.parametrize("point", ["transcript.write", "transcript.fsync"])
@pytest.mark.parametrize("action", ["enospc", "raise"])
def test_a_failed_append_is_not_acknowledged_leaves_no_bytes_and_the_next_one_works(tmp_path, point, action):
    store, sid = new_store(tmp_path, FailNth(frozenset({point}), action, nth=3))
    store.append_message(sid, None, "user", [TextBlock(text="one")])
    store.append_message(sid, None, "user", [TextBlock(text="two")])
    size = store.transcripts.size(sid)
    with pytest.raises(StoreError) as failed:
        store.append_message(sid, None, "user", [TextBlock(text="three")])
    assert failed.value.code == "PERSISTENCE_FAILURE"
    assert store.transcripts.size(sid) == size  # the unacknowledged bytes are gone, durably
    store.append_message(sid, None, "user", [TextBlock(text="four")])
    messages, _ = store.page(sid, None, 10)
    assert [(m.seq, m.text()) for m in messages] == [(1, "one"), (2, "two"), (3, "four")]
    store.close()
    again = Store(tmp_path / "data")
    assert again.reconcile().quarantined == []
    assert [m.text() for m in again.page(sid, None, 10)[0]] == ["one", "two", "four"]
    again.close()


@pytest.mark.asyncio
async def test_a_prompt_whose_line_cannot_be_synced_fails_with_persistence_failure(make_host, project):
    host = make_host(faults=FailNth(frozenset({"transcript.fsync"}), "enospc", nth=1))
    s = await session(host, project)
    with pytest.raises(PideskError) as failed:
        await prompt(host, s["id"], "hello")
    assert failed.value.code == "PERSISTENCE_FAILURE"
    got = await state(host, s["id"])
    assert got["messages"] == [] and got["session"]["status"] == "idle"
    turn = (await host.call("session.turns", {"sessionId": s["id"]}))["turns"][-1]
    assert (turn["reason"], turn["errorCode"]) == ("error", "PERSISTENCE_FAILURE")
