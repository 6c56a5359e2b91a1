from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from pidesk.core.errors import Code
from pidesk.tools import Bash, children, run_tool
from pidesk.store.process_groups import ProcessGroups
from pidesk.tools import make_bash_tool as _make_bash_tool
from pidesk.tools.bash import _WAIT_FOR_COMMAND, RUNNING_MARK, WARM_LIMIT, _Collector, _wait_exit
from tests.scenario import cold_shells, gone, spare_shells

# The command records its background child's pid, then waits on it.
SPAWNS_GRANDCHILD = "sleep 30 & echo $! > child.pid; echo $$ > shell.pid; wait"


MakeBash = Callable[..., Awaitable[Bash]]


@pytest_asyncio.fixture(params=["cold", "warm"])
async def make_bash_tool(request: pytest.FixtureRequest) -> AsyncIterator[MakeBash]:
    """Bash tools made for one test, closed after it. Every test runs twice: on a tool's first call
    (a cold ``bash -c``) and on a later one (the spare shell the previous call started)."""
    made: list[Bash] = []

    async def make(root: Path, **options: Any) -> Bash:
        made.append(tool := _make_bash_tool(root, **options))
        if request.param == "warm":
            assert (await tool({"command": "true"})).ok  # starts the spare the test's call will run in
        return tool

    yield make
    for tool in made:
        await tool.aclose()


async def _pid_from(path: Path) -> int:
    """Wait (bounded) for a pid file an external process writes."""
    for _ in range(500):
        text = path.read_text() if path.exists() else ""
        if text.endswith("\n"):
            return int(text)
        await asyncio.sleep(0.01)
    raise AssertionError(f"{path} was never written")


@pytest.mark.asyncio
async def test_success_output_and_exit_code(root: Path, make_bash_tool: MakeBash) -> None:
    result = await run_tool(await make_bash_tool(root), {"command": "echo out; echo err >&2; pwd"})
    assert result.ok and result.error_code is None
    assert result.output == f"out\nerr\n{root}\n[exit code 0]"


@pytest.mark.asyncio
async def test_non_zero_exit_is_a_plain_failure(root: Path, make_bash_tool: MakeBash) -> None:
    result = await run_tool(await make_bash_tool(root), {"command": "echo failing; exit 3"})
    assert (result.ok, result.error_code) == (False, None)
    assert result.output == "failing\n[exit code 3]"


@pytest.mark.asyncio
async def test_stdin_is_empty_and_silence_is_reported(root: Path, make_bash_tool: MakeBash) -> None:
    result = await run_tool(await make_bash_tool(root), {"command": "cat"})
    assert result.ok and result.output == "(no output)\n[exit code 0]"


@pytest.mark.asyncio
async def test_killed_by_signal(root: Path, make_bash_tool: MakeBash) -> None:
    result = await run_tool(await make_bash_tool(root), {"command": "kill -KILL $$"})
    assert (result.ok, result.error_code) == (False, None)
    assert result.output.endswith("[killed by signal 9]")


@pytest.mark.asyncio
async def test_env_replaces_the_inherited_environment(root: Path, make_bash_tool: MakeBash) -> None:
    tool = await make_bash_tool(root, env={"PATH": os.environ["PATH"], "GREETING": "hi"})
    result = await run_tool(tool, {"command": 'echo "$GREETING ${HOME:-nohome}"'})
    assert result.output == "hi nohome\n[exit code 0]"


@pytest.mark.asyncio
async def test_output_keeps_the_tail_and_says_what_was_cut(root: Path, make_bash_tool: MakeBash) -> None:
    tool = await make_bash_tool(root, max_output=1000)
    result = await run_tool(tool, {"command": "head -c 100000 /dev/zero | tr '\\0' x; echo; echo END"})
    assert result.ok
    first, *_ = result.output.splitlines()
    assert first == "[99005 earlier bytes of output cut]"
    assert result.output.endswith("x\nEND\n[exit code 0]")
    assert len(result.output) < 1100


