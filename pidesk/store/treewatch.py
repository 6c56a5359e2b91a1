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

Where inotify cannot be had at all (not Linux, no libc symbol) or the watch
limit (``max_watches``, and the system's ``fs.inotify.max_user_watches``) is
reached, ``available`` turns False for good and every answer is ``None``.

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

MAX_WATCHES = 20_000
MAX_NEW = 1_000  # new directories one look may start watching
MAX_PATHS = 256  # changed paths one look may name


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
        return MAX_WATCHES


class _Restart(Exception):
    """The watch cannot vouch for this look; start afresh."""


class TreeWatch:
    def __init__(self, root: Path, *, max_watches: int = MAX_WATCHES, max_new: int = MAX_NEW,
                 max_paths: int = MAX_PATHS) -> None:
        self.root = root
        self.max_watches = min(max_watches, max(_system_limit() // 2, 1))
        self.max_new = max_new
        self.max_paths = max_paths
        self._libc = _libc()
        self.available = self._libc is not None
        self._fd = -1
        self._dirs: dict[int, str] = {}  # watch descriptor -> directory, relative ("" is the root)
        self._skip: Callable[[str], bool] = lambda rel: False

    # ---- the caller's two calls ---------------------------------------------------------

    def start(self, skip: Callable[[str], bool]) -> None:
        """Watch the root afresh (events before this call are forgotten). ``skip(rel)``: a
        directory (relative posix path) never to watch. Call it before the full scan it pairs
        with, so a change during that scan is reported by the next ``changes()``."""
        self.close()
        if not self.available:
            return
        assert self._libc is not None
        self._skip = skip
        fd = self._libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            self.available = False
            return
        self._fd = fd
        try:
            self._watch_tree("", budget=self.max_watches)
        except _Restart:
            self.close()
            self.available = False  # the limit: a root this large is scanned in full each time

    def changes(self) -> set[str] | None:
        """The paths (relative) that may have changed since the last call or the start; None:
        every path may have (and the caller is to ``start`` again before its full scan)."""
        if self._fd < 0:
            return None
        try:
            return self._drain()
        except _Restart:
            self.close()
            return None

    @property
    def watching(self) -> bool:
        return self._fd >= 0

    def quiet(self) -> bool:
        """Watching, and no event has come since the last look (one poll: cheap on any thread)."""
        return self._fd >= 0 and not select.select([self._fd], [], [], 0)[0]

    def close(self) -> None:
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
        self._fd = -1
        self._dirs = {}

    # ---- inside ---------------------------------------------------------------------------

    def _drain(self) -> set[str]:
        changed: set[str] = set()
        new_dirs: list[str] = []
        while True:
            try:
                data = os.read(self._fd, 256 * 1024)
            except BlockingIOError:
                break
            pos = 0
            while pos + EVENT.size <= len(data):
                wd, mask, _cookie, size = EVENT.unpack_from(data, pos)
                name = os.fsdecode(data[pos + EVENT.size:pos + EVENT.size + size].rstrip(b"\0"))
                pos += EVENT.size + size
                if mask & IN_Q_OVERFLOW:
                    raise _Restart
                directory = self._dirs.get(wd)
                if directory is None:
                    continue  # a watch already dropped
                if mask & IN_IGNORED:
                    del self._dirs[wd]
                    if directory == "":
                        raise _Restart
                    continue
                if not name:  # the directory itself
                    if directory == "" and mask & (IN_DELETE_SELF | IN_MOVE_SELF):
                        raise _Restart
                    continue
                path = f"{directory}/{name}" if directory else name
                if name in (".gitignore", ".git"):  # what counts moved; a nested repository came or went
                    raise _Restart
                changed.add(path)
                if mask & IN_ISDIR:
                    if mask & (IN_CREATE | IN_MOVED_TO):
                        new_dirs.append(path)
                    elif mask & IN_MOVED_FROM:
                        self._forget(path)
        budget = min(self.max_new, self.max_watches - len(self._dirs))
        for path in new_dirs:
            budget = self._watch_tree(path, budget)
        if len(changed) > self.max_paths:
            raise _Restart
        return changed

    def _watch_tree(self, rel: str, budget: int) -> int:
        """Watch ``rel`` and every directory below it that is not skipped; returns what is left
        of ``budget`` (raising ``_Restart`` past it)."""
        assert self._libc is not None
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
            wd = self._libc.inotify_add_watch(self._fd, os.fsencode(full), MASK)
            if wd < 0:
                code = ctypes.get_errno()
                if code in (errno.ENOENT, errno.ENOTDIR):
                    continue
                raise _Restart  # ENOSPC (the system's watch limit) or worse
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
        assert self._libc is not None
        prefix = rel + "/"
        for wd, directory in list(self._dirs.items()):
            if directory == rel or directory.startswith(prefix):
                self._libc.inotify_rm_watch(self._fd, wd)
                del self._dirs[wd]
