"""Door tests (issue 7 item 5): the host's front door under hostile traffic, against a real
``pidesk serve`` subprocess on loopback.

Not repeated here: the Host/Origin/token matrix (``tests/server/test_server_auth.py``) and the
hypothesis frame fuzz (``tests/server/test_server_fuzz.py``). This module adds:

(a) cross-site form posts — ``POST /rpc`` as a browser ``<form>`` sends it
    (``application/x-www-form-urlencoded``, ``text/plain``, ``multipart/form-data``, including
    the ``enctype=text/plain`` trick that makes the body valid JSON) with a foreign, ``null`` or
    missing ``Origin``, with and without the token: 403/401 or a JSON-RPC parse error, and no
    method ever runs (``session.list`` and ``audit.list`` unchanged);
(b) idle sockets — raw TCP connections that send nothing and idle authenticated WebSockets held
    open at once while a normal client's ``host.hello`` is answered in under 1 s; the host's RSS
    (``/proc/<pid>/status`` VmRSS/VmHWM) stays bounded;
(c) a 100 MB request — a streamed (chunked) POST body and a declared ``Content-Length``: HTTP 413
    with ``LIMIT_EXCEEDED``; a 100 MB WebSocket frame: close 1009; the host does not buffer the
    body (VmHWM grows by far less than 100 MB) and stays up;
(d) invalid UTF-8 and NULs — a binary frame of invalid UTF-8 (parse error, the socket stays up), a
    text frame of invalid UTF-8 (close 1007, the host stays up), lone surrogates, and ``\\u0000``
    in every text param: a well-formed error and nothing written;
(e) RPC fuzzing at volume — seeded random method names and params, pipelined over a few
    WebSockets (single requests, batches, notifications, malformed frames): every answer is
    well-formed JSON-RPC with a documented code (never ``INTERNAL``), the host stays alive
    (``/healthz``), and a token-less portion over HTTP is refused 401 every time with no state
    change;
(f) issue 15 — 20 authenticated WebSockets that never read while a turn streams 40,000 deltas: the
    host's RSS stays bounded and each is closed 1013 (authority hole 9); 2,000 connections that send
    one byte of a request, and more coming, against a host with 1,024 descriptors: an authenticated
    client still gets in and is answered in < 100 ms (authority hole 10).

Bugs this file found are fixed and kept as regression tests: an unusable ``projectPath`` (``~user``,
a symlink loop, an over-long name) is INVALID_PARAMS, not INTERNAL; silent connections are reaped
and the host raises its open-files limit, so they cannot lock clients out. Any INTERNAL fails the fuzz.

CI sizes are reduced (300 raw sockets + 50 WebSockets, 10k fuzz cases); ``bench/door_stress.py``
runs the same code at full size (1,000 + 200 sockets, 100k cases) and prints the figures. The
helpers below (``spawn_host``, ``hold_idle_sockets``, ``big_post``, ``big_ws_frame``,
``run_fuzz``, ``run_unauthorised``) are shared with it.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import resource
import select
import signal
import socket
import string
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from pidesk.core.errors import Code
from pidesk.host.host import METHODS, Host, _wire_params

TOKEN = "door-token-0123456789abcdef0123456789abcdef"
MIB = 1024 * 1024
MAX_FRAME = 16 * MIB

# PROTOCOL.md's -32000 table (LIMIT_EXCEEDED travels with -32600)
SERVER_CODES: set[str | None] = {"AGENT_BUSY", "NOT_FOUND", "TURN_ENDED", "STALE_REQUEST", "PLAN_NOT_FOUND", "PLAN_ALREADY_RESOLVED",
                "PLAN_APPROVAL_STALE", "PLAN_PERMISSION_MODE_REQUIRED", "PLAN_PERMISSION_MODE_INVALID",
                "PLAN_WORKSPACE_REQUIRED", "PLAN_REQUIRES_INTERACTIVE_SESSION", "PROTOCOL_MISMATCH",
                "PERSISTENCE_FAILURE"}
DATA_CODES: dict[int, set[str | None]] = {-32700: {None}, -32600: {None, "LIMIT_EXCEEDED"}, -32601: {"METHOD_NOT_FOUND"},
              -32602: {"INVALID_PARAMS"}, -32000: SERVER_CODES}


# ---- the host under test ----------------------------------------------------------------------------


@dataclass
class DoorHost:
    url: str
    port: int
    popen: subprocess.Popen[str]
    project: Path
    data_dir: Path
    stderr_path: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/rpc"

    def reset_peak(self) -> dict[str, int]:
        """Start VmHWM afresh (``clear_refs`` 5) and return ``mem()``: a peak the host reached before (at
        start-up, in an earlier test) is not counted against what is measured next."""
        with open(f"/proc/{self.pid}/clear_refs", "w") as f:
            f.write("5")
        return self.mem()

    def mem(self) -> dict[str, int]:
        """VmRSS and VmHWM of the host process, in kB."""
        out = {}
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "VmHWM"):
                    out[key] = int(value.split()[0])
        return out

    def alive(self) -> bool:
        if self.popen.poll() is not None:
            return False
        try:
            answer = httpx.get(self.url + "/healthz", trust_env=False, timeout=10)
        except httpx.HTTPError:
            return False
        return answer.status_code == 200 and answer.json() == {"ok": True}

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def rpc(self, method: str, params: Any = None) -> Any:
        frame: dict[str, Any] = {"jsonrpc": "2.0", "id": 1, "method": method}
        if params is not None:
            frame["params"] = params
        answer = httpx.post(self.url + "/rpc", json=frame, headers={"Authorization": f"Bearer {TOKEN}"},
                            trust_env=False, timeout=30)
        assert answer.status_code == 200, (answer.status_code, answer.text)
        body = answer.json()
        assert "result" in body, body
        return body["result"]

    def snapshot(self) -> tuple[Any, Any, Any]:
        return (self.rpc("session.list")["sessions"], self.rpc("audit.list", {"limit": 10_000})["entries"],
                self.rpc("schedules.list")["schedules"])

    async def ws(self, **kwargs: Any) -> ClientConnection:
        return await connect(self.ws_url, additional_headers={"Authorization": f"Bearer {TOKEN}"}, proxy=None,
                             max_size=None, compression=None, open_timeout=10, **kwargs)

    def stop(self) -> int | None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                return self.popen.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.popen.kill()  # only the process this helper started
                self.popen.wait(timeout=10)
                return None
        return self.popen.returncode


def spawn_host(root: Path, *args: str, nofile: int | None = None, hard_nofile: int | None = None) -> DoorHost:
    """``python -m pidesk serve`` on loopback, port 0, a fixed token; returns once it has announced.
    ``nofile``: start it with that soft RLIMIT_NOFILE (the hard limit unchanged, or ``hard_nofile``),
    e.g. a desktop's 1024."""
    root.mkdir(parents=True, exist_ok=True)
    project = root / "project"
    project.mkdir(exist_ok=True)
    (project / "README.md").write_text("# door\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIDESK_")} | {"XDG_CONFIG_HOME": str(root / "xdg")}
    stderr_path = root / "host.stderr"
    with open(stderr_path, "w") as err:
        popen = subprocess.Popen([sys.executable, "-m", "pidesk", "serve", "--data-dir", str(root / "data"), "--no-open",
                                  "--port", "0", "--token", TOKEN, *args], stdout=subprocess.PIPE, stderr=err,
                                 text=True, env=env,
                                 preexec_fn=None if nofile is None else lambda: _nofile(nofile, hard_nofile))
    assert popen.stdout is not None
    line = popen.stdout.readline()
    if not line.startswith("pidesk serving at "):
        popen.kill()
        popen.wait()
        raise AssertionError(f"the host did not start: {line!r} {stderr_path.read_text()}")
    url = line.split()[-1].split("/?")[0]
    return DoorHost(url, int(url.rsplit(":", 1)[1]), popen, project, root / "data", stderr_path)


