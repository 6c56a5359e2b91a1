"""A lossy disk, the child half: journal every mutation pidesk/store makes to the disk.

A SIGKILL leaves the page cache; a power cut may also take what was never
synced. ``install`` replaces the names that ``pidesk/store``'s file code calls —
the module-level ``os`` of ``transcripts``, ``artifacts``, ``blobs`` and
``store``, every module-level alias of ``os.fsync`` / ``os.fdatasync`` there
(``transcripts._sync``), their ``open``, and ``Path.mkdir`` / ``Path.unlink`` for
paths under the watched directories — with recording versions. Each mutation
(create, O_TRUNC, write, fsync/fdatasync of a file or of a directory,
ftruncate, rename/replace, unlink, mkdir) is done, then appended to a journal
file as one JSON line, both under one lock, so the journal is exactly what
reached the page cache. A write on a descriptor opened with ``O_DSYNC`` /
``O_SYNC`` is recorded as synced.

The layer can SIGKILL the process itself at the Nth matching mutation,
``before`` it runs or ``after`` it (a write that ran but never returned: not
durable even under O_DSYNC), or when the scenario says (``Layer.die``) —
always holding the lock, so the journal never lags the disk.

The parent half, ``power_cut.py``, replays the journal and writes a power
cut's outcome over the real files. SQLite's files (``index.db*``) and the
host's ``host.lock`` / ``host.json`` are never recorded.
"""

from __future__ import annotations

import base64
import builtins
import fcntl
import json
import os
import pathlib
import signal
import stat
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

EXCLUDED = ("index.db", "host.lock", "host.json")
"""Names never modelled: SQLite's files (trusted for their own durability) and the host's lock and URL file."""

_real_mkdir = pathlib.Path.mkdir
_real_unlink = pathlib.Path.unlink


def excluded(path: str) -> bool:
    return os.path.basename(path).startswith(EXCLUDED)


# ---- the child side: record every mutation ---------------------------------------------------------


class Layer:
    """Records the mutations of the watched trees to ``journal``; may SIGKILL at a chosen one.

    ``kill``: ``{"op": "write", "suffix": ".jsonl", "contains": "", "nth": 3, "when": "after"}``;
    every key is optional (``{"nth": 40}`` kills before the 40th mutation of any kind).
    """

    def __init__(self, journal: Path, watched: Sequence[Path], kill: dict[str, Any] | None = None) -> None:
        self.watched = [os.path.abspath(p) for p in watched]
        self.kill = kill
        self.lock = threading.RLock()
        self.ops = 0
        self.matched = 0
        self.fds: dict[int, str] = {}
        self._journal = os.open(journal, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.os = LossyOs(self)

    def watches(self, path: Any) -> bool:
        p = os.path.abspath(os.fspath(path))
        return not excluded(p) and any(p == w or p.startswith(w + os.sep) for w in self.watched)

    def die(self) -> None:
        """SIGKILL this process now, between two recorded operations."""
        with self.lock:
            os.kill(os.getpid(), signal.SIGKILL)

    def before(self, op: str, path: str) -> bool:
        """Count a mutation about to run; die now if it is the kill point; True: die right after it."""
        self.ops += 1
        k = self.kill
        if k is None or k.get("op", op) != op or not path.endswith(k.get("suffix", "")) \
                or k.get("contains", "") not in path:
            return False
        self.matched += 1
        if self.matched != k.get("nth", 1):
            return False
        if k.get("when", "before") == "before":
            self.die()
        return True

    def record(self, event: dict[str, Any], then_die: bool = False) -> None:
        os.write(self._journal, json.dumps(event).encode() + b"\n")
        if then_die:
            self.die()

    def path_of(self, fd: int) -> str:
        return self.fds.get(fd, f"<fd {fd}>")


def _absolute(path: Any, dir_fd: int | None) -> str:
    """The absolute path a call names: a relative one is relative to ``dir_fd``'s directory when given
    (artifacts are opened component by component, relative to their parent's descriptor)."""
    if dir_fd is None or os.path.isabs(path):
        return os.path.abspath(os.fspath(path))
    return os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), os.fspath(path))


