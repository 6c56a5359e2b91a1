"""Durable append: what persisting a message costs next to a bare write + fsync.

(a) baseline  — the same ~300-byte JSON line appended to one file, ``os.fsync`` each time;
(b) single    — ``Store.append_message`` of a comparable message, one session, one thread;
(c) parallel  — 50 threads, each appending to its own session of the same Store;
(d) raw x50   — for context: 50 threads doing (a), each on its own file — how far
                this disk overlaps fsyncs at all, the ceiling (c) works under;
(e) dsync x50 — for context: 50 threads each writing to its own O_DSYNC file, one
                syscall an append, as the store's transcripts do: (c)'s own ceiling.

Targets: (b)/(a) ≥ 0.7 — a message costs little more than its fsync;
(c)/(b) ≥ 3 — fsyncs of different transcripts overlap (the GIL is released) and
index rows of concurrent appends share one commit.

A virtual disk's fsync latency can drift 2-5x within seconds, so the four phases
run interleaved in rounds (order rotated each round) and each rate is the total
appends over the total time of its phase; per-round ratios show the spread.
Both ratios move with the disk (a slower fsync leaves more room for (c) to
overlap), so the store's own cost per append is printed too: "cost above (a)".

    .venv/bin/python bench/durable_append.py [--quick]
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path

import harness
from harness import Figure

from pidesk.core.modes import Mode, PermissionMode, PlanState, SessionStatus
from pidesk.core.records import Message, Session, TextBlock
from pidesk.ids import new_id, now_iso
from pidesk.store import Store
from pidesk.store.transcripts import as_line, encode_line

WRITERS = 50
TEXT = "Run the unit tests for the parser module and tell me which ones fail; quote the first assertion."


def new_session(store: Store, title: str) -> str:
    now = now_iso()
    session = Session(
        id=new_id("s"), title=title, project_path=None, root=str(store.scratch_root("x")), mode=Mode.AGENT,
        permission_mode=PermissionMode.ASK, status=SessionStatus.IDLE, plan_state=PlanState.INACTIVE,
        current_turn_id=None, forked_from=None, created_at=now, updated_at=now,
    )
    store.create_session(session)
    return session.id


def sample_line(session_id: str) -> bytes:
    """The transcript line ``append_message`` writes for one of this benchmark's messages."""
    message = Message(
        id=new_id("m"), session_id=session_id, turn_id=new_id("t"), seq=1234, role="user",
        content=[TextBlock(text=TEXT)], created_at=now_iso(),
    )
    return encode_line(as_line(message))


class Baseline:
    """One file held open; each append is a write and an fsync."""

    def __init__(self, path: Path, line: bytes) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.line = line

    def run(self, n: int) -> float:
        start = time.perf_counter()
        for _ in range(n):
            os.write(self.fd, self.line)
            os.fsync(self.fd)
        return time.perf_counter() - start

    def close(self) -> None:
        os.close(self.fd)


class DsyncBaseline(Baseline):
    """One O_DSYNC file held open; each append is one write that is also its sync."""

    def __init__(self, path: Path, line: bytes) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_DSYNC, 0o644)
        self.line = line

    def run(self, n: int) -> float:
        start = time.perf_counter()
        for _ in range(n):
            os.write(self.fd, self.line)
        return time.perf_counter() - start


class Single:
    def __init__(self, store: Store) -> None:
        self.store = store
        self.session_id = new_session(store, "single writer")
        self.turn_id = new_id("t")

    def run(self, n: int) -> float:
        start = time.perf_counter()
        for _ in range(n):
            self.store.append_message(self.session_id, self.turn_id, "user", [TextBlock(text=TEXT)])
        return time.perf_counter() - start


class Crowd:
    """Threads that live across rounds: each round, every thread runs its ``job(n)`` once;
    a barrier starts the round and another ends it."""

    def __init__(self, jobs: list[Callable[[int], object]]) -> None:
        self.n = 0
        self.stop = False
        self.errors: list[BaseException] = []
        self.start = threading.Barrier(len(jobs) + 1)
        self.end = threading.Barrier(len(jobs) + 1)
        self.threads = [threading.Thread(target=self._work, args=(job,), daemon=True) for job in jobs]
        for thread in self.threads:
            thread.start()

    def _work(self, job: Callable[[int], object]) -> None:
        while True:
            self.start.wait()
            if self.stop:
                return
            try:
                job(self.n)
            except BaseException as exc:  # reported by run(); the barrier must still be reached
                self.errors.append(exc)
            self.end.wait()

    def run(self, n: int) -> float:
        self.n = n
        self.start.wait()
        began = time.perf_counter()
        self.end.wait()
        elapsed = time.perf_counter() - began
        if self.errors:
            raise RuntimeError(f"a writer failed: {self.errors[0]!r}") from self.errors[0]
        return elapsed

    def close(self) -> None:
        self.stop = True
        self.start.wait()
        for thread in self.threads:
            thread.join()