def _nofile(soft: int, hard: int | None = None) -> None:
    _, current = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, current if hard is None else hard))


@pytest.fixture(scope="module")
def door(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DoorHost]:
    host = spawn_host(tmp_path_factory.mktemp("door"))
    try:
        yield host
        assert host.alive(), host.stderr()[-3000:]
        assert host.stop() == 0, host.stderr()[-3000:]  # survived everything and shuts down cleanly
    finally:
        host.stop()
        if host.popen.stdout is not None:
            host.popen.stdout.close()


@pytest.fixture
def fresh(tmp_path: Path) -> Iterator[DoorHost]:
    """A host of its own (its VmHWM is then this test's alone)."""
    host = spawn_host(tmp_path / "fresh")
    try:
        yield host
        assert host.alive(), host.stderr()[-3000:]
    finally:
        host.stop()
        if host.popen.stdout is not None:
            host.popen.stdout.close()


# ---- (a) cross-site form posts ------------------------------------------------------------------------

# What a browser <form method=post> can send. The text/plain trick: a field named
# '{"jsonrpc":"2.0","id":1,"method":"session.create","params":{"title":"x' with value '"}}' is sent
# as name=value, i.e. exactly the valid JSON request below. A form cannot set an Authorization
# header, and the host reads no cookie; the "token" column is for a non-browser sender.
TRICK = '{"jsonrpc":"2.0","id":1,"method":"session.create","params":{"title":"x="}}'
FORMS = [
    ("urlencoded", "application/x-www-form-urlencoded",
     "jsonrpc=2.0&id=1&method=session.create&params%5Btitle%5D=pwned"),
    ("urlencoded JSON-ish", "application/x-www-form-urlencoded",
     "%7B%22jsonrpc%22%3A%222.0%22%2C%22id%22%3A1%2C%22method%22%3A%22session.create%22%7D="),
    ("text/plain trick", "text/plain", TRICK),
    ("multipart", "multipart/form-data; boundary=XyZ",
     '--XyZ\r\nContent-Disposition: form-data; name="' + TRICK.replace('"', "%22") + '"\r\n\r\nv\r\n--XyZ--\r\n'),
]
ORIGINS = [("foreign Origin", "http://evil.example"), ("Origin null", "null"), ("no Origin", None),
           ("https own-looking Origin", "https://127.0.0.1:PORT")]


@pytest.mark.parametrize("with_token", [False, True], ids=["no token", "token"])
@pytest.mark.parametrize("origin_name, origin", ORIGINS, ids=[o[0] for o in ORIGINS])
@pytest.mark.parametrize("form_name, ctype, body", FORMS, ids=[f[0] for f in FORMS])
def test_a_cross_site_form_post_runs_nothing(door, form_name, ctype, body, origin_name, origin, with_token):
    before = door.snapshot()
    headers = {"Content-Type": ctype}
    if origin is not None:
        headers["Origin"] = origin.replace("PORT", str(door.port))
    if with_token:
        headers["Authorization"] = f"Bearer {TOKEN}"
    answer = httpx.post(door.url + "/rpc", content=body.encode(), headers=headers, trust_env=False, timeout=30)
    if origin is not None:
        assert answer.status_code == 403 and "origin" in answer.text.lower(), (answer.status_code, answer.text)
    elif not with_token:
        assert answer.status_code == 401, (answer.status_code, answer.text)
    elif form_name == "text/plain trick":
        # Not a cross-site request any more: a browser cannot attach the bearer token. The host does not
        # look at Content-Type, so a token holder's text/plain JSON runs (see the report: hardening only).
        assert answer.status_code == 200 and "result" in answer.json(), answer.text
        door.rpc("session.delete", {"sessionId": answer.json()["result"]["id"]})
        return
    else:
        assert answer.status_code == 200, (answer.status_code, answer.text)
        error = answer.json()["error"]
        assert error["code"] in (-32700, -32600), error
    assert TOKEN not in answer.text
    after = door.snapshot()
    assert after == before, "a refused form post changed the host's state"


# ---- (b) idle sockets ---------------------------------------------------------------------------------


@dataclass
class IdleFigures:
    raw: int
    ws: int
    opened_s: float
    hello_ms: list[float] = field(default_factory=list)
    http_hello_ms: list[float] = field(default_factory=list)
    mem_before: dict[str, int] = field(default_factory=dict)
    mem_held: dict[str, int] = field(default_factory=dict)
    mem_after: dict[str, int] = field(default_factory=dict)
    raw_closed_by_host: int = 0
    ws_closed_by_host: int = 0

    def show(self) -> str:
        per = (self.mem_held["VmRSS"] - self.mem_before["VmRSS"]) / max(1, self.raw + self.ws)
        return (f"{self.raw} raw TCP + {self.ws} WebSockets held (opened in {self.opened_s:.2f} s); "
                f"host.hello over WS max {max(self.hello_ms):.1f} ms, over HTTP max {max(self.http_hello_ms):.1f} ms; "
                f"RSS {self.mem_before['VmRSS'] / 1024:.1f} -> {self.mem_held['VmRSS'] / 1024:.1f} MiB held "
                f"({per:.1f} kB/socket) -> {self.mem_after['VmRSS'] / 1024:.1f} MiB after close, "
                f"VmHWM {self.mem_after['VmHWM'] / 1024:.1f} MiB; closed by the host while idle: "
                f"{self.raw_closed_by_host} raw, {self.ws_closed_by_host} WS")


async def hello_ms(ws: ClientConnection, rid: int) -> float:
    start = time.perf_counter()
    await ws.send(json.dumps({"jsonrpc": "2.0", "id": rid, "method": "host.hello", "params": {"protocolVersion": 1}}))
    async with asyncio.timeout(10):
        while True:
            message = json.loads(await ws.recv())
            if message.get("id") == rid:
                assert message["result"]["protocolVersion"] == 1, message
                return (time.perf_counter() - start) * 1000


async def hold_idle_sockets(host: DoorHost, raw: int, ws: int, hold_s: float, probes: int = 10) -> IdleFigures:
    """Open ``raw`` silent TCP connections and ``ws`` authenticated WebSockets that send nothing, keep them
    all open for ``hold_s`` seconds while a normal client probes ``host.hello``, then close them."""
    figures = IdleFigures(raw, ws, 0.0, mem_before=host.mem())
    start = time.perf_counter()
    raws: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    for _ in range(raw):
        raws.append(await asyncio.open_connection("127.0.0.1", host.port))
    sockets: list[ClientConnection] = []
    for start_at in range(0, ws, 50):
        sockets += await asyncio.gather(*(host.ws(ping_interval=None) for _ in range(min(50, ws - start_at))))
    figures.opened_s = time.perf_counter() - start
    probe = await host.ws()
    async with httpx.AsyncClient(trust_env=False, timeout=10, limits=httpx.Limits(max_keepalive_connections=0)) as http:
        deadline = time.perf_counter() + hold_s
        rid = 0
        while True:
            rid += 1
            figures.hello_ms.append(await hello_ms(probe, rid))
            t0 = time.perf_counter()
            answer = await http.post(host.url + "/rpc", headers={"Authorization": f"Bearer {TOKEN}"},
                                     json={"jsonrpc": "2.0", "id": 1, "method": "host.hello",
                                           "params": {"protocolVersion": 1}})
            figures.http_hello_ms.append((time.perf_counter() - t0) * 1000)
            assert answer.status_code == 200 and answer.json()["result"]["protocolVersion"] == 1
            if rid >= probes and time.perf_counter() >= deadline:
                break
            await asyncio.sleep(max(0.0, min(0.25, deadline - time.perf_counter())))
    figures.mem_held = host.mem()
    for reader, _writer in raws:
        if reader.at_eof() or bool(getattr(reader, "_buffer", None)) or reader.exception() is not None:  # peeking only
            figures.raw_closed_by_host += 1
    figures.ws_closed_by_host = sum(1 for s in sockets if s.close_code is not None)
    for _reader, writer in raws:
        writer.close()
    await asyncio.gather(*(s.close() for s in sockets), return_exceptions=True)
    await asyncio.gather(*(w.wait_closed() for _r, w in raws), return_exceptions=True)
    # the host is still fine once they are gone
    figures.hello_ms.append(await hello_ms(probe, 10_000))
    await probe.close()
    await asyncio.sleep(0.5)
    figures.mem_after = host.mem()
    return figures