@pytest.mark.asyncio
async def test_truncation_does_not_split_a_character(root: Path, make_bash_tool: MakeBash) -> None:
    tool = await make_bash_tool(root, max_output=9)
    result = await run_tool(tool, {"command": "printf 'ééééééééé'"})
    assert result.output == "[10 earlier bytes of output cut]\néééé\n[exit code 0]"


@pytest.mark.asyncio
async def test_timeout_kills_the_whole_group(root: Path, make_bash_tool: MakeBash) -> None:
    tool = await make_bash_tool(root, kill_grace_ms=200)
    result = await run_tool(tool, {"command": "echo started; " + SPAWNS_GRANDCHILD, "timeoutMs": 300})
    assert (result.ok, result.error_code) == (False, Code.TOOL_TIMEOUT)
    assert result.output.startswith("started\n")
    assert "timed out after 300 ms" in result.output
    assert gone(int((root / "child.pid").read_text()))
    assert gone(int((root / "shell.pid").read_text()))


@pytest.mark.asyncio
async def test_timeout_escalates_to_sigkill_for_a_process_ignoring_sigterm(root: Path, make_bash_tool: MakeBash) -> None:
    tool = await make_bash_tool(root, kill_grace_ms=100)
    command = "bash -c 'trap \"\" TERM; echo $$ > stubborn.pid; while :; do :; done' & wait"
    result = await run_tool(tool, {"command": command, "timeoutMs": 300})
    assert result.error_code == Code.TOOL_TIMEOUT
    assert gone(int((root / "stubborn.pid").read_text()))


@pytest.mark.asyncio
async def test_cancellation_kills_the_whole_group_before_it_completes(root: Path, make_bash_tool: MakeBash) -> None:
    task = asyncio.create_task(run_tool(await make_bash_tool(root), {"command": SPAWNS_GRANDCHILD}))
    child = await _pid_from(root / "child.pid")
    shell = await _pid_from(root / "shell.pid")
    assert not gone(child)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert gone(child)
    assert gone(shell)


@pytest.mark.asyncio
async def test_background_leftovers_are_stopped_when_the_command_ends(root: Path, make_bash_tool: MakeBash) -> None:
    result = await run_tool(await make_bash_tool(root), {"command": "sleep 30 & echo $! > child.pid; echo done"})
    assert result.ok and result.output == "done\n[exit code 0]"
    assert gone(int((root / "child.pid").read_text()))


@pytest.mark.asyncio
async def test_a_detached_process_holding_the_output_cannot_hang_the_call(root: Path, make_bash_tool: MakeBash) -> None:
    command = (
        "setsid sh -c 'echo $$ > child.pid; exec sleep 30' & "
        "until [ -s child.pid ]; do :; done; echo done"
    )
    result = await run_tool(await make_bash_tool(root), {"command": command})
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
async def test_malformed_arguments(root: Path, args: dict[str, object], make_bash_tool: MakeBash) -> None:
    result = await run_tool(await make_bash_tool(root), dict(args))
    assert result.error_code == Code.INVALID_ARGUMENTS


@pytest.mark.asyncio
async def test_each_call_runs_in_a_fresh_shell_whether_cold_or_prepared(root: Path) -> None:
    tool = _make_bash_tool(root)
    try:
        first = await tool({"command": "x=1; export Y=2; cd /; echo $$"})
        second = await tool({"command": 'echo "[$x][$Y][$PWD] $$"; declare -p __pidesk_command'})
        shell = first.output.splitlines()[0]
        line = second.output.splitlines()[0]
        assert line.startswith(f"[][][{root}] ") and line.split()[-1] != shell  # no state, another process
        assert "not found" in second.output and "[exit code 1]" in second.output  # the wrapper's variable is gone
        third = await tool({"command": "echo 'unclosed"})  # a syntax error, as from bash -c: status 2
        assert "unexpected EOF" in third.output and third.output.endswith("[exit code 2]")
    finally:
        await tool.aclose()