class LossyOs:
    """The ``os`` a patched module sees: mutations are recorded, everything else is the real ``os``."""

    def __init__(self, layer: Layer) -> None:
        self._layer = layer

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)

    def open(self, path: Any, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
        layer, p = self._layer, _absolute(path, dir_fd)
        with layer.lock:
            if not layer.watches(p):
                return os.open(path, flags, mode, dir_fd=dir_fd)
            existed = os.path.lexists(p)
            creates = bool(flags & os.O_CREAT) and not existed
            truncates = bool(flags & os.O_TRUNC) and existed and not os.path.isdir(p)
            die = layer.before("create", p) if creates else layer.before("trunc", p) if truncates else False
            fd = os.open(path, flags, mode, dir_fd=dir_fd)
            layer.fds[fd] = p
            if creates:
                layer.record({"op": "create", "path": p, "ino": os.fstat(fd).st_ino}, die)
            elif truncates:
                layer.record({"op": "trunc", "ino": os.fstat(fd).st_ino, "size": 0, "sync": False}, die)
            return fd

    def close(self, fd: int) -> None:
        with self._layer.lock:
            self._layer.fds.pop(fd, None)
            os.close(fd)

    def write(self, fd: int, data: Any) -> int:
        return self._write(fd, data, None)

    def pwrite(self, fd: int, data: Any, offset: int) -> int:
        return self._write(fd, data, offset)

    def writev(self, fd: int, buffers: Iterable[Any]) -> int:
        return self._write(fd, b"".join(bytes(b) for b in buffers), None)

    def _write(self, fd: int, data: Any, offset: int | None) -> int:
        layer = self._layer
        with layer.lock:
            path = layer.path_of(fd)
            if fd not in layer.fds:  # opened outside the watched trees
                return os.write(fd, data) if offset is None else os.pwrite(fd, data, offset)
            die = layer.before("write", path)
            flags = fcntl.fcntl(fd, fcntl.F_GETFL)
            st = os.fstat(fd)
            if offset is None:
                at = st.st_size if flags & os.O_APPEND else os.lseek(fd, 0, os.SEEK_CUR)
                n = os.write(fd, data)
            else:
                at, n = offset, os.pwrite(fd, data, offset)
            synced = bool(flags & (os.O_DSYNC | os.O_SYNC)) and not die  # a write that never returned is not durable
            layer.record({"op": "write", "ino": st.st_ino, "off": at, "sync": synced,
                          "data": base64.b64encode(bytes(memoryview(data)[:n])).decode()}, die)
            return n

    def fsync(self, fd: int) -> None:
        self._sync(fd, os.fsync)

    def fdatasync(self, fd: int) -> None:
        self._sync(fd, os.fdatasync)

    def _sync(self, fd: int, real: Callable[[int], None]) -> None:
        layer = self._layer
        with layer.lock:
            if fd not in layer.fds:
                return real(fd)
            st = os.fstat(fd)
            die = layer.before("dirsync" if stat.S_ISDIR(st.st_mode) else "fsync", layer.path_of(fd))
            real(fd)
            layer.record({"op": "fsync", "ino": st.st_ino}, die)

    def ftruncate(self, fd: int, size: int) -> None:
        layer = self._layer
        with layer.lock:
            if fd not in layer.fds:
                return os.ftruncate(fd, size)
            die = layer.before("trunc", layer.path_of(fd))
            os.ftruncate(fd, size)
            synced = bool(fcntl.fcntl(fd, fcntl.F_GETFL) & (os.O_DSYNC | os.O_SYNC)) and not die
            layer.record({"op": "trunc", "ino": os.fstat(fd).st_ino, "size": size, "sync": synced}, die)

    def truncate(self, path: Any, size: int) -> None:
        fd = self.open(path, os.O_WRONLY)
        try:
            self.ftruncate(fd, size)
        finally:
            self.close(fd)

    def replace(self, src: Any, dst: Any, **kw: Any) -> None:
        self._rename(src, dst, os.replace, kw)

    def rename(self, src: Any, dst: Any, **kw: Any) -> None:
        self._rename(src, dst, os.rename, kw)

    def _rename(self, src: Any, dst: Any, real: Callable[..., None], kw: dict[str, Any]) -> None:
        layer = self._layer
        s, d = os.path.abspath(os.fspath(src)), os.path.abspath(os.fspath(dst))
        with layer.lock:
            if not (layer.watches(s) or layer.watches(d)):
                return real(src, dst, **kw)
            die = layer.before("rename", d)
            real(src, dst, **kw)
            layer.record({"op": "rename", "src": s, "dst": d}, die)

    def unlink(self, path: Any, **kw: Any) -> None:
        layer, p = self._layer, os.path.abspath(os.fspath(path))
        with layer.lock:
            if not layer.watches(p):
                return os.unlink(path, **kw)
            die = layer.before("unlink", p)
            os.unlink(path, **kw)
            layer.record({"op": "unlink", "path": p}, die)

    remove = unlink

    def mkdir(self, path: Any, mode: int = 0o777, **kw: Any) -> None:
        layer, p = self._layer, _absolute(path, kw.get("dir_fd"))
        with layer.lock:
            if not layer.watches(p):
                return os.mkdir(path, mode, **kw)
            die = layer.before("mkdir", p) if not os.path.lexists(p) else False
            os.mkdir(path, mode, **kw)
            layer.record({"op": "mkdir", "path": p, "ino": os.stat(p).st_ino}, die)


class LossyFile:
    """What the patched ``open`` returns for a binary write: an unbuffered file whose writes go through ``LossyOs``."""

    def __init__(self, los: LossyOs, fd: int) -> None:
        self._os, self._fd, self.closed = los, fd, False

    def write(self, data: Any) -> int:
        view, done = memoryview(data), 0
        while done < len(view):
            done += self._os.write(self._fd, view[done:])
        return done

    def truncate(self, size: int | None = None) -> int:
        size = os.lseek(self._fd, 0, os.SEEK_CUR) if size is None else size
        self._os.ftruncate(self._fd, size)
        return size

    def flush(self) -> None:
        pass  # unbuffered

    def fileno(self) -> int:
        return self._fd

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        return os.lseek(self._fd, offset, whence)

    def tell(self) -> int:
        return os.lseek(self._fd, 0, os.SEEK_CUR)

    def read(self, n: int = -1) -> bytes:
        if n >= 0:
            return os.read(self._fd, n)
        chunks = []
        while chunk := os.read(self._fd, 1 << 16):
            chunks.append(chunk)
        return b"".join(chunks)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._os.close(self._fd)

    def __enter__(self) -> LossyFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _lossy_open(los: LossyOs) -> Callable[..., Any]:
    def lossy_open(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        if not any(c in mode for c in "wax+") or not los._layer.watches(file):
            return builtins.open(file, mode, *args, **kwargs)
        if "b" not in mode:
            raise NotImplementedError(f"the lossy disk models binary writes only, not open({file!r}, {mode!r})")
        flags = (os.O_RDWR if "+" in mode else os.O_WRONLY) | os.O_CLOEXEC
        flags |= {"w": os.O_CREAT | os.O_TRUNC, "a": os.O_CREAT | os.O_APPEND, "x": os.O_CREAT | os.O_EXCL}.get(
            next(c for c in mode if c in "rwax"), 0)
        return LossyFile(los, los.open(file, flags, 0o666))

    return lossy_open


def _store_modules() -> list[Any]:
    from pidesk.store import artifacts, blobs, store, transcripts

    return [transcripts, artifacts, blobs, store]


@dataclass
class Installed:
    layer: Layer
    saved: list[tuple[Any, str, Any]] = field(default_factory=list)

    def uninstall(self) -> None:
        for owner, name, value in reversed(self.saved):
            if value is _ABSENT:
                delattr(owner, name)
            else:
                setattr(owner, name, value)
        os.close(self.layer._journal)


_ABSENT = object()


def install(journal: Path, watched: Sequence[Path], kill: dict[str, Any] | None = None) -> Installed:
    """Route pidesk/store's file mutations through a recording ``Layer`` (undo with ``.uninstall()``)."""
    layer = Layer(journal, watched, kill)
    done = Installed(layer)

    def patch(owner: Any, name: str, value: Any) -> None:
        done.saved.append((owner, name, vars(owner).get(name, _ABSENT)))
        setattr(owner, name, value)

    for module in _store_modules():
        patch(module, "os", layer.os)
        patch(module, "open", _lossy_open(layer.os))
        for name, value in list(vars(module).items()):  # e.g. transcripts._sync = os.fdatasync
            if value is os.fsync or value is os.fdatasync:
                patch(module, name, getattr(layer.os, value.__name__))

    def mkdir(self: Path, mode: int = 0o777, parents: bool = False, exist_ok: bool = False) -> None:
        if not layer.watches(self):
            return _real_mkdir(self, mode, parents, exist_ok)
        try:
            layer.os.mkdir(self, mode)
        except FileNotFoundError:
            if not parents or self.parent == self:
                raise
            self.parent.mkdir(parents=True, exist_ok=True)
            self.mkdir(mode, parents=False, exist_ok=exist_ok)
        except OSError:
            if not exist_ok or not self.is_dir():
                raise

    def unlink(self: Path, missing_ok: bool = False) -> None:
        if not layer.watches(self):
            return _real_unlink(self, missing_ok)
        try:
            layer.os.unlink(self)
        except FileNotFoundError:
            if not missing_ok:
                raise

    patch(pathlib.Path, "mkdir", mkdir)
    patch(pathlib.Path, "unlink", unlink)
    return done