@pytest.mark.asyncio
async def test_idle_sockets_do_not_starve_a_normal_client(fresh):
    figures = await hold_idle_sockets(fresh, raw=300, ws=50, hold_s=2.0)
    print("\n(b)", figures.show())
    assert max(figures.hello_ms) < 1000 and max(figures.http_hello_ms) < 1000, figures.show()
    grown_mib = (figures.mem_held["VmRSS"] - figures.mem_before["VmRSS"]) / 1024
    assert grown_mib < 64, figures.show()  # ~350 idle sockets; measured a few MiB
    assert fresh.alive()


async def silent_lockout(host: DoorHost, silent: int, wait_s: float) -> tuple[int, float | None, str]:
    """Open ``silent`` TCP connections that never send a byte, wait ``wait_s`` s (longer than any sane idle
    timeout), then time a normal client's ``host.hello``. Returns (connections opened, hello ms or None, why)."""
    raws = []
    for _ in range(silent):
        try:
            raws.append(await asyncio.wait_for(asyncio.open_connection("127.0.0.1", host.port), 2))
        except (OSError, TimeoutError):
            break
    await asyncio.sleep(wait_s)
    try:
        async with asyncio.timeout(2):
            ws = await host.ws()
            took: float | None = await hello_ms(ws, 1)
            await ws.close()
        why = "ok"
    except (OSError, TimeoutError) as exc:
        took, why = None, f"the normal client could not connect: {exc!r}"
    for _reader, writer in raws:
        writer.close()
    await asyncio.gather(*(w.wait_closed() for _r, w in raws), return_exceptions=True)
    return len(raws), took, why


@pytest.mark.asyncio
async def test_silent_connections_past_the_fd_limit_do_not_lock_a_client_out(tmp_path):
    host = spawn_host(tmp_path / "fd", nofile=256)
    try:
        opened, took, why = await silent_lockout(host, silent=300, wait_s=6.0)
        assert host.alive()  # it recovers once they are gone: not a crash, a lock-out
        assert took is not None and took < 1000, f"{opened} silent connections: {why}"
    finally:
        host.stop()
        if host.popen.stdout is not None:
            host.popen.stdout.close()


# ---- (c) a 100 MB request -----------------------------------------------------------------------------


def _head(host: DoorHost, extra: str) -> bytes:
    return (f"POST /rpc HTTP/1.1\r\nHost: 127.0.0.1:{host.port}\r\nAuthorization: Bearer {TOKEN}\r\n"
            f"Content-Type: application/json\r\n{extra}\r\n").encode()


def big_post(host: DoorHost, size: int = 100 * MIB, chunked: bool = True) -> tuple[int, dict[str, Any], int]:
    """Stream a ``size``-byte POST body over a raw socket (chunked, or with a declared Content-Length)
    until the host answers; returns (HTTP status, JSON body, bytes of body sent before the answer)."""
    sock = socket.create_connection(("127.0.0.1", host.port), timeout=30)
    try:
        sock.sendall(_head(host, "Transfer-Encoding: chunked\r\n" if chunked else f"Content-Length: {size}\r\n"))
        piece = b"[" + b" " * (256 * 1024 - 1)
        frame = (b"%x\r\n" % len(piece) + piece + b"\r\n") if chunked else piece
        sent = 0
        sock.setblocking(False)
        pending = b""
        while sent < size:
            readable, writable, _ = select.select([sock], [sock], [], 30)
            if readable:
                break  # the host has answered: stop sending
            if not writable:
                raise AssertionError("the host neither read nor answered for 30 s")
            if not pending:
                pending = frame
                sent += len(piece)
            try:
                pending = pending[sock.send(pending):]
            except (BrokenPipeError, ConnectionResetError):
                break
        sock.setblocking(True)
        sock.settimeout(30)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            assert chunk, f"the connection closed without an answer: {data!r}"
            data += chunk
        head, _, rest = data.partition(b"\r\n\r\n")
        status = int(head.split()[1])
        length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
        while len(rest) < length:
            chunk = sock.recv(65536)
            assert chunk
            rest += chunk
        return status, json.loads(rest[:length]), sent
    finally:
        sock.close()


def close_code(closed: ConnectionClosed) -> int | None:
    """The close code the host sent, or None when the connection ended without one reaching us."""
    for frame in (closed.rcvd, closed.sent):
        if frame is not None:
            return frame.code
    return None


async def big_ws_frame(host: DoorHost, size: int = 100 * MIB, fragment: int | None = None) -> ConnectionClosed:
    """Send one ``size``-byte binary message (one frame, or ``fragment``-byte fragments) and return how the
    connection closed. The host closes its socket right after its 1009 while our unread bytes are still
    arriving, so the kernel may answer with a reset that discards the close frame before we read it
    (``close_code`` None): a lost courtesy, not a host failure."""
    ws = await host.ws(ping_interval=None)

    async def pieces():
        for start in range(0, size, fragment or size):
            yield b" " * min(fragment or size, size - start)

    try:
        await ws.send(pieces() if fragment else b" " * size)
        async with asyncio.timeout(30):
            await ws.recv()
    except ConnectionClosed as closed:
        return closed
    raise AssertionError("a 100 MB frame was not refused")


async def closes_until_1009(host: DoorHost, fragment: int | None = None, attempts: int = 6) -> list[int | None]:
    """The close codes of 100 MiB messages sent one after another until one clean 1009 (at most
    ``attempts``). A reset loses the 1009 (big_ws_frame) in 4 of 10 attempts with two busy CPUs beside
    the test: three attempts failed a run now and then (0.4³ ≈ 6 %), six leave 0.4⁶ ≈ 0.4 %."""
    seen: list[int | None] = []
    for _ in range(attempts):
        seen.append(close_code(await big_ws_frame(host, fragment=fragment)))
        if seen[-1] == 1009:
            break
    return seen


def test_a_100mb_post_is_refused_without_buffering_it(fresh):
    fresh.rpc("host.hello", {"protocolVersion": 1})
    before = fresh.reset_peak()
    for chunked in (True, False):
        status, body, sent = big_post(fresh, chunked=chunked)
        assert status == 413, (status, body)
        assert body["error"]["code"] == -32600 and body["error"]["data"]["code"] == "LIMIT_EXCEEDED", body
        assert body["id"] is None and body["jsonrpc"] == "2.0"
        assert fresh.alive()
    after = fresh.mem()
    grown = (after["VmHWM"] - before["VmRSS"]) / 1024
    print(f"\n(c) POST 100 MiB: RSS {before['VmRSS'] / 1024:.1f} MiB before, VmHWM {after['VmHWM'] / 1024:.1f} MiB "
          f"after (+{grown:.1f} MiB), RSS now {after['VmRSS'] / 1024:.1f} MiB")
    assert grown < 48, f"the host's peak RSS grew by {grown:.1f} MiB for a refused 100 MiB body"
    fresh.rpc("host.hello", {"protocolVersion": 1})


