"""Checkpoint retention (issue 33 §3): shadow repositories no longer grow for ever.

Real hosts, real git, real files; the scripted provider plays the model. The policy keeps each
session's last ``checkpoint_keep_turns`` turns made in the last ``checkpoint_keep_days`` days.
"""

from __future__ import annotations

import os
import subprocess
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from pidesk.core.errors import NotFound
from pidesk.host import checkpoints
from pidesk.host.checkpoints import beyond_policy
from pidesk.ids import iso
from pidesk.store.checkpoints import JournalUnit
from tests.scenario import completed_turn, ended, prompt, session, tool

pytestmark = pytest.mark.asyncio


def _content(n: int) -> str:
    return os.urandom(60_000).hex() + f"\nversion {n}\n"  # 120 KB that compress to about half


def _git_ok(git_dir: Any, *args: str) -> bool:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")} | {"GIT_CONFIG_GLOBAL": os.devnull}
    return subprocess.run(["git", f"--git-dir={git_dir}", *args], env=env, capture_output=True).returncode == 0


async def test_issue33_retention_prunes_old_turns_keeps_recent_ones_and_the_repository_shrinks(
    make_host, provider, project
):
    """Issue 33 §3: with checkpoint_keep_turns = 3, a prune forgets all but each session's last three
    turns: the shadow repository shrinks; every turn is still listed with its files, a pruned turn's
    diffs say the retention policy pruned them, and reverting it says so, naming the setting; a kept
    turn's diffs and revert work, and so do the turns after the prune."""
    keeping = make_host(checkpoint_keep_turns=0, checkpoint_keep_days=0)  # 0 and 0: everything is kept
    sid = (await session(keeping, project, permissionMode="auto"))["id"]
    contents = [_content(n) for n in range(8)]
    turns = [await completed_turn(keeping, provider, sid, tool("Write", path="data.txt", content=c)) for c in contents]
    await keeping.call("session.changes", {"sessionId": sid})  # (every turn's checkpoints recorded)
    await keeping.close()
    host = make_host(checkpoint_keep_turns=3, checkpoint_keep_days=0)
    cps = checkpoints.of(host.parts)
    shadow = cps._project(project).repo
    assert len(shadow.units()) == 8
    before = shadow.disk_bytes()
    assert await cps.prune(project) == 5
    assert shadow.disk_bytes() < before / 2
    assert [u.id for u in shadow.units()] == turns[5:]
    for line in shadow.entries():  # every tree the journal still names is there
        assert _git_ok(shadow.git_dir, "cat-file", "-e", line["tree"])

    changes = await host.call("session.changes", {"sessionId": sid})
    assert [t["turnId"] for t in changes["turns"]] == turns
    for n, turn in enumerate(changes["turns"]):
        (file,) = turn["files"]
        assert file["path"] == "data.txt" and file["status"] == ("added" if n == 0 else "modified")
        if n < 5:
            assert "pruned by the retention policy" in file["diff"] and "checkpoint_keep_turns = 3" in file["diff"]
        else:
            assert f"+version {n}" in file["diff"]
    with pytest.raises(NotFound) as refused:
        await host.call("session.revert", {"sessionId": sid, "turnId": turns[2]})
    assert "pruned by the retention policy" in str(refused.value) and "checkpoint_keep_turns = 3" in str(refused.value)

    reverted = await host.call("session.revert", {"sessionId": sid, "turnId": turns[6]})
    assert reverted["files"] == ["data.txt"] and (project / "data.txt").read_text() == contents[5]
    last = await completed_turn(host, provider, sid, tool("Write", path="data.txt", content="after the prune\n"))
    one = await host.call("session.changes", {"sessionId": sid, "turnId": last})
    assert "+after the prune" in one["turns"][0]["files"][0]["diff"]
    again = await host.call("session.revert", {"sessionId": sid, "turnId": last})
    assert again["files"] == ["data.txt"] and (project / "data.txt").read_text() == contents[5]


async def test_issue33_retention_runs_by_itself_after_turns_and_never_drops_a_rowless_turns_files(
    make_host, provider, project, monkeypatch
):
    """Issue 33 §3: the policy is applied on a root's first use in a process and every PRUNE_EVERY turns,
    in the background; a pruned turn whose list was not stored yet (its row lost to a crash) has it
    worked out before its checkpoints go."""
    monkeypatch.setattr(checkpoints, "PRUNE_EVERY", 3)
    host = make_host(checkpoint_keep_turns=2, checkpoint_keep_days=0)
    sid = (await session(host, project, permissionMode="auto"))["id"]
    cps = checkpoints.of(host.parts)
    turns = []
    for n in range(7):
        turns.append(await completed_turn(host, provider, sid, tool("Write", path=f"f{n}.txt", content=f"{n}\n")))
        await host.call("session.changes", {"sessionId": sid, "turnId": turns[-1], "diff": False})
        if n == 4:  # as a crash between a turn's checkpoints and its row leaves it
            with host.parts.store.db.tx() as db:
                db.execute("DELETE FROM turn_changes WHERE id = ?", (turns[3],))
        project_state = cps._project(project)
        if project_state.pruning is not None:
            await project_state.pruning
    shadow = cps._project(project).repo
    assert len(shadow.units()) < 7  # (pruned at turns 1, 4 and 7: at most the last two plus those since)
    assert {u.id for u in shadow.units()} >= set(turns[-2:])
    changes = await host.call("session.changes", {"sessionId": sid, "diff": False})
    assert [[f["path"] for f in t["files"]] for t in changes["turns"]] == [[f"f{n}.txt"] for n in range(7)]


async def test_issue33_the_policy_keeps_each_sessions_last_turns_made_within_the_days():
    """Issue 33 §3: the retention policy as a rule — each session's last N (reverts count as turns),
    made in the last D days; 0 lifts a limit."""
    now = datetime(2027, 1, 31, tzinfo=UTC)
    units = [JournalUnit("a", f"a{n}", "turn", iso(now - timedelta(days=40 - n * 10))) for n in range(5)]
    units += [JournalUnit("b", "b0", "turn", iso(now - timedelta(days=1))),
              JournalUnit("a", "rv1", "revert", iso(now - timedelta(hours=1)))]
    assert beyond_policy(units, 0, 0, now) == set()
    assert beyond_policy(units, 3, 0, now) == {"a0", "a1", "a2"}
    assert beyond_policy(units, 0, 30, now) == {"a0"}  # 40 days old (a1, made 30 days ago to the ms, stays)
    assert beyond_policy(units, 10, 15, now) == {"a0", "a1", "a2"}  # 40, 30 and 20 days old
    assert beyond_policy(units, 1, 0, now) == {"a0", "a1", "a2", "a3", "a4"}
