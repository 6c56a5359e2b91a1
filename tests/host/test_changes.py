"""Checkpoints through the host (issue 17): session.changes, session.revert, permission previews.

Real hosts, real git, real files; the scripted provider plays the model.
"""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path
from typing import Any

import pytest

from pidesk.core import events as ev
from pidesk.core.errors import Conflict
from pidesk.host import checkpoints
from tests.scenario import (Ticker, completed_turn, ended, permission_requested, prompt, session,
                            small_projects, tool)

pytestmark = pytest.mark.asyncio


def _files(changes: dict[str, Any], turn_id: str) -> dict[str, dict[str, Any]]:
    entry = next(t for t in changes["turns"] if t["turnId"] == turn_id)
    return {f["path"]: f for f in entry["files"]}


async def _audit(host: Any, sid: str) -> list[dict[str, Any]]:
    return list((await host.call("audit.list", {"sessionId": sid}))["entries"])


async def test_issue17_every_tools_changes_appear_under_the_turn_that_made_them(host, provider, project):
    """Issue 17: Write (a file in a new directory), Edit, and Bash creating, deleting and renaming files
    and writing a binary one are each listed under their own turn, oldest first; a turn that changed
    nothing is listed with no files."""
    s = await session(host, project, permissionMode="auto")
    sid = s["id"]
    first = await completed_turn(host, provider, sid, tool("Write", path="docs/new/guide.md", content="# Guide\n"),
                        tool("Edit", path="README.md", oldText="demo", newText="sample"))
    quiet = await completed_turn(host, provider, sid, tool("Read", path="README.md"))
    second = await completed_turn(host, provider, sid, tool(
        "Bash", command="mv src/app.py src/main.py && rm README.md && printf 'a\\000b' > blob.bin && echo hi > made.txt"))
    changes = await host.call("session.changes", {"sessionId": sid})
    assert [t["turnId"] for t in changes["turns"]] == [first, quiet, second]
    one = _files(changes, first)
    assert {p: f["status"] for p, f in one.items()} == {"docs/new/guide.md": "added", "README.md": "modified"}
    assert (one["README.md"]["additions"], one["README.md"]["deletions"]) == (1, 1)
    assert "-# demo project" in one["README.md"]["diff"] and "+# sample project" in one["README.md"]["diff"]
    assert _files(changes, quiet) == {}
    two = _files(changes, second)
    assert {p: f["status"] for p, f in two.items()} == {
        "src/app.py": "deleted", "src/main.py": "added", "README.md": "deleted", "blob.bin": "added",
        "made.txt": "added"}
    assert two["blob.bin"]["diff"] == "binary"
    only = await host.call("session.changes", {"sessionId": sid, "turnId": first})
    assert [t["turnId"] for t in only["turns"]] == [first]


async def test_issue17_revert_restores_before_the_turn_leaves_ignored_files_and_can_itself_be_reverted(
    host, provider, project
):
    """Issue 17: a revert puts back the state before the turn (undoing the later turns too), never touches
    .gitignore'd files or .pi/, is audited with its files, and reverting the revert restores what it undid."""
    (project / ".gitignore").write_text("*.log\n")
    s = await session(host, project, permissionMode="auto")
    sid = s["id"]
    first = await completed_turn(host, provider, sid, tool("Write", path="README.md", content="rewritten\n"))
    await completed_turn(host, provider, sid, tool("Bash", command="echo later > later.txt && echo log > build.log"))
    (project / ".pi").mkdir(exist_ok=True)
    (project / ".pi" / "note.md").write_text("p\n")  # (the host's own: a command cannot write .pi/)
    (project / "src" / "app.py").write_text("edited by hand\n")  # the confirmation says these go too
    result = await host.call("session.revert", {"sessionId": sid, "turnId": first})
    assert sorted(result["files"]) == ["README.md", "later.txt", "src/app.py"]
    assert (project / "README.md").read_text() == "# demo project\n"
    assert not (project / "later.txt").exists()
    assert (project / "src" / "app.py").read_text() == "print('hello')\n"
    assert (project / "build.log").read_text() == "log\n" and (project / ".pi" / "note.md").read_text() == "p\n"
    audited = [e for e in await _audit(host, sid) if e["action"] == "workspace.reverted"]
    assert audited and sorted(audited[0]["detail"]["files"]) == sorted(result["files"])
    listed = (await host.call("session.changes", {"sessionId": sid}))["turns"]
    assert listed[-1]["turnId"] == result["revertId"] and listed[-1].get("revert") is True
    assert listed[-1]["revertOf"] == first
    again = await host.call("session.revert", {"sessionId": sid, "turnId": result["revertId"]})
    listed = (await host.call("session.changes", {"sessionId": sid}))["turns"]
    assert listed[-1]["turnId"] == again["revertId"] and listed[-1]["revertOf"] == result["revertId"]
    assert sorted(again["files"]) == sorted(result["files"])
    assert (project / "README.md").read_text() == "rewritten\n"
    assert (project / "later.txt").read_text() == "later\n"
    assert (project / "src" / "app.py").read_text() == "edited by hand\n"


