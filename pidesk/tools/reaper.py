"""The watchdog's own program, and the /proc reading and kill it shares with boot's.

``tools/watchdog.py`` starts this file as a process of its own (``python -I -S``)
beside each host; the module docstring there has the design. It starts while a
turn's first tool calls run, on a machine whose CPUs those calls want, so it
imports four small standard-library modules and nothing else: the watchdog's
whole start is ~10 ms of CPU, where one that imported ``logging``,
``subprocess`` and ``threading`` took ~25 ms (docs/benchmarks.md, the peer
benchmark). Keep it that way: no pidesk import, no heavier stdlib module (not even
``__future__``: these annotations evaluate on 3.11 as they are).

Every kill is by process group and checked against the leader's start time
(``/proc/<pid>/stat`` field 22), so a pid the kernel reused is left alone.
"""

import fcntl
import os
import select
import signal

DRAIN_S = 0.5  # how often a watchdog reads the lines its host wrote
PIPE_BYTES = 1 << 20  # the pipe's room for them meanwhile

_BOOT_ID: list[str] = []


def boot_id() -> str:
    """This boot of the kernel (``/proc/sys/kernel/random/boot_id``); a constant where there is none."""
    if not _BOOT_ID:
        try:
            with open("/proc/sys/kernel/random/boot_id") as file:
                _BOOT_ID.append(file.read().strip() or "unknown")
        except OSError:
            _BOOT_ID.append("unknown")
    return _BOOT_ID[0]


def _stat(pid: int) -> list[bytes] | None:
    """``/proc/<pid>/stat`` from field 3 (the state) on; None if there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            return file.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None


def start_time(pid: int) -> int | None:
    """When the process started (field 22, clock ticks since boot); None if there is no such process."""
    fields = _stat(pid)
    return int(fields[19]) if fields is not None and len(fields) > 19 else None


def running_members(pgid: int) -> list[tuple[int, int, int]]:
    """``(pid, session, start)`` of every process in group ``pgid`` that is not a zombie."""
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    found = []
    for entry in entries:
        if not entry.isdigit():
            continue
        fields = _stat(int(entry))
        if fields is None or len(fields) <= 19 or fields[0] in (b"Z", b"X") or int(fields[2]) != pgid:
            continue
        found.append((int(entry), int(fields[3]), int(fields[19])))
    return found


def kill_group(pgid: int, start: int) -> bool:
    """SIGKILL group ``pgid`` if it is still the one whose leader started at ``start``; True if it was running.

    The leader's pid names the group for as long as any member lives (the kernel hands out no pid still
    used as a group id). A leader alive or a zombie must have the recorded start time; a leader already
    reaped leaves members that must all belong to its session and have started after it.
    """
    members = running_members(pgid)
    if not members:
        return False
    leader = start_time(pgid)
    if leader is not None and leader != start:
        return False  # the pid is another process's now
    if leader is None and any(session != pgid or born < start for _pid, session, born in members):
        return False
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def main() -> None:
    """The watchdog: learn the groups from stdin; at EOF (the host is gone) kill those still running.

    It sleeps until the host hangs up, and reads what it was told only every ``DRAIN_S`` meanwhile:
    woken by each line, it would take a CPU from the host at the start and end of every Bash call
    (docs/benchmarks.md, the peer benchmark). Between reads the pipe holds ``PIPE_BYTES``, tens of
    thousands of lines, where a host writes two per call; should it fill, the host logs it and boot's
    kill (the durable record) covers what the watchdog missed."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # (a terminal's ^C is for the host, which then closes the pipe)
    fd = 0  # (stdin)
    os.set_blocking(fd, False)
    try:
        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
    except (AttributeError, OSError):  # (Linux only; a smaller pipe still works)
        pass
    hangup = select.poll()
    hangup.register(fd, 0)  # (no events asked: POLLHUP, the host gone, is reported regardless)
    groups: dict[tuple[int, int], None] = {}
    unread = b""
    while True:
        data, ended = _read_available(fd)
        *lines, unread = (unread + data).split(b"\n")
        for line in lines:
            fields = line.split()
            if len(fields) != 3 or fields[0] not in (b"+", b"-"):
                continue
            key = (int(fields[1]), int(fields[2]))
            if fields[0] == b"+":
                groups[key] = None
            else:
                groups.pop(key, None)
        if ended:
            break
        hangup.poll(DRAIN_S * 1000)
    for pgid, start in groups:
        kill_group(pgid, start)


def _read_available(fd: int) -> tuple[bytes, bool]:
    """What the non-blocking ``fd`` holds now, and whether it has reached EOF."""
    chunks: list[bytes] = []
    while True:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            return b"".join(chunks), False
        if not chunk:
            return b"".join(chunks), True
        chunks.append(chunk)


if __name__ == "__main__":
    main()
