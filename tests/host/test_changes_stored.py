"""Each turn's list of changes, stored when it ends (issue 33 §1): session.changes reads rows.

Real hosts, real git, real files, the scripted provider as the model. The lists are checked against
an independent reading of the checkpoint journal with plain ``git`` (what session.changes computed
on every call before); paging, one turn, one file, reverts, a restart, turns from before the rows,
and that no read waits for the project's lock.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from pidesk.core.errors import InvalidParams, NotFound
from pidesk.host import checkpoints
from pidesk.store.checkpoints import ShadowRepo
from tests.scenario import completed_turn, ended, prompt, session, tool

pytestmark = pytest.mark.asyncio

CAP = 4096  # the checkpoint size cap in these tests: small files go over it


async def _listed(host: Any, sid: str, limit: int = 1000) -> list[dict[str, Any]]:
    """Every turn and revert of a session, page by page (the list form: no diffs)."""
    turns: list[dict[str, Any]] = []
    cursor = None
    for _ in range(1000):
        page = await host.call("session.changes", {"sessionId": sid, "limit": limit}
                               | ({"cursor": cursor} if cursor else {}))
        turns += page["turns"]
        cursor = page["nextCursor"]
        if cursor is None:
            return turns
    raise AssertionError("paging did not end")


def _shadow(host: Any, root: str) -> ShadowRepo:
    return checkpoints.of(host.parts)._project(Path(root)).repo


def _git(shadow: ShadowRepo, *args: str) -> bytes:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")} | {"GIT_CONFIG_GLOBAL": os.devnull}
    return subprocess.run(["git", f"--git-dir={shadow.git_dir}", *args], env=env, check=True,
                          capture_output=True).stdout


def _old_list(shadow: ShadowRepo, sid: str, turn_id: str) -> dict[str, dict[str, Any]]:
    """What session.changes gave for a turn before the lists were stored, read straight from the journal
    with plain git: for the files the turn's own calls changed, the change from its "before" tree to its
    last tree; files over the cap as too large; a file over it before the turn with no diff."""
    entries = [e for e in shadow.entries() if e.get("s") == sid and e.get("t") == turn_id]
    start = next(e for e in entries if e["k"] == "turn")
    calls = [e for e in entries if e["k"] == "call"]
    if not calls:
        return {}
    before, last = start["tree"], calls[-1]["tree"]
    touched: set[str] = set()
    for call in calls:
        touched |= {p for p in _git(shadow, "diff-tree", "-r", "-z", "--no-renames", "--name-only",
                                    call.get("prev") or before, call["tree"]).decode().split("\0") if p}
    status = {}
    for line in _git(shadow, "diff-tree", "-r", "--no-renames", "--name-status", before, last).decode().splitlines():
        letter, path = line.split("\t", 1)
        status[path] = {"A": "added", "D": "deleted"}.get(letter[0], "modified")
    files: dict[str, dict[str, Any]] = {}
    for line in _git(shadow, "diff-tree", "-r", "--no-renames", "--numstat", before, last).decode().splitlines():
        added, removed, path = line.split("\t", 2)
        if path not in touched:
            continue
        patch = _git(shadow, "diff-tree", "-r", "-p", "--no-renames", "--full-index", before, last, "--", path).decode()
        binary = added == "-"
        files[path] = {"path": path, "status": status[path], "additions": 0 if binary else int(added),
                       "deletions": 0 if binary else int(removed), "diff": "binary" if binary else patch}
    for path in set(start.get("held", ())) & set(files):
        files[path] |= {"additions": 0, "deletions": 0, "diff": "was over the checkpoint limit before this turn"}
    for call in calls:
        for path, was, _size in call.get("big", ()):
            files[path] = {"path": path, "status": files[path]["status"] if path in files else was, "additions": 0,
                           "deletions": 0, "tooLarge": True, "diff": "over the 4,096 bytes checkpoint limit"}
    return files


def _same(got: dict[str, Any], old: dict[str, Any]) -> None:
    """A file as session.changes gives it with its diff, against the old reading."""
    assert {k: v for k, v in got.items() if k not in ("diff", "binary")} == \
        {k: v for k, v in old.items() if k != "diff"}, got["path"]
    assert got.get("binary", False) == (old["diff"] == "binary")
    if old["diff"] == "binary" or got.get("tooLarge") or old["diff"].startswith("was over"):
        assert old["diff"] in got["diff"], (got["diff"], old["diff"])
    else:
        assert got["diff"] == old["diff"], got["path"]


async def test_issue33_each_turns_stored_list_equals_its_diff_for_every_kind_of_change(host, provider, project):
    """Issue 33 §1: the list stored at a turn's end — Write (a new file in a new directory), Edit, Bash
    creating, moving, deleting, writing binary files, growing files past the checkpoint cap, and a file
    back under the cap — is what the journal and git say the turn changed; each file's diff (asked with
    its turn, or alone) is git's; a turn that changed nothing lists nothing."""
    checkpoints.of(host.parts).size_cap = CAP
    s = await session(host, project, permissionMode="auto")
    sid = s["id"]
    turns = [
        await completed_turn(host, provider, sid, tool("Write", path="docs/new/guide.md", content="# Guide\n\nHello.\n"),
                    tool("Edit", path="README.md", oldText="demo", newText="sample")),
        await completed_turn(host, provider, sid, tool(
            "Bash", command="mv src/app.py src/main.py && printf 'a\\000b' > blob.bin && echo hi > made.txt")),
        await completed_turn(host, provider, sid, tool("Read", path="README.md")),
        await completed_turn(host, provider, sid, tool(
            "Bash", command="rm made.txt && head -c 10000 /dev/zero | tr '\\0' x >> README.md "
                            "&& head -c 5000 /dev/zero > big.bin && printf 'c\\000d' > blob.bin")),
        await completed_turn(host, provider, sid, tool("Write", path="README.md", content="short again\n"),
                    tool("Edit", path="docs/new/guide.md", oldText="Hello.", newText="Hello again.\nAnd more.")),
    ]
    shadow = _shadow(host, s["root"])
    listed = {t["turnId"]: t for t in await _listed(host, sid)}
    assert list(listed) == turns
    expected = {
        turns[0]: {"docs/new/guide.md": "added", "README.md": "modified"},
        turns[1]: {"src/app.py": "deleted", "src/main.py": "added", "blob.bin": "added", "made.txt": "added"},
        turns[2]: {},
        turns[3]: {"made.txt": "deleted", "README.md": "modified", "big.bin": "added", "blob.bin": "modified"},
        turns[4]: {"README.md": "modified", "docs/new/guide.md": "modified"},
    }
    for turn_id in turns:
        old = _old_list(shadow, sid, turn_id)
        assert {p: f["status"] for p, f in old.items()} == expected[turn_id]  # (the oracle reads what it should)
        stored = listed[turn_id]["files"]
        assert all("diff" not in f for f in stored)  # the list form: no diffs
        assert {f["path"] for f in stored} == set(old)
        one = (await host.call("session.changes", {"sessionId": sid, "turnId": turn_id}))["turns"]
        assert [t["turnId"] for t in one] == [turn_id]
        assert [{k: v for k, v in f.items() if k != "diff"} for f in one[0]["files"]] == stored
        for f in one[0]["files"]:
            _same(f, old[f["path"]])
            alone = (await host.call("session.changes", {"sessionId": sid, "turnId": turn_id, "path": f["path"]}))
            assert alone["turns"][0]["files"] == [f]
        bare = await host.call("session.changes", {"sessionId": sid, "turnId": turn_id, "diff": False})
        assert bare["turns"][0]["files"] == stored  # what a page asks after a turn: no git at all
    assert {f["path"]: f.get("tooLarge", False) for f in listed[turns[3]]["files"]} == {
        "made.txt": False, "README.md": True, "big.bin": True, "blob.bin": False}
    assert [f.get("binary") for f in listed[turns[1]]["files"] if f["path"] == "blob.bin"] == [True]
    # the unpaged call gives today's shape: every turn, every file with its diff
    whole = await host.call("session.changes", {"sessionId": sid})
    assert whole["nextCursor"] is None and [t["turnId"] for t in whole["turns"]] == turns
    for t in whole["turns"]:
        old = _old_list(shadow, sid, t["turnId"])
        for f in t["files"]:
            _same(f, old[f["path"]])