async def test_issue17_revert_is_refused_while_the_session_is_busy_and_the_permission_card_has_a_diff(
    host, provider, project
):
    """Issue 17: session.revert on a busy session is AGENT_BUSY and changes nothing; the Write waiting for
    permission carries preview {diff, overwrites: true} computed from its arguments."""
    s = await session(host, project)
    sid = s["id"]
    sub = host.subscribe()
    provider.enqueue(sid, tool("Write", path="README.md", content="replaced\n"), {"text": "Done."})
    turn = await prompt(host, sid)
    requested = await permission_requested(sub)
    preview = requested.request.preview
    assert preview is not None and preview["overwrites"] is True
    assert "-# demo project" in preview["diff"] and "+replaced" in preview["diff"]
    pending = (await host.call("session.get", {"sessionId": sid}))["pendingPermissions"]
    assert pending[0]["preview"]["overwrites"] is True  # also after a reload
    with pytest.raises(Conflict) as refused:
        await host.call("session.revert", {"sessionId": sid, "turnId": turn["turnId"]})
    assert refused.value.code == "AGENT_BUSY"
    await host.call("permissions.resolve", {"requestId": requested.request.id, "sessionId": sid,
                                            "turnId": turn["turnId"], "decision": "allow"})
    await ended(sub, turn["turnId"])
    assert (project / "README.md").read_text() == "replaced\n"


async def test_issue17_edit_preview_shows_the_edit_and_no_overwrite(host, provider, project):
    """Issue 17: an Edit's permission preview is the diff of the edit, not an overwrite."""
    s = await session(host, project)
    sub = host.subscribe()
    provider.enqueue(s["id"], tool("Edit", path="src/app.py", oldText="hello", newText="bye"), {"text": "Done."})
    turn = await prompt(host, s["id"])
    requested = await permission_requested(sub)
    assert requested.request.preview == {
        "diff": "--- a/src/app.py\n+++ b/src/app.py\n@@ -1 +1 @@\n-print('hello')\n+print('bye')\n",
        "overwrites": False}
    await host.call("agent.abort", {"sessionId": s["id"]})
    await ended(sub, turn["turnId"])


async def test_issue17_two_sessions_in_one_project_each_list_only_their_own_changes(host, provider, project):
    """Issue 17: with two sessions in one project, each turn's changes are the files its own calls
    changed; a revert is refused while the other session runs in the same project."""
    a = (await session(host, project, permissionMode="auto"))["id"]
    b = (await session(host, project, permissionMode="auto"))["id"]
    ta = await completed_turn(host, provider, a, tool("Write", path="from_a.txt", content="a\n"))
    tb = await completed_turn(host, provider, b, tool("Write", path="from_b.txt", content="b\n"))
    assert set(_files(await host.call("session.changes", {"sessionId": a}), ta)) == {"from_a.txt"}
    assert set(_files(await host.call("session.changes", {"sessionId": b}), tb)) == {"from_b.txt"}
    sub = host.subscribe()
    provider.enqueue(b, {"gate": "b-runs", "text": "working"})
    running = await prompt(host, b)
    await provider.wait_reached("b-runs")
    with pytest.raises(Conflict) as refused:
        await host.call("session.revert", {"sessionId": a, "turnId": ta})
    assert refused.value.code == "AGENT_BUSY"
    provider.release("b-runs")
    await ended(sub, running["turnId"])
    assert (await host.call("session.revert", {"sessionId": a, "turnId": ta}))["files"] == ["from_a.txt", "from_b.txt"]


