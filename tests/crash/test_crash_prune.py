"""Crash test (issue 33 §3): a kill -9 in the middle of a checkpoint prune.

The child (this file run as a script) builds a session of six turns, each rewriting one file, on a host
that keeps every checkpoint, closes it, then opens one keeping the last two turns, armed to SIGKILL
itself at a prune's fault point — after the ref to the kept trees and before the journal is rewritten,
or after the journal and before ``git repack``/``git prune`` — and prunes. The parent then opens a
host on the same data dir and checks the journal and repository are usable: every turn is listed with
its files, the last turn reverts, a later turn is recorded, and the next prune finishes the job.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TURNS = 6


def CONTENT(n: int) -> str:
    return f"written by turn {n}\n" * 100


async def _child(spec: dict[str, Any]) -> None:
    from pidesk.config import HostConfig
    from pidesk.faults import NO_FAULTS
    from pidesk.host import Host, checkpoints
    from pidesk.providers.scripted import ScriptedProvider
    from tests.crash.crash_driver import KillOnNthHit
    from tests.scenario import ended, prompt, session, tool

    data_dir, project = Path(spec["dataDir"]), Path(spec["project"])
    provider = ScriptedProvider()
    host = Host.open(HostConfig(data_dir=data_dir, faults=NO_FAULTS, checkpoint_keep_turns=0,
                                checkpoint_keep_days=0), provider)
    s = await session(host, project, permissionMode="auto")
    turns = []
    for n in range(TURNS):
        provider.enqueue(s["id"], tool("Write", path="data.txt", content=CONTENT(n)), {"text": "Done."})
        sub = host.subscribe()
        turn = await prompt(host, s["id"])
        await ended(sub, turn["turnId"])
        turns.append(turn["turnId"])
    await host.call("session.changes", {"sessionId": s["id"]})
    await host.close()
    print(json.dumps({"session": s["id"], "turns": turns}), flush=True)
    armed = Host.open(HostConfig(data_dir=data_dir, faults=KillOnNthHit(frozenset({spec["point"]}), "kill", nth=1),
                                 checkpoint_keep_turns=2, checkpoint_keep_days=0), ScriptedProvider())
    await checkpoints.of(armed.parts).prune(project)
    print(json.dumps({"survived": True}), flush=True)


def _run_child(data_dir: Path, project: Path, point: str) -> dict[str, Any]:
    spec = {"dataDir": str(data_dir), "project": str(project), "point": point}
    return crash_script(Path(__file__).resolve(), spec, timeout=120)


if __name__ == "__main__":
    sys.path[:0] = [str(HERE.parents[1])]
    asyncio.run(_child(json.loads(sys.argv[1])))
else:
    import pytest
    from crash_harness import crash_script

    from pidesk.host import checkpoints
    from tests.scenario import ended, prompt, tool

    @pytest.mark.asyncio
    @pytest.mark.parametrize("point", ["checkpoints.prune_before_journal", "checkpoints.prune_after_journal"])
    async def test_issue33_kill_during_a_prune_leaves_a_usable_journal_and_repository(
        data_dir: Path, project: Path, make_host: Any, provider: Any, point: str
    ) -> None:
        """Issue 33 §3 (crash safety of retention): killed with the kept trees' ref written but the journal
        not yet rewritten, or with the journal rewritten but git's repack and prune not run, the next host
        lists every turn with its files, reverts the last turn, records a new one, and its prune finishes."""
        acks = _run_child(data_dir, project, point)
        sid, turns = acks["session"], acks["turns"]
        host = make_host(checkpoint_keep_turns=2, checkpoint_keep_days=0)
        changes = await host.call("session.changes", {"sessionId": sid})
        assert [t["turnId"] for t in changes["turns"]] == turns
        assert all([f["path"] for f in t["files"]] == ["data.txt"] for t in changes["turns"])
        assert f"+written by turn {TURNS - 1}" in changes["turns"][-1]["files"][0]["diff"]
        reverted = await host.call("session.revert", {"sessionId": sid, "turnId": turns[-1]})
        assert reverted["files"] == ["data.txt"] and (project / "data.txt").read_text() == CONTENT(TURNS - 2)
        provider.enqueue(sid, tool("Write", path="data.txt", content="after the crash\n"), {"text": "Done."})
        sub = host.subscribe()
        turn = await prompt(host, sid)
        await ended(sub, turn["turnId"])
        one = await host.call("session.changes", {"sessionId": sid, "turnId": turn["turnId"]})
        assert "+after the crash" in one["turns"][0]["files"][0]["diff"]
        cps = checkpoints.of(host.parts)
        pending = cps._project(project).pruning
        if pending is not None:
            await pending
        await cps.prune(project)
        shadow = cps._project(project).repo
        kept = [u.id for u in shadow.units() if u.kind == "turn"]
        assert kept == [turn["turnId"]] or kept == [turns[-1], turn["turnId"]]  # (the revert counts as a turn)
        assert not list((data_dir / "checkpoints").glob("*.tmp"))
