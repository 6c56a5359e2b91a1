"""The root's watch (store/treewatch.py) never lets a checkpoint miss a change.

Hypothesis drives random file-system work — writes, deletions, renames of files
and directories, new directory trees, mode changes, symlinks, ``.gitignore``
edits, ignored files — and after each step the snapshot the watch narrowed must
be the tree a full scan makes of the same files.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pidesk.store.checkpoints import ShadowRepo
from pidesk.store.treewatch import TreeWatch

if not TreeWatch(Path(".")).available:
    pytest.skip("inotify is not available here (Linux only)", allow_module_level=True)

DIRS = ["", "a", "a/b", "c", "a/b/d"]
NAMES = ["x.txt", "y.py", "z.log", "w"]
PATHS = st.builds(lambda d, n: f"{d}/{n}" if d else n, st.sampled_from(DIRS), st.sampled_from(NAMES))
ANY = st.one_of(PATHS, st.sampled_from(DIRS[1:]))

OPS = st.one_of(
    st.tuples(st.just("write"), PATHS, st.sampled_from(["1\n", "two\n", "three lines\n\n\n"])),
    st.tuples(st.just("delete"), ANY),
    st.tuples(st.just("rename"), ANY, ANY),
    st.tuples(st.just("chmod"), PATHS, st.sampled_from([0o644, 0o755])),
    st.tuples(st.just("symlink"), PATHS, st.sampled_from(["x.txt", "a", "missing"])),
    st.tuples(st.just("ignore"), st.sampled_from(["*.log\n", "", "c/\n", "a/b/\n"])),
    st.tuples(st.just("tree"), st.sampled_from(DIRS[1:]), st.integers(1, 4)),
)


def apply(root: Path, op: tuple) -> None:
    kind, *args = op
    with contextlib.suppress(OSError):
        match kind:
            case "write":
                target = root / args[0]
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(args[1])
            case "delete":
                target = root / args[0]
                if target.is_dir() and not target.is_symlink():
                    shutil.rmtree(target)
                else:
                    target.unlink()
            case "rename":
                (root / args[1]).parent.mkdir(parents=True, exist_ok=True)
                os.rename(root / args[0], root / args[1])
            case "chmod":
                os.chmod(root / args[0], args[1])
            case "symlink":
                (root / args[0]).parent.mkdir(parents=True, exist_ok=True)
                os.symlink(args[1], root / args[0])
            case "ignore":
                (root / ".gitignore").write_text(args[0])
            case "tree":  # a directory tree made in one go, as an unpacked archive is
                for n in range(args[1]):
                    deep = root / args[0] / f"t{n}" / "u"
                    deep.mkdir(parents=True, exist_ok=True)
                    (deep / f"f{n}.txt").write_text(f"{n}\n")


async def _compare(scratch: Path, steps: list[list[tuple]]) -> None:
    """Apply each batch of ``steps``; after each, the watched snapshot must equal a full scan's."""
    root = scratch / "project"
    root.mkdir()
    (root / "x.txt").write_text("x\n")
    shadow = ShadowRepo(scratch / "data", root)
    scanner = ShadowRepo(scratch / "scanner", root)  # a second shadow that scans every file each time
    scanner.watch.available = False
    try:
        await shadow.snapshot()
        for batch in steps:
            for op in batch:
                apply(root, op)
            assert await shadow.snapshot() == await scanner.snapshot(), batch
    finally:
        shadow.close()


SCENARIOS = {
    "a mode change alone": [[("chmod", "x.txt", 0o755)], [("chmod", "x.txt", 0o644)]],
    "an edit inside a directory made since the last look": [[("write", "a/b/x.txt", "1\n")],
                                                           [("write", "a/b/x.txt", "two\n")]],
    "an edit inside a renamed directory": [[("write", "a/b/x.txt", "1\n")], [("rename", "a", "c")],
                                           [("write", "c/b/x.txt", "two\n")]],
    "a file written through a temporary name, as Write does": [[("write", "x.txt", "1\n")],
                                                               [("write", ".x.tmp", "two\n"), ("rename", ".x.tmp", "x.txt")]],
    "a directory of tracked files removed": [[("write", "a/b/x.txt", "1\n")], [("delete", "a")]],
    "a directory whose files were all ignored gets one that is not": [
        [("write", "a/z.log", "1\n"), ("ignore", "*.log\n")], [("write", "a/x.txt", "1\n")]],
    "a directory ignored by name, then un-ignored": [[("ignore", "c/\n"), ("write", "c/x.txt", "1\n")],
                                                    [("write", "c/y.py", "1\n")], [("ignore", "")]],
    "a tree unpacked at once": [[("tree", "a/b", 4)], [("write", "a/b/t3/u/f3.txt", "two\n")]],
}


