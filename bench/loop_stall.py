"""Does any hostile call stall the host's event loop? (issue 15, authority hole 6)

Each case runs against its own ``pidesk serve`` subprocess (a scripted model, a
project holding the case's files, permission mode auto) while a probe process of
its own GETs ``/healthz`` on one kept-alive connection every 10 ms. The figure
is the worst probe latency while the case runs: a probe is only slow when the
host's loop did not get to it, so it is the longest stall the case caused.
Target: ≤ 50 ms for every case. Also printed: how long the case took, what it
answered, and the host's peak RSS (VmHWM) — the cases that used to exhaust memory.

The cases (full size; ``--quick`` shrinks the large ones):

- ``grep-redos``: Grep ``(a*)*b`` over a 27-byte file (exponential in Python ``re``);
- ``glob-redos``: Glob ``*a*a*a*a*a*a*a*a*b`` over one 40-character name;
- ``markdown-brackets``: ``markdown.render`` of ``"[" * 1_000_000``;
- ``markdown-batch``: 1,000 ``markdown.render`` calls of ``"[](" * 300`` at once on one WebSocket;
- ``plans-get``: ``plans.get`` (×3) of a pending plan of ``"[]("`` repeated to 990 KB;
- ``read-1g``: Read of a 1 GiB file with no newline;
- ``bash-100m``: a Bash command printing 100 MB;
- ``args-10m``: a Write whose arguments are 10 MB (refused past 1 MiB: ``INVALID_ARGUMENTS``);
- ``write-preview``: a Write rewriting a 10,000-line file under ``ask``, its request read back ten
  times (issue 29: its diff held the loop 13-18 s, every read again);
- ``list-batch``: one batch of 100 ``session.list`` over 5,000 sessions (issue 29: a 405 MB reply);
- ``huge-revert``: a Bash command grows a tracked file by 1.5 GB, then the turn is reverted (issue 29:
  4.1 GB of memory, a 3.1 s stall and a shadow repository 1.5 GB larger); also printed, how much
  the shadow repository grew.

``run_cases(quick=True)`` is also what the CI-size test (tests/server/test_loop_stall.py) runs.

    .venv/bin/python bench/loop_stall.py [--quick] [--only grep-redos,read-1g] [--json PATH]
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402
import rpc_load  # noqa: E402
from harness import Figure  # noqa: E402

TARGET_MS = 50.0
PROBE_EVERY = 0.010
CASE_TIMEOUT = 300.0

# The probe: its own process (so nothing of the bench's own work delays it), one kept-alive
# connection, one line "start latency" per probe (monotonic seconds, comparable across processes).
PROBE = r"""
import http.client, sys, time
port, every, out = int(sys.argv[1]), float(sys.argv[2]), open(sys.argv[3], "w")
conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
print("ready", flush=True)
while True:
    start = time.monotonic()
    try:
        conn.request("GET", "/healthz", headers={"Host": f"127.0.0.1:{port}"})
        conn.getresponse().read()
    except OSError:
        conn.close()
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    out.write(f"{start} {time.monotonic() - start}\n")
    out.flush()
    if sys.stdin in __import__("select").select([sys.stdin], [], [], max(0.0, every - (time.monotonic() - start)))[0]:
        break
