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

Bash starts its shells outside asyncio (``tools/bash.py`` says why) and watches
each one's exit with ``watch_exit``, the same pidfd reader without the watcher.
``spawn`` does the same for the other tools' children (ripgrep, ``git status``):
on 3.11 a ``create_subprocess_exec`` still under way when ``asyncio.run`` ends
(which cancels every task, asyncio's own pipe-connecting task among them) waits
for that child forever, and the process never exits.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from pathlib import Path
from typing import Any

log = logging.getLogger("pidesk.tools.children")

KILL_WAIT_S = 2.0  # how long a killed child is waited for (one stuck in the kernel must not hang its caller)


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
        callback(pid, _reap(pid, pidfd), *args)

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


def watch_exit(pid: int, exited: Callable[[int], object]) -> None:
    """Call ``exited(returncode)`` on the running loop once child ``pid`` has exited, and reap it.

    For a child started outside asyncio (``tools/bash.py``): through its pidfd where the
    kernel has them, else in a thread of its own that waits for it, as 3.11's default
    watcher does. A child already reaped elsewhere is reported with 255."""
    loop = asyncio.get_running_loop()
    if not _pidfds_work():
        threading.Thread(target=_wait_in_thread, args=(loop, pid, exited), daemon=True).start()
        return
    pidfd = os.pidfd_open(pid)

    def ready() -> None:
        loop.remove_reader(pidfd)
        exited(_reap(pid, pidfd))

    loop.add_reader(pidfd, ready)


class Child:
    """A child process started by ``spawn``: ``stdout``/``stderr`` read as asyncio streams (where piped),
    ``wait()`` for its exit status, ``kill()``; as ``asyncio.subprocess.Process`` has them."""

    def __init__(self, popen: subprocess.Popen[bytes], *, leads_group: bool = False) -> None:
        self._popen = popen
        self.pid = popen.pid
        self.leads_group = leads_group  # started in a session of its own: ``stop`` kills its whole group
        self.stdout: asyncio.StreamReader | None = None
        self.stderr: asyncio.StreamReader | None = None
        self._exited: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    @property
    def returncode(self) -> int | None:
        """The exit status once the child has exited and been reaped; None until then."""
        return self._exited.result() if self._exited.done() else None

    async def wait(self) -> int:
        return await asyncio.shield(self._exited)

    def kill(self, *, group: bool = False) -> None:
        """SIGKILL the child (with ``group``: its whole process group, which it leads), unless it has been
        reaped already — then its pid may be another process's."""
        if self._exited.done():
            return
        with suppress(ProcessLookupError, PermissionError):
            if group:
                os.killpg(self.pid, signal.SIGKILL)
            else:
                os.kill(self.pid, signal.SIGKILL)

    async def stop(self, within_s: float = KILL_WAIT_S) -> bool:
        """SIGKILL the child (its whole group, when it leads one) and wait until it has exited and been
        reaped, at most ``within_s``; True if it has."""
        self.kill(group=self.leads_group)
        await asyncio.wait({self._exited}, timeout=within_s)
        return self._exited.done()

    def _report(self, returncode: int) -> None:
        self._popen.returncode = returncode  # (reaped: Popen must not wait for it again)
        if not self._exited.done():
            self._exited.set_result(returncode)


async def spawn(argv: Sequence[str], *, cwd: Path | None = None, env: Mapping[str, str] | None = None,
                stdout: bool = True, stderr: bool = True, start_new_session: bool = False) -> Child:
    """Start ``argv`` with stdin from /dev/null and stdout and stderr piped (or to /dev/null), its exit
    watched with ``watch_exit``. ``OSError`` if it cannot start. Nothing a cancelled call started is left
    behind: cancelled while it starts (``Popen`` runs in a thread) or while its pipes are being
    connected, the child is killed (its group, with ``start_new_session``) and reaped (``Child.stop``)
    before the cancellation propagates."""
    def start() -> subprocess.Popen[bytes]:
        return subprocess.Popen(list(argv), cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE if stdout else subprocess.DEVNULL,
                                stderr=subprocess.PIPE if stderr else subprocess.DEVNULL,
                                start_new_session=start_new_session)

    popen, cancelled = await popen_off_loop(start)
    child = Child(popen, leads_group=start_new_session)
    try:
        watch_exit(popen.pid, child._report)
    except OSError:  # (out of file descriptors): it has run nothing to speak of; stop it here
        child.kill(group=start_new_session)
        child._report(popen.wait())
        _close_pipes(popen)
        raise
    if cancelled:
        _close_pipes(popen)
        await child.stop()
        raise asyncio.CancelledError
    try:
        child.stdout = await _stream(popen.stdout)
        child.stderr = await _stream(popen.stderr)
    except BaseException:  # cancelled: the child is gone (reaped, bounded) before the cancellation goes on
        _close_pipes(popen)
        await child.stop()
        raise
    return child


async def _stream(pipe: Any) -> asyncio.StreamReader | None:
    """The read end ``pipe`` (a file, or None when not piped) as an asyncio stream."""
    if pipe is None:
        return None
    reader = asyncio.StreamReader()
    await asyncio.get_running_loop().connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), pipe)
    return reader