def main() -> int:
    args = harness.parse_args(__doc__ or "")
    n, rounds = (200, 4) if args.quick else (2000, 10)
    per_thread = max(1, 2 * n // WRITERS // rounds)  # the parallel phase appends twice as many lines in all
    harness.header("durable append", args.quick)
    with harness.scratch("append") as tmp:
        store = Store(tmp / "data")
        line = sample_line("s_0123456789abcdef")
        baseline = Baseline(tmp / "baseline.jsonl", line)
        single = Single(store)
        parallel = Crowd([Single(store).run for _ in range(WRITERS)])
        raw_files = [Baseline(tmp / f"raw-{i}.jsonl", line) for i in range(WRITERS)]
        raw_parallel = Crowd([f.run for f in raw_files])
        dsync_files = [DsyncBaseline(tmp / f"dsync-{i}.jsonl", line) for i in range(WRITERS)]
        dsync_parallel = Crowd([f.run for f in dsync_files])
        phases: dict[str, tuple[Callable[[], float], int]] = {
            "baseline": (lambda: baseline.run(n // rounds), n // rounds),
            "single": (lambda: single.run(n // rounds), n // rounds),
            "parallel": (lambda: parallel.run(per_thread), per_thread * WRITERS),
            "raw parallel": (lambda: raw_parallel.run(per_thread), per_thread * WRITERS),
            "dsync parallel": (lambda: dsync_parallel.run(per_thread), per_thread * WRITERS),
        }
        totals: dict[str, list[float]] = {name: [0.0, 0] for name in phases}
        per_round: dict[str, list[float]] = {name: [] for name in phases}
        try:
            warm = 20
            baseline.run(warm)
            single.run(warm)
            order = list(phases)
            for r in range(rounds):
                for name in order[r % len(order):] + order[: r % len(order)]:
                    run, count = phases[name]
                    elapsed = run()
                    totals[name][0] += elapsed
                    totals[name][1] += count
                    per_round[name].append(count / elapsed)
        finally:
            parallel.close()
            raw_parallel.close()
            dsync_parallel.close()
            for f in [baseline, *raw_files, *dsync_files]:
                f.close()
            store.close()
    rate = {name: count / seconds for name, (seconds, count) in totals.items()}
    ratio_b = [s / b for s, b in zip(per_round["single"], per_round["baseline"], strict=True)]
    ratio_c = [p / s for p, s in zip(per_round["parallel"], per_round["single"], strict=True)]

    def spread(values: list[float]) -> str:
        return f"per round {min(values):.2f}–{max(values):.2f}, median {statistics.median(values):.2f}"

    print(f"  line {len(line)} bytes; {rounds} rounds; (a),(b) {n} appends each; (c) {WRITERS} threads × "
          f"{per_thread * rounds} = {per_thread * rounds * WRITERS} appends")
    figures = [
        Figure("(a) baseline write+fsync", rate["baseline"], "appends/s"),
        Figure("(b) Store.append_message, one session", rate["single"], "appends/s"),
        Figure("(b) cost above (a): 1/(b) - 1/(a)", 1e6 / rate["single"] - 1e6 / rate["baseline"], "µs/append",
               note=f"(a) itself is {1e6 / rate['baseline']:.0f} µs"),
        Figure("(b)/(a) single writer vs raw fsync", rate["single"] / rate["baseline"], "x", 0.7,
               note=spread(ratio_b)),
        Figure(f"(c) Store.append_message, {WRITERS} threads", rate["parallel"], "appends/s"),
        Figure(f"(c)/(b) {WRITERS} writers vs one", rate["parallel"] / rate["single"], "x", 3.0,
               note=spread(ratio_c)),
        Figure(f"(d) raw write+fsync, {WRITERS} threads, own files", rate["raw parallel"], "appends/s"),
        Figure("(d)/(a) what this disk gains from parallel fsyncs", rate["raw parallel"] / rate["baseline"], "x",
               note="context: the ceiling for (c)/(b)"),
        Figure(f"(e) raw O_DSYNC write, {WRITERS} threads, own files", rate["dsync parallel"], "appends/s"),
        Figure("(e)/(a) the same with one syscall an append", rate["dsync parallel"] / rate["baseline"], "x",
               note="context: the store's own ceiling"),
    ]
    return harness.report("durable_append", figures, args.json)


if __name__ == "__main__":
    raise SystemExit(main())