@pytest.mark.parametrize("steps", SCENARIOS.values(), ids=SCENARIOS.keys())
@pytest.mark.asyncio
async def test_issue17_a_watched_snapshot_sees_each_hard_case(tmp_path: Path, steps: list[list[tuple]]) -> None:
    """Issue 17: the cases a watch most easily misses, each checked against a full scan."""
    await _compare(tmp_path, steps)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(st.lists(OPS, min_size=1, max_size=4), min_size=1, max_size=6))
def test_issue17_a_watched_snapshot_is_always_the_tree_a_full_scan_makes(steps: list[list[tuple]]) -> None:
    """Issue 17: whatever happens to the files between two checkpoints, the snapshot the watch
    narrowed records all of it: a full scan right after finds nothing more."""

    with tempfile.TemporaryDirectory() as scratch:
        asyncio.run(_compare(Path(scratch), steps))


@pytest.mark.asyncio
async def test_issue17_past_the_watch_limits_a_snapshot_scans_everything_and_misses_nothing(tmp_path: Path) -> None:
    """Issue 17: a root with more directories than the watch may hold is scanned in full each time
    (the watch gives up for good); a burst of new directories past what one look may add restarts
    the watch. Either way the snapshot is the tree a full scan makes."""
    root = tmp_path / "project"
    for d in ("a", "b", "c"):
        (root / d).mkdir(parents=True)
        (root / d / "f.txt").write_text(f"{d}\n")
    scanner = ShadowRepo(tmp_path / "scanner", root)
    scanner.watch.available = False

    too_many = ShadowRepo(tmp_path / "few", root)
    too_many.watch.max_watches = 2  # the root and one directory: three are there
    await too_many.snapshot()
    assert not too_many.watch.available
    (root / "b" / "f.txt").write_text("changed\n")
    assert await too_many.snapshot() == await scanner.snapshot()

    burst = ShadowRepo(tmp_path / "burst", root)
    burst.watch.max_new = 2
    try:
        await burst.snapshot()
        assert burst.watch.watching
        apply(root, ("tree", "c", 3))  # c/t0/u, c/t1/u, c/t2/u: six new directories
        assert await burst.snapshot() == await scanner.snapshot()
        assert burst.watch.watching  # started afresh, with the new directories
        (root / "c" / "t2" / "u" / "f2.txt").write_text("edited\n")
        assert await burst.snapshot() == await scanner.snapshot()
    finally:
        burst.close()


@pytest.mark.asyncio
async def test_issue33_roots_share_one_instance_and_a_directory_both_hold_serves_each(tmp_path: Path) -> None:
    """Issue 33 §3: every root's watch is on one inotify instance (a user has 128 instances); a root
    inside another holds the same directories — one descriptor each, named to both — and when the inner
    root stops watching, the outer one still sees changes there; an overflow of the shared queue makes
    every root scan in full once, and each snapshot is still the tree a full scan makes."""
    outer = tmp_path / "outer"
    (outer / "inner" / "deep").mkdir(parents=True)
    (outer / "inner" / "deep" / "f.txt").write_text("f\n")
    (outer / "o.txt").write_text("o\n")
    big = ShadowRepo(tmp_path / "data", outer)
    small = ShadowRepo(tmp_path / "data", outer / "inner")
    scan_big = ShadowRepo(tmp_path / "scan", outer)
    scan_small = ShadowRepo(tmp_path / "scan", outer / "inner")
    scan_big.watch.available = scan_small.watch.available = False
    inotify = big.watch.inotify
    assert small.watch.inotify is inotify
    try:
        await big.snapshot()
        held = inotify.count
        await small.snapshot()
        assert big.watch.watching and small.watch.watching
        assert inotify.count == held  # the inner root's directories were watched already
        (outer / "inner" / "deep" / "f.txt").write_text("changed\n")
        scans = (big.full_scans, small.full_scans)
        assert await big.snapshot() == await scan_big.snapshot()
        assert await small.snapshot() == await scan_small.snapshot()
        assert (big.full_scans, small.full_scans) == scans  # each root's watch named the file
        small.close()
        assert inotify.count == held
        (outer / "inner" / "deep" / "g.txt").write_text("new\n")
        assert await big.snapshot() == await scan_big.snapshot()
        await small.snapshot()
        scans = (big.full_scans, small.full_scans)
        with inotify.lock:  # what a queue overflow does: every root's next look cannot vouch
            for watch in (big.watch, small.watch):
                watch.broken = True
        (outer / "o.txt").write_text("edited\n")
        assert await big.snapshot() == await scan_big.snapshot()
        assert await small.snapshot() == await scan_small.snapshot()
        assert (big.full_scans, small.full_scans) == (scans[0] + 1, scans[1] + 1)
    finally:
        big.close()
        small.close()
