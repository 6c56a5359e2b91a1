"""Load soak (issue 7 item 6): many sessions for minutes against a real ``pidesk serve``, nothing lost.

A real ``pidesk serve --port 0 --no-open`` subprocess talks to the instant mock
model (``_mock_openai.py --policy load_mix``, its own process). Each session is
driven by a task of its own over one of ``--clients`` WebSockets, cycle after
cycle until ``--duration`` is over, in a seeded mix of:

* a prompt (``agent.prompt``) whose turn makes one Read or Bash call or none,
  permission mode auto;
* a slow prompt (its Bash call sleeps 0.3 s) with 1–3 ``agent.queue.push`` while it
  runs; the queue drains by itself, one queued turn after another;
* Plan mode (``session.setMode``): the model Reads, then calls SubmitPlan; the
  driver rejects with feedback (then revises, or goes back to Agent) or approves
  with a permission mode (ask, accept-edits or auto); the execution turn's Bash
  call then asks under ask/accept-edits and the driver allows it
  (``permissions.resolve``); the permission mode goes back to auto afterwards.

A probe client sends ``host.status`` and ``session.get`` at a steady rate and
records their round trips; the driver's own calls are timed too. The host's
VmRSS is sampled each second (and VmHWM read at the end). Checks:

* every connection (the probe's and each driver's) sees the event ``seq`` rise
  by exactly one — a gap is a lost event — and all end on the same seq;
* after the drain, each session's messages, paged with ``session.get``
  ``beforeSeq``, are exactly those its ``message.appended`` events announced
  (none missing, none unannounced, none twice, seqs 1..N), and each prompt and
  queued text is there exactly once;
* every plan submitted was resolved as the driver decided (``plans.list``), every
  approved execution completed, every permission request was answered once,
  every queued entry started as a queued turn, every turn ended ``completed``;
* the host is idle (``host.status``), healthy (``/healthz``) and alive.

    flock /tmp/pidesk-bench.lock .venv/bin/python bench/load_soak.py
          [--quick] [--sessions 200] [--duration 600] [--clients 2] [--seed 7] [--json PATH]

``--quick`` is 20 sessions for 20 s. Exit status 0 when every check held, 1
otherwise. The CI version, ``tests/server/test_load_soak.py``, runs ``soak`` below
at 20 sessions for ~10 s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import statistics
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import harness
from harness import Figure
from rpc_load import (
    RpcFailed,
    Server,
    Ws,
    cpu_seconds_busy,
    cpu_seconds_of,
    mock_openai,
    ms,
    pct,
    served,
    vm,
)
from websockets.asyncio.client import ClientConnection

PERMISSION_MODES = ("ask", "accept-edits", "auto")


@dataclass(frozen=True)
class SoakConfig:
    sessions: int = 200
    duration: float = 600.0  # seconds during which new cycles start
    clients: int = 2  # driver WebSockets; each drives sessions/clients sessions
    seed: int = 7
    probe_interval: float = 0.05  # the probe's steady rate: one call each 50 ms
    rss_interval: float = 1.0
    step_timeout: float = 120.0  # bound on any one wait inside a cycle
    drain_timeout: float = 180.0  # bound on finishing the cycles under way once the duration is over


class Stuck(Exception):
    """A wait inside a cycle passed its deadline."""


# ---- what each connection sees ------------------------------------------------------------


@dataclass
class SeqCheck:
    """The event ``seq`` one connection saw: it must rise by exactly one each time."""

    name: str
    first: int | None = None
    last: int | None = None
    count: int = 0
    gaps: int = 0  # seq jumped ahead: events lost
    missing: int = 0  # how many seqs the gaps skipped
    backwards: int = 0  # seq repeated or went down: events duplicated or reordered

    def see(self, seq: int) -> None:
        if self.first is None:
            self.first = seq
        elif self.last is not None and seq != self.last + 1:
            if seq > self.last:
                self.gaps += 1
                self.missing += seq - self.last - 1
            else:
                self.backwards += 1
        self.last = seq if self.last is None else max(self.last, seq)
        self.count += 1

    @property
    def span(self) -> int:
        return 0 if self.first is None or self.last is None else self.last - self.first + 1


def session_of(event: dict[str, Any]) -> str | None:
    for key in ("session", "request", "approval", "notification"):
        if isinstance(event.get(key), dict):
            inner = event[key]
            return inner.get("id") if key == "session" else inner.get("sessionId")
    return event.get("sessionId")


@dataclass
class View:
    """One session as its driver saw it through events, plus what the driver sent it."""

    sid: str
    status: str = "idle"
    mode: str = "agent"
    permission_mode: str = "auto"
    started: dict[str, str] = field(default_factory=dict)  # turn id -> origin
    ended: dict[str, dict[str, Any]] = field(default_factory=dict)  # turn id -> turn.ended
    queue: list[str] = field(default_factory=list)  # entry ids in the latest queue.changed
    approvals: dict[str, dict[str, Any]] = field(default_factory=dict)  # latest PlanApproval per id
    executions: dict[str, str] = field(default_factory=dict)  # approval id -> executionState
    permissions: dict[str, dict[str, Any]] = field(default_factory=dict)  # latest PermissionRequest per id
    announced: dict[str, int] = field(default_factory=dict)  # message id -> seq from message.appended
    announced_twice: int = 0
    plans_requested: int = 0
    plans_resolved_events: int = 0
    permissions_requested: int = 0
    permissions_resolved_events: int = 0
    # what the driver did
    texts: list[str] = field(default_factory=list)  # every prompt and queued text sent
    pushed: dict[str, str] = field(default_factory=dict)  # entry id -> text
    decisions: dict[str, str] = field(default_factory=dict)  # approval id -> "approved" / "rejected"
    last_plan: str | None = None  # the session's latest plan approval: the next one ``revises`` it
    answered: set[str] = field(default_factory=set)  # permission requests resolved
    news: asyncio.Event = field(default_factory=asyncio.Event)

    def apply(self, event: dict[str, Any]) -> None:
        kind = event["type"]
        if kind == "session.updated":
            session = event["session"]
            self.status, self.mode, self.permission_mode = (session["status"], session["mode"],
                                                            session["permissionMode"])
        elif kind == "turn.started":
            self.started[event["turnId"]] = event["origin"]
        elif kind == "turn.ended":
            self.ended[event["turnId"]] = event
        elif kind == "message.appended":
            message = event["message"]
            if message["id"] in self.announced:
                self.announced_twice += 1
            self.announced[message["id"]] = message["seq"]
        elif kind == "queue.changed":
            self.queue = [entry["id"] for entry in event["entries"]]
        elif kind in ("plan.requested", "plan.resolved"):
            approval = event["approval"]
            self.approvals[approval["id"]] = approval
            if kind == "plan.requested":
                self.plans_requested += 1
            else:
                self.plans_resolved_events += 1
        elif kind == "execution.changed":
            self.executions[event["approvalId"]] = event["executionState"]
        elif kind in ("permission.requested", "permission.resolved"):
            request = event["request"]
            self.permissions[request["id"]] = request
            if kind == "permission.requested":
                self.permissions_requested += 1
            else:
                self.permissions_resolved_events += 1
        self.news.set()

    def settled(self) -> bool:
        return self.status == "idle" and not self.queue and len(self.ended) >= len(self.started)


class Client(Ws):
    """A driver or probe connection: times every call, checks every event's seq, hands events on."""

    keep_events = False

    def __init__(self, ws: ClientConnection) -> None:
        super().__init__(ws)
        self.latency: dict[str, list[float]] = defaultdict(list)
        self.seq = SeqCheck("?")
        self.views: dict[str, View] = {}  # the sessions this connection drives
        self.errors: list[str] = []
        self.news: asyncio.Event | None = None  # set on every event (the end-of-run convergence wait)
        self.listeners.append(self._on_event)

    def _on_event(self, _arrival: float, event: dict[str, Any]) -> None:
        try:  # the reader swallows exceptions: report them instead
            self.seq.see(event["seq"])
            view = self.views.get(session_of(event) or "")
            if view is not None:
                view.apply(event)
            if self.news is not None:
                self.news.set()
        except Exception as exc:  # noqa: BLE001 — a malformed event is a finding, not a crash
            self.errors.append(f"{self.seq.name}: bad event {event!r:.200}: {exc!r}")

    async def call(self, method: str, params: dict[str, Any] | None = None) -> Any:
        start = time.perf_counter()
        try:
            return await super().call(method, params)
        finally:
            self.latency[method].append(time.perf_counter() - start)

    @property
    def alive(self) -> bool:
        return not self._reader.done()


