"""Authority hole 7 (issue 15): a Bash call's process group dies with the process that runs it.

Observed before the fix: ``sleep 5; echo late > I_late.txt`` wrote 3.2 s after a
``kill -9`` of the host. Here a child Python process stands in for the host: it
runs a Bash command that announces its process group on a FIFO, then sleeps and
writes ``late.txt``; the test SIGKILLs the child while the command sleeps. The
group must be gone at once (the watchdog, ``tools/watchdog.py``), long before
the command's sleep ends, and ``late.txt`` never written. Also: the durable
record a host keeps of its running groups (``store/process_groups.py``).
"""

from __future__ import annotations

import asyncio
import os
import select
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pidesk.store.process_groups import ProcessGroups
from pidesk.tools import make_bash_tool, run_tool
from pidesk.tools.reaper import DRAIN_S, start_time
from pidesk.tools.watchdog import COMMAND, WATCHDOG
from tests.scenario import running_with

REPO = Path(__file__).resolve().parents[2]
DELAY_S = 2.0173  # the command's sleep before its late write (its odd digits find the sleep: read_group)
LATE_SLEEP = f"sleep\0{DELAY_S}"  # (its command line)
LATE_COMMAND = f"echo started > started.fifo; sleep {DELAY_S}; echo late > late.txt"

# The stand-in host: run one Bash command (after a first call, for the spare-shell path), forever.
HOST = """
import asyncio, os, signal, sys
from pathlib import Path
from pidesk.tools import make_bash_tool
from pidesk.tools.watchdog import WATCHDOG

async def main(root, command, how):
    tool = make_bash_tool(Path(root))
    if how != "cold":
        assert (await tool({"command": "true"})).ok
    if how == "watchdog-restarted":  # its first watchdog dies; the next call must start another
        os.kill(WATCHDOG.pid, signal.SIGKILL)
        WATCHDOG._proc.wait(timeout=10)
    await tool({"command": command})
    print("survived", flush=True)

asyncio.run(main(*sys.argv[1:]))
"""


