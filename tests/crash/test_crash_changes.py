"""Crash test (issue 33 §1): a kill -9 between a checkpoint and the row that keeps its list.

A turn's list of changes is stored after its checkpoints, in a row that is not synced (it can be
worked out again); a revert's after its journal line and audit entry. The child (this file run as a
script) runs a real host armed to SIGKILL itself right before that row: after a turn whose Bash call
appends to a file and whose Write makes one (``changes.before_row``), or in a revert
(``revert.before_row``). The parent opens a new host on the data dir and checks that the list is
still right — worked out again from the journal, then stored — and that nothing was replayed: the
appended line is there once, the turn is not run again, the revert is not redone.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PROMPT = "Log once and write the notes"


async def _child(spec: dict[str, Any]) -> None:
    from pidesk.config import HostConfig
    from pidesk.faults import NO_FAULTS, Faults
    from pidesk.host import Host
    from pidesk.providers.scripted import ScriptedProvider
    from tests.scenario import ended, prompt, session, tool

    data_dir, project = Path(spec["dataDir"]), Path(spec["project"])
    armed = Faults(frozenset({spec["point"]}), "kill")
    provider = ScriptedProvider()
    host = Host.open(HostConfig(data_dir=data_dir, faults=armed if spec["point"] == "changes.before_row" else NO_FAULTS),
                     provider)
    s = await session(host, project, permissionMode="auto")
    provider.enqueue(s["id"], {**tool("Bash", command="echo once >> log.txt"), "gate": "acked"},
                     tool("Write", path="notes.md", content="# Notes\n"), {"text": "Done."})
    sub = host.subscribe()
    turn = await prompt(host, s["id"], PROMPT)
    print(json.dumps({"session": s["id"], "turn": turn["turnId"]}), flush=True)
    provider.release("acked")
    await ended(sub, turn["turnId"])
    if spec["point"] == "changes.before_row":
        await sub.wait_for(lambda e: False, timeout=40)  # the turn's list is being stored: the kill ends this
        return
    await host.close()
    host = Host.open(HostConfig(data_dir=data_dir, faults=armed), ScriptedProvider())
    await host.call("session.revert", {"sessionId": s["id"], "turnId": turn["turnId"]})
    print(json.dumps({"survived": True}), flush=True)


def _run_child(data_dir: Path, project: Path, point: str) -> dict[str, Any]:
    spec = {"dataDir": str(data_dir), "project": str(project), "point": point}
    return crash_script(Path(__file__).resolve(), spec)


def _stored(host: Any, item_id: str) -> int:
    with host.store.db.read() as db:
        return int(db.execute("SELECT count(*) FROM turn_changes WHERE id = ? AND files IS NOT NULL",
                              (item_id,)).fetchone()[0])


if __name__ == "__main__":
    sys.path[:0] = [str(HERE.parents[1])]
    asyncio.run(_child(json.loads(sys.argv[1])))
else:
    import pytest
    from crash_harness import crash_script

    @pytest.mark.asyncio
    async def test_issue33_kill_between_a_turns_checkpoint_and_its_row_lists_it_after_restart_and_replays_nothing(
        data_dir: Path, project: Path, make_host: Any
    ) -> None:
        """Issue 33 §1: killed after the turn's checkpoints and before its row, the next host lists the turn's
        files and prompt all the same (worked out from the journal, then stored); the turn stands as
        completed, its Bash line is in the file once, and nothing runs again."""
        acks = _run_child(data_dir, project, "changes.before_row")
        assert (project / "log.txt").read_text() == "once\n"
        host = make_host()
        assert _stored(host, acks["turn"]) == 0  # the kill came before the row
        turns = (await host.call("session.changes", {"sessionId": acks["session"], "limit": 10}))["turns"]
        assert [(t["turnId"], t["prompt"]) for t in turns] == [(acks["turn"], PROMPT)]
        assert {f["path"]: (f["status"], f["additions"]) for f in turns[0]["files"]} == {
            "log.txt": ("added", 1), "notes.md": ("added", 1)}
        assert _stored(host, acks["turn"]) == 1
        one = (await host.call("session.changes", {"sessionId": acks["session"], "turnId": acks["turn"]}))["turns"]
        assert "+once" in next(f["diff"] for f in one[0]["files"] if f["path"] == "log.txt")
        ran = (await host.call("session.turns", {"sessionId": acks["session"]}))["turns"]
        assert [t["reason"] for t in ran] == ["completed"]
        assert (await host.call("session.get", {"sessionId": acks["session"]}))["session"]["status"] == "idle"
        assert (project / "log.txt").read_text() == "once\n"

    @pytest.mark.asyncio
    async def test_issue33_kill_between_a_reverts_journal_line_and_its_row_lists_the_revert_after_restart(
        data_dir: Path, project: Path, make_host: Any
    ) -> None:
        """Issue 33 §1: killed after a revert's journal line (and audit) and before its row, the next host
        lists the revert where it belongs, with the files it changed back, and does not revert again."""
        acks = _run_child(data_dir, project, "revert.before_row")
        assert not (project / "log.txt").exists() and not (project / "notes.md").exists()
        host = make_host()
        turns = (await host.call("session.changes", {"sessionId": acks["session"], "limit": 10}))["turns"]
        assert [t["turnId"] for t in turns][0] == acks["turn"] and len(turns) == 2
        revert = turns[1]
        assert revert["revert"] is True and revert["revertOf"] == acks["turn"]
        assert {f["path"]: f["status"] for f in revert["files"]} == {"log.txt": "deleted", "notes.md": "deleted"}
        assert _stored(host, revert["turnId"]) == 1
        audited = [e for e in (await host.call("audit.list", {"sessionId": acks["session"]}))["entries"]
                   if e["action"] == "workspace.reverted"]
        assert len(audited) == 1 and audited[0]["detail"]["revert_id"] == revert["turnId"]
        assert not (project / "log.txt").exists()