def _close_pipes(popen: subprocess.Popen[bytes]) -> None:
    for pipe in (popen.stdout, popen.stderr):
        if pipe is not None:
            pipe.close()


async def popen_off_loop(start: Callable[[], subprocess.Popen[bytes]]) -> tuple[subprocess.Popen[bytes], bool]:
    """``start()`` (a ``subprocess.Popen``) in a thread, and whether the caller was cancelled meanwhile.

    Popen returns once the child has exec'd: on a loaded machine that wait held the event loop for
    45-140 ms (a turn's ``git status``, a sandbox's start, with 32 sessions busy). A cancellation does
    not abandon the start: it is waited for (a fork and an exec), so the caller can stop what started
    and then let the cancellation go on (``cancelled``). ``OSError`` if it could not start; a
    ``CancelledError`` instead if it could not and the caller was cancelled."""
    starting = asyncio.get_running_loop().run_in_executor(None, start)
    cancelled = False
    while not starting.done():  # bounded: a fork and an exec (or their failure)
        try:
            await asyncio.shield(starting)
        except asyncio.CancelledError:
            cancelled = True
    try:
        return starting.result(), cancelled
    except OSError:
        if cancelled:
            raise asyncio.CancelledError from None
        raise


def _reap(pid: int, pidfd: int) -> int:
    """The exit status of the child whose pidfd has become readable, reaped; the pidfd is closed."""
    try:
        info = os.waitid(os.P_PIDFD, pidfd, os.WEXITED)
    except ChildProcessError:  # reaped elsewhere: asyncio's convention for a status nobody can know
        log.warning("child process %d was reaped elsewhere; reporting returncode 255", pid)
        return 255
    finally:
        os.close(pidfd)
    assert info is not None  # (no WNOHANG: waitid returned because the child exited)
    return exit_code(info)


def _wait_in_thread(loop: asyncio.AbstractEventLoop, pid: int, exited: Callable[[int], object]) -> None:
    try:
        _, status = os.waitpid(pid, 0)
    except ChildProcessError:
        code = 255
    else:
        code = os.waitstatus_to_exitcode(status)
    with suppress(RuntimeError):  # the loop has closed: nobody is waiting any more
        loop.call_soon_threadsafe(exited, code)


@functools.cache
def _pidfds_work() -> bool:
    try:
        os.close(os.pidfd_open(os.getpid()))
    except (AttributeError, OSError):  # not Linux, or a kernel before 5.3, or a seccomp filter
        return False
    return True


def exit_code(info: os.waitid_result) -> int:
    """A child's status from ``waitid`` as a ``returncode``: the exit status, or minus the killing signal."""
    return -info.si_status if info.si_code in (os.CLD_KILLED, os.CLD_DUMPED) else info.si_status