# ---- the result -----------------------------------------------------------------------------


@dataclass
class SoakResult:
    config: SoakConfig
    seconds: float = 0.0  # first prompt → every cycle drained
    load_seconds: float = 0.0  # first prompt → the duration's end
    cycles: Counter[str] = field(default_factory=Counter)
    turns_started: Counter[str] = field(default_factory=Counter)  # by origin
    turns_ended: Counter[str] = field(default_factory=Counter)  # by reason/errorCode
    probe: dict[str, list[float]] = field(default_factory=dict)
    driver: dict[str, list[float]] = field(default_factory=dict)
    rss_kib: list[tuple[float, int, int]] = field(default_factory=list)  # (s since start, VmRSS, turns ended)
    hwm_kib: int = 0
    rss_parts: dict[str, int] = field(default_factory=dict)  # RssAnon / RssFile / RssShmem at the end, KiB
    host_cpu: float = 0.0
    tools_cpu: float = 0.0  # the host's reaped children: the Bash tool's processes
    driver_cpu: float = 0.0
    foreign_cpu: float = 0.0
    connections: list[SeqCheck] = field(default_factory=list)
    messages_checked: int = 0
    messages_missing: int = 0  # announced, not stored
    messages_unannounced: int = 0  # stored, never announced: a lost message.appended
    messages_duplicated: int = 0  # stored twice, or announced twice
    seq_mismatch: int = 0  # stored seq differs from the announced one, or seqs not 1..N
    texts_checked: int = 0
    texts_wrong: int = 0  # a prompt or queued text not stored exactly once
    plans_submitted: int = 0
    plans_approved: int = 0
    plans_rejected: int = 0
    plans_revised: int = 0
    plans_resolved_events: int = 0
    executions_completed: int = 0
    permissions_requested: int = 0
    permissions_resolved: int = 0
    permissions_resolved_events: int = 0
    queue_pushed: int = 0
    queue_pushed_while_running: int = 0
    queue_started: int = 0
    busy_retries: int = 0
    healthy: bool = False  # after the drain: host.status idle, /healthz ok, the process alive
    failures: list[str] = field(default_factory=list)

    @property
    def lost_events(self) -> int:
        return sum(c.missing for c in self.connections) + self.messages_unannounced

    @property
    def ok(self) -> bool:
        return not self.failures

    def fail(self, text: str) -> None:
        if len(self.failures) < 1000:
            self.failures.append(text)

    def rss_slope(self) -> float:
        """MB of VmRSS per 1,000 turns ended, fitted over the samples after the first tenth of the run:
        near 0 when memory levels off, steady when something is kept per turn."""
        points = [(turns, kib / 1024) for t, kib, turns in self.rss_kib if t >= self.seconds / 10]
        if len(points) < 3 or len({x for x, _ in points}) < 2:
            return 0.0
        return 1000 * statistics.linear_regression([x for x, _ in points], [y for _, y in points]).slope

    def probe_all(self) -> list[float]:
        return [t for times in self.probe.values() for t in times]

    def driver_all(self) -> list[float]:
        return [t for times in self.driver.values() for t in times]

    def figures(self) -> list[Figure]:
        cfg = self.config
        turns = sum(self.turns_ended.values())
        probe = self.probe_all() or [0.0]
        drive = self.driver_all() or [0.0]
        rss = [kib for _, kib, _ in self.rss_kib] or [0]
        after_min = next((f", after 1 min {kib / 1024:.0f}" for t, kib, _ in self.rss_kib if t >= 60), "")
        minutes = " ".join(f"{kib / 1024:.0f}" for t, kib, _ in self.rss_kib[::max(1, round(60 / cfg.rss_interval))])
        per_method = ", ".join(f"{m} {ms(pct(v, 99)):.0f}" for m, v in sorted(self.driver.items()) if v)
        events = sum(c.count for c in self.connections)
        return [
            Figure(f"{cfg.sessions} sessions for {cfg.duration:.0f} s: wall until drained", self.seconds, "s",
                   note=f"{sum(self.cycles.values())} cycles {dict(self.cycles)}"),
            Figure("turns completed per second", turns / max(self.seconds, 1e-9), "turns/s",
                   note=f"{turns} turns; started by origin {dict(self.turns_started)}; ended {dict(self.turns_ended)}"),
            Figure("probe RPC p50 (host.status + session.get)", ms(pct(probe, 50)), "ms",
                   note=f"{len(probe)} calls at one per {cfg.probe_interval * 1000:.0f} ms"),
            Figure("probe RPC p99", ms(pct(probe, 99)), "ms", 50, at_least=False,
                   note=f"host.status {ms(pct(self.probe.get('host.status') or [0], 99)):.0f}, session.get "
                        f"{ms(pct(self.probe.get('session.get') or [0], 99)):.0f}"),
            Figure("probe RPC max", ms(max(probe)), "ms"),
            Figure("driver RPC p50 / p99 / max (every call the driver made)", ms(pct(drive, 99)), "ms",
                   note=f"p50 {ms(pct(drive, 50)):.1f}, max {ms(max(drive)):.0f}; {len(drive)} calls; "
                        f"p99 by method: {per_method}; {self.busy_retries} AGENT_BUSY retries"),
            Figure("host RSS peak (VmHWM)", self.hwm_kib / 1024, "MB", 300, at_least=False,
                   note=f"VmRSS at start {rss[0] / 1024:.0f}{after_min}, "
                        f"max {max(rss) / 1024:.0f}, at the end {rss[-1] / 1024:.0f} MB ({len(rss)} samples: "
                        + ", ".join(f"{k} {v / 1024:.0f}" for k, v in self.rss_parts.items()) + " MB)"),
            Figure("host VmRSS growth per 1,000 turns (least squares, after the first 10 %)", self.rss_slope(), "MB",
                   note=f"VmRSS by minute: {minutes} MB"),
            Figure("host process CPU busy", self.host_cpu, "CPU",
                   note=f"its Bash tools {self.tools_cpu:.2f}, driver {self.driver_cpu:.2f} CPU; "
                        f"other processes {self.foreign_cpu:.2f} CPU (noise: rerun if well above 0)"),
            Figure("plans submitted / resolved", self.plans_submitted, "plans",
                   note=f"{self.plans_approved} approved, {self.plans_rejected} rejected ({self.plans_revised} then "
                        f"revised), {self.executions_completed} executions completed; "
                        f"{self.plans_resolved_events} plan.resolved events"),
            Figure("permission requests answered", self.permissions_resolved, "requests",
                   note=f"{self.permissions_requested} requested, {self.permissions_resolved_events} "
                        "permission.resolved events"),
            Figure("queue entries pushed / started as queued turns", self.queue_pushed, "entries",
                   note=f"{self.queue_started} started; {self.queue_pushed_while_running} pushed while a turn ran"),
            Figure("events checked (all connections)", events, "events",
                   note="; ".join(f"{c.name} {c.count}" for c in self.connections)),
            Figure("events lost (seq gaps + unannounced messages)", self.lost_events, "events", 0, at_least=False,
                   note=f"{sum(c.gaps for c in self.connections)} gaps, "
                        f"{sum(c.backwards for c in self.connections)} out of order"),
            Figure("messages checked against their announcements", self.messages_checked, "messages",
                   note=f"missing {self.messages_missing}, duplicated {self.messages_duplicated}, seq wrong "
                        f"{self.seq_mismatch}; {self.texts_checked} sent texts, {self.texts_wrong} not stored once"),
            Figure("failed checks", len(self.failures), "failures", 0, at_least=False),
        ]


