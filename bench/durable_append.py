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

Each phase's writers append without pause; a round counts the appends finished
in a timed window that opens only once every writer of the phase is appending,
and the rate is the appends over the time of all its windows: the load (c) names,
50 sessions appending at once. (Until 2026-12-03 a round gave each of the 50
threads a fixed 8 appends between two barriers: all 50 were appending at once for
only 2-4 % of such a round, as threads woke one by one and finished unevenly,
and (c) came out 10-20 % under its steady rate; docs/benchmarks.md.)

A virtual disk's fsync latency can drift 2-5x within seconds, so the phases run
interleaved in rounds (order rotated each round); per-round ratios show the
spread. Both ratios move with the disk (a slower fsync leaves more room for (c)
to overlap), so the store's own cost per append is printed too: "cost above (a)".

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


class RawFile:
    """One file held open; ``append`` writes the line and syncs it: ``os.fsync`` after
    each write, or with ``dsync`` an O_DSYNC descriptor whose every write is its sync."""

    def __init__(self, path: Path, line: bytes, *, dsync: bool = False) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | (os.O_DSYNC if dsync else 0), 0o644)
        self.line = line
        self.append = self._write if dsync else self._write_fsync

    def _write_fsync(self) -> None:
        os.write(self.fd, self.line)
        os.fsync(self.fd)

    def _write(self) -> None:
        os.write(self.fd, self.line)

    def close(self) -> None:
        os.close(self.fd)


class StoreSession:
    """One session of the store; ``append`` persists one message to it."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.session_id = new_session(store, "writer")
        self.turn_id = new_id("t")

    def append(self) -> None:
        self.store.append_message(self.session_id, self.turn_id, "user", [TextBlock(text=TEXT)])


class Writers:
    """Threads that live across rounds, each calling its ``append`` without pause while a
    round runs. ``run`` counts the appends finished inside a window of ``seconds`` that
    opens once every thread is inside its loop, so the figure is the rate with all of
    them at work, whatever their start and finish cost."""

    def __init__(self, appends: list[Callable[[], object]]) -> None:
        self.counts = [0] * len(appends)
        self.going = False
        self.closing = False
        self.errors: list[BaseException] = []
        self.started = 0
        self.started_lock = threading.Lock()
        self.all_started = threading.Event()
        self.start = threading.Barrier(len(appends) + 1)
        self.end = threading.Barrier(len(appends) + 1)
        self.threads = [threading.Thread(target=self._work, args=(i, a), daemon=True) for i, a in enumerate(appends)]
        for thread in self.threads:
            thread.start()

    def _work(self, i: int, append: Callable[[], object]) -> None:
        counts = self.counts
        while True:
            self.start.wait()
            if self.closing:
                return
            with self.started_lock:
                self.started += 1
                if self.started == len(counts):
                    self.all_started.set()
            try:
                while self.going:
                    append()
                    counts[i] += 1
            except BaseException as exc:  # reported by run(); the barrier must still be reached
                self.errors.append(exc)
            self.end.wait()

    def run(self, seconds: float) -> tuple[int, float]:
        """One round: (appends finished in the window, the window's length)."""
        self.started = 0
        self.all_started.clear()
        self.going = True
        self.start.wait()
        if not self.all_started.wait(timeout=60):
            raise RuntimeError("the writers did not all start within 60 s")
        before, began = sum(self.counts), time.perf_counter()
        time.sleep(seconds)  # the measured window: the writers run meanwhile
        after, ended = sum(self.counts), time.perf_counter()
        self.going = False
        self.end.wait()
        if self.errors:
            raise RuntimeError(f"a writer failed: {self.errors[0]!r}") from self.errors[0]
        return after - before, ended - began

    def close(self) -> None:
        self.closing = True
        self.start.wait()
        for thread in self.threads:
            thread.join()


def main() -> int:
    args = harness.parse_args(__doc__ or "")
    rounds, window = (4, 0.05) if args.quick else (10, 0.2)
    harness.header("durable append", args.quick)
    with harness.scratch("append") as tmp:
        store = Store(tmp / "data")
        line = sample_line("s_0123456789abcdef")
        files = [RawFile(tmp / "baseline.jsonl", line)]
        files += [RawFile(tmp / f"raw-{i}.jsonl", line) for i in range(WRITERS)]
        files += [RawFile(tmp / f"dsync-{i}.jsonl", line, dsync=True) for i in range(WRITERS)]
        phases = {
            "baseline": Writers([files[0].append]),
            "single": Writers([StoreSession(store).append]),
            "parallel": Writers([StoreSession(store).append for _ in range(WRITERS)]),
            "raw parallel": Writers([f.append for f in files[1 : 1 + WRITERS]]),
            "dsync parallel": Writers([f.append for f in files[1 + WRITERS :]]),
        }
        totals: dict[str, list[float]] = {name: [0, 0.0] for name in phases}
        per_round: dict[str, list[float]] = {name: [] for name in phases}
        try:
            for writers in phases.values():  # each writer opens its file; the store reads each session's seq
                writers.run(0.01)
            order = list(phases)
            for r in range(rounds):
                for name in order[r % len(order):] + order[: r % len(order)]:
                    count, seconds = phases[name].run(window)
                    totals[name][0] += count
                    totals[name][1] += seconds
                    per_round[name].append(count / seconds)
        finally:
            for writers in phases.values():
                writers.close()
            for f in files:
                f.close()
            store.close()
    counts = {name: int(count) for name, (count, _) in totals.items()}
    rate = {name: count / seconds for name, (count, seconds) in totals.items()}
    ratio_b = [s / b for s, b in zip(per_round["single"], per_round["baseline"], strict=True)]
    ratio_c = [p / s for p, s in zip(per_round["parallel"], per_round["single"], strict=True)]

    def spread(values: list[float]) -> str:
        return f"per round {min(values):.2f}–{max(values):.2f}, median {statistics.median(values):.2f}"

    print(f"  line {len(line)} bytes; {rounds} rounds of a {window * 1000:.0f} ms window a phase; appends counted: "
          + ", ".join(f"{name} {count:,}" for name, count in counts.items()))
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
