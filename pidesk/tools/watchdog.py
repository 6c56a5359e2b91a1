"""Tool process groups die with the host: a watchdog process, and the kill boot does.

Invariant: a Bash call's process group (the command and every descendant that
did not detach itself with ``setsid``) never runs on after the host process is
gone — whether the host exited, crashed or was ``kill -9``'d (issue 15, item 7).

Design: one *watchdog* per host process, started on the first guarded group
(``tools/reaper.py`` run by ``sys.executable -I -S``, in a session of its own). The host
holds the write end of a pipe to its stdin and tells it ``+ pgid start`` before a
group's command runs and ``- pgid start`` once the group is gone. The kernel
closes that pipe when the host dies, however it dies; the watchdog, asleep until
that hang-up (it reads its lines only every ``reaper.DRAIN_S`` meanwhile),
reads EOF and SIGKILLs every group it still knows (``kill_group``), then exits.

Why not ``PR_SET_PDEATHSIG`` on each call's child, through a small launcher:

- the death signal reaches only the direct child; bash forks for
  ``sleep 5; echo late``, so the launcher would have to stay as a supervisor
  that kills the group — a Python process per call (~15 ms of CPU, where a
  whole Bash call costs ~2 ms and the spare shell exists to save 1.5 ms);
- the signal fires when the *thread* that forked the child exits, not the
  process: a host whose event loop runs in a worker thread would kill its
  tools when that thread ends, or miss them;
- a setsid-free grandchild of a killed launcher is reparented to init and
  keeps running unless someone kills the whole group by id — which is what
  the watchdog does for every group, with one process per host.

The pipe's write end is non-inheritable (no tool child holds it open) and is
closed in a forked child (``os.register_at_fork``). Writes are non-blocking: a
watchdog that stopped reading costs a warning, never a stuck event loop; one
that died is started again and told every group still running.

The watchdog is one half. The other is the store's durable record
(``store/process_groups.py``): the same ``+``/``-`` lines, written before a
command can have any effect, which boot replays (``kill_recorded``) before the
host serves — for a watchdog killed along with its host (``kill -9`` of both,
the OOM killer). Either way a group is killed only while its leader is the
process that was recorded: same pid, same start time (``/proc/<pid>/stat``
field 22) and, at boot, the same boot id. A pid the kernel reused is left alone.

The watchdog process itself, and the /proc reads and the kill it shares with
boot, are ``tools/reaper.py``: a few standard-library modules, no more, since it
starts beside a turn's first tool calls.
"""

from __future__ import annotations

import atexit
import logging
import os
import select
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from typing import Final, Protocol

from pidesk.tools import reaper
from pidesk.tools.reaper import boot_id, kill_group, running_members, start_time

log = logging.getLogger("pidesk.tools.watchdog")

_STOP_WAIT_S: Final = 2.0  # how long boot waits for the groups it killed to stop
_POLL_S: Final = 0.01
_RETRY_S: Final = 10.0  # a watchdog that could not start is not tried again sooner
COMMAND: Final = [sys.executable, "-I", "-S", os.path.abspath(reaper.__file__)]  # the watchdog process


class GroupRecord(Protocol):
    """The durable record of running groups (``pidesk.store.process_groups.ProcessGroups``)."""

    def add(self, pgid: int, start: int, boot_id: str) -> None: ...

    def remove(self, pgid: int, start: int) -> None: ...


Guarded = tuple[int, int]  # (pgid, the leader's start time)


def guard(pgid: int, record: GroupRecord | None) -> Guarded | None:
    """A group is about to run its command: record it (durably when ``record`` is given) and tell the
    watchdog. None if its leader is already gone (nothing to guard). Call before the command gets any input;
    an ``OSError`` here (the record could not be written) means the command must not run."""
    start = start_time(pgid)
    if start is None:
        return None
    if record is not None:
        record.add(pgid, start, boot_id())
    WATCHDOG.watch(pgid, start)
    return pgid, start


def keep_guarded(guarded: Guarded | None) -> None:
    """A group guarded a while ago (a spare shell, guarded when it started) is about to run its command:
    make sure a watchdog that knows it is still there. One that died meanwhile is started again and told
    every group still watched, as a failed write in ``guard`` would have it."""
    if guarded is not None:
        WATCHDOG.ensure()


def release(guarded: Guarded | None, record: GroupRecord | None) -> None:
    """The group is gone (no member runs): forget it."""
    if guarded is None:
        return
    WATCHDOG.unwatch(*guarded)
    if record is not None:
        try:
            record.remove(*guarded)
        except OSError as exc:  # harmless: boot finds the group gone
            log.warning("could not record the end of process group %d: %s", guarded[0], exc)


