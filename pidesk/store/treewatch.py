"""Which paths under a root may have changed since the last look: inotify watches (Linux).

The checkpoints' shadow repository (``store/checkpoints.py``) asks before each
snapshot, and scans only the paths named instead of statting every file of the
root — a Bash ``echo`` in a 10,000-file project then costs no git process at all.

A watch is an optimisation with no say over correctness: whenever it cannot
vouch for a complete answer, ``changes()`` answers ``None`` — "scan everything" —
and the watch starts afresh. That is when:

- it was never started, or has just been (re)started;
- the kernel's event queue overflowed;
- a ``.gitignore`` changed (which files count moved: ignored directories are not
  watched), or a nested repository's ``.git`` came or went;
- a burst of new directories would pass ``max_new`` watches in one look (an
  ``npm install`` into an ignored directory: the fresh start asks git again
  which directories are ignored and leaves them out);
- more than ``max_paths`` paths changed (one scan of the whole root is cheaper);
- the root itself was moved or deleted.

Where inotify cannot be had at all (not Linux, no libc symbol) or a root holds
more directories than ``max_watches``, ``available`` turns False for good and
every answer is ``None``.

One inotify instance serves every root of the process (``Inotify``; issue 33
§3): a user has 128 instances (``fs.inotify.max_user_instances``), shared with
editors and every other tool, so a watch per root capped a host at 8 watched
roots, and the 9th busy project made each checkpoint of the least recent one
scan in full and start its watch again (throughput halved at 12 projects). What
is shared instead is the budget of watched directories (``WATCH_BUDGET``: half
of ``fs.inotify.max_user_watches``, the other half left to the user's editors).
A directory two roots hold (one root inside another) is one watch descriptor,
named to both, and removed when the last lets go. Events are read by whichever
root looks first and kept per root until it looks (past ``max_paths`` a root's
are dropped and it scans in full). A root whose watch would pass the budget is
not watched (``starved``; its snapshots scan in full) until the host unwatches
the least recently used roots to make room (``host/checkpoints.py``). A queue
overflow (shared too) makes every root scan in full once.

What is watched: every directory under the root but ``.git`` directories, what
lies below a nested repository's top (a directory holding a ``.git``: watched
itself, so its ``.git`` coming or going restarts the watch), and the directories
the caller's ``skip`` names (``.pi/``, the data dir, directories ignored by name).
Events from a directory created after the start are caught by naming the new
directory itself as changed (a scan of it sees files made before its watch was
added). Symbolic links are never followed.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import os
import select
import struct
import threading
from collections.abc import Callable
from pathlib import Path

IN_MODIFY = 0x2
IN_ATTRIB = 0x4
IN_CLOSE_WRITE = 0x8
IN_MOVED_FROM = 0x40
IN_MOVED_TO = 0x80
IN_CREATE = 0x100
IN_DELETE = 0x200
IN_DELETE_SELF = 0x400
IN_MOVE_SELF = 0x800
IN_Q_OVERFLOW = 0x4000
IN_IGNORED = 0x8000
IN_ONLYDIR = 0x01000000
IN_DONT_FOLLOW = 0x02000000
IN_ISDIR = 0x40000000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC

MASK = (IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE
        | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR | IN_DONT_FOLLOW)
EVENT = struct.Struct("iIII")  # wd, mask, cookie, len; then len bytes of NUL-padded name

MAX_WATCHES = 20_000  # directories of one root
MAX_NEW = 1_000  # new directories one look may start watching
MAX_PATHS = 256  # changed paths one look may name
DEFAULT_LIMIT = 8192  # fs.inotify.max_user_watches where it cannot be read (the kernel's old default)


@functools.cache
def _libc() -> ctypes.CDLL | None:
    """The C library's inotify calls (the process's own symbols: no library search, which would
    run ``ldconfig``), once per process; None where there are none."""
    if not hasattr(os, "uname") or os.uname().sysname != "Linux":
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.inotify_init1.argtypes = [ctypes.c_int]
        libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        libc.inotify_rm_watch.argtypes = [ctypes.c_int, ctypes.c_int]
    except (OSError, AttributeError):
        return None
    return libc


def _system_limit() -> int:
    try:
        return int(Path("/proc/sys/fs/inotify/max_user_watches").read_text())
    except (OSError, ValueError):
        return DEFAULT_LIMIT


WATCH_BUDGET = max(_system_limit() // 2, 1)  # directories watched at once, all roots together


class _Restart(Exception):
    """The watch cannot vouch for this look; start afresh."""


class _Full(_Restart):
    """The shared budget of watched directories is spent."""


class Inotify:
    """The one inotify instance of the process, shared by every root's watch. Its state is guarded
    by ``lock`` (roots look from worker threads, and from the event loop when that costs nothing)."""

    def __init__(self, budget: int | None = None) -> None:
        self.budget = WATCH_BUDGET if budget is None else budget
        self.lock = threading.RLock()
        self.fd = -1
        self._libc = _libc()
        self._owners: dict[int, dict[TreeWatch, str]] = {}  # wd -> the watches holding it -> their directory

    @property
    def available(self) -> bool:
        return self._libc is not None

    @property
    def count(self) -> int:
        """Directories watched now (one per descriptor, whatever the roots holding it)."""
        return len(self._owners)

    def _open(self) -> bool:
        if self.fd < 0 and self._libc is not None:
            fd = self._libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
            if fd >= 0:
                self.fd = fd
        return self.fd >= 0

    def add(self, watch: TreeWatch, full: str, rel: str) -> int | None:
        """Watch directory ``full`` for ``watch`` (as ``rel``); None when it is gone or not a directory."""
        assert self._libc is not None
        if not self._open():
            raise _Restart
        if self.count >= self.budget:
            raise _Full
        wd = self._libc.inotify_add_watch(self.fd, os.fsencode(full), MASK)
        if wd < 0:
            code = ctypes.get_errno()
            if code in (errno.ENOENT, errno.ENOTDIR):
                return None
            raise _Full if code == errno.ENOSPC else _Restart  # the system's watch limit; or worse
        self._owners.setdefault(wd, {})[watch] = rel
        return wd

    def remove(self, watch: TreeWatch, wd: int) -> None:
        owners = self._owners.get(wd)
        if owners is None:
            return
        owners.pop(watch, None)
        if not owners:
            del self._owners[wd]
            assert self._libc is not None
            self._libc.inotify_rm_watch(self.fd, wd)
        if not self._owners and self.fd >= 0:  # nothing watched: no descriptor kept open
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = -1

    def ready(self) -> bool:
        """An event waits to be read (one poll)."""
        return self.fd >= 0 and bool(select.select([self.fd], [], [], 0)[0])

    def drain(self) -> None:
        """Read every event waiting and hand each to the watches of its directory. Hold ``lock``."""
        while self.fd >= 0:
            try:
                data = os.read(self.fd, 256 * 1024)
            except BlockingIOError:
                return
            pos = 0
            while pos + EVENT.size <= len(data):
                wd, mask, _cookie, size = EVENT.unpack_from(data, pos)
                name = os.fsdecode(data[pos + EVENT.size:pos + EVENT.size + size].rstrip(b"\0"))
                pos += EVENT.size + size
                if mask & IN_Q_OVERFLOW:  # every root may have missed something
                    for held in list(self._owners.values()):
                        for watch in held:
                            watch.broken = True
                    continue
                owners = self._owners.get(wd)
                if owners is None:
                    continue  # a watch already dropped
                if mask & IN_IGNORED:  # the directory is gone: the kernel dropped its watch
                    del self._owners[wd]
                    for watch, directory in owners.items():
                        watch.dropped(wd, directory)
                    continue
                for watch, directory in list(owners.items()):
                    watch.event(directory, mask, name)


@functools.cache
def shared() -> Inotify:
    """The process's inotify instance (opened on the first watch, closed when none is left)."""
    return Inotify()