async def test_issue17_a_failing_checkpoint_never_fails_the_turn_and_is_reported_on_it(
    host, provider, project, monkeypatch, tmp_path
):
    """Issue 17: with git missing, the turn still completes and does its work; the failure is audited on
    the turn (checkpoint.failed) and session.changes carries a note saying so."""
    empty = tmp_path / "no-git"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    s = await session(host, project, permissionMode="auto")
    turn = await completed_turn(host, provider, s["id"], tool("Write", path="out.txt", content="still written\n"))
    assert (project / "out.txt").read_text() == "still written\n"
    failed = [e for e in await _audit(host, s["id"]) if e["action"] == "checkpoint.failed"]
    assert len(failed) == 1 and failed[0]["turnId"] == turn and "git is not installed" in failed[0]["detail"]["error"]
    assert "git is not installed" in (await host.call("session.changes", {"sessionId": s["id"]}))["note"]


async def test_issue17_a_workspace_too_large_turns_checkpoints_off_with_a_note_not_a_failed_turn(
    host, provider, project
):
    """Issue 17: over the file limit, checkpoints are off for the project (audited once, noted in
    session.changes), the turn completes, and a revert says why it cannot."""
    checkpoints.of(host.parts).max_files = 1  # the project holds two files
    s = await session(host, project, permissionMode="auto")
    turn = await completed_turn(host, provider, s["id"], tool("Write", path="x.txt", content="x\n"))
    assert (project / "x.txt").exists()
    off = [e for e in await _audit(host, s["id"]) if e["action"] == "checkpoints.off"]
    assert len(off) == 1
    changes = await host.call("session.changes", {"sessionId": s["id"]})
    assert "checkpoints are off" in changes["note"] and changes["turns"][0]["files"] == []
    with pytest.raises(Conflict):
        await host.call("session.revert", {"sessionId": s["id"], "turnId": turn})


async def test_issue17_checkpoints_come_back_once_a_too_large_workspace_has_shrunk(
    host, provider, project, monkeypatch
):
    """Issue 17: a workspace over the file limit is counted again by a turn starting RECHECK_S later;
    once it is under the limit (files removed, or ignored), that turn's changes are recorded."""
    checkpoints.of(host.parts).max_files = 2
    (project / "extra.txt").write_text("one file too many\n")
    s = await session(host, project, permissionMode="auto")
    await completed_turn(host, provider, s["id"], tool("Write", path="x.txt", content="x\n"))
    assert "checkpoints are off" in (await host.call("session.changes", {"sessionId": s["id"]}))["note"]
    (project / "extra.txt").unlink()
    (project / "x.txt").unlink()
    await completed_turn(host, provider, s["id"], tool("Write", path="y.txt", content="y\n"))  # too soon: still off
    assert "checkpoints are off" in (await host.call("session.changes", {"sessionId": s["id"]}))["note"]
    monkeypatch.setattr(checkpoints, "RECHECK_S", 0.0)
    (project / "y.txt").unlink()
    turn = await completed_turn(host, provider, s["id"], tool("Write", path="README.md", content="z\n"))
    changes = await host.call("session.changes", {"sessionId": s["id"]})
    assert changes["note"] is None and set(_files(changes, turn)) == {"README.md"}


async def test_issue17_a_temporary_session_outside_any_git_repository_is_checkpointed(host, provider):
    """Issue 17: a project that is not a git repository (here a temporary session's scratch root)
    gets checkpoints and reverts like any other."""
    s = await session(host, permissionMode="auto")
    turn = await completed_turn(host, provider, s["id"], tool("Write", path="notes.txt", content="n\n"))
    assert set(_files(await host.call("session.changes", {"sessionId": s["id"]}), turn)) == {"notes.txt"}
    assert (await host.call("session.revert", {"sessionId": s["id"], "turnId": turn}))["files"] == ["notes.txt"]
    assert not (Path(s["root"]) / "notes.txt").exists()