# ---- the driver ---------------------------------------------------------------------------------


class Soak:
    def __init__(self, server: Server, project: Path, mock_pid: int, config: SoakConfig) -> None:
        self.server = server
        self.project = project
        self.mock_pid = mock_pid
        self.cfg = config
        self.result = SoakResult(config)
        self.clients: list[Client] = []
        self.probe: Client | None = None
        self.views: dict[str, View] = {}
        self.end_at = 0.0
        self.done = asyncio.Event()  # the drain is over: background samplers stop

    async def run(self) -> SoakResult:
        cfg, result = self.cfg, self.result
        news = asyncio.Event()
        try:
            for i in range(cfg.clients):
                client = await Client.open(self.server)
                assert isinstance(client, Client)
                client.seq.name, client.news = f"driver {i + 1}", news
                self.clients.append(client)
            probe = await Client.open(self.server)
            assert isinstance(probe, Client)
            probe.seq.name, probe.news = "probe", news
            self.probe = probe
            for i in range(cfg.sessions):
                client = self.clients[i % cfg.clients]
                session = await client.call("session.create", {
                    "projectPath": str(self.project), "permissionMode": "auto", "title": f"soak {i}"})
                view = View(session["id"])
                client.views[view.sid] = view
                self.views[view.sid] = view
            await self._drive()
            await self._converge(news)
            await self._verify()
        finally:
            for client in [*self.clients, *([self.probe] if self.probe else [])]:
                result.connections.append(client.seq)
                for error in client.errors:
                    result.fail(error)
                if not client.alive:
                    result.fail(f"{client.seq.name}: the WebSocket closed during the run")
                result_map = result.probe if client is self.probe else result.driver
                for method, times in client.latency.items():
                    result_map.setdefault(method, []).extend(times)
                with suppress(Exception):
                    await client.close()
        return result

    async def _drive(self) -> None:
        cfg, result = self.cfg, self.result
        pid = self.server.proc.pid
        begin = time.perf_counter()
        self.end_at = time.monotonic() + cfg.duration
        cpu0 = (cpu_seconds_busy(), cpu_seconds_of(pid), cpu_seconds_of(self.mock_pid), time.process_time(),
                children_cpu(pid))
        samplers = [asyncio.create_task(self._probing()), asyncio.create_task(self._sampling(begin))]
        tasks = [asyncio.create_task(self._session(client, view, random.Random(f"{cfg.seed}-{n}")))
                 for n, (client, view) in enumerate((c, v) for c in self.clients for v in c.views.values())]
        try:
            _done, pending = await asyncio.wait(tasks, timeout=cfg.duration + cfg.drain_timeout)
            if pending:
                result.fail(f"{len(pending)} sessions were still inside a cycle {cfg.drain_timeout:.0f} s after "
                            "the duration ended")
                for task in pending:
                    task.cancel()
                await asyncio.gather(*pending, return_exceptions=True)
            for task in tasks:
                if not task.cancelled() and task.exception() is not None:
                    result.fail(f"a session task crashed: {task.exception()!r}")
        finally:
            result.seconds = time.perf_counter() - begin
            result.load_seconds = min(result.seconds, cfg.duration)
            cpu1 = (cpu_seconds_busy(), cpu_seconds_of(pid), cpu_seconds_of(self.mock_pid), time.process_time(),
                    children_cpu(pid))
            self.done.set()
            await asyncio.gather(*samplers, return_exceptions=True)
        wall = max(result.seconds, 1e-9)
        result.host_cpu = (cpu1[1] - cpu0[1]) / wall
        result.driver_cpu = (cpu1[3] - cpu0[3]) / wall
        result.tools_cpu = (cpu1[4] - cpu0[4]) / wall
        ours = sum(cpu1[i] - cpu0[i] for i in (1, 2, 3, 4))
        result.foreign_cpu = max(0.0, (cpu1[0] - cpu0[0]) - ours) / wall
        result.hwm_kib = vm(pid, "VmHWM")
        result.rss_parts = {key: vm(pid, key) for key in ("RssAnon", "RssFile", "RssShmem")}

    async def _probing(self) -> None:
        assert self.probe is not None
        rng = random.Random(self.cfg.seed)
        sids = list(self.views)
        next_at = time.monotonic()
        calls = 0
        while not self.done.is_set():
            try:
                if calls % 2 == 0:
                    await self.probe.call("host.status")
                else:
                    await self.probe.call("session.get", {"sessionId": rng.choice(sids), "limit": 50})
            except (RpcFailed, TimeoutError, ConnectionError) as exc:
                self.result.fail(f"probe call failed: {exc!r}")
                return
            calls += 1
            next_at = max(next_at + self.cfg.probe_interval, time.monotonic())  # a steady rate, no catch-up burst
            with suppress(TimeoutError):
                async with asyncio.timeout(next_at - time.monotonic()):
                    await self.done.wait()

    async def _sampling(self, begin: float) -> None:
        pid = self.server.proc.pid
        while not self.done.is_set():
            turns = sum(len(view.ended) for view in self.views.values())
            self.result.rss_kib.append((time.perf_counter() - begin, vm(pid, "VmRSS"), turns))
            with suppress(TimeoutError):
                async with asyncio.timeout(self.cfg.rss_interval):
                    await self.done.wait()

    # ---- one session ------------------------------------------------------------------------

    async def _session(self, client: Client, view: View, rng: random.Random) -> None:
        cycle = 0
        while time.monotonic() < self.end_at:
            cycle += 1
            kind = rng.choices(("prompt", "queue", "plan"), weights=(4, 3, 3))[0]
            self.result.cycles[kind] += 1
            try:
                if kind == "prompt":
                    await self._prompt_cycle(client, view, rng, cycle)
                elif kind == "queue":
                    await self._queue_cycle(client, view, rng, cycle)
                else:
                    await self._plan_cycle(client, view, rng, cycle)
            except (RpcFailed, Stuck, TimeoutError, ConnectionError) as exc:
                code = getattr(exc, "code", None)
                self.result.fail(f"session {view.sid}, cycle {cycle} ({kind}): {type(exc).__name__} "
                                 f"{code or ''} {exc}".rstrip())
                return  # this session's state is unknown now; the others go on

    async def _until(self, client: Client, view: View, what: str, ready: Callable[[], bool]) -> None:
        """Wait for ``ready()`` on this session's events, answering its permission requests meanwhile."""
        deadline = time.monotonic() + self.cfg.step_timeout
        while True:
            asks = [r for r in view.permissions.values() if r["status"] == "pending" and r["id"] not in view.answered]
            if asks:
                for request in asks:
                    view.answered.add(request["id"])
                    await client.call("permissions.resolve", {
                        "requestId": request["id"], "sessionId": view.sid, "turnId": request["turnId"],
                        "decision": "allow"})
                    self.result.permissions_resolved += 1
                continue
            if ready():
                return
            view.news.clear()
            left = deadline - time.monotonic()
            try:
                if left <= 0:
                    raise TimeoutError
                async with asyncio.timeout(left):
                    await view.news.wait()
            except TimeoutError:
                raise Stuck(f"waited {self.cfg.step_timeout:.0f} s for {what}; the session is {view.status}, "
                            f"queue {len(view.queue)}, turns {len(view.started)} started / {len(view.ended)} "
                            f"ended; the host says: {await self._host_view(client, view)}") from None

    async def _host_view(self, client: Client, view: View) -> str:
        """What the host itself says of a stuck session: its row, newest turns and messages, waits."""
        try:
            got = await client.call("session.get", {"sessionId": view.sid, "limit": 4})
            turns = (await client.call("session.turns", {"sessionId": view.sid, "limit": 3}))["turns"]
        except (RpcFailed, TimeoutError, ConnectionError) as exc:
            return f"(could not ask: {exc!r})"
        session = got["session"]
        messages = [f"{m['seq']} {m['role']} " + ",".join(b.get("name") or b["type"] for b in m["content"])
                    for m in got["messages"]]
        turn = session.get("currentTurnId")
        return (f"status {session['status']}, currentTurnId {turn}, "
                f"turns {[(t['id'], t['origin'], t['state'], t.get('reason')) for t in turns]}, "
                f"last messages {messages}, queue {len(got['queue'])}, "
                f"pending permissions {len(got['pendingPermissions'])}, pending approval "
                f"{bool(got['pendingApproval'])}; its task awaits: {await self._turn_stack(turn)}")

    async def _turn_stack(self, turn_id: str | None) -> str:
        """Ask the server (SIGUSR1) what the turn's task awaits, and read the answer from its stderr."""
        path = self.server.stderr
        if turn_id is None or path is None or self.server.proc.poll() is not None:
            return "(no turn, or no server to ask)"
        start = path.stat().st_size
        os.kill(self.server.proc.pid, signal.SIGUSR1)
        for _ in range(100):  # bounded: the server answers within milliseconds
            with path.open("rb") as f:
                f.seek(start)
                dump = f.read().decode(errors="replace")
            if "pidesk: end of tasks" in dump:
                parts = dump.split(f"--- task turn {turn_id}\n")
                return parts[1].split("--- task ")[0].split("pidesk: end")[0].strip() if len(parts) > 1 else \
                    "(no task for it: the turn is not being driven)"
            await asyncio.sleep(0.05)
        return "(the server did not answer SIGUSR1)"

    async def _idle_call(self, client: Client, view: View, method: str, params: dict[str, Any]) -> Any:
        """A call that needs an idle session, made once events said it is idle. A host that is not
        done with the turn yet answers AGENT_BUSY; wait for the session's next event, then retry."""
        for _ in range(50):
            try:
                return await client.call(method, params)
            except RpcFailed as exc:
                if exc.code != "AGENT_BUSY":
                    raise
                self.result.busy_retries += 1
                view.news.clear()
                with suppress(TimeoutError):
                    async with asyncio.timeout(1.0):
                        await view.news.wait()
        raise Stuck(f"{method} stayed AGENT_BUSY on an idle session")

    async def _prompt(self, client: Client, view: View, text: str) -> str:
        view.texts.append(text)
        answer = await self._idle_call(client, view, "agent.prompt", {"sessionId": view.sid, "text": text})
        turn_id: str = answer["turnId"]
        return turn_id

    async def _prompt_cycle(self, client: Client, view: View, rng: random.Random, cycle: int) -> None:
        tag = rng.choice(("[read]", "[bash]", "[text]"))
        turn = await self._prompt(client, view, f"{tag} prompt {cycle} of {view.sid}")
        await self._until(client, view, f"turn {turn} to end", lambda: turn in view.ended and view.settled())

    async def _queue_cycle(self, client: Client, view: View, rng: random.Random, cycle: int) -> None:
        ended_before = len(view.ended)
        turn = await self._prompt(client, view, f"[slow] prompt {cycle} of {view.sid}")
        count = rng.randint(1, 3)
        for j in range(count):
            text = f"{rng.choice(('[read]', '[bash]', '[text]'))} queued {cycle}.{j} of {view.sid}"
            view.texts.append(text)
            running = turn not in view.ended
            entry = await client.call("agent.queue.push", {"sessionId": view.sid, "text": text})
            view.pushed[entry["entryId"]] = text
            self.result.queue_pushed += 1
            self.result.queue_pushed_while_running += running
        if rng.random() < 0.25:
            listed = await client.call("agent.queue.list", {"sessionId": view.sid})
            unknown = [e["id"] for e in listed["entries"] if e["id"] not in view.pushed]
            if unknown:
                self.result.fail(f"session {view.sid}: agent.queue.list holds entries never pushed: {unknown}")
        await self._until(client, view, f"the queue of {count} to drain",
                          lambda: len(view.ended) >= ended_before + 1 + count and view.settled())

    async def _plan_cycle(self, client: Client, view: View, rng: random.Random, cycle: int) -> None:
        await self._idle_call(client, view, "session.setMode", {"sessionId": view.sid, "mode": "plan"})
        await self._until(client, view, "plan mode", lambda: view.mode == "plan")
        for revision in range(3):  # bounded: at most two rejections, then an approval
            text = f"plan {cycle}.{revision} for {view.sid}: tidy the README"
            turn = await self._prompt(client, view, text)
            await self._until(client, view, f"turn {turn}'s plan", lambda: any(
                a["turnId"] == turn for a in view.approvals.values()) or turn in view.ended)
            approval = next((a for a in view.approvals.values() if a["turnId"] == turn), None)
            if approval is None:
                raise Stuck(f"turn {turn} ended ({view.ended[turn].get('reason')}) without submitting a plan")
            self.result.plans_submitted += 1
            if approval.get("revises") != view.last_plan:  # the session's previous plan, whatever its status
                self.result.fail(f"approval {approval['id']} revises {approval.get('revises')}, not {view.last_plan}")
            view.last_plan = approval["id"]
            params = {"approvalId": approval["id"], "sessionId": view.sid, "turnId": turn}
            if revision < 2 and rng.random() < 0.4:
                resolved = await client.call("plans.resolve", {
                    **params, "decision": "reject", "feedback": f"too vague; name the files ({cycle}.{revision})"})
                view.decisions[approval["id"]] = "rejected"
                self.result.plans_rejected += 1
                if resolved["status"] != "rejected":
                    self.result.fail(f"approval {approval['id']}: rejected, but its status is {resolved['status']}")
                await self._until(client, view, f"turn {turn} to end after a rejection",
                                  lambda: turn in view.ended and view.settled())
                if rng.random() < 0.5:
                    self.result.plans_revised += 1
                    continue
                await self._idle_call(client, view, "session.setMode", {"sessionId": view.sid, "mode": "agent"})
                await self._until(client, view, "agent mode", lambda: view.mode == "agent")
                return
            mode = rng.choice(PERMISSION_MODES)
            resolved = await client.call("plans.resolve", {**params, "decision": "approve", "permissionMode": mode})
            view.decisions[approval["id"]] = "approved"
            self.result.plans_approved += 1
            if resolved["status"] != "approved":
                self.result.fail(f"approval {approval['id']}: approved, but its status is {resolved['status']}")
            await self._until(client, view, f"the execution of {approval['id']}", lambda: view.executions.get(
                approval["id"]) in ("completed", "failed", "aborted", "interrupted") and view.settled())
            state = view.executions[approval["id"]]
            if state != "completed":
                self.result.fail(f"execution of {approval['id']} ended {state}")
            else:
                self.result.executions_completed += 1
            if view.mode != "agent" or view.permission_mode != mode:
                self.result.fail(f"after approval the session is {view.mode}/{view.permission_mode}, not agent/{mode}")
            if mode != "auto":
                await self._idle_call(client, view, "session.setPermissionMode",
                                      {"sessionId": view.sid, "permissionMode": "auto"})
                await self._until(client, view, "permission mode auto", lambda: view.permission_mode == "auto")
            return

    # ---- after the drain ---------------------------------------------------------------------

    async def _converge(self, news: asyncio.Event) -> None:
        """Every connection must reach the same last seq (all events are out by now)."""
        connections = [*self.clients, *([self.probe] if self.probe else [])]
        deadline = time.monotonic() + 30
        while True:
            last = max((c.seq.last or 0) for c in connections)
            behind = [c.seq.name for c in connections if (c.seq.last or 0) < last]
            if not behind:
                break
            news.clear()
            try:
                async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                    await news.wait()
            except TimeoutError:
                self.result.fail(f"{behind} never received the events up to seq {last}")
                break
        for c in connections:
            if c.seq.count != c.seq.span:
                self.result.fail(f"{c.seq.name}: {c.seq.count} events over seqs {c.seq.first}..{c.seq.last}")

    async def _verify(self) -> None:
        result = self.result
        client = self.clients[0]
        for view in self.views.values():
            result.turns_started.update(view.started.values())
            result.turns_ended.update(e.get("errorCode") or e["reason"] for e in view.ended.values())
            result.queue_started += sum(1 for origin in view.started.values() if origin == "queued")
            result.plans_resolved_events += view.plans_resolved_events
            result.permissions_requested += view.permissions_requested
            result.permissions_resolved_events += view.permissions_resolved_events
            result.messages_duplicated += view.announced_twice
        semaphore = asyncio.Semaphore(8)

        async def one(view: View) -> None:
            async with semaphore:
                await self._verify_session(client, view)

        await asyncio.gather(*(one(view) for view in self.views.values()))
        if set(result.turns_ended) - {"completed"}:
            result.fail(f"turns ended otherwise than completed: {dict(result.turns_ended)}")
        started, ended = sum(result.turns_started.values()), sum(result.turns_ended.values())
        if started != ended:
            result.fail(f"{started} turns started, {ended} ended")
        if result.queue_started != result.queue_pushed:
            result.fail(f"{result.queue_pushed} entries pushed, {result.queue_started} queued turns started")
        resolved = result.plans_approved + result.plans_rejected
        if not result.plans_submitted == resolved == result.plans_resolved_events:
            result.fail(f"{result.plans_submitted} plans submitted, {resolved} resolved, "
                        f"{result.plans_resolved_events} plan.resolved events")
        if not result.permissions_requested == result.permissions_resolved == result.permissions_resolved_events:
            result.fail(f"{result.permissions_requested} permission requests, {result.permissions_resolved} "
                        f"answered, {result.permissions_resolved_events} permission.resolved events")
        status = await client.call("host.status")
        idle = (status["sessions"], status["running"], status["pendingApprovals"], status["queued"]) == (
            len(self.views), 0, 0, 0)
        if not idle:
            result.fail(f"host.status after the drain: {status}")
        health = await healthz(self.server)
        if not health:
            result.fail("/healthz did not answer ok after the run")
        alive = self.server.proc.poll() is None
        if not alive:
            result.fail(f"pidesk serve exited {self.server.proc.returncode} during the run")
        result.healthy = idle and health and alive

    async def _verify_session(self, client: Client, view: View) -> None:
        result = self.result
        messages: list[dict[str, Any]] = []
        before: int | None = None
        page: dict[str, Any] = {}
        for _ in range(10_000):  # bounded paging, newest page first
            params: dict[str, Any] = {"sessionId": view.sid, "limit": 200}
            if before is not None:
                params["beforeSeq"] = before
            page = await client.call("session.get", params)
            messages = page["messages"] + messages
            if not page["hasMore"] or not page["messages"]:
                break
            before = page["messages"][0]["seq"]
            if before is None or before <= 1:
                break
        stored = {m["id"]: m["seq"] for m in messages}
        seqs = [m["seq"] for m in messages]
        result.messages_checked += len(messages)
        result.messages_duplicated += len(messages) - len(stored)
        missing = view.announced.keys() - stored.keys()
        unannounced = stored.keys() - view.announced.keys()
        wrong = sum(1 for mid, seq in stored.items() if mid in view.announced and view.announced[mid] != seq)
        if seqs != list(range(1, len(seqs) + 1)):
            wrong += 1
        result.messages_missing += len(missing)
        result.messages_unannounced += len(unannounced)
        result.seq_mismatch += wrong
        if missing or unannounced or wrong or len(messages) != len(stored):
            result.fail(f"session {view.sid}: {len(missing)} announced messages missing, {len(unannounced)} never "
                        f"announced, {wrong} seq mismatches, {len(messages) - len(stored)} duplicated")
        said = Counter(block.get("text") for m in messages if m["role"] == "user"
                       for block in m["content"] if block.get("type") == "text")
        result.texts_checked += len(view.texts)
        wrong_texts = [t for t in view.texts if said[t] != 1]
        result.texts_wrong += len(wrong_texts)
        if wrong_texts:
            result.fail(f"session {view.sid}: {len(wrong_texts)} sent texts not stored exactly once, "
                        f"e.g. {wrong_texts[0]!r} ×{said[wrong_texts[0]]}")
        session = page.get("session") or {}
        if (session.get("status"), page.get("queue"), page.get("pendingApproval"), page.get("pendingPermissions")) \
                != ("idle", [], None, []):
            result.fail(f"session {view.sid} is not at rest: {session.get('status')}, queue {page.get('queue')}, "
                        f"approval {page.get('pendingApproval')}, permissions {page.get('pendingPermissions')}")
        approvals = (await client.call("plans.list", {"sessionId": view.sid}))["approvals"]
        got = {a["id"]: a["status"] for a in approvals}
        if got != view.decisions:
            result.fail(f"session {view.sid}: plans.list {got} != the driver's decisions {view.decisions}")
        for approval in approvals:
            expected = "completed" if approval["status"] == "approved" else "none"
            if approval["executionState"] != expected:
                result.fail(f"approval {approval['id']} ({approval['status']}): execution "
                            f"{approval['executionState']}, expected {expected}")