def kill_recorded(groups: Iterable[tuple[int, int, str]]) -> list[int]:
    """Boot: SIGKILL every recorded ``(pgid, start, boot_id)`` group still running as the process recorded;
    return their pgids once none of them runs (waiting at most ``_STOP_WAIT_S``)."""
    this_boot = boot_id()
    killed = [pgid for pgid, start, boot in groups if boot == this_boot and kill_group(pgid, start)]
    deadline = time.monotonic() + _STOP_WAIT_S
    while any(running_members(pgid) for pgid in killed) and time.monotonic() < deadline:
        time.sleep(_POLL_S)
    return killed


class Watchdog:
    """The host side: the watchdog process of this host process, started on first use."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._fd: int | None = None
        self._live: dict[Guarded, None] = {}
        self._failed_at: float | None = None  # when a start last failed: tried again only after _RETRY_S

    def watch(self, pgid: int, start: int) -> None:
        with self._lock:
            self._live[(pgid, start)] = None
            self._send(f"+ {pgid} {start}\n".encode())

    def unwatch(self, pgid: int, start: int) -> None:
        with self._lock:
            if (pgid, start) not in self._live:
                return
            del self._live[(pgid, start)]
            self._send(f"- {pgid} {start}\n".encode())

    def ensure(self) -> None:
        """Start the watchdog again if it has gone (no reader on its pipe), telling it every group watched."""
        with self._lock:
            if self._fd is not None:
                if not _reader_gone(self._fd):
                    return
                log.warning("the tool watchdog (pid %s) is gone; starting another", self.pid)
            self._restart()  # (none running: one that could not start is tried again only after _RETRY_S)

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def close(self) -> None:
        """Close the pipe (the watchdog kills what is still watched, then exits) and wait for it, bounded."""
        with self._lock:
            proc, self._proc = self._proc, None
            self._close_fd()
        if proc is not None:
            try:
                proc.wait(timeout=_STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                log.warning("the tool watchdog (pid %d) did not exit", proc.pid)

    def _send(self, line: bytes) -> None:
        if self._fd is None:
            self._restart()  # (the first use: there is no watchdog yet)
            return
        try:
            os.write(self._fd, line)  # (under PIPE_BUF: all of it or nothing)
        except BlockingIOError:
            log.warning("the tool watchdog (pid %s) is not reading; boot will kill what it missed", self.pid)
        except OSError as exc:  # EPIPE: it died
            log.warning("the tool watchdog (pid %s) is gone (%s); starting another", self.pid, exc)
            self._restart()

    def _restart(self) -> None:
        """Start a watchdog (the previous one, if any, is gone) and tell it every group still watched."""
        self._close_fd()
        if self._proc is not None:
            self._proc.poll()  # (reap it)
            self._proc = None
        if not self._start():
            return
        assert self._fd is not None
        body = b"".join(f"+ {pgid} {start}\n".encode() for pgid, start in self._live)
        os.set_blocking(self._fd, True)  # (it reads as soon as it runs; usually a line or two)
        try:
            os.write(self._fd, body)
        except OSError as exc:
            log.warning("cannot reach the new tool watchdog: %s; only boot will kill groups a crash leaves", exc)
            self._close_fd()
        else:
            os.set_blocking(self._fd, False)

    def _start(self) -> bool:
        now = time.monotonic()
        if self._failed_at is not None and now - self._failed_at < _RETRY_S:
            return False
        try:
            self._proc = subprocess.Popen(
                COMMAND,
                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                cwd="/", start_new_session=True,
            )
        except OSError as exc:  # (fork refused under a load spike: try again later, not on every call)
            self._failed_at = now
            log.warning("cannot start the tool watchdog: %s; only boot will kill groups a crash leaves", exc)
            return False
        self._failed_at = None
        assert self._proc.stdin is not None
        self._fd = os.dup(self._proc.stdin.fileno())  # (dup: non-inheritable, and ours to close)
        self._proc.stdin.close()
        os.set_blocking(self._fd, False)
        return True

    def _close_fd(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _forked(self) -> None:
        """In a forked child: the parent's pipe is not ours to hold (it would keep its watchdog waiting)."""
        self._lock = threading.Lock()
        self._close_fd()
        self._proc = None
        self._live = {}


def _reader_gone(fd: int) -> bool:
    """Whether the pipe ``fd`` writes to has no reader left (poll's POLLERR on a write end), without writing."""
    poller = select.poll()
    poller.register(fd, 0)  # (no events asked: POLLERR and POLLHUP are reported regardless)
    return bool(poller.poll(0))


WATCHDOG: Final = Watchdog()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=WATCHDOG._forked)
atexit.register(WATCHDOG.close)
