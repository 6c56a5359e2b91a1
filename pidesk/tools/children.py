"""How the event loop learns that a tool's child process has exited.

Python 3.11's asyncio waits for each child in a thread of its own
(``ThreadedChildWatcher``), and starting that thread costs about 1.5 ms — a
third of a tool call's budget (docs/benchmarks-server.md). Linux ≥ 5.3 gives
every process a *pidfd* that the loop can poll like a socket; asyncio 3.12+
uses it by default. On 3.11 a host installs it once its loop is running.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading


def use_pidfd_watcher() -> bool:
    """Watch children through pidfds on this running loop (3.11 on Linux); True if in use.

    Only from the main thread's loop: the 3.11 watcher delivers every exit to the
    loop it is attached to, which asyncio moves along with the main thread's
    event loop. A host running in another thread keeps the threaded watcher.
    """
    if sys.version_info >= (3, 12):
        return True  # the default already
    if threading.current_thread() is not threading.main_thread() or not _pidfds_work():
        return False
    watcher = asyncio.PidfdChildWatcher()
    watcher.attach_loop(asyncio.get_running_loop())
    asyncio.set_child_watcher(watcher)
    return True


def _pidfds_work() -> bool:
    try:
        os.close(os.pidfd_open(os.getpid()))
    except (AttributeError, OSError):  # not Linux, or a kernel before 5.3, or a seccomp filter
        return False
    return True
