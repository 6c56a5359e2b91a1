"""The protocol server under load (issue 4's figures), against a real ``pidesk serve`` subprocess.

Every figure talks to the host over loopback only, as an outside client would:

(a) RPC round trip, one request at a time: ``host.status`` and ``session.get``
    over one WebSocket; ``host.status`` over HTTP POST, on a kept-alive
    connection and on a fresh connection per request (what ``pidesk``'s own
    thin commands do).
(b) Event fan-out: 10 WebSocket clients listen while an 11th calls
    ``session.create``; per client, the delay from sending the call to receiving
    that session's ``session.updated``, and the spread between the first and
    the last client to get each event.
(c) 200 sessions at once against an instant mock model (``_mock_openai`` in its
    own process, or ``--model scripted``): each runs TURNS prompts, each turn one
    Read call then a text answer, permission mode auto, driven over one
    WebSocket. A probe client meanwhile measures ``host.status`` /
    ``session.get`` round trips, and checks that the events it received have a
    gapless ``seq``. Host RSS: VmHWM of the server process. Also printed: how
    busy the host process was, and how much CPU other processes used meanwhile
    (/proc/stat less the host, the mock and this script) — rerun if that is high.
(d) ``pidesk --help`` wall time and ``pidesk serve`` time to ready (process
    start → the announced line) on an empty store.

    .venv/bin/python bench/rpc_load.py [--quick] [--model openai|scripted] [--sessions 200] [--turns 3]
                                 [--only abcd] [--wait-idle 300]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import select
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import harness
from harness import Figure
from websockets.asyncio.client import ClientConnection, connect

EXE = Path(sys.executable).parent / "pidesk"
PIDESK = [str(EXE)] if EXE.exists() else [sys.executable, "-m", "pidesk"]
MOCK = harness.BENCH_DIR / "_mock_openai.py"
CALL_TIMEOUT = 30.0
LOAD_TIMEOUT = 600.0


def ms(seconds: float) -> float:
    return seconds * 1000


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(p / 100 * len(ordered)) - 1))]


# ---- processes --------------------------------------------------------------------------


def clean_env(scratch: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIDESK_", "OPENAI_", "ANTHROPIC_"))}
    env["XDG_CONFIG_HOME"] = str(scratch / "xdg")  # no user config file
    env.update(extra or {})
    return env


def read_line(proc: subprocess.Popen[bytes], timeout: float) -> bytes:
    """The first line of ``proc``'s stdout, or b"" if it exits or stays silent for ``timeout``."""
    assert proc.stdout is not None
    deadline = time.perf_counter() + timeout
    line = b""
    while not line.endswith(b"\n"):
        left = deadline - time.perf_counter()
        if left <= 0 or not select.select([proc.stdout], [], [], left)[0]:
            return b""
        chunk = os.read(proc.stdout.fileno(), 4096)
        if not chunk:
            return b""
        line += chunk
    return line


