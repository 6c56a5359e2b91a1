"""Bash: a fresh bash per call, in the session root, in its own process group.

Each call runs in a new process, started cold (``bash -c``) or ahead of time as a
spare (``Bash`` below): either way nothing of one call's shell state reaches the next.
A tool given a ``sandbox`` starts every shell, spares included, inside it: forked
by the sandbox's own process (``tools/sandbox_server.py``), which starts with the
turn's first call; a sandbox that cannot start fails the call with
``SANDBOX_UNAVAILABLE`` and the command never runs.

Invariant: nothing a call starts outlives the call. The command runs as the
leader of a new session (so its process group holds every descendant that does
not detach itself), with stdin from /dev/null and stdout+stderr merged into
one pipe. However the call ends, the group is stopped before it returns:

- normal exit: leftover background processes get SIGTERM, then SIGKILL after
  ``kill_grace_ms``; a process that must keep running has to detach itself
  (``setsid cmd >log 2>&1 &``) — in a sandbox it then lives until the sandbox
  ends, when the tool is closed at the end of its turn;
- timeout: the same, and the result is ``TOOL_TIMEOUT``;
- cancellation (abort): SIGKILL at once, then ``CancelledError`` propagates;
  this holds even while bash is still being spawned (it is killed once it
  exists, before it was handed anything to run).

"Stopped" means no member of the group is still running (zombies waiting for
init count as stopped); each wait for that is bounded, so a process stuck in
the kernel cannot hang the call. Only the last ``max_output`` bytes of output
are kept, with a note of how much was cut.

Nor does a group outlive the host (issue 15, item 7). Every shell starts gated:
it waits for its command (a spare) or for a go-ahead line (a cold shell, whose
command is in its argv) on a pipe from the host, and exits without running
anything if that pipe closes first. Before that first byte the group is
guarded (``tools/watchdog.py``): written to the durable record
(``process_groups``, the store's ``process-groups`` file) and told to the
host's watchdog, which kills it if the host dies. A spare is guarded once bash
runs (a byte its script prints before it reads its command), while it waits off
the call that will use it, or else by the call that takes it; a cold shell
once bash runs too, before its go-ahead. Once the group has stopped, it is forgotten
again; a group that would not stop stays recorded for boot.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import subprocess
from collections import deque
from collections.abc import Mapping
from contextlib import suppress
from pathlib import Path
from typing import Any, Final

from pidesk.core.errors import Code
from pidesk.tools.base import ToolFailure, ToolResult, optional_bool, optional_int, require_str
from pidesk.tools.children import exit_code, popen_off_loop, watch_exit
from pidesk.tools.sandbox_server import Sandbox, SandboxServer
from pidesk.tools.watchdog import GroupRecord, Guarded, guard, keep_guarded, release

log = logging.getLogger("pidesk.tools.bash")

MAX_TIMEOUT_MS: Final = 600_000
_KILL_WAIT_S: Final = 2.0
_EOF_WAIT_S: Final = 0.5
_START_WAIT_S: Final = 10.0  # how long a cold shell's guard waits for bash to run (then it reads /proc anyway)
_POLL_S: Final = 0.01
_EXIT_CHECK_S: Final = 1.0  # how often a running command's process is checked directly (_wait_exit)
WARM_LIMIT: Final = 1024  # bytes of command (and its NUL) a spare shell is handed; longer ones start cold
SPARE_MAX_AGE_S: Final = 60.0  # a spare older than this is replaced, never raced against its idle exit
SPARE_IDLE_S: Final = 120  # a spare nobody hands a command exits by itself after this
MAX_SPARES: Final = 2  # spares kept ready when calls come faster than a shell starts (Bash, below)


class _Collector:
    """What bash writes (stdout and stderr share one pipe), its last ``limit`` bytes kept; and when
    the output ended (``eof``) and the process exited (``exited``)."""

    def __init__(self, limit: int) -> None:
        loop = asyncio.get_running_loop()
        self.limit = limit
        self.tail = bytearray()
        self.total = 0
        self.exited: asyncio.Future[None] = loop.create_future()
        self.eof: asyncio.Future[None] = loop.create_future()
        self.unreported_code: int | None = None  # the exit status, when its report was lost (_wait_exit)

    def add(self, data: bytes) -> None:
        self.total += len(data)
        self.tail += data
        if len(self.tail) > 2 * self.limit:
            del self.tail[: -self.limit]

    def ended(self) -> None:
        if not self.eof.done():
            self.eof.set_result(None)

    def process_exited(self) -> None:
        if not self.exited.done():
            self.exited.set_result(None)

    def text(self) -> str:
        kept = bytes(self.tail[-self.limit :]) if self.limit else b""
        cut = self.total - len(kept)
        if cut:
            while kept and kept[0] & 0xC0 == 0x80:
                kept = kept[1:]
                cut += 1
        body = kept.decode("utf-8", errors="replace").rstrip("\n") or "(no output)"
        return f"[{cut} earlier bytes of output cut]\n{body}" if cut else body


def make_bash_tool(
    root: Path,
    *,
    default_timeout_ms: int = 120_000,
    max_output: int = 30_000,
    kill_grace_ms: int = 1_000,
    env: Mapping[str, str] | None = None,
    sandbox: Sandbox | None = None,
    process_groups: GroupRecord | None = None,
) -> Bash:
    """``env`` replaces the inherited environment (the host passes an allowlist of its own,
    ``config.command_environment``); ``None`` inherits the host's. ``sandbox`` is where
    each shell starts (``tools/sandbox_server.py``; the tool closes it in ``aclose``);
    ``None`` runs commands unconfined. ``process_groups`` is the store's durable record of
    running groups, which boot kills (a host passes its store's; without one only the
    watchdog guards them)."""
    return Bash(root, default_timeout_ms=default_timeout_ms, max_output=max_output, kill_grace_ms=kill_grace_ms,
                env=env, sandbox=sandbox, process_groups=process_groups)


class Bash:
    """The Bash tool of one agent's turn: ``await bash(args)``; ``aclose()`` once the turn is over.

    Spawning bash is most of a short call's cost (1.5–2 ms here, the dynamic loader
    and bash's start-up), so each call also starts the *next* call's shell: a bash
    that waits, in the root and with the call's environment, for a command on its
    stdin, then reads stdin from /dev/null and ``eval``s the command — a fresh
    process with a fresh state, as ``bash -c`` would be. It starts once the
    current command has ended, while the agent talks to its model. A command longer than
    ``WARM_LIMIT`` bytes (bash reads a pipe one byte at a time), the first call,
    and a spare older than ``SPARE_MAX_AGE_S`` take a cold shell instead (the
    command in its argv, as ``bash -c`` has it).
    A spare nobody uses exits by itself after ``SPARE_IDLE_S`` or when the host
    goes away (its stdin closes), and ``aclose()`` kills it at once.

    One spare is kept ready; two, once a call took one that had not started yet (calls
    coming faster than a shell starts: a model answering at once), so that each spare
    has two calls' time to get ready.
    """

    def __init__(self, root: Path, *, default_timeout_ms: int, max_output: int, kill_grace_ms: int,
                 env: Mapping[str, str] | None, sandbox: Sandbox | None = None,
                 process_groups: GroupRecord | None = None) -> None:
        self.root = root.resolve()
        self.default_timeout_ms = default_timeout_ms
        self.max_timeout_ms = max(MAX_TIMEOUT_MS, default_timeout_ms)
        self.max_output = max_output
        self.kill_grace_ms = kill_grace_ms
        self.env = dict(env) if env is not None else None
        self.sandbox = sandbox
        self.process_groups = process_groups
        self.bash = shutil.which("bash") or "/bin/bash"
        # the next calls' shells, oldest first, each maybe still starting, with when it was asked for
        self._spares: deque[tuple[asyncio.Future[_Shell], float]] = deque()
        self._depth = 1  # how many spares to keep ready (MAX_SPARES once calls came faster than they start)
        self._starting: set[asyncio.Task[None]] = set()  # the spares being started (_spawn_spare)
        self._closed = False

    @property
    def next_spare(self) -> asyncio.Future[_Shell] | None:
        """The shell the next call will take, maybe still starting; None if there is none."""
        return self._spares[0][0] if self._spares else None

    async def __call__(self, args: dict[str, Any]) -> ToolResult:
        command = require_str(args, "Bash", "command")
        timeout_ms = (
            optional_int(args, "Bash", "timeoutMs", minimum=1, maximum=self.max_timeout_ms)
            or self.default_timeout_ms
        )
        if "\0" in command:
            raise ToolFailure(Code.INVALID_ARGUMENTS, "Bash: a command cannot contain a NUL character")
        optional_bool(args, "Bash", "escalate")  # (the host's to act on: it chose this tool by it)
        if args.get("justification") is not None and not isinstance(args["justification"], str):
            raise ToolFailure(Code.INVALID_ARGUMENTS, "Bash: `justification` must be a string")
        shell = await self._start(command)
        group, collector = shell.pid, shell.collector
        stopped = False
        try:
            timed_out = not await _wait_exit(group, collector, timeout_ms / 1000, ours=shell.server is None)
            stopped = await _stop_group(group, self.kill_grace_ms / 1000)
            await asyncio.wait({collector.exited}, timeout=_KILL_WAIT_S)
            await asyncio.wait({collector.eof}, timeout=_EOF_WAIT_S)
        except BaseException:
            _signal_group(group, signal.SIGKILL)
            stopped = await _wait_stopped(group, _KILL_WAIT_S)
            await asyncio.wait({collector.exited}, timeout=_KILL_WAIT_S)
            raise
        finally:
            shell.close()
            if stopped:  # (one that would not stop stays guarded: the watchdog or boot kills it)
                release(shell.guarded, self.process_groups)
        # Only now: a spawn's fork and exec would compete with the command for the CPU; from here
        # they overlap the caller's durable write of the result and the model's next answer.
        self._start_spare()
        output = collector.text()
        if not collector.eof.done():
            output += "\n[stopped reading: a detached process still holds the output open]"
        if timed_out:
            return ToolResult.error(
                Code.TOOL_TIMEOUT,
                f"{output}\n[timed out after {timeout_ms} ms; the command and its processes "
                "were killed]",
            )
        # (an exit found by _wait_exit, unreported: its status, not what a late report says of it)
        code = collector.unreported_code if collector.unreported_code is not None else shell.returncode
        if code is not None and code < 0:
            return ToolResult.failure(f"{output}\n[killed by signal {-code}]")
        return ToolResult(ok=code == 0, output=f"{output}\n[exit code {code}]")

    async def aclose(self) -> None:
        """Kill the spare shells and return once they have exited (bounded), and end the sandbox; no spare
        is started after this."""
        self._closed = True
        exits = set()
        while self._spares:
            spare, _ = self._spares.popleft()
            spare.cancel()  # (not started yet: it never will be; starting: it is killed once it exists)
            self._discard(spare)
            if not spare.cancelled() and spare.exception() is None:
                exits.add(spare.result().collector.exited)
        if self._starting:
            await asyncio.wait(self._starting, timeout=_KILL_WAIT_S)
        if exits:
            await asyncio.wait(exits, timeout=_KILL_WAIT_S)
        if self.sandbox is not None:
            await self.sandbox.aclose()

    async def _start(self, command: str) -> _Shell:
        """The command running: in the spare shell if there is a fresh one (guarded since it started),
        else in a new (gated) shell, guarded here once bash runs (as a spare is, and for the same reason);
        either way before the shell gets the first byte that lets it run anything."""
        data = command.encode() + b"\0"
        shell = self._take_spare() if len(data) <= WARM_LIMIT else None
        if shell is not None:
            keep_guarded(shell.guarded)  # (guarded by now: _take_spare sees to it)
        else:
            data = b"\n"  # the go-ahead: the command is in the argv
            server = await self.sandbox.ready() if self.sandbox is not None else None  # (ToolFailure if it cannot)
            try:
                shell = await self._spawn(["-c", _RUN_WHEN_TOLD, self.bash, command], server)
            except OSError as exc:
                raise ToolFailure(None, f"Bash: cannot start {self.bash} in {self.root}: {exc}") from None
            try:  # (a shell that could not start, a sandbox that failed: its exit, and the guard finds it gone)
                await asyncio.wait({shell.running, shell.collector.exited}, timeout=_START_WAIT_S,
                                   return_when=asyncio.FIRST_COMPLETED)
            except BaseException:  # cancelled: it has run nothing and never will
                _retire(shell, self.process_groups)
                raise
            try:
                shell.guarded = guard(shell.pid, self.process_groups)
            except OSError as exc:  # not recorded: it must not run (nothing of it has)
                _retire(shell, self.process_groups)
                raise ToolFailure(None, f"Bash: cannot record the command's process group, so it was not run: "
                                        f"{exc}; check that the data directory is writable") from None
        shell.hand(data)
        return shell

    def _start_spare(self) -> None:
        """Start the next calls' shells (once this call has returned) up to the spares kept ready,
        unless no call will come."""
        loop = asyncio.get_running_loop()
        while len(self._spares) < self._depth and not self._closed:
            self._spares.append((self._begin_spare(loop), loop.time()))

    def _begin_spare(self, loop: asyncio.AbstractEventLoop) -> asyncio.Future[_Shell]:
        """A spare shell, being started (``_spawn_spare``); cancelled if its start ends without one."""
        spare: asyncio.Future[_Shell] = loop.create_future()
        starting = loop.create_task(self._spawn_spare(spare))
        self._starting.add(starting)
        starting.add_done_callback(self._starting.discard)
        starting.add_done_callback(lambda _: spare.cancel())  # (cut short: the loop ended before it began)
        return spare

    async def _spawn_spare(self, spare: asyncio.Future[_Shell]) -> None:
        """The next call's shell, guarded once bash runs: the call that takes it hands it the command with
        nothing left to record. Not at once: the guard reads the leader's start time from /proc, and while
        the kernel still runs bash's exec that read waits for it (up to ~2 ms of a stalled event loop here,
        one spawn in five). A spare that cannot start or be recorded is never used: the call starts a cold
        shell, which reports why. One started after its call came (a cold shell ran the command) or after
        the tool closed is killed: it has run nothing."""
        if spare.done():  # taken or closed before it started
            return
        server = self.sandbox.current() if self.sandbox is not None else None
        if self.sandbox is not None and server is None:  # (none runs, or not as the policy now asks)
            spare.set_exception(ConnectionError("no sandbox to start a spare in: the next call starts one"))
            return
        try:
            shell = await self._spawn(["-c", _WAIT_FOR_COMMAND], server)
        except OSError as exc:
            if not spare.done():
                spare.set_exception(exc)
            return
        if spare.done():
            _retire(shell, self.process_groups)
            return
        shell.guard_due = True
        shell.running.add_done_callback(lambda _: self._guard_spare(shell))
        spare.set_result(shell)

    def _guard_spare(self, shell: _Shell) -> bool:
        """Guard a spare that is not yet guarded; False if that failed (it must not be used)."""
        if shell.guard_due and shell.returncode is None:
            try:
                shell.guarded = guard(shell.pid, self.process_groups)
            except OSError:  # (the call that takes it retires it)
                return False
            shell.guard_due = False
        return True

    def _take_spare(self) -> _Shell | None:
        if not self._spares:
            return None
        spare, born = self._spares.popleft()
        spare.cancel()  # (still starting: the call starts a cold shell, and the spare is killed once it exists)
        if spare.cancelled():  # asked for too late to be ready: calls come faster than shells start
            self._depth = MAX_SPARES
            return None
        if spare.exception() is not None:
            return None
        if asyncio.get_running_loop().time() - born > SPARE_MAX_AGE_S:
            self._discard(spare)
            return None
        shell = spare.result()
        if not shell.running.done():  # taken before it ran: calls come faster than a shell starts
            self._depth = MAX_SPARES
        if shell.server is not None and (shell.server.retired or not shell.server.alive):
            _retire(shell, self.process_groups)  # its sandbox is ending (no longer what the policy asks)
            return None
        # killed meanwhile: start afresh; not running yet, or its guard failed: guarded now (or never used)
        if shell.returncode is not None or not self._guard_spare(shell):
            _retire(shell, self.process_groups)
            return None
        return shell

    def _discard(self, spare: asyncio.Future[_Shell]) -> None:
        """Kill a spare shell nobody will use, if it has started."""
        if spare.cancelled() or spare.exception() is not None:
            return
        _retire(spare.result(), self.process_groups)

    async def _spawn(self, argv: list[str], server: SandboxServer | None) -> _Shell:
        """A new shell running ``bash argv``: forked in ``server``'s sandbox, or started here."""
        return await _Shell.start([self.bash, *argv], cwd=self.root, env=self.env, max_output=self.max_output,
                                  server=server)


