"""``children.spawn``: the tools' children other than Bash's shells (ripgrep, ``git status``).

On Python 3.11 a ``create_subprocess_exec`` still under way when ``asyncio.run`` ends waits for
its child forever: a process whose loop ended in the first moments of a Grep, or of a turn's
``git status``, never exited. These run the real callers in a process of their own and end its
loop at each point of the spawn in turn.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pidesk.tools.children import spawn

REPO = Path(__file__).resolve().parents[2]

# End asyncio.run after TURNS turns of the loop, the call still in flight (asyncio.run cancels it).
STOPPED_MID_CALL = """
import asyncio, sys
from pathlib import Path
from pidesk.host.instructions import git_state
from pidesk.tools.children import use_pidfd_watcher
from pidesk.tools.search import run_rg

call, turns, root = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])

async def main():
    use_pidfd_watcher()  # (as a host does)
    if call == "rg":
        asyncio.ensure_future(run_rg(["--files"], cwd=root, timeout_s=30, separator=b"\\n",
                                     on_record=lambda record: None, tool="Grep"))
    else:
        asyncio.ensure_future(git_state(root, None))
    for _ in range(turns):
        await asyncio.sleep(0)

asyncio.run(main())
print("exited")
"""


@pytest.mark.asyncio
async def test_a_spawned_childs_output_error_and_status_come_through() -> None:
    child = await spawn(["bash", "-c", "echo out; echo err >&2; exit 3"])
    assert child.stdout is not None and child.stderr is not None
    assert await child.stdout.read() == b"out\n"
    assert await child.stderr.read() == b"err\n"
    assert await child.wait() == 3 and child.returncode == 3


@pytest.mark.asyncio
async def test_a_killed_child_reports_the_signal() -> None:
    child = await spawn(["sleep", "30"], stdout=False, stderr=False)
    assert child.stdout is None and child.returncode is None
    child.kill()
    assert await child.wait() == -9


@pytest.mark.parametrize("call", ["rg", "git"])
@pytest.mark.parametrize("turns", range(6))
def test_a_loop_ended_mid_spawn_lets_the_process_exit(call: str, turns: int) -> None:
    """Grep's ripgrep and the turn's ``git status`` (each spawned within the first few turns of the loop):
    the process exits at once whichever turn its loop ends on."""
    done = subprocess.run([sys.executable, "-c", STOPPED_MID_CALL, call, str(turns), str(REPO)],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "exited"


def _our_sleeps() -> list[int]:
    """Our child processes named ``sleep``, zombies included (not yet reaped counts as left behind)."""
    me, found = os.getpid(), []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{entry}/stat").read_bytes()
        except OSError:
            continue
        name, rest = stat[stat.index(b"(") + 1 : stat.rindex(b")")], stat[stat.rindex(b")") + 2 :].split()
        if name == b"sleep" and int(rest[1]) == me:
            found.append(int(entry))
    return found


@pytest.mark.asyncio
@pytest.mark.parametrize("turns", range(4))
async def test_a_spawn_cancelled_while_its_pipes_connect_leaves_no_child(turns: int) -> None:
    """Issue 28, item 0: the cancelled call returns only once its child is gone and reaped, whichever
    turn of the loop the cancellation lands on (it once returned with the child still a zombie, and a
    busy machine's check saw it)."""
    assert _our_sleeps() == []
    call = asyncio.ensure_future(spawn(["sleep", "30"], start_new_session=True))
    for _ in range(turns):
        await asyncio.sleep(0)
    call.cancel()
    try:
        child = await call
    except asyncio.CancelledError:
        assert _our_sleeps() == []
    else:  # (it finished connecting first: the caller owns it)
        assert await child.stop() and child.returncode == -9
        assert _our_sleeps() == []


@pytest.mark.asyncio
async def test_stop_kills_the_whole_group_and_reaps_the_leader() -> None:
    child = await spawn(["bash", "-c", "sleep 30 & echo started; wait"], stderr=False, start_new_session=True)
    assert child.stdout is not None
    assert await child.stdout.readline() == b"started\n"
    assert await child.stop()
    assert child.returncode == -9
    assert await child.stdout.read() == b""  # (the background sleep, which held the pipe too, is dead)