async def test_issue17_delegates_changes_count_for_the_parent_turn(host, provider, project):
    """Issue 17: a delegate's Write is checkpointed and listed under its parent's turn."""
    s = await session(host, project, permissionMode="auto")
    provider.enqueue(f"{s['id']}/task_1", tool("Write", path="by_task.txt", content="t\n"), {"text": "ok"})
    turn = await completed_turn(host, provider, s["id"], tool("Task", description="write", prompt="write it"),
                       tool("TaskWait", taskIds=["task_1"]))
    assert set(_files(await host.call("session.changes", {"sessionId": s["id"]}), turn)) == {"by_task.txt"}


async def test_issue17_finished_turn_event_order_lets_a_client_read_changes_at_turn_end(host, provider, project):
    """Issue 17: a client asking session.changes right on turn.ended sees the turn's last call (the
    call checkpoints run behind the turn, under the project's lock)."""
    s = await session(host, project, permissionMode="auto")
    sub = host.subscribe()
    provider.enqueue(s["id"], tool("Bash", command="echo x > last.txt"))
    turn = await prompt(host, s["id"])
    await sub.wait_for(lambda e: isinstance(e, ev.TurnEnded))
    assert set(_files(await host.call("session.changes", {"sessionId": s["id"]}), turn["turnId"])) == {"last.txt"}


async def test_issue33_more_roots_than_the_old_cap_are_all_watched_and_checkpointed(host, provider, tmp_path):
    """Issue 33 §3: a watch per root was an inotify instance (a user has 128, shared with editors), so
    a host watched 8 roots and the 9th busy one made every checkpoint of the least recent scan in full.
    One instance serves every root now: 12 projects, each turn's changes right, each root still watched
    after all of them, and a second round of turns scans no root in full — hand edits between rounds
    included in the next "before" state, not in the turn's changes."""
    roots = small_projects(tmp_path, 12)
    sids = [(await session(host, root, permissionMode="auto"))["id"] for root in roots]
    firsts = await asyncio.gather(*(completed_turn(host, provider, sid, tool("Bash", command=f"echo {n} > b.txt"))
                                    for n, sid in enumerate(sids)))
    for sid in sids:  # (each waits for its turn's checkpoints)
        await host.call("session.changes", {"sessionId": sid})
    repos = [checkpoints.of(host.parts)._project(root).repo for root in roots]
    if not repos[0].watch.available:
        pytest.skip("inotify is not available here (Linux only)")
    assert all(r.watch.watching for r in repos)
    scans = [r.full_scans for r in repos]
    for root in roots[::2]:
        (root / "a.txt").write_text("by hand\n")
    seconds = await asyncio.gather(*(completed_turn(host, provider, sid, tool("Bash", command="echo x > c.txt"))
                                     for sid in sids))
    for sid, first, second in zip(sids, firsts, seconds, strict=True):
        changes = await host.call("session.changes", {"sessionId": sid})
        assert set(_files(changes, first)) == {"b.txt"} and set(_files(changes, second)) == {"c.txt"}
    assert [r.full_scans for r in repos] == scans and all(r.watch.watching for r in repos)
    reverted = await host.call("session.revert", {"sessionId": sids[0], "turnId": seconds[0]})
    assert reverted["files"] == ["c.txt"] and (roots[0] / "a.txt").read_text() == "by hand\n"