async def test_issue33_interleaved_sessions_each_list_only_what_their_own_calls_changed(host, provider, project):
    """Issue 33 §1 (issue 17's rule kept): when another session's checkpoint comes between a turn's calls,
    the turn's list still holds only the files its own calls changed."""
    a = (await session(host, project, permissionMode="auto"))["id"]
    b = (await session(host, project, permissionMode="auto"))["id"]
    sub = host.subscribe()
    provider.enqueue(a, tool("Write", path="a1.txt", content="1\n"), {**tool("Write", path="a2.txt", content="2\n"),
                                                                       "gate": "a-waits"}, {"text": "Done."})
    running = (await prompt(host, a))["turnId"]
    await provider.wait_reached("a-waits")
    tb = await completed_turn(host, provider, b, tool("Write", path="b1.txt", content="b\n"))
    provider.release("a-waits")
    await ended(sub, running)
    listed = {t["turnId"]: sorted(f["path"] for f in t["files"]) for t in await _listed(host, a)}
    assert listed == {running: ["a1.txt", "a2.txt"]}
    assert {t["turnId"]: sorted(f["path"] for f in t["files"]) for t in await _listed(host, b)} == {tb: ["b1.txt"]}
    old = _old_list(_shadow(host, str(project)), a, running)
    assert sorted(old) == ["a1.txt", "a2.txt"]


