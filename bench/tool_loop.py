"""Harness overhead per tool round trip with an instant model (issue 3's figures).

``pidesk run PROJECT PROMPT --model openai/mock --permission auto`` runs as a real
subprocess against ``_mock_openai`` (in a thread of this script, loopback,
keep-alive), which answers every request at once with one Bash ``echo`` call
until N results are in, then with a final text. Every message is persisted as
in production (the data dir is under bench/out/, on the repository's disk).

Per N = 1, 10, 50 (median of the repeats):
* wall time, process start → exit;
* time to the first model request (no host running: the CLI opens an embedded
  host — a "cold" start, though the store itself already exists);
* per-tool-call overhead: the mock-side gap between an answer's last byte and
  the next request's arrival — SDK parsing, authorize, the Bash tool itself
  (its own duration, as ``pidesk run`` prints it, is shown beside), durable
  writes, events, and building the next request;
* peak RSS of the pidesk process (``wait4`` rusage: the whole life's peak).

Before each round of runs the script times a reference, the plain OS work of a
call (``reference_ms``), and prints the per-call figure less Bash as a multiple
of it: the VM's speed drifts, and that ratio drifts less.

Each run also measures how much CPU other processes used meanwhile (/proc/stat
less this script and its children); a run disturbed beyond ``--max-other`` is
repeated, at most ``--retries`` times, and the least disturbed attempt is kept.

Then the same with a host already running: ``pidesk serve`` on the same data
dir and model, and ``pidesk run`` going through it (it finds host.json).

    .venv/bin/python bench/tool_loop.py [--quick] [--repeats 5] [--settle 2] [--wait-idle 300]
                                        [--max-other 0.25] [--retries 3]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import select
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO
from urllib.parse import urlsplit

import harness
from _mock_openai import Hit, MockOpenAI, tool_loop
from harness import Figure

PIDESK = [sys.executable, "-m", "pidesk"]
EXE = Path(sys.executable).parent / "pidesk"  # the installed console script, as a user runs it
RUN_TIMEOUT = 60.0
TOOL_MS = re.compile(r"✓ Bash \((\d+) ms\)")


@dataclass
class Run:
    n: int
    wall: float
    first_request: float
    gaps: list[float]  # seconds, one per tool call
    tool_ms: list[int]  # each Bash call's own duration as reported
    peak_rss_kb: int  # wait4 ru_maxrss (0 when it ran through a host)
    hwm_at_final_kb: int  # VmHWM when the final request arrived
    exit_code: int
    foreign_cpu: float  # CPUs' worth of other processes' work during the run (noise; 0 on a quiet machine)
    hits: list[Hit] = field(repr=False, default_factory=list)


def pidesk_command() -> list[str]:
    return [str(EXE)] if EXE.exists() else PIDESK


def clean_env(scratch: Path, base_url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIDESK_", "OPENAI_", "ANTHROPIC_"))}
    env.update(XDG_CONFIG_HOME=str(scratch / "xdg"), OPENAI_BASE_URL=base_url, OPENAI_API_KEY="x")
    return env


def vm_hwm_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def cpu_seconds_busy() -> float:
    """CPU seconds all processes have been busy since boot (Linux /proc/stat; 0 elsewhere)."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except OSError:
        return 0.0
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")  # less idle and iowait