@pytest.mark.asyncio
async def test_a_100mb_websocket_frame_is_closed_1009(fresh):
    before = fresh.reset_peak()
    seen = await closes_until_1009(fresh)
    assert set(seen) <= {1009, None} and 1009 in seen, seen
    after = fresh.mem()
    grown = (after["VmHWM"] - before["VmRSS"]) / 1024
    print(f"\n(c) WS frame 100 MiB: closes {seen}; VmHWM +{grown:.1f} MiB")
    assert grown < 48, f"the host's peak RSS grew by {grown:.1f} MiB for a refused 100 MiB frame"
    ws = await fresh.ws()  # a fresh socket is served as before
    assert await hello_ms(ws, 1) < 1000
    await ws.close()
    assert fresh.alive()


@pytest.mark.asyncio
async def test_a_100mb_message_in_4mb_fragments_is_closed_1009(fresh):
    before = fresh.reset_peak()
    seen = await closes_until_1009(fresh, fragment=4 * MIB)
    assert set(seen) <= {1009, None} and 1009 in seen, seen
    grown = (fresh.mem()["VmHWM"] - before["VmRSS"]) / 1024
    print(f"\n(c) 100 MiB in 4 MiB fragments: closes {seen}; VmHWM +{grown:.1f} MiB")
    # What is refused must not be buffered whole (100 MiB): the 16 MiB a message may reach before its
    # 1009, the join of its fragments and the socket's read chunks stay well under 64 MiB (22-49 seen).
    assert grown < 64
    assert fresh.alive()


@pytest.mark.asyncio
async def test_a_frame_just_over_the_limit_is_refused_and_one_at_it_is_parsed(door):
    ws = await door.ws(ping_interval=None)
    with pytest.raises(ConnectionClosed) as closed:
        await ws.send(b" " * (MAX_FRAME + 1))
        async with asyncio.timeout(30):
            await ws.recv()
    assert close_code(closed.value) in (1009, None), closed.value  # None: see big_ws_frame
    ws = await door.ws(ping_interval=None)
    padded = json.dumps({"jsonrpc": "2.0", "id": 5, "method": "host.hello", "params": {"protocolVersion": 1}})
    await ws.send(padded + " " * (MAX_FRAME - len(padded)))  # exactly 16 MiB: allowed
    async with asyncio.timeout(30):
        assert json.loads(await ws.recv())["result"]["protocolVersion"] == 1
    await ws.close()


# ---- (d) invalid UTF-8, surrogates and NULs -----------------------------------------------------------


async def _answer(ws: ClientConnection, rid: Any = None) -> Any:
    async with asyncio.timeout(10):
        while True:
            message = json.loads(await ws.recv())
            if isinstance(message, dict) and message.get("method") == "event":
                continue
            if rid is None or message.get("id") == rid:
                return message


@pytest.mark.asyncio
async def test_invalid_utf8_in_a_binary_frame_is_a_parse_error(door):
    before = door.snapshot()
    ws = await door.ws()
    for raw in (b"\xff\xfe", b'{"jsonrpc":"2.0","id":1,"method":"session.create","params":{"title":"\xc3\x28"}}',
                b'{"jsonrpc":"2.0","id":2,"method":"session.create","params":{"title":"\xed\xa0\x80"}}',
                b'{"jsonrpc":"2.0","id":3,"method":"session.create","params":{"title":"ok"}}\xff',
                b"\x00" * 64):
        await ws.send(raw)
        answer = await _answer(ws)
        assert answer["jsonrpc"] == "2.0" and answer["id"] is None and answer["error"]["code"] == -32700, answer
        assert set(answer) == {"jsonrpc", "id", "error"}
    assert await hello_ms(ws, 99) < 1000  # the same socket goes on
    await ws.close()
    assert door.snapshot() == before


@pytest.mark.asyncio
async def test_invalid_utf8_in_a_text_frame_closes_1007_and_the_host_stays_up(door):
    before = door.snapshot()
    ws = await door.ws()
    await ws.send(b'{"jsonrpc":"2.0","id":1,"method":"session.create","params":{"title":"\xff"}}', text=True)
    with pytest.raises(ConnectionClosed) as closed:
        await _answer(ws)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1007, closed.value
    assert door.alive()
    assert door.snapshot() == before


def _valid_session(door: DoorHost) -> str:
    return door.rpc("session.create", {"projectPath": str(door.project), "title": "nul-target"})["id"]


NUL = "a\u0000b"
LOOKUPS = {"notifications.markSeen"}  # marking unknown ids seen is a no-op: {}


def nul_cases(door: DoorHost, sid: str) -> list[tuple[str, dict[str, Any]]]:
    project = str(door.project)
    return [
        ("session.create", {"title": NUL}),
        ("session.create", {"title": "\u0000"}),
        ("session.create", {"projectPath": project + "\u0000"}),
        ("session.create", {"projectPath": project, "title": "ok", "mode": "plan\u0000"}),
        ("session.list", {"projectPath": "\u0000"}),
        ("agent.prompt", {"sessionId": sid, "text": NUL}),
        ("agent.prompt", {"sessionId": sid, "text": "\u0000"}),
        ("agent.prompt", {"sessionId": sid + "\u0000", "text": "hi"}),
        ("agent.prompt", {"sessionId": sid, "text": "hi",
                          "attachments": [{"kind": "file", "name": NUL, "mime": "text/plain", "size": 1, "ref": NUL}]}),
        ("agent.queue.push", {"sessionId": sid, "text": NUL}),
        ("agent.steer", {"sessionId": sid, "turnId": "t_x", "text": NUL}),
        ("session.setMode", {"sessionId": sid, "mode": "plan\u0000"}),
        ("session.setPermissionMode", {"sessionId": sid, "permissionMode": "auto\u0000"}),
        ("session.fork", {"sessionId": sid, "throughMessageId": NUL}),
        ("schedules.create", {"name": NUL, "cron": "0 0 * * *", "projectPath": project, "prompt": "p"}),
        ("schedules.create", {"name": "n", "cron": "0 0 * * *\u0000", "projectPath": project, "prompt": "p"}),
        ("schedules.create", {"name": "n", "cron": "0 0 * * *", "projectPath": project, "prompt": NUL}),
        ("attachments.put", {"name": NUL, "mime": "text/plain", "data": "aGk="}),
        ("attachments.put", {"name": "n", "mime": "text/plain\u0000", "data": "aGk="}),
        ("markdown.render", {"text": NUL}),
        ("plans.resolve", {"approvalId": NUL, "sessionId": sid, "turnId": "t", "decision": "reject", "feedback": NUL}),
        ("permissions.resolve", {"requestId": NUL, "sessionId": sid, "turnId": "t", "decision": "deny"}),
        ("notifications.markSeen", {"ids": [NUL]}),
        ("audit.list", {"sessionId": NUL}),
    ]