async def test_issue33_paging_returns_every_turn_and_revert_exactly_once_oldest_first(host, provider, project):
    """Issue 33 §1: ``limit``/``cursor`` page a session's turns and reverts, oldest first, each exactly once,
    ``nextCursor`` null after the last; the pages together are the unpaged list. A cursor this host did not
    make, a limit out of range, ``path`` without ``turnId`` and paging one turn are INVALID_PARAMS."""
    s = await session(host, project, permissionMode="auto")
    sid = s["id"]
    made = [await completed_turn(host, provider, sid, tool("Write", path=f"f{n}.txt", content=f"{n}\n")) for n in range(5)]
    reverted = await host.call("session.revert", {"sessionId": sid, "turnId": made[3]})
    made.append(reverted["revertId"])
    made.append(await completed_turn(host, provider, sid, tool("Write", path="last.txt", content="l\n")))
    whole = [t["turnId"] for t in (await host.call("session.changes", {"sessionId": sid}))["turns"]]
    assert whole == made
    for size in (1, 2, 3, 7, 1000):
        paged = await _listed(host, sid, size)
        assert [t["turnId"] for t in paged] == made, size
    diffed = await host.call("session.changes", {"sessionId": sid, "limit": 3, "diff": True})
    assert ["+0" in f["diff"] for f in diffed["turns"][0]["files"]] == [True]  # a page may carry diffs too
    first = await host.call("session.changes", {"sessionId": sid, "limit": 2})
    assert len(first["turns"]) == 2 and first["nextCursor"]
    by_cursor = await host.call("session.changes", {"sessionId": sid, "cursor": first["nextCursor"]})
    assert [t["turnId"] for t in by_cursor["turns"]] == made[2:] and by_cursor["nextCursor"] is None
    for bad in ({"cursor": "not-one-of-ours"}, {"cursor": 5}, {"limit": 0}, {"limit": 1001}, {"path": "f1.txt"},
                {"turnId": made[0], "limit": 5}, {"diff": "no"}):
        with pytest.raises(InvalidParams):
            await host.call("session.changes", {"sessionId": sid} | bad)
    with pytest.raises(NotFound):
        await host.call("session.changes", {"sessionId": sid, "turnId": made[0], "path": "f4.txt"})