"""


class HealthzProbe:
    """``PROBE`` in a process of its own against ``server``'s /healthz, for a ``with`` block; ``during(begin,
    end)``: the latencies (s) of the probes that overlapped that window (``time.monotonic`` times)."""

    def __init__(self, server: rpc_load.Server, samples: Path) -> None:
        self.samples = samples
        self.proc = subprocess.Popen([sys.executable, "-c", PROBE, str(server.port), str(PROBE_EVERY), str(samples)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        if rpc_load.read_line(self.proc, 30) != b"ready\n":
            self.stop()
            raise RuntimeError("the /healthz probe did not start")

    def __enter__(self) -> HealthzProbe:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.write(b"stop\n")
            self.proc.stdin.close()
        self.proc.wait(150)
        if self.proc.stdout is not None:
            self.proc.stdout.close()

    def during(self, begin: float, end: float) -> list[float]:
        lines = (line.split() for line in self.samples.read_text().splitlines())
        return [float(lat) for s, lat in lines if float(s) <= end and float(s) + float(lat) >= begin]

    def worst_ms(self, begin: float, end: float) -> float:
        return max(self.during(begin, end), default=float("nan")) * 1000


@dataclass
class Case:
    name: str
    what: str
    files: Callable[[Path, bool], None]  # lays out the project
    script: Callable[[bool], list[dict[str, Any]]]  # the model's responses
    drive: Callable[[rpc_load.Ws, str, bool], Awaitable[str]]  # runs the case; says what it answered
    mode: str = "agent"
    permission: str = "auto"
    prepare: Callable[[rpc_load.Server, bool], Awaitable[None]] | None = None  # before the measured window


@dataclass
class Row:
    case: str
    worst_ms: float
    probes: int
    seconds: float
    answer: str
    peak_rss_mib: float


# ---- the cases -----------------------------------------------------------------------------


def _nothing(_project: Path, _quick: bool) -> None:
    pass


def _redos_file(project: Path, _quick: bool) -> None:
    (project / "redos.txt").write_text("a" * 27)


def _long_name(project: Path, _quick: bool) -> None:
    (project / ("a" * 40)).write_text("x\n")


def _big_line(project: Path, quick: bool) -> None:
    chunk = b"a" * (1 << 20)
    with (project / "one-line.txt").open("wb") as file:
        for _ in range(64 if quick else 1024):
            file.write(chunk)


def _big_module(project: Path, quick: bool) -> None:
    (project / "big.py").write_text("".join(f"value_{i} = {i}\n" for i in range(2_000 if quick else 10_000)))


def _small_tracked(project: Path, _quick: bool) -> None:
    (project / "grow.dat").write_text("small\n")


def _rewrite(quick: bool) -> list[dict[str, Any]]:
    lines = 2_000 if quick else 10_000
    return _tool("Write", path="big.py", content="".join(f"value_{i} = {i * 2 if i % 7 == 0 else i}\n"
                                                        for i in range(lines)))


def _tool(name: str, **args: Any) -> list[dict[str, Any]]:
    return [{"toolCalls": [{"name": name, "args": args}]}, {"text": "done"}]


async def _after(ws: rpc_load.Ws, sid: str, text: str, wanted: str) -> dict[str, Any]:
    """Prompt the session and return the first event of type ``wanted`` that follows."""
    seen = asyncio.get_running_loop().create_future()

    def listen(_at: float, event: dict[str, Any]) -> None:
        if event.get("type") == wanted and not seen.done():
            seen.set_result(event)

    ws.listeners.append(listen)
    try:
        await ws.call("agent.prompt", {"sessionId": sid, "text": text})
        async with asyncio.timeout(CASE_TIMEOUT):
            return await seen
    finally:
        ws.listeners.remove(listen)


async def _turn(ws: rpc_load.Ws, sid: str, _quick: bool) -> str:
    """Prompt the scripted model and wait for the turn's end; the answer is its tool result."""
    end = await _after(ws, sid, "go", "turn.ended")
    state = await ws.call("session.get", {"sessionId": sid, "limit": 10})
    results = [b for m in state["messages"] for b in m["content"] if b["type"] == "toolResult"]
    result = f"{results[-1]['name']} {'ok' if results[-1]['ok'] else results[-1].get('errorCode')}" if results else "-"
    return f"{result}; turn {end['reason']}"


async def _write_preview(ws: rpc_load.Ws, sid: str, _quick: bool) -> str:
    """Under ask: the Write's permission request (its preview a diff of the file), read back ten times."""
    request = (await _after(ws, sid, "rewrite it", "permission.requested"))["request"]
    for _ in range(5):
        await ws.call("permissions.pending", {"sessionId": sid})
        await ws.call("session.get", {"sessionId": sid})
    await ws.call("permissions.resolve", {"requestId": request["id"], "sessionId": sid,
                                          "turnId": request["turnId"], "decision": "deny"})
    return f"preview: {request['preview']['diff'][:60]}…"


async def _many_sessions(server: rpc_load.Server, quick: bool) -> None:
    ws = await rpc_load.Ws.open(server)
    try:
        for first in range(0, 500 if quick else 5_000, 500):
            await asyncio.gather(*(ws.call("session.create", {"title": f"s{first + i} " + "x" * 150})
                                   for i in range(500)))
    finally:
        await ws.close()


async def _list_batch(ws: rpc_load.Ws, _sid: str, _quick: bool) -> str:
    """One small batch of session.list calls over many sessions (the amplification)."""
    answers = await ws.call_batch([("session.list", {}) for _ in range(100)])
    refused = sum("error" in a for a in answers)
    return f"{len(answers) - refused} lists answered, {refused} not run (LIMIT_EXCEEDED)"


async def _huge_revert(ws: rpc_load.Ws, sid: str, quick: bool) -> str:
    """The turn that grows the file, then its revert; the shadow repositories' size after."""
    turn = (await _after(ws, sid, "grow it", "turn.ended"))["turnId"]
    reverted = await ws.call("session.revert", {"sessionId": sid, "turnId": turn})
    root = Path((await ws.call("session.get", {"sessionId": sid, "limit": 1}))["session"]["root"])
    shadow = sum(p.stat().st_size for p in (root.parent / "data" / "checkpoints").rglob("*") if p.is_file())
    return (f"reverted {reverted['files']}, left {reverted.get('notRestored')}; "
            f"checkpoints {shadow / 1024:,.0f} KiB")


async def _render_brackets(ws: rpc_load.Ws, _sid: str, quick: bool) -> str:
    html = (await ws.call("markdown.render", {"text": "[" * (200_000 if quick else 1_000_000)}))["html"]
    return f"{len(html):,} chars of html"


async def _render_batch(ws: rpc_load.Ws, _sid: str, quick: bool) -> str:
    count = 100 if quick else 1000
    answers = await asyncio.gather(*(ws.call("markdown.render", {"text": "[](" * 300 + f" {i}"})
                                     for i in range(count)))
    return f"{len(answers)} renders"