@pytest.mark.asyncio
async def test_nul_characters_in_text_params_are_refused_cleanly(door):
    sid = _valid_session(door)
    before = door.snapshot()
    ws = await door.ws()
    for rid, (method, params) in enumerate(nul_cases(door, sid), start=1):
        await ws.send(json.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params}))
        answer = await _answer(ws, rid)
        assert set(answer) in ({"jsonrpc", "id", "error"}, {"jsonrpc", "id", "result"}), answer
        if "result" in answer:
            # only a pure lookup may answer (an id that matches nothing); the snapshot below shows it wrote nothing
            assert method in LOOKUPS, f"{method} accepted a NUL: {answer}"
            continue
        error = answer["error"]
        assert error["code"] in DATA_CODES and (error.get("data") or {}).get("code") in DATA_CODES[error["code"]], \
            (method, params, answer)
    await ws.close()
    assert door.snapshot() == before, "a refused NUL left something behind"
    assert door.rpc("session.get", {"sessionId": sid})["messages"] == []


@pytest.mark.asyncio
async def test_lone_surrogates_are_a_parse_error_not_a_storage_failure(door):
    before = door.snapshot()
    ws = await door.ws()
    for rid, escaped in enumerate(("\\ud800", "\\udfff", "a\\ud83d", "\\udc00\\ud800"), start=1):
        await ws.send('{"jsonrpc":"2.0","id":%d,"method":"session.create","params":{"title":"%s"}}' % (rid, escaped))
        answer = await _answer(ws)
        assert set(answer) == {"jsonrpc", "id", "error"} and answer["error"]["code"] in (-32700, -32602), answer
    # a valid pair is fine and round-trips exactly
    await ws.send('{"jsonrpc":"2.0","id":9,"method":"session.create","params":{"title":"\\ud83d\\ude00 ok"}}')
    made = (await _answer(ws, 9))["result"]
    assert made["title"] == "\U0001f600 ok"
    assert door.rpc("session.get", {"sessionId": made["id"]})["session"]["title"] == "\U0001f600 ok"
    door.rpc("session.delete", {"sessionId": made["id"]})
    await ws.close()
    assert door.snapshot()[0] == before[0]


# ---- (e) RPC fuzzing at volume ------------------------------------------------------------------------



def wire_params(method: str) -> list[str]:
    """The camelCase params a method takes (read off the Host's signatures, as Host.call does)."""
    return [name for name in _wire_params(getattr(Host, METHODS[method])) if name != "self"]


PARAM_NAMES = sorted({name for method in METHODS for name in wire_params(method)})
WORDS = ["agent", "plan", "goal", "ask", "accept-edits", "auto", "approve", "reject", "allow", "deny", "session",
         "interactive", "0 0 * * *", "*/5 * * * *", "bogus cron", "", " ", "null", "true", "..", "../..", "/etc/passwd",
         "~", "%00", "\u202e", "\U0001f600", "é", "A" * 300, "t_0", "s_0", "r_0", "a_0", "text/plain", "aGk=", "###"]


def _text(rng: random.Random) -> str:
    roll = rng.random()
    if roll < 0.5:
        return rng.choice(WORDS)
    if roll < 0.8:
        return "".join(rng.choice(string.printable) for _ in range(rng.randint(0, 24)))
    return "".join(chr(rng.choice([rng.randint(0x20, 0x7E), rng.randint(0xA0, 0xD7FF), rng.randint(0xE000, 0x10FFFF),
                                   0]))
                   for _ in range(rng.randint(1, 12)))


def _value(rng: random.Random, ctx: dict[str, Any], depth: int = 0) -> Any:
    roll = rng.random()
    if roll < 0.25 and ctx["sessions"]:
        return rng.choice(ctx["sessions"])
    if roll < 0.30:
        return str(ctx["project"])
    if roll < 0.55:
        return _text(rng)
    if roll < 0.70:
        return rng.choice([0, 1, -1, 2**31, 2**53, 2**63, 10**30, 1.5, -0.0, 1e308, 200, 10_000, 10_001])
    if roll < 0.78:
        return rng.choice([None, True, False])
    if depth < 3 and roll < 0.9:
        return [_value(rng, ctx, depth + 1) for _ in range(rng.randint(0, 3))]
    if depth < 3:
        return {_text(rng)[:8]: _value(rng, ctx, depth + 1) for _ in range(rng.randint(0, 3))}
    return _text(rng)


def _typed(rng: random.Random, name: str, ctx: dict[str, Any], method: str = "") -> Any:
    """A plausible value for a param of that name (so the fuzz gets past validation into the methods)."""
    if name == "sessionId" and method == "session.delete" and rng.random() < 0.97:
        return "s_nope"  # keep the pre-made sessions alive for most of the run
    if name == "sessionId":
        return rng.choice(ctx["sessions"])
    if name in ("text", "prompt", "title", "name", "feedback", "summary", "reason"):
        return rng.choice(["hi", "please plan", "x" * rng.randint(1, 2000), _text(rng)])
    if name == "projectPath":
        return rng.choice([str(ctx["project"]), str(ctx["project"] / "README.md"), str(ctx["project"]) + "/nope", "rel",
                           "~", "~/", "~nosuchuser-door", "~nosuchuser-door/x", "/" + "a" * 300,
                           str(ctx["project"] / "loop1")])
    if name == "mode":
        return rng.choice(["agent", "plan", "goal", "Plan", "agent "])
    if name == "permissionMode":
        return rng.choice(["ask", "accept-edits", "auto", "yolo"])
    if name == "decision":
        return rng.choice(["approve", "reject", "allow", "deny", "maybe"])
    if name == "protocolVersion":
        return rng.choice([1, 1, 0, 2, "1", 1.0, True, 2**63, -(2**63) - 1, 2**70])
    if name in ("limit", "beforeSeq"):  # out of range (SQLite's int64 too) and not integers: INVALID_PARAMS
        return rng.choice([1, 5, 200, 0, -1, 10_000, 10**12, 2**63 - 1, 2**63, -(2**63) - 1, 2**64, -(2**70),
                           True, False, 1.0, 2.5e300])
    if name == "cron":
        return rng.choice(["0 0 * * *", "0 0 1 1 *", "61 * * * *", "* * *", "@hourly"])
    if name in ("unseenOnly", "smart"):
        return rng.choice([True, False])
    if name == "remember":
        return rng.choice(["session", "forever", None])
    if name.endswith("Id"):
        return rng.choice(ctx["sessions"] + ["t_1", "r_1", "a_1", "m_1", "q_1"])
    return _value(rng, ctx)


def _method(rng: random.Random) -> str:
    roll = rng.random()
    names = sorted(METHODS)
    if roll < 0.75:
        return rng.choice(names)
    name = rng.choice(names)
    mutations = [name.upper(), name + " ", name.replace(".", "_"), name.replace(".", "/"), "." + name, name + ".",
                 "__init__", "call", "close", "_wire", "store", "parts.session", "session.__class__", "host.close",
                 "constructor", "__proto__", "", "rpc.discover", name.split(".")[0], name + "\u0000", "ΣΣ"]
    return rng.choice(mutations) if roll < 0.95 else _text(rng)


def _params(rng: random.Random, method: str, ctx: dict[str, Any]) -> Any:
    roll = rng.random()
    if roll < 0.05:
        return _value(rng, ctx)  # anything, often not an object
    if roll < 0.10:
        return None
    names = wire_params(method) if method in METHODS else PARAM_NAMES
    params = {}
    typed = rng.random() < 0.6
    for name in names:
        if rng.random() < (0.9 if typed else 0.6):
            params[name] = _typed(rng, name, ctx, method) if typed and rng.random() < 0.9 else _value(rng, ctx)
    if rng.random() < 0.1:
        params[rng.choice(PARAM_NAMES + ["__class__", "clientId", "client_id", "self"])] = _value(rng, ctx)
    return params