def run_once(n: int, project: Path, data_dir: Path, scratch: Path, host_mock: MockOpenAI | None = None) -> Run:
    """One ``pidesk run`` of N tool calls: against a mock of its own, or through a running host whose
    mock is ``host_mock`` (its policy is set to N for this run)."""
    box: dict[str, int] = {"pid": 0, "hwm": 0}

    def before_answer(hit: Hit) -> None:
        if hit.tool_results >= n and box["pid"]:  # the final request: the process is at its peak now
            box["hwm"] = vm_hwm_kb(box["pid"])

    mock = host_mock or MockOpenAI(tool_loop(n), before_answer=before_answer).start()
    if host_mock is not None:
        host_mock.policy = tool_loop(n)
    first = len(mock.hits)
    try:
        env = clean_env(scratch, mock.url)
        out_path = scratch / "run.out"
        argv = [*pidesk_command(), "run", str(project), f"make {n} calls", "--model", "openai/mock",
                "--permission", "auto", "--data-dir", str(data_dir)]
        with out_path.open("w") as out:
            busy_before, own_before = cpu_seconds_busy(), time.process_time()
            start = time.perf_counter()
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
            box["pid"] = proc.pid
            watchdog = threading.Timer(RUN_TIMEOUT, proc.kill)  # bounded: a hung run is killed
            watchdog.start()
            try:
                _, status, usage = os.wait4(proc.pid, 0)
            finally:
                watchdog.cancel()
            end = time.perf_counter()
            ours = usage.ru_utime + usage.ru_stime + time.process_time() - own_before
            foreign = max(0.0, cpu_seconds_busy() - busy_before - ours) / (end - start)
            proc.returncode = os.waitstatus_to_exitcode(status)
        output = out_path.read_text()
    finally:
        if host_mock is None:
            mock.stop()
    hits = mock.hits[first:]
    if proc.returncode != 0 or len(hits) != n + 1:
        raise RuntimeError(f"pidesk run (N={n}) exited {proc.returncode} after {len(hits)} requests:\n"
                           f"{output[-3000:]}")
    return Run(n=n, wall=end - start, first_request=hits[0].arrived - start,
               gaps=[b.arrived - a.answered for a, b in zip(hits, hits[1:])],
               tool_ms=[int(x) for x in TOOL_MS.findall(output)],
               peak_rss_kb=usage.ru_maxrss, hwm_at_final_kb=box["hwm"], exit_code=proc.returncode,
               foreign_cpu=foreign, hits=hits)


def reference_ms(mock: MockOpenAI, scratch: Path, rounds: int = 50) -> float:
    """The plain OS work of a tool call, timed in this script beside the runs: two 300-byte O_DSYNC
    appends and one request to the mock over a kept-alive loopback connection, its answer read
    whole — what pidesk does per call less Bash and less Python. Median ms of ``rounds``.

    It says how fast this machine is right now: a VM's speed drifts by tens of per cent within
    minutes, and the per-call figure moves with it (docs/benchmarks-server.md)."""
    parsed = urlsplit(mock.url)
    body = json.dumps({"model": "mock", "stream": True, "messages": [{"role": "user", "content": "x"}]}).encode()
    path = scratch / "reference.jsonl"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_DSYNC, 0o644)
    connection = http.client.HTTPConnection(parsed.hostname or "127.0.0.1", parsed.port, timeout=10)
    times: list[float] = []
    try:
        for _ in range(rounds):
            start = time.perf_counter()
            os.write(fd, b"x" * 299 + b"\n")
            connection.request("POST", f"{parsed.path}/chat/completions", body, {"content-type": "application/json"})
            connection.getresponse().read()
            os.write(fd, b"y" * 299 + b"\n")
            times.append(time.perf_counter() - start)
    finally:
        connection.close()
        os.close(fd)
        path.unlink()
    return ms(statistics.median(times))


@dataclass
class Served:
    proc: subprocess.Popen[bytes]
    start: float
    ready: float
    err: IO[bytes]


def start_host(data_dir: Path, scratch: Path, mock: MockOpenAI, timeout: float = 30.0) -> Served:
    env = clean_env(scratch, mock.url)
    argv = [*pidesk_command(), "serve", "--port", "0", "--no-open", "--data-dir", str(data_dir),
            "--model", "openai/mock"]
    start = time.perf_counter()
    err = (scratch / "serve.err").open("wb")
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, env=env)
    assert proc.stdout is not None
    deadline = start + timeout
    line = b""
    while not line.endswith(b"\n"):
        left = deadline - time.perf_counter()
        if left <= 0 or proc.poll() is not None:
            stop_host(proc, err)
            raise RuntimeError(f"pidesk serve did not announce itself: {(scratch / 'serve.err').read_text()[-2000:]}")
        if select.select([proc.stdout], [], [], left)[0]:
            chunk = os.read(proc.stdout.fileno(), 4096)
            if not chunk:
                continue
            line += chunk
    if not line.startswith(b"pidesk serving at "):
        stop_host(proc, err)
        raise RuntimeError(f"unexpected announcement {line!r}")
    return Served(proc, start, time.perf_counter(), err)