async def test_issue33_a_revert_is_listed_as_a_turn_with_its_files_and_still_reverts(host, provider, project):
    """Issue 33 §1: a revert is stored and listed at its place — ``revert: true``, ``revertOf``, the files it
    changed back — alone (with diffs) too; reverting the revert restores the files."""
    s = await session(host, project, permissionMode="auto")
    sid = s["id"]
    first = await completed_turn(host, provider, sid, tool("Write", path="README.md", content="rewritten\n"))
    await completed_turn(host, provider, sid, tool("Bash", command="echo later > later.txt"))
    result = await host.call("session.revert", {"sessionId": sid, "turnId": first})
    assert sorted(result["files"]) == ["README.md", "later.txt"]
    assert (project / "README.md").read_text() == "# demo project\n" and not (project / "later.txt").exists()
    listed = await _listed(host, sid, 2)
    entry = listed[-1]
    assert entry["turnId"] == result["revertId"] and entry["revert"] is True and entry["revertOf"] == first
    assert {f["path"]: f["status"] for f in entry["files"]} == {"README.md": "modified", "later.txt": "deleted"}
    alone = (await host.call("session.changes", {"sessionId": sid, "turnId": result["revertId"]}))["turns"]
    diffs = {f["path"]: f["diff"] for f in alone[0]["files"]}
    assert "-rewritten" in diffs["README.md"] and "+# demo project" in diffs["README.md"]
    again = await host.call("session.revert", {"sessionId": sid, "turnId": result["revertId"]})
    assert (project / "README.md").read_text() == "rewritten\n" and (project / "later.txt").read_text() == "later\n"
    listed = await _listed(host, sid)
    assert [t["turnId"] for t in listed][-2:] == [result["revertId"], again["revertId"]]
    assert listed[-1]["revertOf"] == result["revertId"]


async def test_issue31_each_turn_is_named_by_its_prompts_first_line_and_its_start(host, provider, project):
    """Issue 31 §4: each listed turn carries ``prompt`` (its prompt's first line, cut at 120 characters)
    and ``at`` (when it started); a revert has no prompt and ``at`` when it was made."""
    s = await session(host, project, permissionMode="auto")
    sid = s["id"]
    one = await completed_turn(host, provider, sid, tool("Write", path="a.txt", content="a\n"),
                      text="\n  Fix the login bug  \nThe details follow here.")
    two = await completed_turn(host, provider, sid, text="word " * 60)
    listed = {t["turnId"]: t for t in await _listed(host, sid)}
    assert listed[one]["prompt"] == "Fix the login bug"
    assert len(listed[two]["prompt"]) == 120 and listed[two]["prompt"].endswith("…")
    assert listed[two]["prompt"].startswith("word word")
    started = {t["id"]: t["startedAt"] for t in (await host.call("session.turns", {"sessionId": sid}))["turns"]}
    assert {t: listed[t]["at"] for t in (one, two)} == started
    reverted = await host.call("session.revert", {"sessionId": sid, "turnId": one})
    entry = (await host.call("session.changes", {"sessionId": sid, "turnId": reverted["revertId"]}))["turns"][0]
    assert entry["prompt"] is None and entry["at"] > started[two]


async def test_issue33_no_read_waits_for_the_projects_lock(host, provider, project):
    """Issue 33 §1: session.changes read the journal and ran git under the project's lock (one call held it
    20 s at 1,000 turns, and every checkpoint waited behind it). Now every form answers while something
    else holds the lock."""
    s = await session(host, project, permissionMode="auto")
    sid = s["id"]
    turn = await completed_turn(host, provider, sid, tool("Write", path="a.txt", content="a\n"))
    lock = checkpoints.of(host.parts)._project(Path(s["root"])).lock
    async with lock:
        for params in ({}, {"limit": 10}, {"turnId": turn}, {"turnId": turn, "path": "a.txt"}):
            got = await asyncio.wait_for(host.call("session.changes", {"sessionId": sid} | params), 10)
            assert [f["path"] for f in got["turns"][0]["files"]] == ["a.txt"]


