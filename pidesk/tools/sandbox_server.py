"""The host's side of ``tools/sandboxd.py``: one sandbox per Bash tool, its shells forked inside.

``SandboxServer`` is one running sandbox: bwrap (``Bubblewrap.prefix``) around ``sandboxd``, and
the socket the host asks it for shells on. ``spawn`` hands it a shell's argv, environment,
directory and pipes; its answer, once sandboxd has forked the shell, is the shell's pid as this
host sees it (from the pidfd sandboxd sends back: the kernel's word, not the sandbox's), and
``on_exit`` hears the shell's return code when sandboxd has reaped it. The event loop does not
wait for the fork: on a loaded machine that wait held it 50-250 ms (64 sessions busy, bench/scale.py).

``Sandbox`` is what a Bash tool holds: the server its policy asks for now, started on the first
call (async: ~15 ms of CPU, a bwrap and a Python; a host lets as many start at once as it has CPUs,
``Parts.sandbox_starts``: 64 turns' sandboxes starting together left the host's own loop waiting
for the CPU 100 ms and more), and started afresh — the old one closed once its
shells are done — when what the policy asks changes (a command made a ``.git``: its hooks and
config are read-only from the next call on). ``current()`` is the server a spare shell may be
started in without waiting; None when a call has to start one.

What a sandbox's shells share, and what they do not: each is a fresh process (no shell state
carries over), the leader of its own process group, killed with that group when its call ends.
They share the sandbox's private /tmp, and a process a command detached (``setsid``) lives until
the sandbox ends — when the tool is closed, at the end of its turn — or the host dies
(``--die-with-parent``; the watchdog kills the groups it was told of too).

A server that dies (killed from inside by a command, out of memory) ends every shell it had: the
kernel kills the whole pid namespace with it. Its shells are told they exited (``-SIGKILL``), and
the next call starts a new server.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import subprocess
import sys
from collections import deque
from collections.abc import Callable, Mapping
from contextlib import suppress
from pathlib import Path
from typing import Final

from pidesk.core.errors import Code
from pidesk.tools.base import ToolFailure
from pidesk.tools.children import popen_off_loop, watch_exit
from pidesk.tools.sandbox import HOW_TO_FIX, Bubblewrap

log = logging.getLogger("pidesk.tools.sandbox")

SANDBOXD: Final = Path(__file__).with_name("sandboxd.py")
START_TIMEOUT_S: Final = 20.0  # for a sandbox to start (bwrap, then Python) and say it is ready
SPAWN_TIMEOUT_S: Final = 5.0  # for sandboxd to answer a spawn (a fork); one it does not answer ends it
CLOSE_WAIT_S: Final = 2.0
_MESSAGE: Final = 4096


class SandboxServer:
    """One running sandbox and its sandboxd (see the module docstring). Make it with ``start``."""

    def __init__(self, prefix: list[str]) -> None:
        self.prefix = prefix  # the bwrap argv it runs in: a policy asking for another gets a new server
        self.shells = 0  # its shells still running
        self.retired = False  # closed once its last shell is done (no new shell is started in it)
        self._on_exit: dict[int, Callable[[int], None]] = {}  # its pid for a shell -> that shell's callback
        # the spawns asked for and not yet answered, in order (sandboxd answers each in turn), each with its callback
        self._answers: deque[tuple[asyncio.Future[int], Callable[[int], None]]] = deque()
        self._sock: socket.socket | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._ended: asyncio.Future[None] = asyncio.get_running_loop().create_future()  # bwrap exited

    @classmethod
    async def start(cls, prefix: list[str]) -> SandboxServer:
        """A ready server; ``ToolFailure`` ``SANDBOX_UNAVAILABLE`` (with bwrap's own words) if it cannot start."""
        server = cls(prefix)
        await server._start()
        return server

    @property
    def alive(self) -> bool:
        return self._sock is not None and not self._ended.done()

    def spawn(self, argv: list[str], env: Mapping[str, str], cwd: Path, stdin: int, output: int,
              on_exit: Callable[[int], None]) -> asyncio.Future[int]:
        """Ask the sandbox to start ``argv`` with ``stdin`` and ``output`` (stdout and stderr) as given (they are
        sent at once: the caller may close its copies on return). The answer is the shell's pid, this host's
        view, once sandboxd has forked it: the loop goes on meanwhile. ``on_exit(returncode)`` is called on
        the loop once it has exited. ``ConnectionError`` at once if the server is gone; the answer fails with
        an ``OSError`` if the shell could not start, or the server ended or did not answer in time.

        Cancelling the answer does not take the request back: the shell starts, and is killed when its
        answer comes. It has run nothing: a shell waits for its command on a stdin only its caller writes."""
        sock = self._sock
        if sock is None or self._ended.done():
            raise ConnectionError("the sandbox has ended")
        env = {**env, "TMPDIR": "/tmp"}  # (the sandbox's own: a TMPDIR elsewhere is read-only there)
        fields = [str(cwd), str(len(argv)), *argv, *(f"{k}={v}" for k, v in env.items())]
        request = b"S" + "\0".join(fields).encode("utf-8", "surrogateescape")
        try:
            socket.send_fds(sock, [request], [stdin, output])
        except BlockingIOError:
            raise ConnectionError("the sandbox is not reading its requests") from None
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[int] = loop.create_future()
        self._answers.append((answer, on_exit))
        deadline = loop.call_later(SPAWN_TIMEOUT_S, self._unanswered, answer)
        answer.add_done_callback(lambda _: deadline.cancel())
        return answer

    def retire(self) -> None:
        """Start no shell here any more; close once the last one is done (at once if none runs)."""
        self.retired = True
        if self._idle:
            self.close()

    def close(self) -> None:
        """End the sandbox: sandboxd reads the end of its socket and exits, and with it everything inside.
        A spawn still unanswered fails (``ConnectionError``)."""
        self.retired = True
        if self._sock is not None:
            asyncio.get_running_loop().remove_reader(self._sock.fileno())
            self._sock.close()
            self._sock = None
        answers, self._answers = self._answers, deque()
        for answer, _ in answers:
            if not answer.done():
                answer.set_exception(ConnectionError("the sandbox has ended"))

    @property
    def _idle(self) -> bool:
        return self.shells == 0 and not self._answers

    async def wait_closed(self) -> None:
        """Once it has ended (bounded; then its whole process group is killed)."""
        if self._proc is None:
            return
        await asyncio.wait({self._ended}, timeout=CLOSE_WAIT_S)
        if not self._ended.done():
            with suppress(ProcessLookupError, PermissionError):
                os.killpg(self._proc.pid, signal.SIGKILL)
            await asyncio.wait({self._ended}, timeout=CLOSE_WAIT_S)

    # ---- inside ----------------------------------------------------------------------

    async def _start(self) -> None:
        loop = asyncio.get_running_loop()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        errors_read, errors_write = os.pipe()
        def start() -> subprocess.Popen[bytes]:
            return subprocess.Popen(
                [*self.prefix, os.path.realpath(sys.executable), "-I", "-S", str(SANDBOXD), str(theirs.fileno())],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=errors_write,
                pass_fds=(theirs.fileno(),), start_new_session=True)

        try:
            self._proc, cancelled = await popen_off_loop(start)
        except (OSError, asyncio.CancelledError) as exc:
            ours.close()
            os.close(errors_read)
            if isinstance(exc, asyncio.CancelledError):
                raise
            raise ToolFailure(Code.SANDBOX_UNAVAILABLE, f"the sandbox could not start: {exc}; {HOW_TO_FIX}") from None
        finally:
            theirs.close()
            os.close(errors_write)
        watch_exit(self._proc.pid, self._bwrap_exited)
        if cancelled:  # started as the call was cancelled: it ends here, and with it the sandbox
            ours.close()
            os.close(errors_read)
            with suppress(ProcessLookupError, PermissionError):
                os.killpg(self._proc.pid, signal.SIGKILL)
            raise asyncio.CancelledError
        ours.setblocking(False)
        ready: asyncio.Future[None] = loop.create_future()

        def readable() -> None:
            if not ready.done():
                ready.set_result(None)

        loop.add_reader(ours.fileno(), readable)
        try:
            await asyncio.wait({ready, self._ended}, timeout=START_TIMEOUT_S, return_when=asyncio.FIRST_COMPLETED)
            first = b""
            with suppress(BlockingIOError):
                first = ours.recv(_MESSAGE) if ready.done() else b""
        finally:
            loop.remove_reader(ours.fileno())
        if first != b"R":
            ours.close()
            with suppress(ProcessLookupError, PermissionError):
                os.killpg(self._proc.pid, signal.SIGKILL)
            os.set_blocking(errors_read, False)
            why = ""
            with suppress(OSError):
                why = os.read(errors_read, 8192).decode(errors="replace").strip()
            os.close(errors_read)
            raise ToolFailure(Code.SANDBOX_UNAVAILABLE, "the sandbox could not start, so the command did not run: "
                              f"{why or 'it did not get ready in time'}\nTo fix: {HOW_TO_FIX}")
        os.close(errors_read)  # (sandboxd writes nothing more there)
        self._sock = ours
        loop.add_reader(ours.fileno(), self._read)

    def _read(self) -> None:
        """Answers and exits, as they come; the end of the socket is the end of the sandbox."""
        sock = self._sock
        if sock is None:
            return
        while self._sock is sock:
            try:
                message, fds, _, _ = socket.recv_fds(sock, _MESSAGE, 1)
            except BlockingIOError:
                return
            except OSError:
                message, fds = b"", []
            if not message:
                self._fail("its socket closed")
                return
            if message[:1] in (b"P", b"E"):
                self._answered(message, fds)
                continue
            for fd in fds:  # (an exit carries none)
                os.close(fd)
            if message[:1] == b"X":
                self._exited(message)

    def _answered(self, message: bytes, fds: list[int]) -> None:
        """The answer to the oldest spawn not yet answered: ``P`` and its pidfd, or ``E`` and why."""
        pid = _pid_of(fds[0]) if message[:1] == b"P" and fds else None
        for fd in fds:
            os.close(fd)
        if not self._answers:
            return  # (sandboxd answers each request once: nothing can be left to answer)
        answer, on_exit = self._answers.popleft()
        if message[:1] == b"P":  # started: it is reaped and reported like any other, whatever its caller does
            self._on_exit[int(message[1:])] = on_exit
            self.shells += 1
        if pid is None:
            why = message[1:].decode(errors="replace") if message[:1] == b"E" else "its answer named no process"
            if not answer.done():
                answer.set_exception(OSError(f"the sandbox could not start the shell: {why}"))
        elif answer.done():  # its caller gave up (cancelled): it has run nothing and never will
            with suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
        else:
            answer.set_result(pid)
        if self.retired and self._idle:
            self.close()

    def _unanswered(self, answer: asyncio.Future[int]) -> None:
        if not answer.done() and self._sock is not None:
            self._fail(f"it did not answer a spawn within {SPAWN_TIMEOUT_S:.0f} s")

    def _exited(self, message: bytes) -> None:
        try:
            pid, code = (int(part) for part in message[1:].split(b"\0"))
        except ValueError:
            return
        callback = self._on_exit.pop(pid, None)
        if callback is None:
            return
        self.shells -= 1
        callback(code)
        if self.retired and self._idle:
            self.close()

    def _fail(self, why: str) -> None:
        """The server is gone (or useless): every shell it had is gone with it (one pid namespace)."""
        if self._sock is not None:
            log.warning("a Bash sandbox ended early: %s", why)
        self.close()
        callbacks, self._on_exit = list(self._on_exit.values()), {}
        self.shells = 0
        if self._proc is not None:
            with suppress(ProcessLookupError, PermissionError):
                os.killpg(self._proc.pid, signal.SIGKILL)
        for callback in callbacks:
            callback(-signal.SIGKILL)

    def _bwrap_exited(self, returncode: int) -> None:
        if not self._ended.done():
            self._ended.set_result(None)
        if self._on_exit or self._answers:
            self._fail(f"bwrap exited ({returncode})")


def _pid_of(pidfd: int) -> int | None:
    """The pid, as this process sees it, of the process ``pidfd`` refers to (its ``/proc`` fdinfo)."""
    try:
        with open(f"/proc/self/fdinfo/{pidfd}") as info:
            for line in info:
                if line.startswith("Pid:"):
                    pid = int(line.split()[1])
                    return pid if pid > 0 else None
    except (OSError, ValueError):
        pass
    return None


class Sandbox:
    """The sandbox of one Bash tool's shells (see the module docstring): ``await ready()`` for the server
    a call starts its shell in, ``current()`` for one a spare may use now, ``aclose()`` at the end."""

    def __init__(self, bubblewrap: Bubblewrap, starts: asyncio.Semaphore | None = None) -> None:
        self.bubblewrap = bubblewrap
        self.starts = starts  # shared by a host's sandboxes: how many may be starting at once (None: any)
        self._server: SandboxServer | None = None
        self._starting: asyncio.Future[SandboxServer] | None = None
        self._old: list[SandboxServer] = []  # retired, closing once their shells are done

    async def ready(self) -> SandboxServer:
        """The server for what the policy asks now, started if need be (``ToolFailure`` if it cannot)."""
        prefix = self.bubblewrap.prefix()
        server = self._server
        if server is not None and server.alive and server.prefix == prefix:
            return server
        if self._starting is None:
            self._starting = asyncio.ensure_future(self._start(prefix))
        starting = self._starting
        try:
            fresh = await asyncio.shield(starting)
        finally:
            if self._starting is starting and starting.done():
                self._starting = None
        if self._server is not fresh:
            self._replace(fresh)
        return fresh  # (one another call started, maybe on an older policy: the next call checks again)

    async def _start(self, prefix: list[str]) -> SandboxServer:
        if self.starts is None:
            return await SandboxServer.start(prefix)
        async with self.starts:
            return await SandboxServer.start(prefix)

    def current(self) -> SandboxServer | None:
        """The running server if it is still what the policy asks, else None (ready() would start another)."""
        server = self._server
        if server is None or not server.alive:
            return None
        try:
            prefix = self.bubblewrap.prefix()
        except ToolFailure:
            return None
        return server if server.prefix == prefix else None

    async def aclose(self) -> None:
        """Close every server (their shells die with them) and wait until they have ended."""
        if self._starting is not None:
            with suppress(Exception):
                self._replace(await self._starting)
            self._starting = None
        servers = [*self._old, *([self._server] if self._server is not None else [])]
        self._server, self._old = None, []
        for server in servers:
            server.close()
        for server in servers:
            await server.wait_closed()

    def _replace(self, fresh: SandboxServer) -> None:
        old, self._server = self._server, fresh
        if old is not None:
            old.retire()
            self._old = [server for server in (*self._old, old) if server.alive]
