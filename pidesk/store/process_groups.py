"""The durable record of the tool process groups running now: ``<data_dir>/process-groups``.

A Bash call's process group must not outlive the host (issue 15, item 7). The
watchdog (``tools/watchdog.py``) kills the groups of a host that died; this
record is the backstop boot uses when the watchdog could not: before the host
serves, recovery kills every group recorded here that still runs as the very
process the record names, then clears the record.

Format: one line per change, appended (mode 0600)::

    + <pgid> <start> <boot_id>     a group started (written before its command runs)
    - <pgid> <start>               that group is gone

``start`` is the leader's start time (``/proc/<pid>/stat`` field 22, clock ticks
since boot) and ``boot_id`` the kernel's (``/proc/sys/kernel/random/boot_id``):
with the pgid they name one process for the life of the machine, so a pid the
kernel handed to someone else since is never killed.

Durability: the ``+`` line is written (``write(2)``, not fsynced) before the
command gets its first byte of input, so before it can have any effect. No
fsync, on purpose: a group can outlive only a crash of the host *process*,
after which the kernel's page cache still holds the line; a crash of the
machine (the only thing an fsync guards against) takes the groups with it,
and their boot id no longer matches. A lost ``-`` line costs nothing: boot
finds that group gone. A torn or unknown line (a full disk) names no group
boot could check: it is logged and skipped.

The file grows by two short lines per call; past ``COMPACT_BYTES`` it is
rewritten with only the groups still running (a new file renamed over it).
"""

from __future__ import annotations

import errno
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Final

log = logging.getLogger("pidesk.store.process_groups")

COMPACT_BYTES: Final = 1 << 20
FILE_NAME: Final = "process-groups"


@dataclass(frozen=True)
class RecordedGroup:
    pgid: int
    start: int  # the leader's start time, clock ticks since boot
    boot_id: str


class ProcessGroups:
    """Thread-safe; the file is opened on the first ``add`` (a store opened only to look creates nothing)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._written = 0
        self._torn = False  # a short write left a line without its end: the next line starts on a new one
        self._live: dict[tuple[int, int], str] = {}  # (pgid, start) -> boot id, as this process recorded them

    def add(self, pgid: int, start: int, boot_id: str) -> None:
        """Record a running group; returns once the line is in the file (see the module docstring)."""
        with self._lock:
            self._write(f"+ {pgid} {start} {boot_id}\n".encode())
            self._live[(pgid, start)] = boot_id

    def remove(self, pgid: int, start: int) -> None:
        """The group is gone (every member has exited)."""
        with self._lock:
            if self._live.pop((pgid, start), None) is None:
                return
            self._write(f"- {pgid} {start}\n".encode())
            if self._written > COMPACT_BYTES:
                self._compact()

    def recorded(self) -> list[RecordedGroup]:
        """The groups the file says are running: every ``+`` without its ``-``, in order."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return []
        live: dict[tuple[int, int], str] = {}
        for line in data.decode("ascii", errors="replace").splitlines():
            fields = line.split()
            try:
                if len(fields) == 4 and fields[0] == "+":
                    live[(int(fields[1]), int(fields[2]))] = fields[3]
                    continue
                if len(fields) == 3 and fields[0] == "-":
                    live.pop((int(fields[1]), int(fields[2])), None)
                    continue
            except ValueError:
                pass
            log.warning("%s: skipping an unreadable line %r", self.path, line[:80])
        return [RecordedGroup(pgid, start, boot) for (pgid, start), boot in live.items()]

    def clear(self) -> None:
        """Forget every record (boot, once the recorded groups are dead)."""
        with self._lock:
            self._live.clear()
            self._close()
            self.path.unlink(missing_ok=True)
            self._written, self._torn = 0, False

    def close(self) -> None:
        with self._lock:
            self._close()

    def _write(self, line: bytes) -> None:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
            self._written = os.fstat(self._fd).st_size
        if self._torn:
            line = b"\n" + line
        written = os.write(self._fd, line)  # (O_APPEND, a short line: one write, never interleaved)
        self._written += written
        self._torn = written < len(line)
        if self._torn:
            raise OSError(errno.ENOSPC, f"{self.path}: a short write (is the disk full?)")

    def _compact(self) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        body = "".join(f"+ {pgid} {start} {boot}\n" for (pgid, start), boot in self._live.items()).encode()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            if os.write(fd, body) < len(body):  # (the old file stays: still right, only longer)
                raise OSError(errno.ENOSPC, f"{tmp}: a short write (is the disk full?)")
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        self._close()
        self._written, self._torn = len(body), False

    def _close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


__all__ = ["COMPACT_BYTES", "FILE_NAME", "ProcessGroups", "RecordedGroup"]