async def _plans_get(ws: rpc_load.Ws, sid: str, _quick: bool) -> str:
    approval = (await _after(ws, sid, "plan", "plan.requested"))["approval"]
    sizes = [len((await ws.call("plans.get", {"approvalId": approval["id"]}))["markdown"]) for _ in range(3)]
    return f"plans.get ×3: {sizes[0]:,} chars each"


CASES = [
    Case("grep-redos", "Grep (a*)*b over 27 bytes", _redos_file,
         lambda _q: _tool("Grep", pattern="(a*)*b", path="redos.txt"), _turn),
    Case("glob-redos", "Glob *a*a*a*a*a*a*a*a*b over a 40-char name", _long_name,
         lambda _q: _tool("Glob", pattern="*a*a*a*a*a*a*a*a*b"), _turn),
    Case("markdown-brackets", 'markdown.render of "[" * 1,000,000', _nothing, lambda _q: [], _render_brackets),
    Case("markdown-batch", "1,000 concurrent markdown.render calls", _nothing, lambda _q: [], _render_batch),
    Case("plans-get", 'plans.get of a 990 KB plan of "[](" repeated', _nothing,
         lambda _q: [{"toolCalls": [{"name": "SubmitPlan", "args": {
             "title": "brackets", "markdown": "[](" * 330_000, "question": "ok?"}}]}],
         _plans_get, mode="plan"),
    Case("read-1g", "Read of a 1 GiB file with no newline", _big_line,
         lambda _q: _tool("Read", path="one-line.txt"), _turn),
    Case("bash-100m", "Bash printing 100 MB", _nothing,
         lambda q: _tool("Bash", command=f"head -c {10_000_000 if q else 100_000_000} /dev/zero | tr '\\0' a"),
         _turn),
    Case("args-10m", "a Write with 10 MB of arguments (refused past 1 MiB)", _nothing,
         lambda q: _tool("Write", path="big.txt", content="a" * (1_000_000 if q else 10_000_000)), _turn),
    Case("write-preview", "a Write rewriting a 10,000-line file under ask, read back ten times", _big_module,
         _rewrite, _write_preview, permission="ask"),
    Case("list-batch", "a batch of 100 session.list over 5,000 sessions", _nothing, lambda _q: [], _list_batch,
         prepare=_many_sessions),
    Case("huge-revert", "a tracked file grown by 1.5 GB in a turn, then reverted", _small_tracked,
         lambda q: _tool("Bash", command=f"head -c {100_000_000 if q else 1_500_000_000} /dev/urandom >> grow.dat"),
         _huge_revert),
]


# ---- running one case ----------------------------------------------------------------------


def run_case(case: Case, scratch: Path, quick: bool) -> Row:
    project = scratch / "project"
    project.mkdir()
    case.files(project, quick)
    script = scratch / "script.json"
    script.write_text(json.dumps({"responses": case.script(quick)}))
    with rpc_load.served(scratch, scratch / "data", f"scripted/{script}") as server:
        with HealthzProbe(server, scratch / "probes.txt") as probe:
            if case.prepare is not None:
                asyncio.run(case.prepare(server, quick))
            begin = time.monotonic()
            answer = asyncio.run(_drive(case, server, project, quick))
            end = time.monotonic()
            peak = rpc_load.vm(server.proc.pid, "VmHWM") / 1024
        during = probe.during(begin, end)
    return Row(case.name, max(during) * 1000 if during else float("nan"), len(during), end - begin, answer, peak)


async def _drive(case: Case, server: rpc_load.Server, project: Path, quick: bool) -> str:
    ws = await rpc_load.Ws.open(server)
    try:
        session = await ws.call("session.create", {"projectPath": str(project), "mode": case.mode,
                                                    "permissionMode": case.permission})
        return await case.drive(ws, session["id"], quick)
    finally:
        await ws.close()


def run_cases(quick: bool, only: set[str] | None = None, progress: Callable[[Row], None] | None = None) -> list[Row]:
    rows = []
    for case in CASES:
        if only and case.name not in only:
            continue
        with harness.scratch(f"loop-stall-{case.name}") as scratch:
            row = run_case(case, scratch, quick)
        rows.append(row)
        if progress is not None:
            progress(row)
    return rows


def main() -> int:
    args = harness.parse_args(__doc__, lambda p: p.add_argument("--only", help="comma-separated case names"))
    harness.header("loop stall: worst /healthz latency under each hostile call", args.quick)
    only = set(args.only.split(",")) if args.only else None
    print(f"  {'case':<18} {'worst':>9} {'probes':>7} {'took':>8} {'peak RSS':>9}  answer")

    def show(row: Row) -> None:
        print(f"  {row.case:<18} {row.worst_ms:>6.1f} ms {row.probes:>7} {row.seconds:>6.2f} s "
              f"{row.peak_rss_mib:>5.0f} MiB  {row.answer}")

    rows = run_cases(args.quick, only, show)
    figures = [Figure(f"worst /healthz during {row.case}", row.worst_ms, "ms", TARGET_MS, at_least=False,
                      note=row.answer) for row in rows]
    return harness.report("loop_stall", figures, args.json)


if __name__ == "__main__":
    sys.exit(main())