class _Shell:
    """A bash in a new session (``_Shell.start``), its stdin a pipe we write its command (or go-ahead) to,
    its stdout and stderr one pipe read into a ``_Collector``, its exit watched (``watch_exit``, or
    reported by the sandbox that forked it); and its process group's guard, once guarded.

    Not asyncio's subprocess transport: on Python 3.11 that connects the pipes in a task of its
    own, and a spawn cancelled before that task has run is waited for forever. Every task is
    cancelled when ``asyncio.run`` ends, so a spare shell being started then hung the process.
    Started here, a shell is never half-made: ``start`` returns it whole or leaves nothing behind."""

    def __init__(self, max_output: int, server: SandboxServer | None) -> None:
        self.collector = _Collector(max_output)
        self.server = server  # the sandbox it was forked in (which reaps it and reports its exit), if any
        self.pid = 0
        self.guarded: Guarded | None = None
        self.guard_due = False  # a spare started but not yet guarded
        # Done once bash runs: at RUNNING_MARK, which both scripts (_WAIT_FOR_COMMAND, _RUN_WHEN_TOLD)
        # print before they read stdin, and which is not output.
        self.running: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.returncode: int | None = None
        self._popen: subprocess.Popen[bytes] | None = None
        self.stdin = self.output = -1  # our ends of its pipes

    @classmethod
    async def start(cls, argv: list[str], *, cwd: Path, env: Mapping[str, str] | None, max_output: int,
                    server: SandboxServer | None = None) -> _Shell:
        """``argv`` started, in ``server``'s sandbox (forked there) or here (``Popen`` in a thread): neither
        holds the event loop for the fork and exec. ``OSError`` if it cannot start. Cancelled meanwhile, the
        shell is killed once it exists (it has run nothing: it waits for its stdin, which closes) and the
        cancellation goes on."""
        shell = cls(max_output, server)
        their_stdin, shell.stdin = os.pipe()
        shell.output, their_output = os.pipe()
        theirs = (their_stdin, their_output)
        try:
            if server is not None:
                try:
                    answer = server.spawn(argv, os.environ if env is None else env, cwd, *theirs, shell._exited)
                finally:
                    _close(theirs)  # (sent: the request holds them now)
                shell.pid = await answer  # (cancelled: the sandbox kills the shell as its answer comes)
            else:
                try:
                    shell._popen, cancelled = await popen_off_loop(lambda: subprocess.Popen(
                        argv, cwd=cwd, env=env, stdin=their_stdin, stdout=their_output, stderr=their_output,
                        start_new_session=True))
                finally:
                    _close(theirs)
                shell.pid = shell._popen.pid
                shell._watch_exit()
                if cancelled:
                    _signal_group(shell.pid, signal.SIGKILL)
                    raise asyncio.CancelledError
        except BaseException:
            shell.close()
            raise
        os.set_blocking(shell.output, False)
        asyncio.get_running_loop().add_reader(shell.output, shell._read)
        return shell

    def _watch_exit(self) -> None:
        assert self._popen is not None
        try:
            watch_exit(self.pid, self._exited)
        except OSError:  # (out of file descriptors): it has run nothing; stop it here
            _signal_group(self.pid, signal.SIGKILL)
            self._exited(self._popen.wait())
            raise

    def hand(self, data: bytes) -> None:
        """Write the shell its command (or go-ahead) and close its stdin. ``data`` is at most
        ``WARM_LIMIT`` bytes, less than a pipe's atomic write, into an empty pipe: it never blocks."""
        stdin, self.stdin = self.stdin, -1
        try:
            os.write(stdin, data)
        except BrokenPipeError:  # killed meanwhile: the call sees it exit
            pass
        finally:
            os.close(stdin)

    def close(self) -> None:
        """Stop reading its output and close our ends of its pipes (its exit is still watched)."""
        if self.stdin >= 0:
            os.close(self.stdin)
            self.stdin = -1
        self._close_output()

    def _close_output(self) -> None:
        if self.output >= 0:
            asyncio.get_running_loop().remove_reader(self.output)
            os.close(self.output)
            self.output = -1

    def _read(self) -> None:
        try:
            data = os.read(self.output, 65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._close_output()
            self.collector.ended()
            return
        if not self.running.done() and (at := data.find(RUNNING_MARK)) >= 0:
            data = data[:at] + data[at + len(RUNNING_MARK):]  # (what came before it: bash's own start-up warnings)
            self.running.set_result(None)
        self.collector.add(data)

    def _exited(self, returncode: int) -> None:
        self.returncode = returncode
        if self._popen is not None:
            self._popen.returncode = returncode  # (reaped: Popen must not wait for it again)
        self.collector.process_exited()


RUNNING_MARK: Final = b"\x06"  # what a shell prints before it reads its command: bash runs (``_Shell.running``)

# What a spare shell runs: print RUNNING_MARK; wait for a NUL-terminated command on
# stdin (for at most SPARE_IDLE_S; at EOF, when the host has gone, run nothing),
# then run it as ``bash -c`` would, with stdin from /dev/null. The variable is unset
# before the command's first word runs.
_WAIT_FOR_COMMAND = (
    f'printf "\\006"; IFS= read -r -d "" -t {SPARE_IDLE_S} __pidesk_command || exit 0; exec </dev/null; '
    'eval "unset __pidesk_command; $__pidesk_command"'
)

# What a cold shell runs, as ``bash -c _RUN_WHEN_TOLD BASH COMMAND``: the same (RUNNING_MARK
# first too), with the command in $1 and a line on stdin as the go-ahead; ``shift`` runs before the command's
# first word, which sees no positional parameters, as under ``bash -c COMMAND``.
_RUN_WHEN_TOLD = (
    f'printf "\\006"; IFS= read -r -t {SPARE_IDLE_S} __pidesk_go || exit 0; exec </dev/null; unset __pidesk_go; '
    'eval "shift; $1"'
)


def _close(fds: tuple[int, ...]) -> None:
    for fd in fds:
        os.close(fd)


def _retire(shell: _Shell, record: GroupRecord | None) -> None:
    """Kill a shell that has run nothing and never will (its group, to be thorough), and forget its
    group once it is gone (a group that would not stop stays guarded)."""

    def gone(_: object = None) -> None:
        if not _group_running(shell.pid):
            release(shell.guarded, record)

    shell.close()
    if shell.returncode is not None:
        gone()
    else:
        _signal_group(shell.pid, signal.SIGKILL)
        shell.collector.exited.add_done_callback(gone)


async def _wait_exit(pid: int, collector: _Collector, timeout: float, *, ours: bool = True) -> bool:
    """Wait, at most ``timeout`` seconds, for bash to exit; False if it is still running.

    The exit normally arrives from ``watch_exit``. Under the load soak's process churn, Python
    3.11's child watcher, which this tool once used, was seen never to report one (its table
    of children is keyed by pid, and pids wrap at 32,768 here): the turn then sat out its whole
    Bash timeout. A pidfd cannot confuse two processes that way, but a lost exit must still
    never cost a timeout, so every ``_EXIT_CHECK_S`` the process is also looked at directly,
    without reaping it; one found exited twice in a row and still unreported counts as
    exited, with its own status, and is reaped here. Not ``ours`` (a shell a sandbox forked and
    reaps): its exit is the sandbox's to report, and a sandbox that ends reports every shell's.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    seen_exited = False
    while (left := deadline - loop.time()) > 0:
        done, _ = await asyncio.wait({collector.exited}, timeout=min(left, _EXIT_CHECK_S))
        if done:
            return True
        if not ours:
            continue
        status = _exit_status(pid)
        if status is None:
            seen_exited = False
        elif not seen_exited:
            seen_exited = True
        else:
            log.warning("the exit of bash (pid %d) was not reported; using its status %d",
                        pid, status)
            collector.unreported_code = status
            with suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
            collector.process_exited()
            return True
    return False


def _exit_status(pid: int) -> int | None:
    """A child's exit status (as ``returncode`` would say it) if it has exited, without reaping it;
    None while it runs. A child already reaped elsewhere gives 255, as asyncio says then."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return 255
    if info is None:
        return None
    return exit_code(info)


async def _stop_group(group: int, grace_s: float) -> bool:
    """SIGTERM, then SIGKILL after ``grace_s``; True once no member runs (False: one would not stop)."""
    if not _group_running(group):
        return True
    _signal_group(group, signal.SIGTERM)
    if await _wait_stopped(group, grace_s):
        return True
    _signal_group(group, signal.SIGKILL)
    return await _wait_stopped(group, _KILL_WAIT_S)


async def _wait_stopped(group: int, limit_s: float) -> bool:
    """Poll until no member of ``group`` runs; False if ``limit_s`` passed first.

    There is no event for "a process group emptied" (its members need not be our
    children), so this polls; SIGKILLed processes stop within milliseconds.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit_s
    while _group_running(group):
        if loop.time() >= deadline:
            return False
        await asyncio.sleep(_POLL_S)
    return True


def _signal_group(group: int, sig: signal.Signals) -> None:
    try:
        os.killpg(group, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _group_running(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        entries = os.listdir("/proc")
    except OSError:
        return True
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as file:
                fields = file.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and int(fields[2]) == group and fields[0] not in (b"Z", b"X"):
            return True
    return False
