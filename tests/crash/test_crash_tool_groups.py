"""Crash tests, authority hole 7 (issue 15): a tool's processes never outlive a crash of the host.

Observed before the fix: Bash children survived ``kill -9`` of the host and changed
files after it (``sleep 5; echo late > I_late.txt`` wrote 3.2 s after the kill; an
execution turn's command wrote after the restarted host was already serving).

A real Host runs in a child process (``bash_crash_child.py``); its agent's Bash
command announces its process group on a FIFO, sleeps, then writes ``late.txt``.
The test SIGKILLs the host while the command sleeps and restarts a host on the
same data dir. Two guards, each tested on its own: the watchdog kills the group
the moment the host dies; and when the watchdog died with it, boot kills the
groups the store recorded, before the host serves — but never a process that
only reuses a recorded pid.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from crash_harness import rows

from pidesk.store.process_groups import ProcessGroups
from pidesk.tools.reaper import boot_id, start_time
from tests.sandboxing import require_sandbox
from tests.tools.test_bash_host_death import (
    DELAY_S,
    LATE_COMMAND,
    LATE_SLEEP,
    group_members,
    open_fifo,
    read_group,
    wait_group_gone,
)

CHILD = Path(__file__).resolve().with_name("bash_crash_child.py")


class CrashedHost:
    """The child host, mid-command: its pid, its watchdog's, and the command's process group."""

    def __init__(self, data_dir: Path, project: Path, sandbox: bool) -> None:
        self.fifo = open_fifo(project / "started.fifo")
        env = {k: v for k, v in os.environ.items() if not k.startswith("PIDESK_")}
        self.proc = subprocess.Popen([sys.executable, str(CHILD), str(data_dir), str(project), LATE_COMMAND,
                                      "on" if sandbox else "off"],
                                     env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.sandboxed = sandbox
        self.group = read_group(self.fifo, running=LATE_SLEEP)

    def watchdog(self) -> int:
        """The host's watchdog: its child running tools/reaper.py."""
        for entry in os.listdir("/proc"):
            try:
                stat = Path(f"/proc/{entry}/stat").read_bytes().rsplit(b")", 1)[1].split()
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except (OSError, IndexError):
                continue
            if int(stat[1]) == self.proc.pid and b"reaper.py" in cmdline:
                return int(entry)
        raise AssertionError("the host started no watchdog")

    def kill(self) -> None:
        self.proc.kill()
        _out, err = self.proc.communicate(timeout=10)
        assert self.proc.returncode == -signal.SIGKILL, err.decode()[-3000:]

    def close(self) -> None:
        os.close(self.fifo)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate(timeout=10)


@pytest.fixture(params=["sandboxed", "unconfined"])
def crashed(request: pytest.FixtureRequest, data_dir: Path, project: Path) -> Iterator[CrashedHost]:
    """A host killed mid-command: one whose commands run in the sandbox (where bubblewrap works here), and
    one whose command runs unconfined (``sandbox = "off"``, or an escalation the person allowed)."""
    if request.param == "sandboxed":
        require_sandbox()
    host = CrashedHost(data_dir, project, sandbox=request.param == "sandboxed")
    try:
        yield host
    finally:
        host.close()
        if group_members(host.group):  # (only when the test failed)
            os.killpg(host.group, signal.SIGKILL)


@pytest.fixture
def stray_group(tmp_path: Path) -> Iterator[int]:
    """A live process group the test started itself (a shell and its sleep), killed at the end."""
    proc = subprocess.Popen(["bash", "-c", "sleep 60 & wait"], start_new_session=True, cwd=tmp_path)
    try:
        yield proc.pid
    finally:
        if group_members(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def recovery_detail(host: Any) -> dict[str, Any]:
    (detail,) = rows(host, "SELECT detail FROM audit WHERE action = 'host.recovered' ORDER BY id DESC LIMIT 1")
    parsed: dict[str, Any] = json.loads(detail[0])
    return parsed


@pytest.mark.asyncio
async def test_kill_9_mid_command_the_commands_later_write_never_happens(
    crashed: CrashedHost, project: Path, data_dir: Path, make_host: Any
) -> None:
    """Authority hole 7: kill -9 of the host mid-command, then a restart: the command's group dies with the
    host (its watchdog), the restarted host finds nothing left to kill, and ``late.txt`` never appears."""
    assert group_members(crashed.group)
    crashed.kill()
    took = wait_group_gone(crashed.group)
    host = make_host()
    assert host.recovery.boot.killed_process_groups == []  # already dead before the restart
    assert ProcessGroups(data_dir / "process-groups").recorded() == []  # and the record cleared
    assert not (project / "late.txt").exists() and group_members(crashed.group) == []
    assert took < DELAY_S / 2


@pytest.mark.asyncio
async def test_groups_a_dead_watchdog_missed_are_killed_at_boot_before_the_host_serves(
    crashed: CrashedHost, project: Path, make_host: Any
) -> None:
    """Authority hole 7: the host and its watchdog both killed (kill -9 of both, the OOM killer): an
    unconfined command runs on, and the restarted host kills its recorded group during recovery, before it
    serves anything. A sandboxed one is already gone: its sandbox dies with the host (issue 28)."""
    os.kill(crashed.watchdog(), signal.SIGKILL)
    crashed.kill()
    if crashed.sandboxed:
        took = wait_group_gone(crashed.group)
        assert took < DELAY_S / 2 and not (project / "late.txt").exists()
        assert make_host().recovery.boot.killed_process_groups == []
        return
    assert group_members(crashed.group)  # nothing killed it: still sleeping

    host = make_host()
    assert group_members(crashed.group) == []  # gone once the host is open, before it serves
    assert host.recovery.boot.killed_process_groups == [crashed.group]
    assert recovery_detail(host)["killed_process_groups"] == [crashed.group]
    assert not (project / "late.txt").exists()


@pytest.mark.asyncio
async def test_a_recorded_group_still_running_is_killed_at_boot(
    stray_group: int, data_dir: Path, make_host: Any
) -> None:
    """Authority hole 7: a group in the store's record, alive as recorded, is killed by boot."""
    data_dir.mkdir()
    start = start_time(stray_group)
    assert start is not None
    ProcessGroups(data_dir / "process-groups").add(stray_group, start, boot_id())

    host = make_host()
    assert group_members(stray_group) == []
    assert host.recovery.boot.killed_process_groups == [stray_group]


@pytest.mark.asyncio
@pytest.mark.parametrize("mismatch", ["start time", "boot id"])
async def test_a_recorded_pid_now_naming_another_process_is_not_killed(
    mismatch: str, stray_group: int, data_dir: Path, make_host: Any
) -> None:
    """Authority hole 7: boot kills a recorded group only while its leader is the recorded process: a pid
    reused by another process (another start time), or recorded in an earlier boot, is left alone."""
    data_dir.mkdir()
    start = start_time(stray_group)
    assert start is not None
    if mismatch == "start time":
        ProcessGroups(data_dir / "process-groups").add(stray_group, start - 1, boot_id())
    else:
        ProcessGroups(data_dir / "process-groups").add(stray_group, start, "0" * 8 + boot_id()[8:])

    host = make_host()
    assert host.recovery.boot.killed_process_groups == []
    assert len(group_members(stray_group)) == 2  # the shell and its sleep, untouched
    assert ProcessGroups(data_dir / "process-groups").recorded() == []  # and the stale record dropped