def _request(rng: random.Random, rid: int | None, ctx: dict[str, Any]) -> dict[str, Any]:
    method = _method(rng)
    request: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
    if rid is not None:
        request["id"] = rid
    params = _params(rng, method, ctx)
    if params is not None or rng.random() < 0.5:
        request["params"] = params
    return request


@dataclass
class FuzzFigures:
    cases: int = 0
    frames: int = 0
    answers: int = 0
    seconds: float = 0.0
    failures: list[str] = field(default_factory=list)
    codes: dict[str, int] = field(default_factory=dict)
    messages: dict[str, int] = field(default_factory=dict)  # the INVALID_PARAMS messages, first words
    results: int = 0
    mem_before: dict[str, int] = field(default_factory=dict)
    mem_after: dict[str, int] = field(default_factory=dict)

    def show(self) -> str:
        top = ", ".join(f"{k} {v}" for k, v in sorted(self.codes.items(), key=lambda kv: -kv[1])[:12])
        return (f"{self.cases} cases in {self.frames} frames over WebSocket, {self.seconds:.1f} s "
                f"({self.cases / max(self.seconds, 1e-9):.0f} cases/s); {self.results} results, errors: {top}; "
                f"RSS {self.mem_before['VmRSS'] / 1024:.1f} -> {self.mem_after['VmRSS'] / 1024:.1f} MiB "
                f"(VmHWM {self.mem_after['VmHWM'] / 1024:.1f}); "
                f"failures: {len(self.failures)}")


def _check(answer: Any, figures: FuzzFigures, where: str, request: Any = None) -> None:
    def fail(why: str) -> None:
        if len(figures.failures) < 50:
            figures.failures.append(f"{where}: {why}: {json.dumps(answer)[:400]}")
        else:
            figures.failures.append("…")

    if not isinstance(answer, dict) or answer.get("jsonrpc") != "2.0" or "id" not in answer:
        return fail("not a JSON-RPC response")
    if "result" in answer:
        if set(answer) != {"jsonrpc", "id", "result"}:
            fail("a result with extra members")
        figures.results += 1
        return None
    if set(answer) != {"jsonrpc", "id", "error"}:
        return fail("neither result nor error")
    error = answer["error"]
    if not isinstance(error, dict) or not isinstance(error.get("message"), str) or set(error) - {"code", "message", "data"}:
        return fail("a malformed error object")
    code, data_code = error.get("code"), (error.get("data") or {}).get("code")
    figures.codes[str(data_code or code)] = figures.codes.get(str(data_code or code), 0) + 1
    if data_code == "INVALID_PARAMS":
        key = " ".join(error["message"].split()[:3])[:60]
        figures.messages[key] = figures.messages.get(key, 0) + 1
    if code not in DATA_CODES or data_code not in DATA_CODES[code]:
        fail(f"an undocumented error code {code}/{data_code}")
    return None


async def run_fuzz(host: DoorHost, cases: int, seed: int = 7, sockets: int = 4, window: int = 64) -> FuzzFigures:
    """``cases`` seeded random requests, pipelined over ``sockets`` WebSockets (at most ``window`` frames in
    flight per socket): 80 % single requests, 8 % batches (2-6 requests), 7 % notifications (no answer
    expected), 5 % malformed frames (answered with id null). Every answer is checked."""
    rng = random.Random(seed)
    loop = host.project / "loop1"
    if not loop.is_symlink():
        loop.symlink_to("loop2")
        (host.project / "loop2").symlink_to("loop1")
    ctx: dict[str, Any] = {"project": host.project, "sessions": [
        host.rpc("session.create", {"projectPath": str(host.project), "title": f"fuzz{i}"})["id"] for i in range(8)]}
    ctx["sessions"] += ["s_nope", ""]
    figures = FuzzFigures(mem_before=host.mem())
    next_id = iter(range(1, 10**9))
    plan: list[list[tuple[str, Any]]] = [[] for _ in range(sockets)]  # per socket: (kind, frame)
    made = 0
    while made < cases:
        roll = rng.random()
        lane = plan[rng.randrange(sockets)]
        if roll < 0.80:
            lane.append(("one", _request(rng, next(next_id), ctx)))
            made += 1
        elif roll < 0.88:
            batch = [_request(rng, next(next_id) if rng.random() < 0.85 else None, ctx) for _ in range(rng.randint(2, 6))]
            lane.append(("batch", batch))
            made += len(batch)
        elif roll < 0.95:
            lane.append(("note", _request(rng, None, ctx)))
            made += 1
        else:
            good = json.dumps(_request(rng, next(next_id), ctx))
            cut = rng.randrange(1, max(2, len(good)))
            lane.append(("bad", rng.choice([good[:cut], good + "}", good.replace('"', "'", 1), "[]", "{}", "1",
                                            "\u0000", "{" * 2000 + "}" * 2000, "[" * 100_000])))
            made += 1
    figures.cases = made
    start = time.perf_counter()

    async def drive(frames: list[tuple[str, Any]], lane_no: int) -> None:
        ws = await host.ws(ping_interval=None)
        expected: dict[Any, Any] = {}  # id -> the request
        batches: dict[int, set[int]] = {}
        sent_by_id: dict[Any, Any] = {}
        nulls = 0
        credit = asyncio.Semaphore(window)
        done = asyncio.Event()
        outstanding = 0

        async def read() -> None:
            nonlocal nulls, outstanding
            async for raw in ws:
                message = json.loads(raw)
                if isinstance(message, dict) and message.get("method") == "event":
                    continue
                figures.answers += 1
                if isinstance(message, list):
                    ids = {m.get("id") for m in message if isinstance(m, dict)}
                    key = min((i for i in ids if isinstance(i, int)), default=None)
                    if key not in batches or batches[key] != ids:
                        _check(None, figures, f"lane {lane_no}: an unexpected batch answer {sorted(map(str, ids))}")
                    else:
                        del batches[key]
                    for one in message:
                        rid = one.get("id") if isinstance(one, dict) else None
                        _check(one, figures, f"lane {lane_no} batch", sent_by_id.pop(rid, None))
                else:
                    rid = message.get("id") if isinstance(message, dict) else None
                    if rid is None:
                        nulls -= 1
                        if nulls < 0:
                            _check(None, figures, f"lane {lane_no}: more id-null answers than malformed frames")
                    elif expected.pop(rid, None) is None:
                        _check(None, figures, f"lane {lane_no}: an answer for id {rid!r} nobody asked")
                    _check(message, figures, f"lane {lane_no}", sent_by_id.pop(rid, None))
                outstanding -= 1
                credit.release()
                if outstanding == 0 and done.is_set():
                    return

        reader = asyncio.create_task(read())
        for kind, frame in frames:
            if kind == "note":
                await ws.send(json.dumps(frame))
                continue
            if kind == "batch":
                ids = {item["id"] for item in frame if "id" in item}
                if not ids:
                    await ws.send(json.dumps(frame))
                    continue
                batches[min(ids)] = ids
                sent_by_id.update({item["id"]: item for item in frame if "id" in item})
            elif kind == "one":
                expected[frame["id"]] = frame
                sent_by_id[frame["id"]] = frame
            else:
                nulls += 1
            await credit.acquire()
            outstanding += 1
            await ws.send(frame if kind == "bad" else json.dumps(frame))
            if reader.done():
                break
        done.set()
        try:
            async with asyncio.timeout(120):
                if outstanding:
                    await reader
        except TimeoutError:
            figures.failures.append(f"lane {lane_no}: {outstanding} frames never answered "
                                    f"(e.g. {list(expected.items())[:5]})")
        if reader.done() and reader.exception() is not None:
            figures.failures.append(f"lane {lane_no}: the connection failed: {reader.exception()!r}")
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
        # nothing left unanswered, and a notification got no answer: a last request is answered first
        if await hello_ms(ws, -1) > 1000:
            figures.failures.append(f"lane {lane_no}: a slow host.hello after the fuzz")
        if expected or batches or nulls:
            figures.failures.append(f"lane {lane_no}: unanswered: {len(expected)} requests, {len(batches)} batches, "
                                    f"{nulls} malformed frames")
        await ws.close()

    await asyncio.gather(*(drive(frames, n) for n, frames in enumerate(plan)))
    figures.seconds = time.perf_counter() - start
    figures.frames = sum(len(frames) for frames in plan)
    figures.mem_after = host.mem()
    if not host.alive():
        figures.failures.append("the host is down after the fuzz")
    for chunk in host.stderr().split("failed inside the host")[1:]:
        raised = [line for line in chunk.splitlines() if re.match(r"^[A-Za-z_.]*(Error|Exception)\b", line)]
        figures.failures.append(f"the host logged an internal failure: {raised[-1:]}")
    return figures