async def test_issue33_past_the_watch_budget_the_least_recent_root_stops_watching_and_misses_nothing(
    host, provider, tmp_path
):
    """Issue 33 §3: the roots share a budget of watched directories; a root whose watch would pass it
    makes the least recently checkpointed idle root stop watching (not the other way round), and a
    change made in the unwatched root meanwhile is still recorded by its next checkpoint."""
    roots = []
    for name in ("one", "two"):
        root = tmp_path / name
        (root / "sub" / "deeper").mkdir(parents=True)
        (root / "a.txt").write_text(f"{name}\n")
        roots.append(root)
    one, two = [(await session(host, root, permissionMode="auto"))["id"] for root in roots]
    await completed_turn(host, provider, one, tool("Bash", command="echo 1 > b.txt"))
    repos = [checkpoints.of(host.parts)._project(root).repo for root in roots]
    inotify = repos[0].watch.inotify
    if not inotify.available:
        pytest.skip("inotify is not available here (Linux only)")
    assert repos[0].watch.watching and repos[0].watch.size == 3
    budget = inotify.budget
    inotify.budget = inotify.count + 2  # room for root one's three directories and two more
    try:
        # its "before" checkpoint finds no room (a full scan); its call's makes room: the least recent goes
        await completed_turn(host, provider, two, tool("Bash", command="echo 2 > b.txt"))
        await host.call("session.changes", {"sessionId": two})  # (waits for the turn's checkpoints)
        assert repos[1].watch.watching and not repos[0].watch.watching
        (roots[0] / "by-hand.txt").write_text("unwatched\n")
        last = await completed_turn(host, provider, one, tool("Bash", command="echo 3 > c.txt"))
        changes = await host.call("session.changes", {"sessionId": one, "turnId": last})
        assert set(_files(changes, last)) == {"c.txt"}  # the hand edit came before the turn: not its change
        assert repos[0].watch.watching and not repos[1].watch.watching
        reverted = await host.call("session.revert", {"sessionId": one, "turnId": last})
        assert reverted["files"] == ["c.txt"] and (roots[0] / "by-hand.txt").exists()
    finally:
        inotify.budget = budget


async def test_issue16_a_turns_first_checkpoint_waits_for_the_model_client_and_its_tool_calls_wait_for_it(
        host, provider, project):
    """On a cold start, importing the vendor's SDK is what the first request waits for; the turn's "before"
    checkpoint (git processes, threads) starts once the provider's client is ready rather than slow that
    import. The model's Write, asked for meanwhile, waits for that checkpoint: the turn still shows its file
    as added, against the workspace as the turn found it."""
    client_ready, asked = asyncio.Event(), asyncio.Event()

    async def ready() -> None:
        asked.set()
        await client_ready.wait()

    provider.ready = ready
    sid = (await session(host, project, permissionMode="auto"))["id"]
    sub = host.subscribe()
    provider.enqueue(sid, tool("Write", path="made.txt", content="new\n"), {"text": "Done."})
    turn_id = (await prompt(host, sid))["turnId"]
    await asyncio.wait_for(asked.wait(), 10)  # (the checkpoint asks whether the client is ready)
    await sub.wait_for(lambda e: isinstance(e, ev.ToolStarted) and e.turn_id == turn_id)
    repo = checkpoints.of(host.parts)._project(project.resolve()).repo
    assert repo.entries() == []  # no checkpoint yet: the client is not ready
    assert not (project / "made.txt").exists()  # and the Write waits for it
    client_ready.set()
    assert (await ended(sub, turn_id)).reason == "completed"
    assert [e["k"] for e in repo.entries()][:1] == ["turn"]
    assert {p: f["status"] for p, f in _files(await host.call("session.changes", {"sessionId": sid}),
                                              turn_id).items()} == {"made.txt": "added"}


