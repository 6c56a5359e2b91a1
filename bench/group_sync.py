"""Would one filesystem sync per group of appends beat the transcripts' own O_DSYNC writes?

Issue 2 asks for 50 sessions appending at once to reach 3x one writer ("group
commit"). The store's transcripts are one file per session, each line one
O_DSYNC write (docs/benchmarks.md), so 50 writers are 50 syncs in parallel. The
other way to group them is one ``syncfs()`` for every write made meanwhile: each
writer writes without syncing, then waits for a sync that started after its
write; one thread at a time runs it, for everyone waiting. This script measures
both, in rounds, each writer on its own file, all on the repository's disk:

(a) one O_DSYNC writer;            (b) 50 threads of O_DSYNC writers;
(c) one writer, write + syncfs;    (d) 50 threads sharing group syncfs calls.

Nothing here is pidesk's code: it is the disk's answer to a design question.

    .venv/bin/python bench/group_sync.py [--quick]
"""

from __future__ import annotations

import ctypes
import os
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path

import harness
from harness import Figure

LINE = b"x" * 299 + b"\n"  # the size of a transcript line in bench/durable_append.py
WRITERS = 50

_libc = ctypes.CDLL(None, use_errno=True)


def syncfs(fd: int) -> None:
    if _libc.syncfs(fd) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))


class GroupSync:
    """``durable()`` returns once a syncfs that began after the caller's write has finished."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.cond = threading.Condition()
        self.asked = 0  # generations: a waiter needs the sync numbered ``asked`` at its call to finish
        self.done = 0
        self.running = False
        self.syncs = 0

    def durable(self) -> None:
        with self.cond:
            self.asked += 1
            want = self.asked
            while self.done < want:
                if self.running:
                    self.cond.wait()
                    continue
                self.running, covers = True, self.asked  # this sync starts now: it covers every write so far
                self.cond.release()
                try:
                    syncfs(self.fd)
                finally:
                    self.cond.acquire()
                    self.running = False
                self.syncs += 1
                self.done = covers
                self.cond.notify_all()


def one_writer(path: Path, n: int, flags: int, after: Callable[[int], None] | None) -> float:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | flags, 0o644)
    try:
        start = time.perf_counter()
        for _ in range(n):
            os.write(fd, LINE)
            if after is not None:
                after(fd)
        return n / (time.perf_counter() - start)
    finally:
        os.close(fd)


def crowd(directory: Path, n: int, flags: int, group: bool) -> tuple[float, float]:
    """Appends a second for WRITERS threads of ``n`` appends, and appends per sync (group only)."""
    fds = [os.open(directory / f"w{i}", os.O_WRONLY | os.O_CREAT | os.O_APPEND | flags, 0o644)
           for i in range(WRITERS)]
    sync = GroupSync(fds[0])

    def work(fd: int) -> None:
        for _ in range(n):
            os.write(fd, LINE)
            if group:
                sync.durable()

    threads = [threading.Thread(target=work, args=(fd,)) for fd in fds]
    try:
        start = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        elapsed = time.perf_counter() - start
    finally:
        for fd in fds:
            os.close(fd)
    return WRITERS * n / elapsed, (WRITERS * n / sync.syncs if sync.syncs else 0.0)


def main() -> int:
    args = harness.parse_args(__doc__ or "")
    rounds, single, each = (2, 300, 20) if args.quick else (5, 1500, 80)
    harness.header("group_sync — one syncfs for many appends vs an O_DSYNC write each", args.quick)
    rates: dict[str, list[float]] = {"a": [], "b": [], "c": [], "d": []}
    per_sync: list[float] = []
    with harness.scratch("group_sync") as scratch:
        for r in range(rounds):
            round_dir = scratch / f"round{r}"
            round_dir.mkdir()
            (round_dir / "b").mkdir()
            (round_dir / "d").mkdir()
            rates["a"].append(one_writer(round_dir / "a", single, os.O_DSYNC, None))
            rates["b"].append(crowd(round_dir / "b", each, os.O_DSYNC, group=False)[0])
            rates["c"].append(one_writer(round_dir / "c", single, 0, syncfs))
            rate, appends = crowd(round_dir / "d", each, 0, group=True)
            rates["d"].append(rate)
            per_sync.append(appends)
    a, b, c, d = (statistics.median(rates[k]) for k in "abcd")
    figures = [
        Figure("(a) one O_DSYNC writer", a, "appends/s"),
        Figure(f"(b) {WRITERS} O_DSYNC writers, own files", b, "appends/s", note=f"{b / a:.2f}x (a)"),
        Figure("(c) one writer, write + syncfs", c, "appends/s", note=f"{c / a:.2f}x (a)"),
        Figure(f"(d) {WRITERS} writers sharing group syncfs calls", d, "appends/s",
               note=f"{d / a:.2f}x (a), {d / b:.2f}x (b); {statistics.median(per_sync):.1f} appends a sync"),
    ]
    return harness.report("group_sync", figures, args.json)


if __name__ == "__main__":
    raise SystemExit(main())
