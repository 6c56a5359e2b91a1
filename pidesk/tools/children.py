"""How the event loop learns that a tool's child process has exited.

Python 3.11's asyncio waits for each child in a thread of its own
(``ThreadedChildWatcher``), and starting that thread costs about 1.5 ms — a
third of a tool call's budget (docs/benchmarks-server.md). Linux ≥ 5.3 gives
every process a *pidfd* that the loop can poll like a socket; asyncio 3.12+
uses it by default. On 3.11 a host installs ``PidfdWatcher`` once its loop runs.

Not 3.11's own ``PidfdChildWatcher``: it keeps its children in a table keyed by
pid and reaps with ``waitpid(pid)``. Under the load soak (this VM's pids wrap at
32,768) it lost exits — a turn waited in Bash for an exit never reported, until
the tool learnt to look for itself (``tools/bash.py``, ``_wait_exit``). This one
is 3.12's design: each child's pidfd goes straight to its own reader callback,
and the child is reaped through that pidfd, so no pid is ever confused with
another.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger("pidesk.tools.children")


def use_pidfd_watcher() -> bool:
    """Watch children through pidfds on this running loop (3.11 on Linux); True if in use.

    Only from the main thread's loop: the 3.11 watcher delivers every exit to the
    loop it is attached to, which asyncio moves along with the main thread's
    event loop. A host running in another thread keeps the threaded watcher.
    """
    if sys.version_info >= (3, 12):
        return True  # the default already
    if threading.current_thread() is not threading.main_thread() or not _pidfds_work():
        return False
    asyncio.set_child_watcher(PidfdWatcher(asyncio.get_running_loop()))
    return True


class PidfdWatcher(asyncio.AbstractChildWatcher):
    """One pidfd per child, handed to its own reader; the child is reaped through it."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop: asyncio.AbstractEventLoop | None = loop

    def add_child_handler(  # type: ignore[override]
            self, pid: int, callback: Callable[..., object], *args: Any) -> None:
        assert self._loop is not None  # (asyncio checks is_active() first)
        pidfd = os.pidfd_open(pid)
        self._loop.add_reader(pidfd, self._exited, pid, pidfd, callback, args)

    def _exited(self, pid: int, pidfd: int, callback: Callable[..., object], args: tuple[Any, ...]) -> None:
        asyncio.get_running_loop().remove_reader(pidfd)
        try:
            info = os.waitid(os.P_PIDFD, pidfd, os.WEXITED)
        except ChildProcessError:  # reaped elsewhere: asyncio's convention for a status nobody can know
            returncode = 255
            log.warning("child process %d was reaped elsewhere; reporting returncode 255", pid)
        else:
            assert info is not None  # (no WNOHANG: waitid returned because the child exited)
            returncode = exit_code(info)
        finally:
            os.close(pidfd)
        callback(pid, returncode, *args)

    def remove_child_handler(self, pid: int) -> bool:
        return True  # asyncio never calls it for a running child; each reader removes itself

    def attach_loop(self, loop: asyncio.AbstractEventLoop | None) -> None:
        self._loop = loop  # asyncio moves it along with the main thread's event loop, as 3.11's own

    def is_active(self) -> bool:
        return self._loop is not None and self._loop.is_running()

    def close(self) -> None:
        pass

    def __enter__(self) -> PidfdWatcher:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def _pidfds_work() -> bool:
    try:
        os.close(os.pidfd_open(os.getpid()))
    except (AttributeError, OSError):  # not Linux, or a kernel before 5.3, or a seccomp filter
        return False
    return True


def exit_code(info: os.waitid_result) -> int:
    """A child's status from ``waitid`` as a ``returncode``: the exit status, or minus the killing signal."""
    return -info.si_status if info.si_code in (os.CLD_KILLED, os.CLD_DUMPED) else info.si_status