def stop(proc: subprocess.Popen[bytes]) -> int | None:
    """SIGTERM, then kill if it lingers — only processes this script started, by their handle."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    for stream in (proc.stdin, proc.stdout):
        if stream is not None:
            stream.close()
    return proc.returncode


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    url: str
    token: str
    started: float
    ready: float
    stderr: Path | None = None  # where the server's stderr goes (SIGUSR1 writes its tasks' stacks there)

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])


@contextmanager
def served(scratch: Path, data_dir: Path, model: str | None, env_extra: dict[str, str] | None = None,
           ) -> Iterator[Server]:
    argv = [*PIDESK, "serve", "--port", "0", "--no-open", "--data-dir", str(data_dir)]
    if model is not None:
        argv += ["--model", model]
    err = (scratch / "serve.err").open("wb")
    started = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, env=clean_env(scratch, env_extra))
    try:
        line = read_line(proc, 30).decode().strip()
        ready = time.perf_counter()
        prefix = "pidesk serving at "
        if not line.startswith(prefix):
            raise RuntimeError(f"pidesk serve did not announce itself ({line!r}): "
                               f"{(scratch / 'serve.err').read_text()[-2000:]}")
        base, _, query = line[len(prefix):].partition("/?token=")
        yield Server(proc, base, query.split("&")[0], started, ready, scratch / "serve.err")
    finally:
        code = stop(proc)
        err.close()
        if code not in (0, None):
            print(f"  note: pidesk serve exited {code}: {(scratch / 'serve.err').read_text()[-1000:]}")


@contextmanager
def mock_openai(scratch: Path, policy: str = "read_then_answer") -> Iterator[tuple[str, int]]:
    """``_mock_openai`` in its own process (so its work is not this script's); yields its base URL and pid."""
    err = (scratch / "mock.err").open("wb")
    proc = subprocess.Popen([sys.executable, str(MOCK), "--policy", policy], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=err)
    try:
        url = read_line(proc, 20).decode().strip()
        if not url.startswith("http://127.0.0.1:"):
            raise RuntimeError(f"the mock did not start: {(scratch / 'mock.err').read_text()[-1000:]}")
        yield url, proc.pid
    finally:
        assert proc.stdin is not None
        proc.stdin.close()  # its signal to stop
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()
        err.close()


def cpu_seconds_busy() -> float:
    """CPU seconds all processes have been busy since boot (Linux /proc/stat)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")  # less idle and iowait


def cpu_seconds_of(pid: int) -> float:
    """utime + stime of one process (0 if it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def vm(pid: int, key: str) -> int:
    """A ``Vm*`` line of /proc/<pid>/status, in KiB (0 if gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


# ---- clients ----------------------------------------------------------------------------


class RpcFailed(Exception):
    def __init__(self, error: dict[str, Any]) -> None:
        super().__init__(error.get("message"))
        self.code = (error.get("data") or {}).get("code")


class Ws:
    """A JSON-RPC client over one WebSocket; every event is kept with its arrival time
    (unless ``keep_events`` is false: a long run hands them to its listeners only)."""

    keep_events = True

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.events: list[tuple[float, dict[str, Any]]] = []
        self.listeners: list[Any] = []  # callables (arrival, params), run by the reader
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._reader = asyncio.create_task(self._read())

    @classmethod
    async def open(cls, server: Server) -> Ws:
        ws = await connect(f"ws://127.0.0.1:{server.port}/rpc", additional_headers={
            "Authorization": f"Bearer {server.token}"}, max_size=None, compression=None, open_timeout=10,
            proxy=None)
        return cls(ws)

    async def _read(self) -> None:
        with suppress(Exception):
            async for raw in self.ws:
                now = time.perf_counter()
                message = json.loads(raw)
                if isinstance(message, list):  # a batch's answers: the batch is known by its first id
                    future = self._pending.pop(message[0].get("id") if message else None, None)
                    if future is not None and not future.done():
                        future.set_result({"batch": message})
                    continue
                if message.get("method") == "event":
                    if self.keep_events:
                        self.events.append((now, message["params"]))
                    for listener in self.listeners:
                        listener(now, message["params"])
                    continue
                future = self._pending.pop(message.get("id"), None)
                if future is not None and not future.done():
                    future.set_result(message)
        for future in self._pending.values():
            if not future.done():
                future.set_exception(ConnectionError("the WebSocket closed"))

    async def call(self, method: str, params: dict[str, Any] | None = None) -> Any:
        rid = next(self._ids)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[rid] = future
        await self.ws.send(json.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params or {}}))
        async with asyncio.timeout(CALL_TIMEOUT):
            answer = await future
        if "error" in answer:
            raise RpcFailed(answer["error"])
        return answer["result"]

    async def call_batch(self, calls: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
        """One batch frame of ``calls``; its answers (results and errors alike), in order."""
        ids = [next(self._ids) for _ in calls]
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[ids[0]] = future
        await self.ws.send(json.dumps([{"jsonrpc": "2.0", "id": rid, "method": method, "params": params}
                                       for rid, (method, params) in zip(ids, calls, strict=True)]))
        async with asyncio.timeout(CALL_TIMEOUT):
            answers: list[dict[str, Any]] = (await future)["batch"]
        return answers

    async def timed(self, method: str, params: dict[str, Any] | None = None) -> float:
        start = time.perf_counter()
        await self.call(method, params)
        return time.perf_counter() - start

    async def close(self) -> None:
        await self.ws.close()
        self._reader.cancel()
        with suppress(asyncio.CancelledError):
            await self._reader


class Http:
    """A minimal HTTP/1.1 JSON-RPC client: kept-alive, or a fresh connection per request."""

    def __init__(self, server: Server, keep_alive: bool) -> None:
        self.server = server
        self.keep_alive = keep_alive
        self._conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def call(self, method: str, params: dict[str, Any] | None = None) -> Any:
        body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params or {}}).encode()
        if self._conn is None:
            self._conn = await asyncio.open_connection("127.0.0.1", self.server.port)
        reader, writer = self._conn
        writer.write(f"POST /rpc HTTP/1.1\r\nHost: 127.0.0.1:{self.server.port}\r\n"
                     f"Authorization: Bearer {self.server.token}\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(body)}\r\nConnection: {'keep-alive' if self.keep_alive else 'close'}"
                     "\r\n\r\n".encode() + body)
        async with asyncio.timeout(CALL_TIMEOUT):
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length:"))
            answer = json.loads(await reader.readexactly(length))
        if not self.keep_alive:
            writer.close()
            self._conn = None
        if not head.startswith(b"HTTP/1.1 200") or "error" in answer:
            raise RuntimeError(f"HTTP RPC failed: {head[:40]!r} {answer}")
        return answer["result"]

    async def timed(self, method: str) -> float:
        start = time.perf_counter()
        await self.call(method)
        return time.perf_counter() - start

    def close(self) -> None:
        if self._conn is not None:
            self._conn[1].close()


# ---- (a) round trips ----------------------------------------------------------------------


async def round_trips(server: Server, project: Path, count: int) -> list[Figure]:
    ws = await Ws.open(server)
    try:
        session = await ws.call("session.create", {"projectPath": str(project), "permissionMode": "auto"})
        for _ in range(50):  # warm-up
            await ws.call("host.status")
        status = [await ws.timed("host.status") for _ in range(count)]
        get = [await ws.timed("session.get", {"sessionId": session["id"]}) for _ in range(count)]
    finally:
        await ws.close()
    figures = [
        Figure("(a) WS host.status round trip p50", ms(pct(status, 50)), "ms"),
        Figure("(a) WS host.status round trip p99", ms(pct(status, 99)), "ms"),
        Figure("(a) WS session.get round trip p50", ms(pct(get, 50)), "ms"),
        Figure("(a) WS session.get round trip p99", ms(pct(get, 99)), "ms"),
    ]
    for keep_alive in (True, False):
        http = Http(server, keep_alive)
        try:
            for _ in range(20):
                await http.call("host.status")
            times = [await http.timed("host.status") for _ in range(max(100, count // 4))]
        finally:
            http.close()
        how = "kept-alive connection" if keep_alive else "new connection each"
        figures += [Figure(f"(a) HTTP POST host.status p50, {how}", ms(pct(times, 50)), "ms"),
                    Figure(f"(a) HTTP POST host.status p99, {how}", ms(pct(times, 99)), "ms")]
    return figures


# ---- (b) fan-out --------------------------------------------------------------------------


async def fan_out(server: Server, project: Path, listeners: int, count: int) -> list[Figure]:
    clients = [await Ws.open(server) for _ in range(listeners)]
    trigger = await Ws.open(server)
    delays: list[float] = []
    spreads: list[float] = []
    replies: list[float] = []
    try:
        for i in range(count):
            sent = time.perf_counter()
            session = await trigger.call("session.create", {"projectPath": str(project), "title": f"fan {i}"})
            replies.append(time.perf_counter() - sent)
            arrivals = []
            async with asyncio.timeout(CALL_TIMEOUT):
                for client in clients:
                    while True:
                        got = next((t for t, e in client.events if e["type"] == "session.updated"
                                    and e["session"]["id"] == session["id"]), None)
                        if got is not None:
                            break
                        await asyncio.sleep(0.0005)
                    arrivals.append(got)
            delays += [t - sent for t in arrivals]
            spreads.append(max(arrivals) - min(arrivals))
            for client in clients:
                client.events.clear()
    finally:
        for client in [*clients, trigger]:
            await client.close()
    return [
        Figure(f"(b) fan-out to {listeners} WS clients: call → event p50", ms(pct(delays, 50)), "ms",
               note=f"session.create answered in {ms(statistics.median(replies)):.1f} ms (median)"),
        Figure(f"(b) fan-out to {listeners} WS clients: call → event p99", ms(pct(delays, 99)), "ms"),
        Figure("(b) fan-out: first → last client spread p50", ms(pct(spreads, 50)), "ms"),
        Figure("(b) fan-out: first → last client spread p99", ms(pct(spreads, 99)), "ms"),
    ]


# ---- (c) many sessions ----------------------------------------------------------------------


@dataclass
class Load:
    turns_done: int = 0
    reasons: dict[str, int] = field(default_factory=dict)
    busy_retries: int = 0
    probe: list[float] = field(default_factory=list)  # every probe round trip during the load
    probe_status: list[float] = field(default_factory=list)
    probe_get: list[float] = field(default_factory=list)
    rss_samples: list[int] = field(default_factory=list)
    seconds: float = 0.0


def gaps_in(seqs: list[int]) -> int:
    return sum(1 for a, b in zip(seqs, seqs[1:]) if b != a + 1)


async def many_sessions(server: Server, project: Path, sessions: int, turns: int, mock_pid: int
                        ) -> tuple[Load, list[Figure]]:
    driver = await Ws.open(server)
    probe = await Ws.open(server)
    load = Load()
    try:
        ids = [(await driver.call("session.create", {"projectPath": str(project), "permissionMode": "auto",
                                                      "title": f"load {i}"}))["id"] for i in range(sessions)]
        remaining = {sid: turns for sid in ids}
        finished = asyncio.Event()
        tasks: set[asyncio.Task[None]] = set()

        async def prompt(sid: str) -> None:
            for _ in range(200):  # bounded: AGENT_BUSY just after turn.ended is retried a little later
                try:
                    await driver.call("agent.prompt", {"sessionId": sid, "text": "read the README"})
                    return
                except RpcFailed as exc:
                    if exc.code != "AGENT_BUSY":
                        raise
                    load.busy_retries += 1
                    await asyncio.sleep(0.01)
            raise RuntimeError(f"session {sid} stayed busy")

        def start(sid: str) -> None:
            remaining[sid] -= 1
            task = asyncio.create_task(prompt(sid))
            tasks.add(task)
            task.add_done_callback(tasks.discard)

        def on_event(_arrival: float, event: dict[str, Any]) -> None:
            if event["type"] != "turn.ended" or event.get("sessionId") not in remaining:
                return
            load.turns_done += 1
            load.reasons[event["reason"]] = load.reasons.get(event["reason"], 0) + 1
            sid = event["sessionId"]
            if remaining[sid] > 0:
                start(sid)
            elif load.turns_done >= sessions * turns:
                finished.set()

        driver.listeners.append(on_event)
        probe.events.clear()
        begin = time.perf_counter()

        async def probing() -> None:
            rng = random.Random(7)
            while not finished.is_set():
                took = await probe.timed("host.status")
                load.probe_status.append(took)
                took2 = await probe.timed("session.get", {"sessionId": rng.choice(ids), "limit": 50})
                load.probe_get.append(took2)
                await asyncio.sleep(0.01)

        async def sampling() -> None:
            while not finished.is_set():
                load.rss_samples.append(vm(server.proc.pid, "VmRSS"))
                await asyncio.sleep(0.25)

        ours = (server.proc.pid, mock_pid) if mock_pid else (server.proc.pid,)
        cpu_before = cpu_seconds_busy(), sum(cpu_seconds_of(p) for p in ours), time.process_time()
        host_before = cpu_seconds_of(server.proc.pid)
        background = [asyncio.create_task(probing()), asyncio.create_task(sampling())]
        for sid in ids:
            start(sid)
        try:
            async with asyncio.timeout(LOAD_TIMEOUT):
                await finished.wait()
        except TimeoutError:
            raise RuntimeError(f"the load did not finish in {LOAD_TIMEOUT:.0f} s: {load.turns_done} of "
                               f"{sessions * turns} turns ended") from None
        load.seconds = time.perf_counter() - begin
        cpu_after = cpu_seconds_busy(), sum(cpu_seconds_of(p) for p in ours), time.process_time()
        host_busy = (cpu_seconds_of(server.proc.pid) - host_before) / load.seconds
        foreign = max(0.0, (cpu_after[0] - cpu_before[0]) - (cpu_after[1] - cpu_before[1])
                      - (cpu_after[2] - cpu_before[2])) / load.seconds
        for task in background:
            await task
        await asyncio.gather(*tasks)
        hwm = vm(server.proc.pid, "VmHWM")
        probe_seqs = [e["seq"] for _, e in probe.events]
        driver_seqs = [e["seq"] for _, e in driver.events]
        status = load.probe_status
        get = load.probe_get
        both = status + get
        figures = [
            Figure(f"(c) {sessions} sessions × {turns} turns: wall", load.seconds, "s",
                   note=f"{load.turns_done / load.seconds:.0f} turns/s, host process {host_busy:.2f} CPU busy, "
                        f"reasons {load.reasons}, {load.busy_retries} AGENT_BUSY retries"),
            Figure("(c) probe RPC p99 during the load (host.status + session.get)", ms(pct(both, 99)), "ms", 50,
                   at_least=False, note=f"{len(both)} calls; p50 {ms(pct(both, 50)):.1f} ms, max {ms(max(both)):.0f} ms"),
            Figure("(c) probe host.status p99", ms(pct(status, 99)), "ms"),
            Figure("(c) probe session.get p99", ms(pct(get, 99)), "ms"),
            Figure("(c) host RSS peak (VmHWM)", hwm / 1024, "MB", 300, at_least=False,
                   note=f"VmRSS at the end {vm(server.proc.pid, 'VmRSS') / 1024:.0f} MB"),
            Figure("(c) other processes' CPU during the load", foreign, "CPU",
                   note="noise indicator: rerun if well above 0"),
            Figure("(c) seq gaps seen by the probe / the driver", gaps_in(probe_seqs) + gaps_in(driver_seqs),
                   "gaps", 0, at_least=False, note=f"{len(probe_seqs)} and {len(driver_seqs)} events"),
        ]
        return load, figures
    finally:
        await driver.close()
        await probe.close()


# ---- (d) start-up ---------------------------------------------------------------------------


def startup(scratch: Path, helps: int, serves: int) -> list[Figure]:
    env = clean_env(scratch)
    help_times = []
    for _ in range(helps + 1):
        start = time.perf_counter()
        subprocess.run([*PIDESK, "--help"], env=env, stdout=subprocess.DEVNULL, check=True, timeout=30)
        help_times.append(time.perf_counter() - start)
    ready = []
    for i in range(serves + 1):
        with served(scratch, scratch / f"empty-{i}", None) as server:
            ready.append(server.ready - server.started)
    return [
        Figure("(d) pidesk --help wall, median", ms(statistics.median(help_times[1:])), "ms", 150, at_least=False,
               note=f"of {helps}, after one warm-up"),
        Figure("(d) pidesk serve: start → announced, empty store, median", ms(statistics.median(ready[1:])), "ms",
               note=f"of {serves}, after one warm-up; each its own new data dir"),
    ]


# ---- main -------------------------------------------------------------------------------------


def main() -> int:
    def options(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--model", choices=("openai", "scripted"), default="openai",
                            help="(c)'s instant model: the mock OpenAI server (default) or a scripted one")
        parser.add_argument("--sessions", type=int, default=0, help="(c) sessions at once (200; 20 with --quick)")
        parser.add_argument("--turns", type=int, default=0, help="(c) prompts per session (3; 1 with --quick)")
        parser.add_argument("--only", default="abcd", help="which parts to run, e.g. 'c'")
        parser.add_argument("--wait-idle", type=float, default=0, metavar="S",
                            help="before each part, wait up to S seconds for the CPUs to be ≤15%% busy")

    args = harness.parse_args(__doc__ or "", options)
    harness.header(f"rpc_load — pidesk serve over loopback ((c) model: {args.model})", args.quick)
    sessions = args.sessions or (20 if args.quick else 200)
    turns = args.turns or (1 if args.quick else 3)
    figures: list[Figure] = []
    with harness.scratch("rpc_load") as scratch:
        project = scratch / "project"
        project.mkdir()
        (project / "README.md").write_text("# bench project\n\nA small file for the Read tool.\n")
        def settle() -> None:
            if args.wait_idle:
                print(f"  {harness.wait_for_quiet(args.wait_idle)}", flush=True)

        if "d" in args.only:
            settle()
            figures += startup(scratch, 3 if args.quick else 10, 2 if args.quick else 5)
        if set(args.only) & set("abc"):
            script = scratch / "instant.json"
            script.write_text(json.dumps({"responses": [
                r for _ in range(turns) for r in (
                    {"toolCalls": [{"name": "Read", "args": {"path": "README.md"}}]}, {"text": "Read it; all good."})
            ]}))
            with (mock_openai(scratch) if args.model == "openai" else _no_mock()) as (base_url, mock_pid):
                model = "openai/mock" if args.model == "openai" else f"scripted/{script}"
                extra = {"OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": "x"} if base_url else {}
                settle()
                with served(scratch, scratch / "data", model, extra) as server:
                    print(f"  pidesk serve pid {server.proc.pid} at {server.url}; ready in "
                          f"{ms(server.ready - server.started):.0f} ms")

                    async def drive() -> None:
                        if "a" in args.only:
                            figures.extend(await round_trips(server, project, 200 if args.quick else 2000))
                        if "b" in args.only:
                            await asyncio.to_thread(settle)
                            figures.extend(await fan_out(server, project, 10, 30 if args.quick else 200))
                        if "c" in args.only:
                            await asyncio.to_thread(settle)
                            _, found = await many_sessions(server, project, sessions, turns, mock_pid)
                            figures.extend(found)

                    asyncio.run(drive())
    return harness.report("rpc_load", figures, args.json)


@contextmanager
def _no_mock() -> Iterator[tuple[str, int]]:
    yield "", 0


if __name__ == "__main__":
    raise SystemExit(main())