class TreeWatch:
    def __init__(self, root: Path, *, max_watches: int = MAX_WATCHES, max_new: int = MAX_NEW,
                 max_paths: int = MAX_PATHS, inotify: Inotify | None = None) -> None:
        self.root = root
        self.inotify = inotify or shared()
        self.max_watches = min(max_watches, self.inotify.budget)
        self.max_new = max_new
        self.max_paths = max_paths
        self.available = self.inotify.available
        self.starved = False  # the last start found the shared budget spent (available stays True)
        self.size = 0  # directories it watched when last watching, or wanted when starved
        self.broken = False  # since the last look something was missed: the next answers None
        self._started = False
        self._dirs: dict[int, str] = {}  # watch descriptor -> directory, relative ("" is the root)
        self._changed: set[str] = set()  # seen since the last look
        self._new_dirs: list[str] = []  # directories made since the last look (to watch at the look)
        self._skip: Callable[[str], bool] = lambda rel: False

    # ---- the caller's two calls ---------------------------------------------------------

    def start(self, skip: Callable[[str], bool]) -> None:
        """Watch the root afresh (events before this call are forgotten). ``skip(rel)``: a
        directory (relative posix path) never to watch. Call it before the full scan it pairs
        with, so a change during that scan is reported by the next ``changes()``."""
        self.close()
        if not self.available:
            return
        self._skip = skip
        with self.inotify.lock:
            self.inotify.drain()  # events of directories it held before (theirs, not this start's)
            self._reset()
            self._started = True
            self.starved = False
            try:
                self._watch_tree("", budget=self.max_watches)
            except _Full:
                wanted = len(self._dirs) + 1
                self._close_locked()
                self.starved, self.size = True, max(self.size, wanted)
                return
            except _Restart:
                self._close_locked()
                self.available = False  # its own limit: a root this large is scanned in full each time
                return
            self.size = len(self._dirs)

    def changes(self) -> set[str] | None:
        """The paths (relative) that may have changed since the last call or the start; None:
        every path may have (and the caller is to ``start`` again before its full scan)."""
        if not self._started:
            return None
        with self.inotify.lock:
            self.inotify.drain()
            try:
                return self._take()
            except _Restart:
                self._close_locked()
                return None

    @property
    def watching(self) -> bool:
        return self._started

    def quiet(self) -> bool:
        """Watching, and nothing has come since the last look (cheap on any thread: the events of
        every root are read here when no other thread is at them, without walking anything)."""
        if not self._started or not self.inotify.lock.acquire(blocking=False):
            return False  # (another thread may have read this root's events and not handed them yet)
        try:
            if self.inotify.ready():
                self.inotify.drain()
            return self._started and not (self.broken or self._changed or self._new_dirs)
        finally:
            self.inotify.lock.release()

    def close(self) -> None:
        if not self._started:
            return
        with self.inotify.lock:
            self._close_locked()

    # ---- events (the shared instance calls these, holding its lock) --------------------------

    def event(self, directory: str, mask: int, name: str) -> None:
        if self.broken:
            return
        if not name:  # the directory itself
            if directory == "" and mask & (IN_DELETE_SELF | IN_MOVE_SELF):
                self.broken = True
            return
        if name in (".gitignore", ".git"):  # what counts moved; a nested repository came or went
            self.broken = True
            return
        path = f"{directory}/{name}" if directory else name
        self._changed.add(path)
        if mask & IN_ISDIR:
            if mask & (IN_CREATE | IN_MOVED_TO):
                self._new_dirs.append(path)
            elif mask & IN_MOVED_FROM:
                self._forget(path)
        if len(self._changed) > self.max_paths or len(self._new_dirs) > self.max_new:
            self.broken = True  # (one scan of the whole root is cheaper; and its memory stays bounded)
            self._changed, self._new_dirs = set(), []

    def dropped(self, wd: int, directory: str) -> None:
        self._dirs.pop(wd, None)
        if directory == "":
            self.broken = True

    # ---- inside ---------------------------------------------------------------------------

    def _take(self) -> set[str]:
        if self.broken:
            raise _Restart
        budget = min(self.max_new, self.max_watches - len(self._dirs))
        for path in self._new_dirs:
            budget = self._watch_tree(path, budget)
        self._new_dirs = []
        self.size = len(self._dirs)
        changed, self._changed = self._changed, set()
        if len(changed) > self.max_paths:
            raise _Restart
        return changed

    def _reset(self) -> None:
        self._dirs, self._changed, self._new_dirs, self.broken = {}, set(), [], False

    def _close_locked(self) -> None:
        for wd in list(self._dirs):
            self.inotify.remove(self, wd)
        self._reset()
        self._started = False

    def _watch_tree(self, rel: str, budget: int) -> int:
        """Watch ``rel`` and every directory below it that is not skipped; returns what is left
        of ``budget`` (raising ``_Restart`` past it, ``_Full`` past the shared budget)."""
        stack = [rel]
        while stack:
            current = stack.pop()
            if current and (self._skip(current) or os.path.basename(current) == ".git"):
                continue
            full = os.path.join(self.root, current) if current else str(self.root)
            try:
                entries = list(os.scandir(full))
            except (FileNotFoundError, NotADirectoryError, PermissionError):
                continue  # gone already (the scan of its path sees that), or closed to us as to git
            except OSError:
                raise _Restart from None
            nested = bool(current) and any(e.name == ".git" for e in entries)
            if budget <= 0:
                raise _Restart
            wd = self.inotify.add(self, full, current)
            if wd is None:
                continue
            self._dirs[wd] = current
            budget -= 1
            if nested:
                continue  # a nested repository: the scans pass it by; only its .git coming or going matters
            for entry in entries:
                with contextlib.suppress(OSError):
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(f"{current}/{entry.name}" if current else entry.name)
        return budget

    def _forget(self, rel: str) -> None:
        """A directory moved away: stop watching it and everything below (its watches would
        report the new place under the old name)."""
        prefix = rel + "/"
        for wd, directory in list(self._dirs.items()):
            if directory == rel or directory.startswith(prefix):
                self.inotify.remove(self, wd)
                del self._dirs[wd]