def group_members(pgid: int) -> list[int]:
    """Processes of group ``pgid`` still running (zombies, dead and awaiting their reaper, are not)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_bytes().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            found.append(int(entry))
    return found


def wait_group_gone(pgid: int, limit_s: float = 10.0) -> float:
    """Poll (bounded; there is no event for a group emptying) until no member of ``pgid`` runs; seconds taken."""
    began = time.monotonic()
    while group_members(pgid):
        assert time.monotonic() - began < limit_s, f"process group {pgid} still runs: {group_members(pgid)}"
        time.sleep(0.01)
    return time.monotonic() - began


def open_fifo(path: Path) -> int:
    """A FIFO the command writes its process group to; opened for reading first, so its write never blocks."""
    os.mkfifo(path)
    return os.open(path, os.O_RDONLY | os.O_NONBLOCK)


def read_group(fd: int, timeout: float = 20.0, *, running: str | None = None) -> int:
    """Wait for the command to start: the line it writes to the FIFO (its shell's pid, the group id). Or,
    for a command that may run sandboxed (its ``$$`` is then its pid namespace's), the group of the process
    whose command line holds ``running``, as this process sees it."""
    ready, _, _ = select.select([fd], [], [], timeout)
    assert ready, "the command never started"
    line = os.read(fd, 64).decode()
    if running is None:
        return int(line.split()[0])
    began = time.monotonic()
    while not (found := running_with(running.encode())):
        assert time.monotonic() - began < timeout, f"no process runs {running!r}"
        time.sleep(0.01)
    (pid,) = found
    return int(Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[2])


@pytest.mark.parametrize("how", ["cold", "warm", "watchdog-restarted"])
def test_host_killed_mid_command_takes_the_commands_whole_group_with_it(root: Path, how: str) -> None:
    """Authority hole 7: ``kill -9`` of the process running Bash, mid-command (a grandchild ``sleep``, then a
    write): the group dies at once and the late write never happens — on a cold shell, on a spare, and
    under a watchdog started again after the first one died."""
    fifo = open_fifo(root / "started.fifo")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    host = subprocess.Popen([sys.executable, "-c", HOST, str(root), LATE_COMMAND, how], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        pgid = read_group(fifo, running=LATE_SLEEP)
        assert group_members(pgid)  # the command runs: its shell and its sleep
        host.kill()
        host.wait(timeout=10)
        took = wait_group_gone(pgid)
    finally:
        os.close(fifo)
        if host.poll() is None:
            host.kill()
        out, err = host.communicate(timeout=10)
    assert host.returncode == -signal.SIGKILL, err.decode()[-2000:]
    assert not (root / "late.txt").exists()
    assert took < DELAY_S / 2  # killed, not finished by itself


@pytest.mark.asyncio
async def test_a_hosts_record_names_each_running_group_until_it_is_gone(root: Path, tmp_path: Path) -> None:
    """Authority hole 7: the record boot kills from holds the running command's group (written before the
    command ran, mode 0600) and forgets it once the group is gone; the spare shell waiting for the next
    command is recorded once it runs (before any command can reach it) until it is discarded."""
    record = ProcessGroups(tmp_path / "process-groups")
    tool = make_bash_tool(root, process_groups=record)
    try:
        for call in ("cold", "warm"):  # the first call's shell, then the spare it started
            fifo = open_fifo(root / f"{call}.fifo")
            os.mkfifo(root / f"{call}-go.fifo")
            command = f"echo $$ > {call}.fifo; read -t 20 line < {call}-go.fifo"
            task = asyncio.create_task(run_tool(tool, {"command": command}))
            try:
                pgid = await asyncio.to_thread(read_group, fifo)
            finally:
                os.close(fifo)
            assert pgid in [g.pgid for g in record.recorded()]
            assert stat.S_IMODE(record.path.stat().st_mode) == 0o600
            await asyncio.to_thread((root / f"{call}-go.fifo").write_text, "go\n")
            assert (await task).ok
            assert pgid not in [g.pgid for g in record.recorded()]
            assert tool.next_spare is not None
            spare = await tool.next_spare  # the next call's shell, waiting: recorded once it runs
            await asyncio.wait_for(spare.running, 10)
            assert [g.pgid for g in record.recorded()] == [spare.pid]
        await tool.aclose()
        assert record.recorded() == []  # the discarded spare forgotten once it is gone
    finally:
        await tool.aclose()
        record.close()


def test_the_record_keeps_every_running_group_through_compaction_and_a_torn_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Authority hole 7: the record boot kills from stays right however long the host runs: rewritten
    once it grows (only the running groups kept), and a torn line (a full disk) costs only itself."""
    import pidesk.store.process_groups as process_groups

    monkeypatch.setattr(process_groups, "COMPACT_BYTES", 200)
    record = ProcessGroups(tmp_path / "process-groups")
    try:
        record.add(101, 7, "boot")
        for pid in range(200, 240):  # calls come and go; 101 keeps running
            record.add(pid, 9, "boot")
            record.remove(pid, 9)
        assert record.path.stat().st_size < 200
        record.add(102, 8, "boot")
        with open(record.path, "ab") as file:
            file.write(b"+ 10")  # torn mid-line
        assert [(g.pgid, g.start, g.boot_id) for g in record.recorded()] == [(101, 7, "boot"), (102, 8, "boot")]
        assert stat.S_IMODE(record.path.stat().st_mode) == 0o600
    finally:
        record.close()



def context_switches(pid: int) -> int:
    """How often process ``pid`` has gone to sleep (``voluntary_ctxt_switches``): once a wake-up."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("voluntary_ctxt_switches:"):
            return int(line.split()[1])
    raise AssertionError(f"no voluntary_ctxt_switches for {pid}")


@pytest.mark.asyncio
async def test_the_watchdog_sleeps_through_bash_calls(root: Path) -> None:
    """Each Bash call tells the watchdog two lines (its group started, then ended). Woken by each, the
    watchdog took a CPU from the host twice a call; it sleeps until its host hangs up and reads its lines
    now and then, so 40 calls wake it only for those reads (not ~80 times)."""
    tool = make_bash_tool(root)
    try:
        assert (await run_tool(tool, {"command": "true"})).ok  # (the watchdog runs from the first call on)
        assert WATCHDOG.pid is not None
        before, began = context_switches(WATCHDOG.pid), time.monotonic()
        for _ in range(40):
            assert (await run_tool(tool, {"command": "true"})).ok
        drains = (time.monotonic() - began) / DRAIN_S + 1  # (its periodic reads, however slow the machine)
        assert context_switches(WATCHDOG.pid) - before <= 2 * drains + 2
    finally:
        await tool.aclose()


def test_the_watchdog_starts_on_a_few_small_modules() -> None:
    """The watchdog starts beside a turn's first Bash calls and takes its CPU from them: it loads no pidesk
    module and none of the heavier standard library (``logging``, ``subprocess``, ``threading`` made its
    start ~25 ms of CPU, against ~10 now)."""
    command = [COMMAND[0], "-X", "importtime", *COMMAND[1:]]
    done = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, timeout=30)
    assert done.returncode == 0  # (EOF at once: no host, nothing to kill)
    loaded = {line.rsplit("|", 1)[1].strip() for line in done.stderr.decode().splitlines() if "|" in line}
    assert "fcntl" in loaded  # (the listing is what the watchdog imported)
    assert not {"logging", "subprocess", "threading", "__future__"} & loaded
    assert not [name for name in loaded if name.startswith("pidesk")]


def test_at_hang_up_the_watchdog_acts_on_every_line_it_had_not_read(tmp_path: Path) -> None:
    """The lines a watchdog has not read yet count when its host hangs up: a burst of groups that started and
    ended, then one that runs — that one is killed, and the watchdog exits cleanly."""
    watchdog = subprocess.Popen(COMMAND,
                                stdin=subprocess.PIPE, start_new_session=True)
    group = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        assert watchdog.stdin is not None
        started = start_time(group.pid)
        assert started is not None
        ended = [f"+ {pgid} 1\n- {pgid} 1\n" for pgid in range(5_000_000, 5_001_000)]  # (beyond any pid_max)
        watchdog.stdin.write("".join(ended).encode() + f"+ {group.pid} {started}\n".encode())
        watchdog.stdin.close()  # the host is gone
        assert group.wait(timeout=10) == -signal.SIGKILL
        assert watchdog.wait(timeout=10) == 0
    finally:
        for proc in (group, watchdog):
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