@pytest.mark.asyncio
async def test_a_long_command_takes_a_cold_shell_and_runs_all_the_same(root: Path) -> None:
    tool = _make_bash_tool(root)
    try:
        await tool({"command": "true"})
        long = "echo " + "y" * (WARM_LIMIT * 4)
        result = await tool({"command": long})
        assert result.ok and result.output.splitlines()[0] == "y" * (WARM_LIMIT * 4)
    finally:
        await tool.aclose()


@pytest.mark.asyncio
@pytest.mark.parametrize("taken", ["once running", "before it runs"])
async def test_a_spare_is_guarded_before_its_command_and_its_running_mark_is_never_output(
        root: Path, tmp_path: Path, taken: str) -> None:
    """A spare shell is guarded once bash runs (the mark its script prints first), or, taken sooner, by the call
    that takes it; either way its group is recorded before the command reaches it, and the mark is not output
    (neither alone in its read nor ahead of the command's first bytes)."""
    record = ProcessGroups(tmp_path / "process-groups")
    tool = _make_bash_tool(root, process_groups=record)
    try:
        await tool({"command": "true"})
        assert tool.next_spare is not None
        spare = await tool.next_spare
        if taken == "once running":
            await asyncio.wait_for(spare.running, 10)
            assert [g.pgid for g in record.recorded()] == [spare.pid]
        result = await tool({"command": "echo $$; printf no-newline"})
        assert result.output == f"{spare.pid}\nno-newline\n[exit code 0]"  # (this very spare ran it)
        assert spare.pid in {int(line.split()[1]) for line in record.path.read_text().splitlines()
                             if line.startswith("+")}
    finally:
        await tool.aclose()
        record.close()


@pytest.mark.asyncio
async def test_a_spare_whose_bash_warns_as_it_starts_still_hides_its_mark(root: Path) -> None:
    """bash's own start-up warnings (an unknown locale) come before the mark: they stay in the output, as they
    did from a cold shell, and the mark still goes."""
    tool = _make_bash_tool(root, env={"PATH": os.environ["PATH"], "LC_ALL": "xx_XX.nonexistent"})
    try:
        await tool({"command": "true"})
        assert tool.next_spare is not None
        spare = await tool.next_spare
        await asyncio.wait_for(spare.running, 10)
        result = await tool({"command": "echo warm"})
        assert "warm\n[exit code 0]" in result.output and RUNNING_MARK.decode() not in result.output
    finally:
        await tool.aclose()


@pytest.mark.asyncio
async def test_a_call_cancelled_while_its_cold_shell_starts_runs_nothing_and_leaves_no_process(root: Path) -> None:
    """A cold shell is guarded once bash runs, so its call waits a moment before the go-ahead; cancelled in that
    moment (an abort), the shell is killed and the command never runs."""
    tool = _make_bash_tool(root)
    try:
        before = cold_shells()
        call = asyncio.create_task(tool({"command": "touch ran"}))
        while call.done() or not cold_shells() - before:  # (the shell is spawned: bounded by the test's timeout)
            assert not call.done(), call
            await asyncio.sleep(0)
        started = cold_shells() - before
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        async with asyncio.timeout(10):
            while not all(gone(pid) for pid in started):
                await asyncio.sleep(0.01)  # (a process's end: observed by polling, bounded)
        assert not (root / "ran").exists()
    finally:
        await tool.aclose()


@pytest.mark.asyncio
async def test_closing_the_tool_kills_its_spare_shell(root: Path) -> None:
    tool = _make_bash_tool(root)
    before = spare_shells()
    await tool({"command": "true"})
    assert tool.next_spare is not None
    await tool.next_spare  # the next call's shell, started once this call had ended
    assert len(spare_shells() - before) == 1  # and waiting
    await tool.aclose()
    assert spare_shells() == before
    assert (await tool({"command": "true"})).ok  # a closed tool still runs a call, cold, and starts no spare
    assert spare_shells() == before