async def test_a_big_rewrite_asks_without_freezing_the_host_and_its_preview_is_kept(host, provider, project):
    """Issue 29 item 3: a Write that rewrites a 10,000-line file under ask stalled the event loop 13-18 s while
    its diff was made, and every permissions.pending and session.get made it again. The preview is made once,
    off the loop, bounded (it says how many lines change), and kept with the request."""
    big = project / "big.py"
    big.write_text("".join(f"value_{i} = {i}\n" for i in range(10_000)))
    rewritten = "".join(f"value_{i} = {i * 2 if i % 7 == 0 else i}\n" for i in range(10_000))
    s = await session(host, project)
    sub = host.subscribe()
    provider.enqueue(s["id"], tool("Write", path="big.py", content=rewritten), {"text": "Done."})
    async with Ticker() as ticker:
        turn = await prompt(host, s["id"])
        preview = (await permission_requested(sub)).request.preview
        big.write_text("changed meanwhile\n")  # what was asked about stays what is shown
        for _ in range(5):
            pending = (await host.call("permissions.pending", {"sessionId": s["id"]}))["requests"]
            shown = (await host.call("session.get", {"sessionId": s["id"]}))["pendingPermissions"]
            assert pending[0]["preview"] == shown[0]["preview"] == preview
    assert ticker.worst < 0.5, ticker.worst  # (13-18 s before; bench/loop_stall.py holds it to 50 ms, without the test run's GC)
    assert preview is not None and preview["overwrites"] is True
    assert preview["diff"] == ("(diff too large to show: big.py goes from 10,000 to 10,000 lines; "
                               "about 1,428 removed and 1,428 added)")  # (value_0 is 0 either way)
    await host.call("agent.abort", {"sessionId": s["id"]})
    await ended(sub, turn["turnId"])


async def test_a_tracked_directory_turned_into_a_link_is_recorded_and_later_turns_too(host, provider, project):
    """Issue 29 item 4: replacing a tracked directory with a symlink made every later checkpoint fail (git
    update-index: Unable to process path d): session.changes showed no files for turns that wrote some."""
    s = await session(host, project, permissionMode="auto")
    sid = s["id"]
    await completed_turn(host, provider, sid, tool("Write", path="a.txt", content="1\n"))
    linked = await completed_turn(host, provider, sid, tool("Bash", command="rm -rf src && ln -s /usr src"))
    later = await completed_turn(host, provider, sid, tool("Write", path="b.txt", content="2\n"))
    turns = {t["turnId"]: sorted(f["path"] for f in t["files"])
             for t in (await host.call("session.changes", {"sessionId": sid}))["turns"]}
    assert turns[linked] == ["src", "src/app.py"] and turns[later] == ["b.txt"]


async def test_a_dot_git_in_another_case_is_left_out_and_checkpoints_go_on(host, provider, project):
    """Issue 29 item 4: a project holding ``.Git/`` broke every checkpoint (git refuses the path in a tree)."""
    (project / ".Git").mkdir()
    (project / ".Git" / "config").write_text("[core]\n")
    s = await session(host, project, permissionMode="auto")
    turn = await completed_turn(host, provider, s["id"], tool("Write", path="a.txt", content="1\n"))
    changes = await host.call("session.changes", {"sessionId": s["id"]})
    assert [(t["turnId"], [f["path"] for f in t["files"]]) for t in changes["turns"]] == [(turn, ["a.txt"])]
    assert changes.get("note") is None


async def test_a_file_grown_past_the_size_cap_is_named_not_stored_and_a_revert_leaves_it(host, provider, project):
    """Issue 29 item 6: a tracked file grown past the cap in a turn was hashed and stored whole (1.5 GB:
    4.1 GB of memory, the shadow repo +1.5 GB) and silently so. Now no object over the cap is stored, the
    turn's changes name the file as too large to checkpoint (once: later turns do not repeat it), and a
    revert leaves it — its content is in no checkpoint — and says so in ``notRestored``."""
    cap = 4096
    checkpoints.of(host.parts).size_cap = cap
    s = await session(host, project, permissionMode="auto")
    sid = s["id"]
    grew = await completed_turn(host, provider, sid, tool(
        "Bash", command="head -c 100000 /dev/zero | tr '\\0' x >> README.md && echo s > small.txt "
                        "&& head -c 50000 /dev/zero > big.bin"))
    later = await completed_turn(host, provider, sid, tool("Write", path="c.txt", content="c\n"))
    changes = await host.call("session.changes", {"sessionId": sid})
    files = _files(changes, grew)
    assert {p: (f["status"], f.get("tooLarge", False)) for p, f in files.items()} == {
        "README.md": ("modified", True), "big.bin": ("added", True), "small.txt": ("added", False)}
    assert "over the 4,096 bytes checkpoint limit" in files["README.md"]["diff"]
    assert "a revert leaves it as it is" in files["big.bin"]["diff"]
    assert list(_files(changes, later)) == ["c.txt"]
    shadow = checkpoints.of(host.parts)._project(project).repo
    sizes = subprocess.run(["git", f"--git-dir={shadow.git_dir}", "cat-file", "--batch-all-objects",
                            "--batch-check=%(objectsize)"], capture_output=True, check=True, text=True).stdout.split()
    assert sizes and max(map(int, sizes)) <= cap  # nothing over the cap was ever stored

    result = await host.call("session.revert", {"sessionId": sid, "turnId": grew})
    assert sorted(result["files"]) == ["c.txt", "small.txt"]
    assert result["notRestored"] == ["README.md", "big.bin"]
    assert (project / "README.md").stat().st_size == len("# demo project\n") + 100000
    assert (project / "big.bin").stat().st_size == 50000
    assert not (project / "small.txt").exists() and not (project / "c.txt").exists()