def children_cpu(pid: int) -> float:
    """cutime + cstime of one process: the CPU of its children it has reaped (0 if it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")


async def healthz(server: Server) -> bool:
    try:
        async with asyncio.timeout(10):
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\nConnection: close\r\n\r\n"
                         .encode())
            answer = await reader.read()
            writer.close()
    except (OSError, TimeoutError):
        return False
    head, _, body = answer.partition(b"\r\n\r\n")
    return head.startswith(b"HTTP/1.1 200") and json.loads(body or b"{}").get("ok") is True


# ---- processes --------------------------------------------------------------------------------


@contextmanager
def soak_host(scratch: Path) -> Iterator[tuple[Server, Path, int]]:
    """A project, the mock model (``load_mix``) and ``pidesk serve`` on it; all stopped afterwards."""
    project = scratch / "project"
    project.mkdir()
    (project / "README.md").write_text("# soak project\n\nA small file for the Read tool.\n")
    with mock_openai(scratch, "load_mix") as (base_url, mock_pid):
        extra = {"OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": "x"}
        with served(scratch, scratch / "data", "openai/mock", extra) as server:
            yield server, project, mock_pid


def soak(scratch: Path, config: SoakConfig) -> tuple[SoakResult, Server]:
    """Start the processes in ``scratch``, run the soak, stop them; the result and the (stopped) server."""
    with soak_host(scratch) as (server, project, mock_pid):
        print(f"  pidesk serve pid {server.proc.pid} at {server.url}; mock model pid {mock_pid}", flush=True)
        result = asyncio.run(Soak(server, project, mock_pid, config).run())
    return result, server


def main() -> int:
    def options(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--sessions", type=int, default=0, help="sessions at once (200; 20 with --quick)")
        parser.add_argument("--duration", type=float, default=0, help="seconds of load (600; 20 with --quick)")
        parser.add_argument("--clients", type=int, default=2, help="driver WebSockets (besides the probe)")
        parser.add_argument("--seed", type=int, default=7)

    args = harness.parse_args(__doc__ or "", options)
    config = SoakConfig(sessions=args.sessions or (20 if args.quick else 200),
                        duration=args.duration or (20.0 if args.quick else 600.0),
                        clients=args.clients, seed=args.seed)
    harness.header(f"load_soak — {config.sessions} sessions for {config.duration:.0f} s against pidesk serve",
                   args.quick)
    signal.signal(signal.SIGTERM, _interrupt)  # a SIGTERM unwinds like Ctrl+C: every process we started is stopped
    with harness.scratch("load_soak") as scratch:
        result, _ = soak(scratch, config)
    harness.report("load_soak", result.figures(), args.json)
    for failure in result.failures[:30]:
        print(f"  FAILED: {failure}")
    if len(result.failures) > 30:
        print(f"  … and {len(result.failures) - 30} more failures")
    print(f"  {'ok' if result.ok else 'FAILED'}: {len(result.failures)} failed checks, {result.lost_events} events lost")
    return 0 if result.ok else 1


def _interrupt(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    raise SystemExit(main())
