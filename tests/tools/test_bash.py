from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from pidesk.core.errors import Code
from pidesk.tools import make_bash_tool, run_tool

# The command records its background child's pid, then waits on it.
SPAWNS_GRANDCHILD = "sleep 30 & echo $! > child.pid; echo $$ > shell.pid; wait"


def _stopped(pid: int) -> bool:
    """Gone, or a zombie (dead, waiting for init to reap it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state in (b"Z", b"X")


async def _pid_from(path: Path) -> int:
    """Wait (bounded) for a pid file an external process writes."""
    for _ in range(500):
        text = path.read_text() if path.exists() else ""
        if text.endswith("\n"):
            return int(text)
        await asyncio.sleep(0.01)
    raise AssertionError(f"{path} was never written")


@pytest.mark.asyncio
async def test_success_output_and_exit_code(root: Path) -> None:
    result = await run_tool(make_bash_tool(root), {"command": "echo out; echo err >&2; pwd"})
    assert result.ok and result.error_code is None
    assert result.output == f"out\nerr\n{root}\n[exit code 0]"


@pytest.mark.asyncio
async def test_non_zero_exit_is_a_plain_failure(root: Path) -> None:
    result = await run_tool(make_bash_tool(root), {"command": "echo failing; exit 3"})
    assert (result.ok, result.error_code) == (False, None)
    assert result.output == "failing\n[exit code 3]"


@pytest.mark.asyncio
async def test_stdin_is_empty_and_silence_is_reported(root: Path) -> None:
    result = await run_tool(make_bash_tool(root), {"command": "cat"})
    assert result.ok and result.output == "(no output)\n[exit code 0]"


@pytest.mark.asyncio
async def test_killed_by_signal(root: Path) -> None:
    result = await run_tool(make_bash_tool(root), {"command": "kill -KILL $$"})
    assert (result.ok, result.error_code) == (False, None)
    assert result.output.endswith("[killed by signal 9]")


@pytest.mark.asyncio
async def test_env_replaces_the_inherited_environment(root: Path) -> None:
    tool = make_bash_tool(root, env={"PATH": os.environ["PATH"], "GREETING": "hi"})
    result = await run_tool(tool, {"command": 'echo "$GREETING ${HOME:-nohome}"'})
    assert result.output == "hi nohome\n[exit code 0]"


@pytest.mark.asyncio
async def test_output_keeps_the_tail_and_says_what_was_cut(root: Path) -> None:
    tool = make_bash_tool(root, max_output=1000)
    result = await run_tool(tool, {"command": "head -c 100000 /dev/zero | tr '\\0' x; echo; echo END"})
    assert result.ok
    first, *_ = result.output.splitlines()
    assert first == "[99005 earlier bytes of output cut]"
    assert result.output.endswith("x\nEND\n[exit code 0]")
    assert len(result.output) < 1100


@pytest.mark.asyncio
async def test_truncation_does_not_split_a_character(root: Path) -> None:
    tool = make_bash_tool(root, max_output=9)
    result = await run_tool(tool, {"command": "printf 'ééééééééé'"})
    assert result.output == "[10 earlier bytes of output cut]\néééé\n[exit code 0]"


@pytest.mark.asyncio
async def test_timeout_kills_the_whole_group(root: Path) -> None:
    tool = make_bash_tool(root, kill_grace_ms=200)
    result = await run_tool(tool, {"command": "echo started; " + SPAWNS_GRANDCHILD, "timeoutMs": 300})
    assert (result.ok, result.error_code) == (False, Code.TOOL_TIMEOUT)
    assert result.output.startswith("started\n")
    assert "timed out after 300 ms" in result.output
    assert _stopped(int((root / "child.pid").read_text()))
    assert _stopped(int((root / "shell.pid").read_text()))


@pytest.mark.asyncio
async def test_timeout_escalates_to_sigkill_for_a_process_ignoring_sigterm(root: Path) -> None:
    tool = make_bash_tool(root, kill_grace_ms=100)
    command = "bash -c 'trap \"\" TERM; echo $$ > stubborn.pid; while :; do :; done' & wait"
    result = await run_tool(tool, {"command": command, "timeoutMs": 300})
    assert result.error_code == Code.TOOL_TIMEOUT
    assert _stopped(int((root / "stubborn.pid").read_text()))


@pytest.mark.asyncio
async def test_cancellation_kills_the_whole_group_before_it_completes(root: Path) -> None:
    task = asyncio.create_task(run_tool(make_bash_tool(root), {"command": SPAWNS_GRANDCHILD}))
    child = await _pid_from(root / "child.pid")
    shell = await _pid_from(root / "shell.pid")
    assert not _stopped(child)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert _stopped(child)
    assert _stopped(shell)


@pytest.mark.asyncio
async def test_background_leftovers_are_stopped_when_the_command_ends(root: Path) -> None:
    result = await run_tool(make_bash_tool(root), {"command": "sleep 30 & echo $! > child.pid; echo done"})
    assert result.ok and result.output == "done\n[exit code 0]"
    assert _stopped(int((root / "child.pid").read_text()))


@pytest.mark.asyncio
async def test_a_detached_process_holding_the_output_cannot_hang_the_call(root: Path) -> None:
    command = (
        "setsid sh -c 'echo $$ > child.pid; exec sleep 30' & "
        "until [ -s child.pid ]; do :; done; echo done"
    )
    result = await run_tool(make_bash_tool(root), {"command": command})
    child = int((root / "child.pid").read_text())
    try:
        assert result.ok
        assert "done" in result.output and "stopped reading" in result.output
    finally:
        os.kill(child, 9)


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "args",
    [{}, {"command": ""}, {"command": 1}, {"command": "true", "timeoutMs": 0},
     {"command": "true", "timeoutMs": True}, {"command": "true", "timeoutMs": 600_001}],
)
async def test_malformed_arguments(root: Path, args: dict[str, object]) -> None:
    result = await run_tool(make_bash_tool(root), dict(args))
    assert result.error_code == Code.INVALID_ARGUMENTS
