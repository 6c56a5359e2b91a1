"""The threads the host's store work runs on (``host/parts.py``): each append wakes one of them.

Every tool call makes two durable appends through them. Once a burst has started several threads
(a host's start runs a few jobs at once), the standard executor woke a second idle thread for
each job, which found nothing to do: a context switch and a GIL hand-off per append.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from pidesk.host.parts import StoreThreads
from tests.conftest import HostFactory

JOBS = 200


def sleeps(pool: ThreadPoolExecutor) -> int:
    """How often the pool's threads have gone to sleep (their ``voluntary_ctxt_switches``)."""
    total = 0
    for thread in pool._threads:
        with open(f"/proc/self/task/{thread.native_id}/status") as status:
            total += sum(int(line.split()[1]) for line in status if line.startswith("voluntary_ctxt_switches:"))
    return total


async def sleeps_per_job(pool: ThreadPoolExecutor) -> float:
    """Three idle threads (a burst of three jobs at once), then jobs one at a time: sleeps per job."""
    loop = asyncio.get_running_loop()
    release = threading.Event()
    burst = [loop.run_in_executor(pool, release.wait) for _ in range(3)]
    assert len(pool._threads) == 3
    release.set()
    await asyncio.gather(*burst)
    before = sleeps(pool)
    for _ in range(JOBS):
        assert await loop.run_in_executor(pool, sum, range(100)) == 4950
    return (sleeps(pool) - before) / JOBS


@pytest.mark.asyncio
async def test_each_job_wakes_one_store_thread_where_the_standard_executor_wakes_two_or_more() -> None:
    store, standard = StoreThreads(), ThreadPoolExecutor()
    try:
        assert await sleeps_per_job(store) <= 1.2  # the thread that ran the job, going back to sleep
        assert await sleeps_per_job(standard) >= 1.8  # (what it replaced: the measurement can tell them apart)
    finally:
        store.shutdown()
        standard.shutdown()


@pytest.mark.asyncio
async def test_store_threads_run_in_the_callers_context_and_stop_with_the_host(make_host: HostFactory) -> None:
    """``in_thread`` runs as ``asyncio.to_thread`` does (the caller's context variables); a closed host's
    threads are gone."""
    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="unset")
    host = make_host()
    var.set("caller's")
    assert await host.parts.in_thread(var.get) == "caller's"
    threads = list(host.parts.threads._threads)
    assert threads and all(thread.name.startswith("pidesk-store") for thread in threads)
    await host.close()
    assert not any(thread.is_alive() for thread in threads)
