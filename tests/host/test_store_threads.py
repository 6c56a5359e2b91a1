"""The threads the host's store work runs on (``host/parts.py``): each append wakes one of them.

Every tool call makes two durable appends through them. Once a burst has started several threads
(a host's start runs a few jobs at once), the standard executor woke a second idle thread for
each job, which found nothing to do: a context switch and a GIL hand-off per append.
"""

from __future__ import annotations

import asyncio
import contextvars
import statistics
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
    """Measured in turns, so both see the same machine: the thread that ran the job goes back to sleep (1 a
    job, a little more when the GIL makes it wait), where the standard executor also wakes another (2 or more).
    Load only adds sleeps, to both: the median of three turns is compared."""
    store, standard = [], []
    for _ in range(3):
        for pool, sleeps in ((StoreThreads(), store), (ThreadPoolExecutor(), standard)):
            try:
                sleeps.append(await sleeps_per_job(pool))
            finally:
                pool.shutdown()
    assert statistics.median(standard) >= 1.8  # (the herd is there to see: the measurement can tell them apart)
    assert statistics.median(s / t for s, t in zip(store, standard)) <= 0.8, (store, standard)


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