async def test_a_file_back_under_the_cap_is_recorded_again_and_a_revert_never_writes_stale_content(
    host, provider, project
):
    """Issue 29 item 6: a held file (over the cap) that shrinks back is checkpointed again. Its diff for that
    turn cannot be told (what it held before was never recorded), and a revert to before that turn leaves
    it: the checkpoint's older content for it is not what the file held then."""
    checkpoints.of(host.parts).size_cap = 4096
    s = await session(host, project, permissionMode="auto")
    sid = s["id"]
    await completed_turn(host, provider, sid, tool("Bash", command="head -c 10000 /dev/zero | tr '\\0' y > README.md"))
    shrank = await completed_turn(host, provider, sid, tool("Write", path="README.md", content="short again\n"))
    files = _files(await host.call("session.changes", {"sessionId": sid}), shrank)
    assert files["README.md"].get("tooLarge") is None
    assert "was over the checkpoint limit before this turn" in files["README.md"]["diff"]
    result = await host.call("session.revert", {"sessionId": sid, "turnId": shrank})
    assert result["files"] == [] and result["notRestored"] == ["README.md"]
    assert (project / "README.md").read_text() == "short again\n"  # not "# demo project", a state it never had then
    back = await host.call("session.revert", {"sessionId": sid, "turnId": result["revertId"]})
    assert back["files"] == [] and (project / "README.md").read_text() == "short again\n"


async def test_issue33_a_hand_edit_between_turns_is_in_the_next_turns_before_state_without_a_full_scan(
    host, provider, project
):
    """Issue 33 §3: a turn's "before" checkpoint takes the watch's word for what changed since the last
    one — an unchanged watched tree is not listed in full (a stat of every file) — and a hand edit made
    between turns is still in it: it is not counted as the turn's change, and reverting the turn puts
    the hand-edited content back, not the previous turn's."""
    sid = (await session(host, project, permissionMode="auto"))["id"]
    await completed_turn(host, provider, sid, tool("Write", path="README.md", content="by turn one\n"))
    shadow = checkpoints.of(host.parts)._project(project).repo
    if not shadow.watch.available:
        pytest.skip("inotify is not available here (Linux only)")
    assert shadow.watch.watching
    scans = shadow.full_scans
    quiet = await completed_turn(host, provider, sid, tool("Bash", command="true"))
    await host.call("session.changes", {"sessionId": sid})  # (waits for the turn's checkpoints)
    assert shadow.full_scans == scans  # nothing changed: nothing listed, whatever the tree's size
    (project / "README.md").write_text("by hand\n")
    (project / "src" / "hand.py").write_text("print('mine')\n")
    second = await completed_turn(host, provider, sid, tool("Write", path="README.md", content="by turn two\n"))
    changes = await host.call("session.changes", {"sessionId": sid})
    assert shadow.full_scans == scans
    assert _files(changes, quiet) == {}
    two = _files(changes, second)
    assert set(two) == {"README.md"}
    assert "-by hand" in two["README.md"]["diff"] and "+by turn two" in two["README.md"]["diff"]
    reverted = await host.call("session.revert", {"sessionId": sid, "turnId": second})
    assert reverted["files"] == ["README.md"]
    assert (project / "README.md").read_text() == "by hand\n"
    assert (project / "src" / "hand.py").read_text() == "print('mine')\n"
