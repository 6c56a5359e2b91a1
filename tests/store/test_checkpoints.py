"""The shadow repository (store/checkpoints.py) against real git, on real files.

Issue 17: checkpoints never touch the project's own ``.git``, honour its
``.gitignore``, leave ``.pi/`` and large files alone, and refuse a root too big
to checkpoint.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import pytest

from pidesk.store import checkpoints
from pidesk.store.checkpoints import ShadowRepo, TooLarge
from tests.scenario import small_projects


def _tree_digest(directory: Path) -> dict[str, str]:
    """Every file under ``directory`` by relative path: its bytes' sha256 (and a link's target)."""
    out = {}
    for path in sorted(directory.rglob("*")):
        rel = path.relative_to(directory).as_posix()
        if path.is_symlink():
            out[rel] = "link:" + os.readlink(path)
        elif path.is_file():
            out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
        else:
            out[rel] = "dir"
    return out


def _plain_git(cwd: Path, *args: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@example.com", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@example.com", GIT_CONFIG_GLOBAL=os.devnull)
    subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True)


@pytest.mark.asyncio
async def test_issue17_the_projects_own_git_is_byte_for_byte_unchanged_after_100_checkpoints_and_a_revert(
    tmp_path: Path, project: Path
) -> None:
    """Issue 17: the shadow repository never commits, stashes or touches the index of the project's
    own repository — every file under its .git is the same bytes after 100 checkpoints and a revert."""
    _plain_git(project, "init", "-q")
    _plain_git(project, "add", "-A")
    _plain_git(project, "commit", "-q", "-m", "first")
    (project / "README.md").write_text("# changed but not committed\n")  # a dirty work tree, as people have
    before = _tree_digest(project / ".git")
    shadow = ShadowRepo(tmp_path / "data", project)
    first = await shadow.snapshot()
    for n in range(100):
        (project / "src" / "app.py").write_text(f"print({n})\n")
        await shadow.snapshot()
    (project / "new.txt").write_text("new\n")
    now = await shadow.snapshot()
    files = await shadow.restore(now, first, {"root": str(project)})
    assert sorted(files) == ["new.txt", "src/app.py"]
    assert (project / "src" / "app.py").read_text() == "print('hello')\n"
    assert not (project / "new.txt").exists()
    assert _tree_digest(project / ".git") == before


@pytest.mark.asyncio
async def test_issue17_diff_names_each_kind_of_change_with_counts_and_binary(tmp_path: Path, project: Path) -> None:
    """Issue 17: a checkpoint diff lists added (in a new directory), modified, deleted and binary files."""
    shadow = ShadowRepo(tmp_path / "data", project)
    before = await shadow.snapshot()
    (project / "deep" / "new").mkdir(parents=True)
    (project / "deep" / "new" / "a.txt").write_text("one\ntwo\n")
    (project / "README.md").write_text("# demo project\nmore\n")
    (project / "src" / "app.py").unlink()
    (project / "blob.bin").write_bytes(b"\x00\x01\x02\xff")
    after = await shadow.snapshot()
    changes = {c.path: c for c in await shadow.stat(before, after)}
    assert {p: c.status for p, c in changes.items()} == {
        "deep/new/a.txt": "added", "README.md": "modified", "src/app.py": "deleted", "blob.bin": "added"}
    assert (changes["deep/new/a.txt"].additions, changes["deep/new/a.txt"].deletions) == (2, 0)
    assert (changes["README.md"].additions, changes["README.md"].deletions) == (1, 0)
    assert changes["blob.bin"].binary and not changes["README.md"].binary
    diffs = (await shadow.patches([(before, after)]))[(before, after)]
    assert "+more" in diffs["README.md"] and diffs["blob.bin"] == "binary"
    assert await shadow.changed_paths(before, after) == set(changes) == set(diffs)


@pytest.mark.asyncio
async def test_issue17_ignored_pi_and_large_files_are_never_checkpointed_nor_touched_by_a_restore(
    tmp_path: Path, project: Path
) -> None:
    """Issue 17: .gitignore'd files, .pi/ and new files over the size cap are outside every checkpoint,
    so a restore to an earlier tree leaves them exactly as they are."""
    (project / ".gitignore").write_text("*.log\n")
    shadow = ShadowRepo(tmp_path / "data", project, size_cap=1000)
    first = await shadow.snapshot()
    (project / "run.log").write_text("log\n")
    (project / ".pi").mkdir()
    (project / ".pi" / "plan.md").write_text("plan\n")
    (project / "big.dat").write_bytes(b"x" * 5000)
    (project / "README.md").write_text("changed\n")
    now = await shadow.snapshot()
    assert await shadow.changed_paths(first, now) == {"README.md"}
    assert await shadow.restore(now, first, {"root": str(project)}) == ["README.md"]
    assert (project / "run.log").read_text() == "log\n"
    assert (project / ".pi" / "plan.md").read_text() == "plan\n"
    assert (project / "big.dat").stat().st_size == 5000
    assert (project / "README.md").read_text() == "# demo project\n"


@pytest.mark.asyncio
async def test_issue17_a_root_with_too_many_files_is_refused_before_anything_is_hashed(
    tmp_path: Path, project: Path
) -> None:
    """Issue 17: a workspace over the file limit (after ignores) raises TooLarge, writing no object."""
    for n in range(5):
        (project / f"f{n}.txt").write_text(str(n))
    shadow = ShadowRepo(tmp_path / "data", project, max_files=4)
    with pytest.raises(TooLarge):
        await shadow.snapshot()
    objects = [p for p in (shadow.git_dir / "objects").rglob("*") if p.is_file()]
    assert objects == []


@pytest.mark.asyncio
async def test_issue17_checkpoint_files_are_private(tmp_path: Path, project: Path) -> None:
    """Issue 17: the checkpoints dir is 0700 and nothing in it is readable by others."""
    shadow = ShadowRepo(tmp_path / "data", project)
    await shadow.snapshot()
    shadow.append({"k": "turn"})
    assert (shadow.base.stat().st_mode & 0o777) == 0o700
    for path in shadow.base.rglob("*"):
        assert path.stat().st_mode & 0o077 == 0, path


def _git_add_all_tree(root: Path, scratch: Path) -> str:
    """The tree plain ``git add -A`` + ``write-tree`` makes of ``root`` (a throwaway repository)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_DIR=str(scratch), GIT_WORK_TREE=str(root), GIT_CONFIG_GLOBAL=os.devnull)
    subprocess.run(["git", "init", "-q", "--template="], env=env, check=True)
    subprocess.run(["git", "add", "-A"], cwd=root, env=env, check=True)
    return subprocess.run(["git", "write-tree"], cwd=root, env=env, check=True, capture_output=True,
                          text=True).stdout.strip()