async def test_issue33_a_running_turn_lists_its_changes_so_far_and_they_are_stored_when_it_ends(
    host, provider, project
):
    """Issue 33 §1: a turn still running is listed with what its calls changed so far (worked out, not
    stored); once it ends its list is stored whole."""
    s = await session(host, project, permissionMode="auto")
    sid = s["id"]
    sub = host.subscribe()
    provider.enqueue(sid, tool("Write", path="first.txt", content="1\n"),
                     {**tool("Write", path="second.txt", content="2\n"), "gate": "midway"}, {"text": "Done."})
    turn = (await prompt(host, sid))["turnId"]
    await provider.wait_reached("midway")
    deadline = asyncio.get_running_loop().time() + 10
    while True:  # the first call's checkpoint runs behind the turn
        so_far = (await host.call("session.changes", {"sessionId": sid, "turnId": turn}))["turns"][0]
        if so_far["files"] or asyncio.get_running_loop().time() > deadline:
            break
        await asyncio.sleep(0.02)
    assert [f["path"] for f in so_far["files"]] == ["first.txt"] and "+1" in so_far["files"][0]["diff"]
    with host.store.db.read() as db:
        assert db.execute("SELECT count(*) FROM turn_changes WHERE id = ?", (turn,)).fetchone()[0] == 0
    provider.release("midway")
    await ended(sub, turn)
    assert sorted(f["path"] for f in (await _listed(host, sid))[0]["files"]) == ["first.txt", "second.txt"]
    with host.store.db.read() as db:
        assert db.execute("SELECT count(*) FROM turn_changes WHERE id = ?", (turn,)).fetchone()[0] == 1


async def test_issue33_a_restart_keeps_the_stored_lists_and_serves_them_without_git(
    make_host, provider, project, monkeypatch, tmp_path
):
    """Issue 33 §1: the lists outlive the host: after a restart the list form is the same, served from the
    rows alone (here with git gone from PATH: nothing is worked out again)."""
    host = make_host()
    s = await session(host, project, permissionMode="auto")
    sid = s["id"]
    await completed_turn(host, provider, sid, tool("Write", path="a.txt", content="a\n"), text="Write a")
    first = await completed_turn(host, provider, sid, tool("Bash", command="echo b > b.txt && rm README.md"), text="Bash b")
    await host.call("session.revert", {"sessionId": sid, "turnId": first})
    before = await _listed(host, sid)
    await host.close()
    empty = tmp_path / "no-git"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    again = make_host()
    assert await _listed(again, sid) == before
    assert [t["prompt"] for t in before] == ["Write a", "Bash b", None]


async def test_issue33_turns_from_before_the_stored_lists_are_worked_out_once_from_the_journal(
    make_host, provider, project, monkeypatch, tmp_path
):
    """Issue 33 §1: a session whose turns and reverts have no rows (made before them) gets them worked out
    from the checkpoint journal on its first read — the same lists, prompts included — and stored: a later
    host serves them without git."""
    host = make_host()
    s = await session(host, project, permissionMode="auto")
    sid = s["id"]
    await completed_turn(host, provider, sid, tool("Write", path="a.txt", content="a\n"), text="Write a")
    second = await completed_turn(host, provider, sid, tool("Edit", path="README.md", oldText="demo", newText="x"),
                         text="Edit it")
    await host.call("session.revert", {"sessionId": sid, "turnId": second})
    before = await _listed(host, sid)
    with_diffs = await host.call("session.changes", {"sessionId": sid})
    with host.store.db.tx() as db:
        db.execute("DELETE FROM turn_changes")
    await host.close()
    old = make_host()
    assert await _listed(old, sid) == before
    assert await old.call("session.changes", {"sessionId": sid}) == with_diffs
    with old.store.db.read() as db:
        assert db.execute("SELECT count(*) FROM turn_changes WHERE files IS NOT NULL").fetchone()[0] == 3
    await old.close()
    empty = tmp_path / "no-git"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    assert await _listed(make_host(), sid) == before