def test_a_spare_whose_host_went_away_runs_nothing_and_exits(root: Path) -> None:
    """The host dies between calls: the spare's stdin closes before any command arrives."""
    marker = root / "ran"
    spare = subprocess.run(["bash", "-c", _WAIT_FOR_COMMAND], input=f"touch {marker}".encode(),  # no NUL: cut short
                           capture_output=True, timeout=10, cwd=root)
    assert spare.returncode == 0 and spare.stdout == RUNNING_MARK and not marker.exists()  # (the mark: it ran)


@pytest.mark.asyncio
async def test_a_nul_in_the_command_is_refused(root: Path, make_bash_tool: MakeBash) -> None:
    result = await run_tool(await make_bash_tool(root), {"command": "echo a\0b"})
    assert result.error_code == Code.INVALID_ARGUMENTS


@pytest.mark.asyncio
@pytest.mark.parametrize(("script", "code"), [("exit 7", 7), ("kill -KILL $$", -9)])
async def test_an_exit_the_child_watcher_never_reports_is_found_directly(root: Path, script: str, code: int) -> None:
    """The load soak caught a turn waiting in Bash for an exit asyncio's watcher never reported. Here no
    watcher knows the process at all (it is started outside asyncio): the wait still ends, with its status."""
    proc = subprocess.Popen(["bash", "-c", script], cwd=root)
    try:
        collector = _Collector(100)
        assert await asyncio.wait_for(_wait_exit(proc.pid, collector, timeout=30), 20)
        assert collector.exited.done() and collector.unreported_code == code
        with pytest.raises(ChildProcessError):  # and reaped: no zombie is left behind
            os.waitpid(proc.pid, os.WNOHANG)
    finally:
        proc.returncode = code  # (reaped above: Popen must not wait for it again)


@pytest.mark.asyncio
async def test_a_running_command_is_not_taken_for_exited(root: Path) -> None:
    proc = subprocess.Popen(["sleep", "30"], cwd=root)
    try:
        assert not await _wait_exit(proc.pid, _Collector(100), timeout=2.5)  # two direct looks: running
    finally:
        proc.kill()
        proc.wait()


def test_a_program_whose_event_loop_ends_while_a_spare_shell_starts_exits_at_once(root: Path) -> None:
    """A call starts the next call's shell as it returns; ``asyncio.run`` ending right then (the tool
    never closed) used to wait forever for that shell, which Python 3.11's subprocess transport
    leaves half-made when its task is cancelled. Now the program ends, and the spare with it
    (its stdin closes with the program, and a spare reading EOF runs nothing and exits)."""
    program = (
        "import asyncio, pathlib\n"
        "from pidesk.tools import make_bash_tool\n"
        f"tool = make_bash_tool(pathlib.Path({str(root)!r}))\n"
        "async def main():\n"
        "    print((await tool({'command': 'echo ran'})).output, flush=True)\n"
        "asyncio.run(main())\n"
        "spare = tool.next_spare\n"  # the spare, starting as the loop wound down: killed then, or started
        "print(0 if spare.cancelled() else spare.result().pid)\n"
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    ran, spare = done.stdout.rsplit("\n", 2)[:2]
    assert ran == "ran\n[exit code 0]"
    if spare == "0":  # its start was cut short by the loop's end (it never ran, or was killed at once)
        return
    for _ in range(500):  # (bounded: not our child, so there is no exit to wait on)
        if gone(int(spare)):
            break
        time.sleep(0.01)
    assert gone(int(spare))


@pytest.mark.asyncio
async def test_without_pidfds_a_thread_reports_each_exit(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the kernel has no pidfds, a shell's exit is waited for in a thread; statuses still come through."""
    monkeypatch.setattr(children, "_pidfds_work", lambda: False)
    tool = _make_bash_tool(root)
    try:
        for _ in ("cold", "warm"):
            assert (await tool({"command": "exit 3"})).output == "(no output)\n[exit code 3]"
            assert (await tool({"command": "kill -9 $$"})).output == "(no output)\n[killed by signal 9]"
    finally:
        await tool.aclose()