@pytest.mark.asyncio
async def test_issue17_the_first_snapshot_is_the_tree_git_add_makes_of_awkward_names_links_and_modes(
    tmp_path: Path, project: Path
) -> None:
    """Issue 17: the first snapshot (streamed through fast-import) records exactly what `git add -A`
    would — names with quotes, spaces, a newline, a backslash and non-ASCII, a symlink, an
    executable, a new directory — and leaves out ignored files and a nested repository."""
    (project / ".gitignore").write_text("*.log\n")
    awkward = ['"quoted".txt', "with space.txt", "new\nline.txt", "back\\slash.txt", "naïve ünïcode.md"]
    for name in awkward:
        (project / name).write_text(f"{name}\n")
    (project / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (project / "run.sh").chmod(0o755)
    (project / "link").symlink_to("src/app.py")
    (project / "deep" / "er").mkdir(parents=True)
    (project / "deep" / "er" / "x.txt").write_text("x\n")
    (project / "debug.log").write_text("ignored\n")
    expected = _git_add_all_tree(project, tmp_path / "reference.git")
    (project / "vendor").mkdir()  # a nested repository (git add would refuse it: no commit)
    _plain_git(project / "vendor", "init", "-q")
    (project / "vendor" / "lib.py").write_text("nested\n")

    shadow = ShadowRepo(tmp_path / "data", project)
    assert await shadow.snapshot() == expected
    # the index the first snapshot leaves behind is current: nothing changed, nothing listed
    assert await shadow.snapshot() == expected


@pytest.mark.asyncio
async def test_issue17_a_narrowed_snapshot_records_the_named_paths_and_the_next_full_scan_the_rest(
    tmp_path: Path, project: Path
) -> None:
    """Issue 17: without a watch of the root, a snapshot told which paths changed (a Write's or
    Edit's file) records those — a new file, an edit, a deletion — and leaves other changes to the
    next full scan, which finds them."""
    shadow = ShadowRepo(tmp_path / "data", project)
    shadow.watch.available = False  # as on a system without inotify
    first = await shadow.snapshot()
    (project / "src" / "app.py").write_text("print('edited')\n")
    (project / "src" / "new.py").write_text("new\n")
    (project / "README.md").write_text("# by hand\n")
    narrowed = await shadow.snapshot(["src/app.py", "src/new.py"])
    assert await shadow.changed_paths(first, narrowed) == {"src/app.py", "src/new.py"}
    (project / "src" / "new.py").unlink()
    gone = await shadow.snapshot(["src/new.py"])
    assert await shadow.changed_paths(narrowed, gone) == {"src/new.py"}
    assert await shadow.snapshot([]) == gone
    full = await shadow.snapshot()
    assert await shadow.changed_paths(gone, full) == {"README.md"}


@pytest.mark.asyncio
async def test_issue17_with_a_watch_a_snapshot_sees_hand_edits_and_spawns_no_git_when_nothing_changed(
    tmp_path: Path, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 17: the root's watch tells a snapshot where to look — a hand edit, a file in a new
    directory tree — and when nothing changed the snapshot answers without running git."""
    shadow = ShadowRepo(tmp_path / "data", project)
    if not shadow.watch.available:
        pytest.skip("inotify is not available here (Linux only)")
    first = await shadow.snapshot()
    (project / "README.md").write_text("# by hand\n")
    (project / "new" / "deeper").mkdir(parents=True)
    (project / "new" / "deeper" / "f.txt").write_text("f\n")
    seen = await shadow.snapshot()
    assert await shadow.changed_paths(first, seen) == {"README.md", "new/deeper/f.txt"}

    def no_git(*args: object) -> None:
        raise AssertionError(f"git ran: {args}")

    monkeypatch.setattr(shadow, "_run_git", no_git)
    assert await shadow.snapshot() == seen


@pytest.mark.asyncio
async def test_a_restore_holds_a_bounded_batch_of_blobs_in_memory(tmp_path: Path, project: Path, monkeypatch) -> None:
    """Issue 29 item 6: a revert read every blob it restores into memory at once (a 1.5 GB file: 4.1 GB of
    memory). It fetches them in batches of at most RESTORE_BATCH bytes, and restores every file."""
    monkeypatch.setattr(checkpoints, "RESTORE_BATCH", 10_000)
    shadow = ShadowRepo(tmp_path / "data", project)
    for n in range(20):
        (project / f"f{n}.txt").write_bytes(bytes([65 + n]) * 3000)
    first = await shadow.snapshot()
    for n in range(20):
        (project / f"f{n}.txt").write_text("changed\n")
    now = await shadow.snapshot()
    held: list[int] = []
    fetch = shadow._blobs

    async def counted(shas: set[str]) -> dict[str, bytes]:
        blobs = await fetch(shas)
        held.append(sum(map(len, blobs.values())))
        return blobs

    monkeypatch.setattr(shadow, "_blobs", counted)
    assert len(await shadow.restore(now, first, {"root": str(project)})) == 20
    assert all((project / f"f{n}.txt").read_bytes() == bytes([65 + n]) * 3000 for n in range(20))
    assert len(held) == 7 and max(held) <= 10_000  # 3 files (9,000 bytes) a batch


@pytest.mark.asyncio
async def test_issue33_stat_and_patches_name_every_change_for_any_file_name(tmp_path: Path, project: Path) -> None:
    """Issue 33 §1: a turn's list is kept from ``stat`` (no diffs) and a diff is made only when asked, by
    ``patches`` — many pairs of trees in one git process. Both name every file, for names git quotes (a
    quote, a backslash, a tab, a newline), names with spaces or non-ASCII letters, a binary file and a
    diff too long to give whole; each pair's files go to that pair."""
    shadow = ShadowRepo(tmp_path / "data", project)
    names = ["sp ace.txt", 'quo"te.txt', "back\\slash.txt", "tab\there.txt", "new\nline.txt", "ünï/cödé.txt",
             "x b/x", "plain.txt"]
    first = await shadow.snapshot()
    for n, name in enumerate(names):
        (project / name).parent.mkdir(parents=True, exist_ok=True)
        (project / name).write_text(f"line {n}\n")
    (project / "blob.bin").write_bytes(b"a\0b")
    (project / "README.md").write_text("".join(f"row {i}\n" for i in range(40_000)))  # a long diff
    middle = await shadow.snapshot()
    (project / "plain.txt").write_text("changed\n")
    (project / "src" / "app.py").unlink()
    last = await shadow.snapshot()
    added = {name: ("added", 1, 0, False) for name in names}
    expected = {
        (first, middle): added | {"blob.bin": ("added", 0, 0, True), "README.md": ("modified", 40_000, 1, False)},
        (middle, last): {"plain.txt": ("modified", 1, 1, False), "src/app.py": ("deleted", 0, 1, False)},
    }
    expected[(first, last)] = {**expected[(first, middle)], "plain.txt": ("added", 1, 0, False),
                               "src/app.py": ("deleted", 0, 1, False)}
    for (old, new), want in expected.items():
        assert {s.path: (s.status, s.additions, s.deletions, s.binary) for s in await shadow.stat(old, new)} == want
    pairs = [(first, middle), (middle, last), (first, last), (first, middle), (last, last)]
    patches = await shadow.patches(pairs)
    assert set(patches) == {(first, middle), (middle, last), (first, last)}
    for pair, found in patches.items():
        assert set(found) == set(expected[pair])
    for n, name in enumerate(names):  # each quoted name's diff is its own, under its own name
        assert f"+line {n}\n" in patches[(first, middle)][name]
    assert patches[(first, middle)]["blob.bin"] == "binary"
    assert patches[(first, middle)]["README.md"].endswith("… (diff cut at 256 KiB)\n")
    assert set(patches[(middle, last)]) == {"plain.txt", "src/app.py"}
    only = await shadow.patches([(first, last)], {"new\nline.txt", "x b/x"})
    assert set(only[(first, last)]) == {"new\nline.txt", "x b/x"}
    assert only[(first, last)]["x b/x"] == patches[(first, last)]["x b/x"]


@pytest.mark.asyncio
async def test_issue33_git_runs_a_bounded_number_at_once_across_repositories(tmp_path: Path, monkeypatch) -> None:
    """Every shadow repository of a process shares ``GIT_AT_ONCE``: a git is CPU work beside the host's loop,
    and 64 projects' first snapshots, six at once on two CPUs, held that loop 46-60 ms."""
    import asyncio
    import threading

    monkeypatch.setattr(checkpoints, "GIT_AT_ONCE", threading.BoundedSemaphore(1))
    running: list[None] = []
    most = 0
    real = ShadowRepo._run_git_now

    def counted(self: ShadowRepo, *args: object) -> tuple[int, bytes, bytes]:
        nonlocal most
        running.append(None)
        most = max(most, len(running))
        try:
            return real(self, *args)  # type: ignore[arg-type]
        finally:
            running.pop()

    monkeypatch.setattr(ShadowRepo, "_run_git_now", counted)
    shadows = [ShadowRepo(tmp_path / f"data{n}", root) for n, root in enumerate(small_projects(tmp_path, 3))]
    snapshots = await asyncio.gather(*(shadow.snapshot() for shadow in shadows))
    assert len(set(snapshots)) == 3 and most == 1


@pytest.mark.asyncio
async def test_issue33_a_git_cancelled_while_it_waits_its_turn_never_runs(tmp_path: Path, project: Path,
                                                                          monkeypatch) -> None:
    import asyncio
    import threading

    monkeypatch.setattr(checkpoints, "GIT_AT_ONCE", threading.BoundedSemaphore(1))
    ran: list[tuple[str, ...]] = []
    real = ShadowRepo._run_git_now
    monkeypatch.setattr(ShadowRepo, "_run_git_now", lambda self, args, *rest: ran.append(args) or real(self, args, *rest))
    shadow = ShadowRepo(tmp_path / "data", project)
    await shadow.snapshot()
    ran.clear()
    checkpoints.GIT_AT_ONCE.acquire()  # every turn taken (another repository's git, say)
    try:
        waiting = asyncio.create_task(shadow._git("rev-parse", "HEAD"))
        await asyncio.sleep(0)  # it starts, and waits in its worker thread
        waiting.cancel()
        await asyncio.sleep(0)  # (the task takes its cancellation first: FIFO) and marks the git dropped
    finally:
        checkpoints.GIT_AT_ONCE.release()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert ran == []


@pytest.mark.asyncio
async def test_issue33_a_file_written_through_a_temporary_name_lists_nothing(tmp_path: Path, project: Path,
                                                                            monkeypatch) -> None:
    """Write writes a temporary file and renames it over its target. The watch reports both names; the gone,
    untracked one used to cost a listing of the whole tree (80 ms at 45,000 files) to learn nothing."""
    shadow = ShadowRepo(tmp_path / "data", project)
    if not shadow.watch.available:
        pytest.skip("inotify is not available here (Linux only)")
    first = await shadow.snapshot()
    ran: list[str] = []
    real = ShadowRepo._run_git_now
    monkeypatch.setattr(ShadowRepo, "_run_git_now", lambda self, args, *rest: ran.append(args[0]) or real(self, args, *rest))
    temporary = project / ".a1b2.pidesk-tmp"
    temporary.write_text("print('written')\n")
    temporary.rename(project / "src" / "app.py")
    now = await shadow.snapshot()
    assert await shadow.changed_paths(first, now) == {"src/app.py"}
    assert "ls-files" not in ran