@dataclass
class UnauthFigures:
    sent: int = 0
    refused: int = 0
    accepted: list[str] = field(default_factory=list)
    seconds: float = 0.0


UNAUTH_HEADERS = [{}, {"Authorization": "Bearer"}, {"Authorization": "Bearer wrong"},
                  {"Authorization": f"Bearer {TOKEN[:-1]}"}, {"Authorization": f"bearer {TOKEN}x"},
                  {"Authorization": f"Basic {TOKEN}"}, {"Cookie": f"token={TOKEN}"}, {"X-Token": TOKEN},
                  {"Authorization": f"Bearer  {TOKEN}"}, {"Authorization": f"Token {TOKEN}"}]


async def run_unauthorised(host: DoorHost, cases: int, seed: int = 11, concurrency: int = 16) -> UnauthFigures:
    """``cases`` random requests over HTTP POST without a valid token (missing, wrong, near-miss, in a
    cookie or the query string): every one must be 401."""
    rng = random.Random(seed)
    ctx: dict[str, Any] = {"project": host.project, "sessions": [s["id"] for s in host.rpc("session.list")["sessions"]][:3] + ["s_nope"]}
    jobs = []
    for n in range(cases):
        frame: Any = _request(rng, n, ctx) if rng.random() < 0.7 else {
            "jsonrpc": "2.0", "id": n, "method": "session.create", "params": {"projectPath": str(host.project),
                                                                          "title": "unauthorised"}}
        if rng.random() < 0.1:
            frame = [frame, {"jsonrpc": "2.0", "id": -n, "method": "schedules.create",
                             "params": {"name": "x", "cron": "* * * * *", "projectPath": str(host.project),
                                        "prompt": "p"}}]
        query = rng.choice(["", f"?token={TOKEN}", "?token=", f"?access_token={TOKEN}"])
        jobs.append((rng.choice(UNAUTH_HEADERS) | {"Content-Type": "application/json"}, query, json.dumps(frame)))
    figures = UnauthFigures()
    queue: asyncio.Queue[tuple[dict[str, str], str, str]] = asyncio.Queue()
    for job in jobs:
        queue.put_nowait(job)
    start = time.perf_counter()
    async with httpx.AsyncClient(trust_env=False, timeout=30,
                                 limits=httpx.Limits(max_keepalive_connections=concurrency)) as http:
        async def worker() -> None:
            while not queue.empty():
                headers, query, body = queue.get_nowait()
                answer = await http.post(host.url + "/rpc" + query, content=body.encode(), headers=headers)
                figures.sent += 1
                if answer.status_code == 401 and TOKEN not in answer.text:
                    figures.refused += 1
                elif len(figures.accepted) < 20:
                    figures.accepted.append(f"{answer.status_code} {headers} {query} {body[:200]} -> {answer.text[:200]}")

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    figures.seconds = time.perf_counter() - start
    return figures


@pytest.mark.asyncio
async def test_unauthorised_fuzz_is_always_401_and_changes_nothing(door):
    before = door.snapshot()
    figures = await run_unauthorised(door, 1000)
    print(f"\n(e) unauthorised: {figures.sent} sent, {figures.refused} refused 401 in {figures.seconds:.1f} s")
    assert figures.refused == figures.sent == 1000, figures.accepted
    assert door.snapshot() == before


@pytest.mark.asyncio
async def test_rpc_fuzz_10k_cases(door):
    figures = await run_fuzz(door, 10_000)
    print("\n(e)", figures.show())
    print(sorted(figures.messages.items(), key=lambda kv: -kv[1])[:25])
    assert not figures.failures, "\n".join(figures.failures[:20])
    assert door.alive()


# ---- unusable project paths (once INTERNAL answers; now INVALID_PARAMS) -------------------------------

BAD_PATHS = [
    # (bug, method, projectPath) — each answers -32000 INTERNAL (an uncaught exception) instead of INVALID_PARAMS
    ("BUG-1", "session.create", "~nosuchuser-door"),
    ("BUG-1", "session.list", "~nosuchuser-door"),
    ("BUG-1", "schedules.create", "~nosuchuser-door/x"),
    ("BUG-2", "session.list", "LOOP"),
    ("BUG-3", "session.create", "/" + "a" * 300),
    ("BUG-3", "schedules.create", "/" + "a" * 300),
]
@pytest.mark.parametrize("bug, method, path", BAD_PATHS, ids=[f"{b}-{m}" for b, m, _ in BAD_PATHS])
def test_an_unusable_project_path_is_invalid_params(door, bug, method, path):
    if path == "LOOP":
        loop = door.project / "loopA"
        if not loop.is_symlink():
            loop.symlink_to("loopB")
            (door.project / "loopB").symlink_to("loopA")
        path = str(loop)
    params: dict[str, Any] = {"projectPath": path}
    if method == "schedules.create":
        params |= {"name": "n", "cron": "0 0 * * *", "prompt": "p"}
    before = door.snapshot()
    answer = httpx.post(door.url + "/rpc", json={"jsonrpc": "2.0", "id": 1, "method": method, "params": params},
                        headers={"Authorization": f"Bearer {TOKEN}"}, trust_env=False, timeout=30).json()
    assert door.snapshot() == before  # true today as well: nothing is written before the exception
    assert "error" in answer and answer["error"]["code"] == -32602, answer
    assert answer["error"]["data"]["code"] == "INVALID_PARAMS"


# ---- (f) issue 15: readers that stall, connections that never finish a request ---------------------------


def _stream_script(root: Path, words: int, per_burst: int) -> Path:
    """A model script whose one turn streams ``words`` short deltas, in bursts of ``per_burst`` (a
    Read call between bursts paces it, as a real model's network does: the scripted model streams
    a response without yielding)."""
    responses: list[dict[str, Any]] = []
    for start in range(0, words, per_burst):
        text = "".join(f"w{i} " for i in range(start, min(words, start + per_burst)))
        responses.append({"text": text, "toolCalls": [{"name": "Read", "args": {"path": "README.md"}}]})
    responses.append({"text": "done"})
    path = root / "stream.json"
    path.write_text(json.dumps({"responses": responses}))
    return path


