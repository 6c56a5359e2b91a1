"""Children of tools are waited for through pidfds: no thread is started per child process."""

from __future__ import annotations

import asyncio
import sys
import threading

import pytest

from pidesk.tools.children import use_pidfd_watcher

pytestmark = pytest.mark.skipif(sys.version_info >= (3, 12), reason="asyncio 3.12+ watches children with pidfds itself")


def waiter_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("asyncio-waitpid-")]  # ThreadedChildWatcher's


@pytest.mark.asyncio
async def test_a_child_is_waited_for_without_a_thread_and_its_exit_is_seen():
    if not use_pidfd_watcher():
        pytest.skip("this kernel offers no pidfds (Linux 5.3+)")
    try:
        child = await asyncio.create_subprocess_exec("cat", stdin=asyncio.subprocess.PIPE,
                                                     stdout=asyncio.subprocess.DEVNULL)
        assert waiter_threads() == []  # the child runs (cat waits on its stdin) and nothing waits in a thread
        assert child.stdin is not None
        child.stdin.close()
        assert await asyncio.wait_for(child.wait(), 10) == 0
    finally:
        asyncio.set_child_watcher(asyncio.ThreadedChildWatcher())  # as asyncio's default, for the other tests


@pytest.mark.asyncio
async def test_exit_statuses_and_signals_come_through_the_pidfd_watcher():
    if not use_pidfd_watcher():
        pytest.skip("this kernel offers no pidfds (Linux 5.3+)")
    try:
        exited = await asyncio.create_subprocess_exec("bash", "-c", "exit 3")
        killed = await asyncio.create_subprocess_exec("sleep", "30")
        killed.kill()
        assert await asyncio.wait_for(exited.wait(), 10) == 3
        assert await asyncio.wait_for(killed.wait(), 10) == -9
    finally:
        asyncio.set_child_watcher(asyncio.ThreadedChildWatcher())


@pytest.mark.asyncio
async def test_without_it_python_311_starts_a_thread_per_child():
    """The cost the pidfd watcher removes (this proves the check above can fail)."""
    asyncio.set_child_watcher(asyncio.ThreadedChildWatcher())
    child = await asyncio.create_subprocess_exec("cat", stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.DEVNULL)
    assert len(waiter_threads()) == 1
    assert child.stdin is not None
    child.stdin.close()
    assert await asyncio.wait_for(child.wait(), 10) == 0


def test_a_host_in_another_thread_keeps_the_threaded_watcher():
    used: list[bool] = []
    thread = threading.Thread(target=lambda: used.append(asyncio.run(_use())))
    thread.start()
    thread.join(10)
    assert used == [False]


async def _use() -> bool:
    return use_pidfd_watcher()