def stop_host(proc: subprocess.Popen[bytes], err: IO[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()  # only the process this script started
            proc.wait(10)
    if proc.stdout is not None:
        proc.stdout.close()
    err.close()


def ms(seconds: float) -> float:
    return seconds * 1000


def main() -> int:
    def options(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--repeats", type=int, default=0, help="runs per N (default 5, or 1 with --quick)")
        parser.add_argument("--host-runs", type=int, default=0, help="runs through a running host (default 5, at least 2)")
        parser.add_argument("--wait-idle", type=float, default=0, metavar="S",
                            help="before the cold runs and the host runs, wait up to S s for the CPUs to be ≤15%% busy")
        parser.add_argument("--max-other", type=float, default=0.25, metavar="CPU",
                            help="repeat a run (see --retries) if other processes used more CPU than this during it")
        parser.add_argument("--retries", type=int, default=3, help="at most this many repeats of one disturbed run")
        parser.add_argument("--settle", type=float, default=2.0,
                            help="seconds between the host's announcement and the first run through it")

    args = harness.parse_args(__doc__ or "", options)
    harness.header("tool_loop — harness overhead per tool round trip (pidesk run, instant mock OpenAI)", args.quick)
    repeats = args.repeats or (1 if args.quick else 5)
    host_runs = max(2, args.host_runs or (2 if args.quick else 5))  # the first run, then later ones
    sizes = (1, 10, 50)
    figures: list[Figure] = []
    runs: dict[int, list[Run]] = {n: [] for n in sizes}
    with harness.scratch("tool_loop") as scratch:
        project = scratch / "project"
        project.mkdir()
        (project / "README.md").write_text("# bench project\n")
        data_dir = scratch / "data"
        if args.wait_idle:
            print(f"  {harness.wait_for_quiet(args.wait_idle)}", flush=True)
        run_once(1, project, data_dir, scratch)  # warm-up, not counted: creates the store, fills the page cache
        retried = 0
        references: list[float] = []
        for _ in range(repeats):
            with MockOpenAI(tool_loop(1)) as reference_mock:
                references.append(reference_ms(reference_mock, scratch))
            for n in sizes:
                best = run_once(n, project, data_dir, scratch)
                for _ in range(args.retries):  # bounded: keep the attempt that other work disturbed least
                    if best.foreign_cpu <= args.max_other:
                        break
                    retried += 1
                    again = run_once(n, project, data_dir, scratch)
                    best = again if again.foreign_cpu < best.foreign_cpu else best
                runs[n].append(best)
        print(f"  {retried} runs repeated because other processes used > {args.max_other} CPU during them")
        for n in sizes:
            for run in runs[n]:
                gaps = sorted(ms(g) for g in run.gaps)
                print(f"  N={n:<3} wall {ms(run.wall):7.1f} ms  first request {ms(run.first_request):6.1f} ms  "
                      f"gap median {statistics.median(gaps):5.2f} ms max {gaps[-1]:6.2f} ms  "
                      f"Bash median {statistics.median(run.tool_ms) if run.tool_ms else 0:.0f} ms  "
                      f"peak RSS {run.peak_rss_kb / 1024:5.1f} MB (VmHWM at final request "
                      f"{run.hwm_at_final_kb / 1024:5.1f} MB)  other load {run.foreign_cpu:4.2f} CPU")

        # through a running host
        if args.wait_idle:
            print(f"  {harness.wait_for_quiet(args.wait_idle)}", flush=True)
        mock = MockOpenAI(tool_loop(1)).start()
        try:
            host = start_host(data_dir, scratch, mock)
            try:
                print(f"  pidesk serve ready {ms(host.ready - host.start):.0f} ms after start; "
                      f"first run {args.settle:g} s later")
                time.sleep(args.settle)
                through = [run_once(1, project, data_dir, scratch, mock).first_request for _ in range(host_runs)]
                fifty = [run_once(50, project, data_dir, scratch, mock) for _ in range(repeats)]
                host_hwm = vm_hwm_kb(host.proc.pid)
            finally:
                stop_host(host.proc, host.err)
        finally:
            mock.stop()
        print(f"  through the host: first request per run (ms): {', '.join(f'{ms(t):.0f}' for t in through)}")

    all_gaps = [ms(g) for run in runs[50] for g in run.gaps]
    bash_ms = [t for run in runs[50] for t in run.tool_ms]
    # the harness alone: each gap less that call's own Bash duration (as pidesk run printed it)
    harness_only = [ms(g) - t for run in runs[50] for g, t in zip(run.gaps, run.tool_ms)]
    overhead = statistics.median(all_gaps)
    figures += [
        Figure("N=1: wall, median", ms(statistics.median(r.wall for r in runs[1])), "ms"),
        Figure("N=10: wall, median", ms(statistics.median(r.wall for r in runs[10])), "ms"),
        Figure("N=50: wall, median", ms(statistics.median(r.wall for r in runs[50])), "ms", 800, at_least=False,
               note="no host running: a cold start, the SDK's import included (docs/benchmarks-server.md)"),
        Figure("first model request, no host running (median)",
               ms(statistics.median(r.first_request for n in sizes for r in runs[n])), "ms", 1000, at_least=False),
        Figure("per tool call: answer end → next request, median (N=50)", overhead, "ms", 5, at_least=False,
               note=f"p90 {statistics.quantiles(all_gaps, n=10)[-1]:.1f} ms; "
                    f"Bash's own duration median {statistics.median(bash_ms) if bash_ms else 0:.0f} ms"),
        Figure("per tool call less Bash's own duration, median (N=50)", statistics.median(harness_only), "ms",
               note="the harness alone (Bash durations are whole ms)"),
        Figure("reference: two O_DSYNC appends + one loopback request, median", statistics.median(references), "ms",
               note=f"the plain OS work of a call, beside the runs: {', '.join(f'{r:.2f}' for r in references)}"),
        Figure("per tool call less Bash, as a multiple of the reference", statistics.median(harness_only)
               / statistics.median(references), "x", note="what pidesk's own code costs, whatever the VM's speed"),
        Figure("per tool call, N=1 and N=10 (median)",
               statistics.median(ms(g) for n in (1, 10) for r in runs[n] for g in r.gaps), "ms"),
        Figure("other processes' CPU during the runs, median / max",
               statistics.median(r.foreign_cpu for n in sizes for r in runs[n]), "CPU",
               note=f"max {max(r.foreign_cpu for n in sizes for r in runs[n]):.2f}; noise: rerun if well above 0"),
        Figure("peak RSS of pidesk run (max over runs)",
               max(r.peak_rss_kb for n in sizes for r in runs[n]) / 1024, "MB", 80, at_least=False),
        Figure("first model request, host running: first run", ms(through[0]), "ms", 300, at_least=False,
               note=f"{args.settle:g} s after the host announced itself"),
        Figure("first model request, host running: later runs, median", ms(statistics.median(through[1:])), "ms",
               300, at_least=False, note=f"of {len(through) - 1}"),
        Figure("through the host, N=50: wall, median", ms(statistics.median(r.wall for r in fifty)), "ms", 800,
               at_least=False, note="the 0.8 s target as docs/benchmarks-server.md reads it"),
        Figure("through the host, per tool call, median (N=50)",
               statistics.median(ms(g) for r in fifty for g in r.gaps), "ms"),
        Figure("peak RSS of pidesk run as a client of the host", max(r.peak_rss_kb for r in fifty) / 1024, "MB"),
        Figure("host VmHWM after those runs", host_hwm / 1024, "MB"),
    ]
    return harness.report("tool_loop", figures, args.json)


if __name__ == "__main__":
    raise SystemExit(main())