async def _stalled_ws(host: DoorHost) -> ClientConnection:
    """An authenticated WebSocket that never reads: a small receive buffer, and the client stops
    reading its socket once a few messages wait (``max_queue``)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, 536)  # the host's send buffer then stays small too
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", host.port))
    return await connect(host.ws_url, sock=sock, additional_headers={"Authorization": f"Bearer {TOKEN}"}, proxy=None,
                         max_size=None, compression=None, ping_interval=None, max_queue=4, open_timeout=10)


@pytest.mark.asyncio
async def test_stalled_websocket_readers_cost_bounded_memory_and_are_closed_1013(tmp_path):
    """Authority hole 9: 20 authenticated sockets that never read while one turn streams 40,000 deltas
    (PROTOCOL.md's default bound: 10,000 events behind). Before the fix each socket's queue held every
    event it had not read, and the host's RSS grew with every event (~1.4 kB per event here, +57 MiB;
    the issue measured 107 -> 494 MiB for 2 MB in ~250k deltas); now each is dropped at the bound, the
    host's RSS grows by a few MiB (at most ~20: 20 queues of 10,000), and each socket,
    when it reads later, gets a gapless run of events and then the close code 1013. The client that
    reads gets every delta."""
    root = tmp_path / "stall"
    root.mkdir()
    words = 40_000
    host = spawn_host(root, "--model", f"scripted/{_stream_script(root, words, 4000)}")
    try:
        stalled = [await _stalled_ws(host) for _ in range(20)]
        reader = await host.ws(max_queue=None)
        await reader.send(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "session.create",
                                      "params": {"projectPath": str(host.project), "permissionMode": "auto"}}))
        before = host.mem()
        peak = dict(before)
        deltas = 0
        async with asyncio.timeout(60):
            while True:
                message = json.loads(await reader.recv())
                if message.get("id") == 1:
                    await reader.send(json.dumps({"jsonrpc": "2.0", "id": 2, "method": "agent.prompt",
                                                  "params": {"sessionId": message["result"]["id"], "text": "go"}}))
                    continue
                if message.get("method") != "event":
                    continue
                kind = message["params"]["type"]
                deltas += kind == "message.delta"
                if deltas % 2000 == 0 or kind == "turn.ended":
                    now = host.mem()
                    peak = {k: max(peak[k], now[k]) for k in now}
                if kind == "turn.ended":
                    assert message["params"]["reason"] == "completed", message
                    break
        assert deltas == words + 1  # the reader lost nothing ("done" is the last delta)
        grown_mib = (peak["VmRSS"] - before["VmRSS"]) / 1024
        print(f"\n(f) 20 stalled sockets, {words} deltas: host RSS {before['VmRSS'] / 1024:.0f} -> peak "
              f"{peak['VmRSS'] / 1024:.0f} MiB")
        assert grown_mib < 32, f"the host's RSS grew {grown_mib:.0f} MiB with 20 stalled readers"
        codes: list[int | None] = []
        for ws in stalled:
            seqs: list[int] = []
            try:
                async with asyncio.timeout(10):
                    async for raw in ws:
                        seqs.append(json.loads(raw)["params"]["seq"])
            except ConnectionClosed:
                pass
            except TimeoutError:
                pass  # still open: the code below says so
            codes.append(ws.close_code)
            assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), "a hole in a stalled socket's events"
            assert len(seqs) < words
        assert codes == [1013] * 20, f"close codes seen by the stalled sockets (None: never closed): {codes}"
        await reader.close()
        assert host.alive()
    finally:
        assert host.stop() == 0, host.stderr()[-3000:]
        if host.popen.stdout is not None:
            host.popen.stdout.close()


SLOWLORIS = """
import socket, sys, time
port, first, rate = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
held, refused = [], 0
def one():
    global refused
    try:
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        sock.sendall(b"P")
        held.append(sock)
    except OSError:
        refused += 1
for _ in range(first):
    one()
print("ready", flush=True)
for i in range(100_000):  # then `rate` more a second until killed
    one()
    if i % 10 == 9:
        print(len(held) + refused, flush=True)
        time.sleep(10 / rate)
"""


def slowloris(port: int, first: int, rate: float) -> subprocess.Popen[str]:
    """A process of its own (sharing neither event loop nor GIL with the client measured) that opens
    ``first`` connections each sending one byte of a request, then ``rate`` more a second, until killed."""
    attacker = subprocess.Popen([sys.executable, "-c", SLOWLORIS, str(port), str(first), str(rate)],
                                stdout=subprocess.PIPE, text=True)
    assert attacker.stdout is not None and attacker.stdout.readline() == "ready\n"
    return attacker


@pytest.mark.asyncio
async def test_two_thousand_slow_connections_do_not_lock_out_an_authenticated_client(tmp_path):
    """Authority hole 10: slowloris needs no token. The host runs with 1,024 descriptors (soft and
    hard, a desktop's default) and 2,000 connections each send one byte of a request, then more keep
    coming (200 a second) while a client is served. Before the fix they took every descriptor
    (``OSError: [Errno 24]`` in accept) and ``/healthz``, ``host.hello`` and ``session.create`` all
    timed out; now connections are capped below the limit and the longest-waiting slow one makes room
    for a new one, so an authenticated client connects, and once in, every answer takes < 100 ms,
    over its WebSocket and over fresh HTTP connections, while the attack goes on."""
    host = spawn_host(tmp_path / "slow", nofile=1024, hard_nofile=1024)
    attacker = slowloris(host.port, 2000, 200)
    try:
        async with asyncio.timeout(10):  # getting in: behind the 2,000 still in the host's accept queue
            ws = await host.ws()
            await hello_ms(ws, 0)
        took = [await hello_ms(ws, rid) for rid in range(1, 21)]
        async with httpx.AsyncClient(trust_env=False, timeout=10, limits=httpx.Limits(max_keepalive_connections=0)) as http:
            for _ in range(10):  # each on a fresh connection, which has to get in past the slow ones
                start = time.perf_counter()
                answer = await http.post(host.url + "/rpc", headers={"Authorization": f"Bearer {TOKEN}"},
                                         json={"jsonrpc": "2.0", "id": 1, "method": "host.hello",
                                               "params": {"protocolVersion": 1}})
                took.append((time.perf_counter() - start) * 1000)
                assert answer.status_code == 200 and answer.json()["result"]["protocolVersion"] == 1, answer.text
                start = time.perf_counter()
                assert (await http.get(host.url + "/healthz")).status_code == 200
                took.append((time.perf_counter() - start) * 1000)
            created = await http.post(host.url + "/rpc", headers={"Authorization": f"Bearer {TOKEN}"},
                                      json={"jsonrpc": "2.0", "id": 1, "method": "session.create",
                                            "params": {"projectPath": str(host.project)}})
            assert "result" in created.json(), created.text  # a write (with its fsync) gets through too
        assert attacker.poll() is None, "the attack stopped before the client was served"
        attacker.kill()  # the process this test started, by its handle
        assert attacker.stdout is not None
        opened = max([2000, *(int(line) for line in attacker.stdout.read().split())])
        await ws.close()
        print(f"\n(f) {opened} slow connections at 1,024 descriptors: answers max {max(took):.1f} ms, "
              f"median {sorted(took)[len(took) // 2]:.1f} ms: {[round(t) for t in took]}")
        # < 100 ms each; two of the 40 may be late (a loaded 2-CPU machine's scheduler), none past 1 s
        assert sorted(took)[-3] < 100 and max(took) < 1000, took
        assert "Errno 24" not in host.stderr() and "Too many open files" not in host.stderr(), host.stderr()[-2000:]
        assert host.alive()
    finally:
        if attacker.poll() is None:
            attacker.kill()
        attacker.wait()
        if attacker.stdout is not None:
            attacker.stdout.close()
        assert host.stop() == 0, host.stderr()[-3000:]
        if host.popen.stdout is not None:
            host.popen.stdout.close()
