"""Checkpoints: a shadow git repository per project root, in the data dir.

Layout, under ``<data-dir>/checkpoints/`` (0700)::

    <key>.git/       the shadow repository of one root (key: a hash of the root's path)
    <key>.jsonl      its journal: one JSON line per recorded checkpoint, oldest first (after a prune,
                     headed by a ``{k: "pruned"}`` line saying up to when each session's are gone)
    <key>.revert     present only while a revert runs (the durable "revert in progress" marker)

Every git invocation of pidesk is here. Each runs the system ``git`` from a
worker thread (its spawn, pipes and exit never touch the event loop), with a timeout, with
``GIT_DIR``, ``GIT_WORK_TREE`` and ``GIT_INDEX_FILE`` set explicitly to the
shadow repository, every other ``GIT_*`` variable of the host's environment
dropped, and neither the system nor the user's global git configuration read
(no fsmonitor, hook or filter of theirs can run). The project's own ``.git`` is
never opened: git skips any path named ``.git`` in a work tree, and nothing here
names it. Git runs with umask 077, so everything it writes is private.

A snapshot looks only where something may have changed since the last one: the
paths the root's inotify watch (``store/treewatch.py``) saw change — none, and
no git runs at all — or, without a watch, the file a Write or Edit names. A
tracked file among them goes straight to ``update-index`` (no ignore rule
applies to a tracked file); anything else is listed by ``ls-files -t -m -d -o
--exclude-standard -- <paths>`` against the shadow index, which holds the
previous snapshot; then ``write-tree``. When the watch cannot vouch for its
answer (not started, overflowed, a ``.gitignore`` changed: ``store/treewatch.py``),
and for a revert, the listing covers the whole root (a stat of every file;
``full_scans`` counts them). The first snapshot of a root streams its files
through ``fast-import`` into one pack (a loose object per file and per directory
costs ~0.1 ms of file-system work each) and reads the index from that tree.
The project's ``.gitignore`` files are honoured; the shadow's ``info/exclude`` adds
``/.pi/``, the data dir when it lies inside the root, and new files over
``size_cap`` bytes (listed once, by path). A tracked file that grows past the
cap keeps its last recorded content in the index (nothing over the cap is ever
hashed or stored: a 1.5 GB file cost 4 GB of memory and 1.5 GB of repository)
and is *held*: a restore leaves it as it is. Each snapshot says which files it
saw change but could not record (``skipped``), so a turn's changes can say so.
Nested repositories are not entered. A root with more than ``max_files`` files
after ignores raises ``TooLarge``.

Git objects and journal lines of plain checkpoints are not fsynced: a power cut
can lose the last checkpoints' records, never a workspace file. A revert's
marker and journal line are synced.

The journal is indexed once per process (each line's offset, kind, session and turn): the
host reads a turn's lines, not the whole file. ``prune`` forgets the turns a retention policy
no longer keeps (the policy is the host's): ``refs/pidesk/keep`` is pointed at a tree of
every tree still named (the journal alone names them), the journal is rewritten atomically,
then ``git repack -a -d`` and ``git prune`` delete what nothing reaches.

A revert fetches the blobs it restores in batches of at most ``RESTORE_BATCH``
bytes, so its memory is bounded whatever it restores. It writes each file to a temporary sibling and renames it over its path
(``<name>.pidesk-revert``), so a kill leaves every file either as it was or as
restored; the marker, written and synced first, names the files, and
``interrupted_reverts`` (at boot) reports it and removes any leftover temporary.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import stat
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Callable, Sequence, Set
from typing import IO, Any

from pidesk.faults import NO_FAULTS, Faults
from pidesk.store.transcripts import fsync_dir, private_dir
from pidesk.store.treewatch import TreeWatch

DIR_NAME = "checkpoints"
SIZE_CAP = 10 * 1024 * 1024  # a file larger than this is never checkpointed (nor touched by a restore)
RESTORE_BATCH = 64 * 1024 * 1024  # bytes of blobs a restore holds in memory at once
MAX_FILES = 50_000  # a root with more files (after ignores) is not checkpointed at all
GIT_TIMEOUT = 60.0  # seconds for one git invocation
MAX_DIFF = 256 * 1024  # characters of one file's diff given; a longer one is cut with a line saying so
PATHSPEC_MAX = 50  # paths named to one diff (beyond, the diff covers every path and is filtered after:
# git matches each path of each pair against every pathspec — 1,000 pairs × 1,000 paths took 17 s)
TEMP_SUFFIX = ".pidesk-revert"
FIRST_REF = "refs/pidesk/first"  # the first snapshot's commit (fast-import writes one)
KEEP_REF = "refs/pidesk/keep"  # a tree holding every tree the journal still names (prune keeps what it reaches)

# The shadow repository's configuration. A split index: an incremental snapshot rewrites a
# small file of the entries that changed, not the whole index (0.9 MB for 10k files) twice.
CONFIG = f"""[core]
\trepositoryformatversion = 0
\tfilemode = true
\tbare = false
\tlogallrefupdates = false
\tautocrlf = false
\tfsmonitor = false
\tsymlinks = true
\tquotePath = false
\thooksPath = {os.devnull}
\tsplitIndex = true
[splitIndex]
\tsharedIndexExpire = now
[gc]
\tauto = 0
"""

Feed = Callable[[IO[bytes]], None]  # writes a git process's standard input

GONE_LOOKS = 4  # gone, untracked paths of one snapshot looked for among the tracked files (_split_tracked)

# git commands running at once across the process's shadow repositories: each is CPU work beside the host's
# event loop, which waited behind them in the run queue when 64 projects' first turns ran six at once on two
# CPUs (worst loop gaps 46-60 ms; 30-40 ms with this limit, bench/scale_checkpoints.py)
GIT_AT_ONCE = threading.BoundedSemaphore(max(2, os.cpu_count() or 1))


class CheckpointError(Exception):
    """A checkpoint or revert could not be made (git missing or failing, disk full, a timeout)."""


class TooLarge(CheckpointError):
    """The root holds more files than ``max_files`` after ignores."""


@dataclass(frozen=True)
class FileStat:
    """One file changed between two trees, without its diff."""

    path: str
    status: str  # "added" | "modified" | "deleted"
    additions: int
    deletions: int
    binary: bool


def project_key(root: Path) -> str:
    return hashlib.sha256(str(root).encode()).hexdigest()[:20]


def _env(git_dir: Path, root: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(
        GIT_DIR=str(git_dir), GIT_WORK_TREE=str(root), GIT_INDEX_FILE=str(git_dir / "index"),
        GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL=os.devnull, GIT_TERMINAL_PROMPT="0",
        LC_ALL="C",
    )
    return env


class ShadowRepo:
    """The shadow repository and journal of one root. Not safe for concurrent use: the host
    serializes every call on one root (``host/checkpoints.py``)."""

    def __init__(self, data_dir: Path, root: Path, *, size_cap: int = SIZE_CAP, max_files: int = MAX_FILES,
                 timeout: float = GIT_TIMEOUT, faults: Faults = NO_FAULTS) -> None:
        self.base = data_dir / DIR_NAME
        self.root = root
        self.data_dir = data_dir
        self.key = project_key(root)
        self.git_dir = self.base / f"{self.key}.git"
        self.journal = self.base / f"{self.key}.jsonl"
        self.marker = self.base / f"{self.key}.revert"
        self.size_cap = size_cap
        self.max_files = max_files
        self.timeout = timeout
        self.faults = faults
        self._env = _env(self.git_dir, root)
        self._ready = False
        self._tracked: set[str] | None = None  # the paths in the shadow index; None: to be read again
        self._tree: str | None = None  # the tree of the index as it stands, when known
        # tracked files over the size cap, left at their last recorded content: (size, mtime) as last seen
        self._held: dict[str, tuple[int, int]] = {}
        # what the last snapshot saw change but could not record: path -> (status, size in bytes)
        self.skipped: dict[str, tuple[str, int]] = {}
        self.full_scans = 0  # listings of the whole root so far (each a stat of every file)
        self._index: _Index | None = None  # the journal's lines by turn, read once (None: not yet)
        self._index_lock = threading.Lock()  # readers of the journal run beside its writer
        self.watch = TreeWatch(root)

    # ---- git ------------------------------------------------------------------------

    async def _git(self, *args: str, stdin: bytes | Feed | None = None, ok: tuple[int, ...] = (0,),
                   reads: bool = False) -> bytes:
        """Run git in a worker thread (its spawn, pipes and exit never touch the event loop, which
        a turn's next step is waiting for); a caller's cancellation kills it. ``reads``: a command
        that only reads objects (a diff between two trees), which may run beside the one that
        writes (so it never removes the index's lock file: that is the writer's)."""
        started: list[subprocess.Popen[bytes]] = []
        dropped = threading.Event()  # (cancelled while waiting its turn: it never runs)
        work = asyncio.ensure_future(asyncio.to_thread(self._run_git, args, stdin, started, reads, dropped))
        try:
            code, out, err = await asyncio.shield(work)
        except asyncio.CancelledError:  # git must not outlive its caller
            dropped.set()
            for proc in started:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
            with contextlib.suppress(Exception):
                await work
            if not reads:
                (self.git_dir / "index.lock").unlink(missing_ok=True)  # ours: the host runs one writing git per root
            raise
        if code not in ok:
            detail = err.decode(errors="replace").strip().splitlines()
            raise CheckpointError(f"git {args[0]} failed: {detail[-1] if detail else f'exit {code}'}")
        return out

    def _run_git(self, args: tuple[str, ...], stdin: bytes | Feed | None, started: list[subprocess.Popen[bytes]],
                 reads: bool = False, dropped: threading.Event | None = None) -> tuple[int, bytes, bytes]:
        """git, once fewer than ``GIT_AT_ONCE`` others run (not at all if ``dropped`` is set by then)."""
        with GIT_AT_ONCE:
            if dropped is not None and dropped.is_set():
                return -1, b"", b"cancelled"
            return self._run_git_now(args, stdin, started, reads)

    def _run_git_now(self, args: tuple[str, ...], stdin: bytes | Feed | None,
                     started: list[subprocess.Popen[bytes]], reads: bool) -> tuple[int, bytes, bytes]:
        try:
            proc = subprocess.Popen(
                ["git", *args], stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=self._env, cwd=self.root, umask=0o077,
            )
        except FileNotFoundError as exc:
            missing = "git is not installed" if exc.filename in (None, "git") else f"{self.root} does not exist"
            raise CheckpointError(f"cannot checkpoint: {missing}") from None
        except OSError as exc:
            raise CheckpointError(f"cannot run git: {exc}") from None
        started.append(proc)
        if callable(stdin):  # streamed (git reads as it goes; its output waits in the pipe)
            assert proc.stdin is not None
            try:
                stdin(proc.stdin)
            except BrokenPipeError:
                pass  # git exited early: its exit code and stderr say why
            finally:
                with contextlib.suppress(BrokenPipeError):
                    proc.stdin.close()
                proc.stdin = None  # communicate must not flush it again
            stdin = None
        try:
            out, err = proc.communicate(stdin, timeout=self.timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            if not reads:
                (self.git_dir / "index.lock").unlink(missing_ok=True)
            raise CheckpointError(f"git {args[0]} took longer than {self.timeout:.0f} s") from None
        return proc.returncode, out, err

    async def _ensure(self) -> None:
        if self._ready:
            return
        await asyncio.to_thread(self._make_base)
        if not (self.git_dir / "HEAD").exists():
            await self._git("init", "-q", "--template=")  # no sample hooks: nothing executable in the data dir
            os.chmod(self.git_dir, 0o700)
        await asyncio.to_thread(self._write_config)
        (self.git_dir / "index.lock").unlink(missing_ok=True)  # a crashed host's
        await asyncio.to_thread(self._write_excludes, [])
        self._ready = True

    def _write_config(self) -> None:
        """The shadow repository's whole configuration (rewritten when an older pidesk's differs)."""
        path = self.git_dir / "config"
        with contextlib.suppress(FileNotFoundError):
            if path.read_text() == CONFIG:
                return
        tmp = path.with_name("config.pidesk")
        with open(tmp, "w", opener=_private) as f:
            f.write(CONFIG)
        os.replace(tmp, path)

    def _write_excludes(self, large: list[str]) -> None:
        path = self.git_dir / "info" / "exclude"
        path.parent.mkdir(mode=0o700, exist_ok=True)
        lines = path.read_text().splitlines() if path.exists() else []
        # ".git" in any case: git refuses such a path in a tree (an NTFS/HFS-safe rule), so one ".Git/"
        # in a project made every checkpoint fail (issue 29)
        wanted = ["/.pi/", ".git", "[.][Gg][Ii][Tt]"]
        data = self.data_dir.resolve()
        root = self.root.resolve()
        if data.is_relative_to(root) and data != root:
            wanted.append("/" + _pattern(data.relative_to(root).as_posix()) + "/")
        wanted += ["/" + _pattern(p) for p in large]
        missing = [w for w in wanted if w not in lines]
        if missing or not path.exists():
            with open(path, "a", opener=_private) as f:
                f.write("".join(f"{w}\n" for w in missing))

    # ---- snapshots --------------------------------------------------------------------

    async def snapshot(self, paths: Sequence[str] | None = None, *, full: bool = False) -> str:
        """The tree of the root as it is now (ignored, excluded and large new files left out).

        The scan looks only where something may have changed since the last snapshot: the
        paths the root's watch saw change or, without a watch, ``paths`` (relative to the root)
        when the caller knows nothing else can have (a Write or Edit names its file). ``full``
        scans every file whatever the watch says."""
        await self._ensure()
        self.skipped = {}
        scope = await self._scope(paths, full)
        if not (self.git_dir / "index").exists():
            return await self._first_snapshot()
        if scope is not None and not scope and self._tree is not None:
            return self._tree  # nothing can have changed: no git at all
        if self._tracked is None:
            self._tracked = {os.fsdecode(p) for p in (await self._git("ls-files", "-z")).split(b"\0") if p}
        direct, scope = self._split_tracked(self._tracked, scope)
        changed = direct
        if scope is None or scope:
            changed += await self._scan(self._tracked, scope)
        changed = self._hold_large(changed)
        if not changed and self._tree is not None:  # the index is the last tree's: no write-tree
            return self._tree
        if changed:
            self._tree = None  # the index is about to move on; until write-tree says where, unknown
            tracked, self._tracked = self._tracked, None  # likewise the paths it holds
            beyond = self._beyond_links(changed)
            if beyond:  # (beneath a link now: gone from here, whatever is there through the link)
                await self._git("update-index", "--force-remove", "-z", "--stdin",
                                stdin=b"".join(os.fsencode(p) + b"\0" for p in beyond))
            # --replace: a tracked directory that is now a file or a link (or the other way round) takes
            # the place of what it conflicts with (without it git refused, and every later checkpoint failed)
            await self._git("update-index", "--add", "--remove", "--replace", "-z", "--stdin",
                            stdin=b"".join(os.fsencode(p) + b"\0" for p in changed if p not in beyond))
            self._tracked = self._after_update(tracked, changed)
        self._tree = (await self._git("write-tree")).decode().strip()
        return self._tree

    @property
    def held(self) -> set[str]:
        """The tracked files over the size cap: their newest content is in no checkpoint."""
        return set(self._held)

    def _hold_large(self, changed: list[str]) -> list[str]:
        """``changed`` without the files now over the size cap: their index entries stay as last
        recorded. One is in ``skipped`` when it changed since it was last seen (not merely listed
        again by a full scan)."""
        kept: list[str] = []
        for path in changed:
            try:
                info = os.lstat(self.root / path)
            except OSError:
                info = None
            if info is None or not stat.S_ISREG(info.st_mode) or info.st_size <= self.size_cap:
                self._held.pop(path, None)
                kept.append(path)
                continue
            seen = (info.st_size, info.st_mtime_ns)
            if self._held.get(path) != seen:
                self._held[path] = seen
                self.skipped[path] = ("modified", info.st_size)
        return kept

    def _beyond_links(self, paths: list[str]) -> set[str]:
        """Of ``paths``, those under a directory that is a symbolic link now: git will not look through it."""
        linked: dict[str, bool] = {}  # directory -> whether it, or one above it, is a link (each looked at once)

        def under_link(directory: str) -> bool:
            if directory in ("", "."):
                return False
            if directory not in linked:
                head = os.path.dirname(directory)
                linked[directory] = under_link(head) or (self.root / directory).is_symlink()
            return linked[directory]

        return {path for path in paths if under_link(os.path.dirname(path))}

    def _split_tracked(self, tracked: set[str], scope: set[str] | None) -> tuple[list[str], set[str] | None]:
        """Of the paths in ``scope``, the tracked files (gone, or a file or link still): ``update-index``
        takes those as they are, no listing needed (an ignore rule never applies to a tracked file).
        An untracked path that is gone, and held no tracked file as a directory, has nothing to record:
        a file written and renamed away (every Write's temporary file) cost a listing of the whole tree,
        80 ms at 45,000 files. (Looking for tracked files under a gone path walks ``tracked``: done for a
        few, else ``ls-files`` looks.) The rest — new paths, directories — is for ``ls-files`` to sort out."""
        if scope is None:
            return [], None
        direct: list[str] = []
        rest: set[str] = set()
        looks = GONE_LOOKS
        for path in scope:
            try:
                is_dir = stat.S_ISDIR(os.lstat(self.root / path).st_mode)
            except FileNotFoundError:
                if path in tracked:
                    direct.append(path)
                elif looks > 0:
                    looks -= 1
                    under = path + "/"
                    if any(t.startswith(under) for t in tracked):
                        rest.add(path)  # a directory of tracked files, gone: ls-files names them
                else:
                    rest.add(path)
                continue
            except OSError:
                rest.add(path)
                continue
            if path in tracked and not is_dir:
                direct.append(path)
            else:
                rest.add(path)
        return direct, rest

    def _after_update(self, tracked: set[str], changed: list[str]) -> set[str]:
        """The index's paths once ``update-index --add --remove`` took ``changed``: each one there
        if it is a file or a link now, gone if it is missing or a directory."""
        for path in changed:
            try:
                present = not stat.S_ISDIR(os.lstat(self.root / path).st_mode)
            except OSError:
                present = False
            if present:
                tracked.add(path)
            else:
                tracked.discard(path)
        return tracked

    async def _scope(self, paths: Sequence[str] | None, full: bool) -> set[str] | None:
        """Where the scan is to look (None: everywhere). The watch's news is taken even for a
        full scan, which it would otherwise report again next time."""
        if not self.watch.available:
            return None if paths is None or full else set(paths)
        # nothing seen: no worker thread either (the drain may walk new directories: it takes one)
        watched = set() if self.watch.quiet() else await asyncio.to_thread(self.watch.changes)
        if watched is None:
            await self._start_watch()  # before the full scan: what changes during it shows next time
            return None
        return None if full else watched | set(paths or ())

    async def _scan(self, tracked: set[str], scope: set[str] | None) -> list[str]:
        """The paths (within ``scope``) that differ from the index. New files over the size cap are
        excluded for good instead; more files than ``max_files`` raise ``TooLarge``."""
        scan = ["ls-files", "-z", "-t", "-m", "-d", "-o", "--exclude-standard"]
        if scope:
            scan += ["--", *(f":(literal){p}" for p in sorted(scope))]
        else:
            self.full_scans += 1
        changed: list[str] = []
        large: list[str] = []
        added = 0
        seen: set[str] = set()
        for entry in (await self._git(*scan)).split(b"\0"):
            if len(entry) < 3:
                continue
            tag, path = entry[:1], os.fsdecode(entry[2:])
            if path.endswith("/") or path in seen:  # a nested repository; or listed as both C and R
                continue
            seen.add(path)
            if tag == b"?":
                try:
                    info = os.lstat(self.root / path)
                except OSError:
                    continue
                if stat.S_ISREG(info.st_mode) and info.st_size > self.size_cap:
                    large.append(path)
                    self.skipped[path] = ("added", info.st_size)
                    continue
                added += 1
            elif tag == b"R":
                added -= 1
            changed.append(path)
        if len(tracked) + added > self.max_files:
            raise TooLarge(f"{self.root} holds more than {self.max_files} files after ignores")
        if large:
            await asyncio.to_thread(self._write_excludes, large)
        return changed

    async def _start_watch(self) -> None:
        """Watch the root's directories but ``.pi/``, the data dir and those a pattern ignores by
        name (``build/``: nothing below one can be un-ignored, short of a .gitignore change —
        which restarts the watch). A directory whose files all happen to be ignored is watched:
        its next file may not be."""
        listed = await self._git("ls-files", "-z", "-o", "-i", "--exclude-standard", "--directory")
        candidates = [p for p in listed.split(b"\0") if p.endswith(b"/")]
        skipped = {".pi"}
        if candidates:
            named = await self._git("check-ignore", "--no-index", "-z", "--stdin", ok=(0, 1),
                                    stdin=b"".join(p + b"\0" for p in candidates))
            skipped |= {os.fsdecode(p).rstrip("/") for p in named.split(b"\0") if p}
        data, root = self.data_dir.resolve(), self.root.resolve()
        if data.is_relative_to(root) and data != root:
            skipped.add(data.relative_to(root).as_posix())
        await asyncio.to_thread(self.watch.start, skipped.__contains__)

    def close(self) -> None:
        """Stop watching the root (the host's close)."""
        self.watch.close()

    async def _first_snapshot(self) -> str:
        """The first snapshot of a root: its files streamed into one pack by ``git fast-import``
        (one file written, where ``update-index`` writes a loose object per file and per
        directory), then the index read from that tree and refreshed against the files."""
        self.full_scans += 1
        listed = (await self._git("ls-files", "-z", "-o", "--exclude-standard")).split(b"\0")
        paths = [os.fsdecode(p) for p in listed if p and not p.endswith(b"/")]  # "dir/": a nested repository
        if len(paths) > self.max_files:
            raise TooLarge(f"{self.root} holds more than {self.max_files} files after ignores")
        imported: list[list[str]] = []
        large: list[str] = []
        await self._git("fast-import", "--quiet", "--done", "--force",
                        stdin=lambda pipe: imported.append(self._stream_import(paths, pipe, large)))
        if large:
            await asyncio.to_thread(self._write_excludes, large)
            self.skipped.update({path: ("added", _size(self.root / path)) for path in large})
        await self._git("read-tree", FIRST_REF)
        await self._git("update-index", "-q", "--refresh", ok=(0, 1))  # 1: a file changed meanwhile
        self._tracked = set(imported[0]) if imported else None
        self._tree = (await self._git("write-tree")).decode().strip()  # the cache tree read-tree primed
        return self._tree

    def _stream_import(self, paths: list[str], pipe: IO[bytes], large: list[str]) -> list[str]:
        """Write a fast-import stream of ``paths`` (regular files and symlinks; files over the
        size cap go to ``large``) as one commit on ``FIRST_REF``. Returns the paths imported."""
        entries: list[bytes] = []
        imported: list[str] = []
        for path in paths:
            full = self.root / path
            try:
                info = os.lstat(full)
                if stat.S_ISLNK(info.st_mode):
                    mode, data = b"120000", os.fsencode(os.readlink(full))
                elif stat.S_ISREG(info.st_mode):
                    if info.st_size > self.size_cap:
                        large.append(path)
                        continue
                    mode = b"100755" if info.st_mode & stat.S_IXUSR else b"100644"
                    with open(full, "rb") as f:
                        data = f.read()
                else:
                    continue
            except OSError:  # gone or unreadable since the listing: the next snapshot's scan sees it
                continue
            mark = len(entries) + 1
            pipe.write(b"blob\nmark :%d\ndata %d\n" % (mark, len(data)))
            pipe.write(data)
            pipe.write(b"\n")
            entries.append(b"M %s :%d %s\n" % (mode, mark, _import_path(os.fsencode(path))))
            imported.append(path)
        pipe.write(b"commit %s\ncommitter pidesk <pidesk> 0 +0000\ndata 0\n" % FIRST_REF.encode())
        pipe.write(b"".join(entries))
        pipe.write(b"\ndone\n")
        return imported

    # ---- diffs --------------------------------------------------------------------------

    async def changed_paths(self, old: str, new: str) -> set[str]:
        if old == new:
            return set()
        out = await self._git("diff-tree", "-r", "-z", "--no-renames", "--name-only", old, new)
        return {os.fsdecode(p) for p in out.split(b"\0") if p}

    async def stat(self, old: str, new: str, only: Set[str] | None = None) -> list[FileStat]:
        """What changed from tree ``old`` to tree ``new`` (restricted to ``only``), by path, without the
        diffs: one ``diff-tree --raw --numstat``. Reads objects only: it needs no lock."""
        if old == new:
            return []
        items = (await self._git("diff-tree", "-r", "-z", "--no-renames", "--raw", "--numstat", old, new,
                                 reads=True)).split(b"\0")
        statuses: list[tuple[str, str]] = []
        counts: dict[str, tuple[int, int, bool]] = {}
        n = 0
        while n < len(items):
            item = items[n]
            if item.startswith(b":") and n + 1 < len(items):  # ":<mode> <mode> <sha> <sha> <X>", then its path
                statuses.append((os.fsdecode(items[n + 1]),
                                 {b"A": "added", b"D": "deleted"}.get(item.split()[-1][:1], "modified")))
                n += 2
                continue
            parts = item.split(b"\t", 2)  # "<added>\t<deleted>\t<path>", "-" for both when binary
            if len(parts) == 3:
                binary = parts[0] == b"-"
                counts[os.fsdecode(parts[2])] = (0, 0, True) if binary else (int(parts[0]), int(parts[1]), False)
            n += 1
        return [FileStat(path, status, *counts.get(path, (0, 0, False)))
                for path, status in statuses if only is None or path in only]

    async def patches(self, pairs: Sequence[tuple[str, str]], paths: Set[str] | None = None,
                      max_diff: int = MAX_DIFF) -> dict[tuple[str, str], dict[str, str]]:
        """The unified diff of each file changed between each pair of trees (``old``, ``new``), by pair
        then path; only ``paths`` when given. One ``diff-tree --stdin`` whatever the number of pairs.
        A binary file's is ``"binary"``; one longer than ``max_diff`` is cut with a line saying so.
        Reads objects only: it needs no lock."""
        wanted = [pair for pair in dict.fromkeys(pairs) if pair[0] != pair[1]]
        found: dict[tuple[str, str], dict[str, str]] = {pair: {} for pair in wanted}
        if not wanted or (paths is not None and not paths):
            return found
        args = ["diff-tree", "--stdin", "-r", "--no-renames", "-p", "--no-color", "--full-index"]
        if paths is not None and len(paths) <= PATHSPEC_MAX:
            args += ["--", *(f":(literal){p}" for p in sorted(paths))]
        out = await self._git(*args, stdin="".join(f"{a} {b}\n" for a, b in wanted).encode(), reads=True)
        pair: tuple[str, str] | None = None
        path: str | None = None
        lines: list[bytes] = []

        def done() -> None:
            if pair in found and path is not None and (paths is None or path in paths):
                found[pair][path] = _patch_text(b"".join(lines), max_diff)

        for line in out.split(b"\n")[:-1] if out.endswith(b"\n") else out.split(b"\n"):
            header = _pair_header(line)
            if header is not None or line.startswith(b"diff --git "):
                done()
                lines = []
                if header is not None:
                    pair, path = header, None
                    continue
                path = _patch_path(line)
            lines.append(line + b"\n")
        done()
        return found

    # ---- revert -----------------------------------------------------------------------

    async def restore(self, current: str, target: str, note: dict[str, Any], keep: Set[str] = frozenset()
                      ) -> list[str]:
        """Make the root's files match tree ``target`` where they differ from tree ``current``
        (a snapshot just taken). Ignored paths, held files (over the size cap: their content now
        is in no checkpoint, so it could not be brought back) and ``keep`` (those held when
        ``target`` was taken: ``target`` does not hold their content then) are never touched.
        Returns the paths changed."""
        raw = (await self._git("diff-tree", "-r", "-z", "--no-renames", "--raw", current, target)).split(b"\0")
        changes: list[tuple[str, str, str, str]] = []  # (path, status, mode, blob)
        for i in range(0, len(raw) - 1, 2):
            head = raw[i].decode()
            if not head.startswith(":"):
                break
            _m1, mode, _b1, blob, status = head[1:].split()
            changes.append((os.fsdecode(raw[i + 1]), status[:1], mode, blob))
        if not changes:
            return []
        ignored = await self._ignored([c[0] for c in changes]) | set(self._held) | set(keep)
        changes = [c for c in changes if c[0] not in ignored and c[2] != "160000"]
        files = [c[0] for c in changes]
        await asyncio.to_thread(self._write_marker, {**note, "files": files})
        self.faults.hit("revert.after_marker")
        deletions, writes = [c for c in changes if c[1] == "D"], [c for c in changes if c[1] != "D"]
        dirs = await asyncio.to_thread(self._delete, deletions)  # first: a file may replace a directory
        for batch in await self._batches(writes):
            blobs = await self._blobs({c[3] for c in batch})
            dirs |= await asyncio.to_thread(self._write, batch, blobs)
        await asyncio.to_thread(self._sync_dirs, dirs)
        await asyncio.to_thread(self.marker.unlink, True)
        return files

    async def _batches(self, writes: list[tuple[str, str, str, str]]) -> list[list[tuple[str, str, str, str]]]:
        """``writes`` in runs whose blobs together hold at most ``RESTORE_BATCH`` bytes (a blob larger
        than that alone: one a checkpoint from before the size cap covered tracked files stored)."""
        if not writes:
            return []
        shas = sorted({c[3] for c in writes})
        listed = await self._git("cat-file", "--batch-check", stdin="".join(f"{s}\n" for s in shas).encode())
        sizes = {sha: int(size) for sha, _kind, size in (line.split() for line in listed.decode().splitlines())}
        batches: list[list[tuple[str, str, str, str]]] = [[]]
        held = 0
        for change in writes:
            size = sizes.get(change[3], 0)
            if batches[-1] and held + size > RESTORE_BATCH:
                batches.append([])
                held = 0
            batches[-1].append(change)
            held += size
        return batches

    async def _ignored(self, paths: list[str]) -> set[str]:
        out = await self._git("check-ignore", "--no-index", "-z", "--stdin", ok=(0, 1),  # 1: none is ignored
                              stdin=b"".join(os.fsencode(p) + b"\0" for p in paths))
        return {os.fsdecode(p) for p in out.split(b"\0") if p}

    async def _blobs(self, shas: set[str]) -> dict[str, bytes]:
        if not shas:
            return {}
        order = sorted(shas)
        out = await self._git("cat-file", "--batch", stdin="".join(f"{s}\n" for s in order).encode())
        blobs: dict[str, bytes] = {}
        pos = 0
        for _ in order:
            end = out.index(b"\n", pos)
            sha, _kind, size = out[pos:end].decode().split()
            start = end + 1
            blobs[sha] = out[start:start + int(size)]
            pos = start + int(size) + 1
        return blobs

    def _write_marker(self, note: dict[str, Any]) -> None:
        tmp = self.marker.with_suffix(".tmp")
        with open(tmp, "w", opener=_private) as f:
            f.write(json.dumps(note))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.marker)
        fsync_dir(self.base)

    def _delete(self, deletions: list[tuple[str, str, str, str]]) -> set[Path]:
        root = self.root
        dirs: set[Path] = set()
        for path, _status, _mode, _blob in deletions:
            target = root / path
            with contextlib.suppress(FileNotFoundError):
                target.unlink()
            _prune(target.parent, root)
            dirs.add(target.parent)
            self.faults.hit("revert.after_file")
        return dirs

    def _write(self, writes: list[tuple[str, str, str, str]], blobs: dict[str, bytes]) -> set[Path]:
        dirs: set[Path] = set()
        for path, _status, mode, blob in writes:
            target = self.root / path
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(target.name + TEMP_SUFFIX)
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
            if mode == "120000":
                os.symlink(os.fsdecode(blobs[blob]), tmp)
            else:
                with open(tmp, "wb") as f:
                    f.write(blobs[blob])
                    f.flush()
                    os.fsync(f.fileno())
                os.chmod(tmp, 0o755 if mode == "100755" else 0o644)
            if target.is_dir() and not target.is_symlink():
                _remove_tree(target)
            self.faults.hit("revert.before_rename")
            os.replace(tmp, target)
            dirs.add(target.parent)
            self.faults.hit("revert.after_file")
        return dirs

    @staticmethod
    def _sync_dirs(dirs: set[Path]) -> None:
        for d in dirs:
            if d.exists():
                fsync_dir(d)

    # ---- journal ------------------------------------------------------------------------

    def _make_base(self) -> None:
        """``checkpoints/`` (0700), its entry in the data dir made durable when it is new."""
        if not self.base.is_dir():
            private_dir(self.base)
            fsync_dir(self.base.parent)

    def append(self, entry: dict[str, Any], *, durable: bool = False) -> None:
        self._make_base()
        line = json.dumps(entry, separators=(",", ":")).encode() + b"\n"
        with self._index_lock:
            index = self._index
            with open(self.journal, "ab", opener=_private) as f:
                offset = f.tell()
                if index is not None and index.torn:  # a line a crash cut short: the new one starts afresh
                    f.write(b"\n")
                    offset += 1
                f.write(line)
                if durable:
                    f.flush()
                    os.fsync(f.fileno())
            if index is not None:
                index.torn = False
                index.add(offset, entry)

    def entries(self) -> list[dict[str, Any]]:
        """Every line of the journal (a test's or a tool's look: the host reads it by turn)."""
        try:
            text = self.journal.read_text()
        except FileNotFoundError:
            return []
        out = []
        for line in text.splitlines():
            with contextlib.suppress(ValueError):  # a torn last line
                entry = json.loads(line)
                if entry.get("k") != "pruned":
                    out.append(entry)
        return out

    # ---- the journal, by turn -------------------------------------------------------------

    def _loaded(self) -> _Index:
        """The journal's index (read in full once per process; hold ``_index_lock``)."""
        if self._index is None:
            index = _Index()
            try:
                with open(self.journal, "rb") as f:
                    offset = 0
                    for raw in f:
                        with contextlib.suppress(ValueError):
                            entry = json.loads(raw)
                            if isinstance(entry, dict):
                                index.add(offset, entry)
                        offset += len(raw)
                        index.torn = not raw.endswith(b"\n")
            except FileNotFoundError:
                pass
            self._index = index
        return self._index

    def _read_at(self, offsets: Sequence[int]) -> list[dict[str, Any]]:
        """The journal's lines at ``offsets`` (hold ``_index_lock``: a prune replaces the file)."""
        out: list[dict[str, Any]] = []
        if not offsets:
            return out
        with open(self.journal, "rb") as f:
            for offset in offsets:
                f.seek(offset)
                with contextlib.suppress(ValueError):
                    out.append(json.loads(f.readline()))
        return out

    def last_tree(self) -> str | None:
        """The tree of the journal's last checkpoint."""
        with self._index_lock:
            return self._loaded().last_tree

    def turn_entries(self, session_id: str, turn_ids: Set[str]) -> dict[str, list[dict[str, Any]]]:
        """The "turn" and "call" lines of each of ``turn_ids`` (of ``session_id``), in order."""
        with self._index_lock:
            index = self._loaded()
            wanted = sorted(line.offset for turn_id in turn_ids for line in index.units.get(turn_id, ())
                            if line.session == session_id and line.kind in ("turn", "call"))
            found: dict[str, list[dict[str, Any]]] = {}
            for entry in self._read_at(wanted):
                found.setdefault(entry.get("t", ""), []).append(entry)
            return found

    def find(self, session_id: str, unit: str, kind: str) -> tuple[int, dict[str, Any]] | None:
        """A turn's "turn" line, or a revert's line (by the revert's id), with its place in the journal."""
        with self._index_lock:
            index = self._loaded()
            line = next((x for x in index.units.get(unit, ()) if x.session == session_id and x.kind == kind), None)
            if line is None:
                return None
            found = self._read_at([line.offset])
            return (index.lines.index(line), found[0]) if found else None

    def big_since(self, position: int) -> list[dict[str, Any]]:
        """The call lines from ``position`` on that name files over the size cap."""
        with self._index_lock:
            index = self._loaded()
            return self._read_at([line.offset for line in index.lines[position:] if line.big])

    def reverts(self) -> list[dict[str, Any]]:
        """Every revert line."""
        with self._index_lock:
            index = self._loaded()
            return self._read_at([line.offset for line in index.lines if line.kind == "revert"])

    def units(self) -> list[JournalUnit]:
        """The turns and reverts the journal holds checkpoints of, in the journal's order."""
        with self._index_lock:
            index = self._loaded()
            seen: dict[str, JournalUnit] = {}
            for line in index.lines:
                if line.unit and line.kind in ("turn", "call", "revert"):
                    known = seen.get(line.unit)
                    kind = "revert" if line.kind == "revert" else "turn"
                    seen[line.unit] = JournalUnit(line.session, line.unit, kind, known.at if known else line.at)
            return list(seen.values())

    def pruned_before(self, session_id: str) -> str | None:
        """Up to when (a turn's start, a revert's time) the turns and reverts of ``session_id`` have had
        their checkpoints pruned (None: none has)."""
        with self._index_lock:
            return self._loaded().horizons.get(session_id)

    # ---- retention ---------------------------------------------------------------------------

    async def prune(self, drop: Set[str], marks: dict[str, str], note: dict[str, Any]) -> int:
        """Forget the checkpoints of the turns and reverts ``drop`` names (by id): their journal lines go
        and git's objects that no kept line's tree reaches are deleted. ``marks``: by session, the time
        (a turn's start, a revert's) up to which its turns and reverts are now pruned (``pruned_before``).
        Returns the lines removed.

        The order keeps a kill anywhere harmless: (1) a ref to a tree of every tree kept — each kept
        line's, and the index's (git keeps what a ref reaches; the journal alone names the trees);
        (2) the journal rewritten to a temporary file, synced and renamed over (``note`` and the time
        of each session's newest removed line head it); (3) ``git repack -a -d`` and ``git prune``.
        Killed before (2), nothing is lost; after, unreachable objects wait for the next prune."""
        await self._ensure()
        with self._index_lock:
            index = self._loaded()
            kept = [line for line in index.lines if line.unit not in drop]
            gone = [line for line in index.lines if line.unit in drop]
        if not gone:
            return 0
        raw = await asyncio.to_thread(self._raw_lines, [line.offset for line in kept])
        trees: set[str] = set()
        for text in raw:
            with contextlib.suppress(ValueError):
                entry = json.loads(text)
                trees |= {t for t in (entry.get("tree"), entry.get("prev")) if isinstance(t, str)}
        if (self.git_dir / "index").exists():
            trees.add((await self._git("write-tree")).decode().strip())
        present = await self._present(trees)
        listing = "".join(f"040000 tree {tree}\tk{n}\n" for n, tree in enumerate(sorted(present)))
        keep = (await self._git("mktree", stdin=listing.encode())).decode().strip()
        await self._git("update-ref", KEEP_REF, keep)
        await self._git("update-ref", "-d", FIRST_REF, ok=(0, 1))  # its tree is kept while a line names it
        self.faults.hit("checkpoints.prune_before_journal")
        horizons = dict(index.horizons)
        for session_id, at in marks.items():
            horizons[session_id] = max(horizons.get(session_id, ""), at)
        header = {"k": "pruned", "at": note.pop("at", ""), "horizons": horizons, **note}
        await asyncio.to_thread(self._rewrite, header, raw)
        self.faults.hit("checkpoints.prune_after_journal")
        await self._git("repack", "-a", "-d", "-q")
        await self._git("prune", "--expire=now")
        return len(gone)

    async def _present(self, trees: set[str]) -> set[str]:
        """Of ``trees``, those the repository holds (a power cut may have lost the last ones)."""
        if not trees:
            return set()
        out = await self._git("cat-file", "--batch-check", stdin="".join(f"{t}\n" for t in sorted(trees)).encode())
        return {parts[0] for parts in (line.split() for line in out.decode().splitlines())
                if len(parts) == 3 and parts[1] == "tree"}

    def _raw_lines(self, offsets: list[int]) -> list[bytes]:
        out: list[bytes] = []
        with self._index_lock, open(self.journal, "rb") as f:
            for offset in offsets:
                f.seek(offset)
                line = f.readline()
                if line.strip():
                    out.append(line if line.endswith(b"\n") else line + b"\n")
        return out

    def _rewrite(self, header: dict[str, Any], lines: list[bytes]) -> None:
        tmp = self.journal.with_name(self.journal.name + ".tmp")
        with open(tmp, "wb", opener=_private) as f:
            f.write(json.dumps(header, separators=(",", ":")).encode() + b"\n")
            f.writelines(lines)
            f.flush()
            os.fsync(f.fileno())
        with self._index_lock:
            os.replace(tmp, self.journal)
            self._index = None  # read again on next use
        fsync_dir(self.base)

    def disk_bytes(self) -> int:
        """Bytes the shadow repository and its journal take."""
        return _tree_bytes(self.git_dir) + _size(self.journal)


@dataclass(frozen=True)
class JournalUnit:
    """A turn's checkpoints (its "turn" and "call" lines) or a revert's line."""

    session: str
    id: str
    kind: str  # "turn" | "revert"
    at: str  # its first line's time


@dataclass(frozen=True)
class _Line:
    offset: int
    kind: str
    session: str
    unit: str  # the turn's id ("turn", "call"), the revert's ("revert")
    at: str
    big: bool


@dataclass
class _Index:
    """A journal's lines without their trees: what finding a turn's lines takes."""

    lines: list[_Line] = field(default_factory=list)
    units: dict[str, list[_Line]] = field(default_factory=dict)
    horizons: dict[str, str] = field(default_factory=dict)  # session -> newest pruned line's time
    last_tree: str | None = None
    torn: bool = False

    def add(self, offset: int, entry: dict[str, Any]) -> None:
        kind = str(entry.get("k", ""))
        if kind == "pruned":
            found = entry.get("horizons")
            if isinstance(found, dict):
                self.horizons |= {str(k): str(v) for k, v in found.items()}
            return
        unit = entry.get("id") if kind == "revert" else entry.get("t")
        line = _Line(offset, kind, str(entry.get("s", "")), str(unit or ""), str(entry.get("at", "")),
                     bool(entry.get("big")))
        self.lines.append(line)
        if line.unit:
            self.units.setdefault(line.unit, []).append(line)
        if isinstance(entry.get("tree"), str):
            self.last_tree = entry["tree"]


def usage(data_dir: Path) -> tuple[int, int]:
    """The shadow repositories under ``data_dir``: how many, and the bytes they and their journals take."""
    base = data_dir / DIR_NAME
    if not base.is_dir():
        return 0, 0
    repos = sum(1 for p in base.glob("*.git") if p.is_dir())
    return repos, _tree_bytes(base)


def _tree_bytes(directory: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(directory):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_size
    return total


def interrupted_reverts(data_dir: Path) -> list[dict[str, Any]]:
    """Boot: the reverts a crash interrupted, as their markers tell (``clear_interrupted_reverts``
    removes them once reported). Their files stand each as it was or as restored."""
    base = data_dir / DIR_NAME
    found: list[dict[str, Any]] = []
    if not base.is_dir():
        return found
    for marker in sorted(base.glob("*.revert")):
        try:
            note = json.loads(marker.read_text())
        except (OSError, ValueError):
            note = {}
        found.append(note if isinstance(note, dict) else {})
    return found


def clear_interrupted_reverts(data_dir: Path) -> None:
    """Remove the temporary files interrupted reverts left, then their markers."""
    for note, marker in zip(interrupted_reverts(data_dir), sorted((data_dir / DIR_NAME).glob("*.revert"))):
        root = note.get("root")
        if isinstance(root, str):
            for path in note.get("files", []):
                with contextlib.suppress(OSError, ValueError):
                    tmp = Path(root) / path
                    tmp.with_name(tmp.name + TEMP_SUFFIX).unlink(missing_ok=True)
        marker.unlink(missing_ok=True)


def _import_path(path: bytes) -> bytes:
    """A path for a fast-import ``M`` line: C-quoted when it starts with a quote or holds a
    control character (a newline would end the line), as is otherwise."""
    if not path.startswith(b'"') and not any(b < 0x20 or b == 0x7F for b in path):
        return path
    out = bytearray(b'"')
    for b in path:
        if b in (0x22, 0x5C):
            out += b"\\" + bytes([b])
        elif b < 0x20 or b == 0x7F:
            out += b"\\%03o" % b
        else:
            out.append(b)
    return bytes(out + b'"')


def _pattern(path: str) -> str:
    """A path as a literal gitignore pattern."""
    return "".join("\\" + c if c in "*?[]\\!# " else c for c in path)


def _size(path: Path) -> int:
    try:
        return os.lstat(path).st_size
    except OSError:
        return 0


def _private(path: str, flags: int) -> int:
    return os.open(path, flags, 0o600)


def _prune(directory: Path, root: Path) -> None:
    """Remove ``directory`` and its parents while empty, never the root itself."""
    for _ in range(256):
        if directory == root or not directory.is_relative_to(root):
            return
        try:
            directory.rmdir()
        except OSError:
            return
        directory = directory.parent


def _remove_tree(directory: Path) -> None:
    """A directory that stands where the restored file goes: only empty directories are removed
    (its files were deleted first, or are ignored and must stay: then the restore fails)."""
    for path in sorted(directory.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        if path.is_dir() and not path.is_symlink():
            path.rmdir()
    directory.rmdir()


def _pair_header(line: bytes) -> tuple[str, str] | None:
    """``diff-tree --stdin`` starts each pair's diff with the line ``<old> <new>``: that pair. (No
    line of a diff looks like it: each starts with a space, a sign, ``@``, ``\\`` or a word.)"""
    old, sep, new = line.partition(b" ")
    if sep and len(old) == len(new) >= 40 and all(c in b"0123456789abcdef" for c in old + new):
        return old.decode(), new.decode()
    return None


def _patch_path(header: bytes) -> str | None:
    """The path of a ``diff --git a/<path> b/<path>`` line (no renames: both name the same path),
    C-quoted by git when it holds a quote, a backslash or a control character."""
    rest = header[len(b"diff --git "):]
    if rest.startswith(b'"'):
        quoted = _unquote(rest)
        return os.fsdecode(quoted[2:]) if quoted is not None and quoted.startswith(b"a/") else None
    size = (len(rest) - 5) // 2
    path = rest[2:2 + size]
    return os.fsdecode(path) if rest == b"a/" + path + b" b/" + path else None


_ESCAPES = {ord("a"): 7, ord("b"): 8, ord("t"): 9, ord("n"): 10, ord("v"): 11, ord("f"): 12, ord("r"): 13,
            ord('"'): 34, ord("\\"): 92}


def _unquote(text: bytes) -> bytes | None:
    """The first C-quoted string of ``text`` (which starts with its opening quote), unescaped."""
    out = bytearray()
    n = 1
    while n < len(text):
        c = text[n]
        if c == 0x22:
            return bytes(out)
        if c == 0x5C and n + 1 < len(text):
            nxt = text[n + 1]
            if 0x30 <= nxt <= 0x37 and n + 3 < len(text):
                out.append(int(text[n + 1:n + 4], 8) & 0xFF)
                n += 4
                continue
            out.append(_ESCAPES.get(nxt, nxt))
            n += 2
            continue
        out.append(c)
        n += 1
    return None


def _patch_text(patch: bytes, max_diff: int) -> str:
    text = patch.decode(errors="replace")
    if text.startswith("Binary files ") or "\nBinary files " in text:
        return "binary"
    if len(text) > max_diff:
        text = text[:max_diff] + f"\n… (diff cut at {max_diff // 1024} KiB)\n"
    return text


