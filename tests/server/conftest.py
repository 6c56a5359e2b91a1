"""Fixtures for the protocol server tests: the REAL server, on a loopback port, driven over the wire.

- ``served`` / ``start_server`` run ``pidesk.server.serve.serve`` as a task of the
  test's event loop (port 0, a fixed token, a tmp data dir, a ``ScriptedProvider``
  the test keeps). Readiness is the ``announce`` callback, never a sleep. Teardown
  cancels the task and fails the test if that cancellation left ``host.json`` or
  the data-dir lock behind. ``shared_served`` is one such server for a whole module.
- The Host that ``serve`` opens is a ``TestHost``: the real Host plus a record of
  the connections the server reported closed (so a test can wait for a close to
  be processed). Tests also reach its store connection for two fault set-ups
  (``PRAGMA max_page_count`` / ``busy_timeout``); nothing else of it is touched.
- ``spawn`` starts ``python -m pidesk serve …`` as a subprocess (lifecycle tests)
  and reads the announced URL from its stdout.
- ``WsClient`` is a JSON-RPC client over a real WebSocket (``websockets``'
  asyncio client): responses routed by id, ``event`` notifications recorded in
  arrival order.

Tests use all of this through fixtures; none imports this file.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
import pytest_asyncio
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from pidesk.config import HostConfig
from pidesk.host import Host
from pidesk.providers.scripted import ScriptedProvider
from pidesk.server import serve as serve_module
from pidesk.server.protocol import DoorLimits
from pidesk.server.serve import ServeOptions
from pidesk.store.lock import DataDirLock

TOKEN = "pidesk-test-token-0123456789abcdef"
EVENT_TIMEOUT = 10.0


class RpcError(Exception):
    def __init__(self, response: dict[str, Any]) -> None:
        self.response = response
        error = response["error"]
        self.code: int = error["code"]
        self.data_code: str | None = (error.get("data") or {}).get("code")
        super().__init__(f"{self.code} {self.data_code}: {error.get('message')}")


def result_of(response: dict[str, Any]) -> Any:
    if "error" in response:
        raise RpcError(response)
    return response["result"]


class WsClient:
    """One JSON-RPC connection over a real WebSocket."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.events: list[dict[str, Any]] = []  # the params of every event, in arrival order
        self.replies: asyncio.Queue[Any] = asyncio.Queue()  # responses nobody is waiting for by id
        self.closed: ConnectionClosed | None = None
        self._pending: dict[Any, asyncio.Future[dict[str, Any]]] = {}
        self._ids = itertools.count(1)
        self._cursor = 0
        self._news = asyncio.Event()
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        try:
            async for raw in self.ws:
                message = json.loads(raw)
                if isinstance(message, dict) and message.get("method") == "event":
                    assert set(message) == {"jsonrpc", "method", "params"} and message["jsonrpc"] == "2.0", message
                    self.events.append(message["params"])
                    self._news.set()
                    continue
                rid = message.get("id") if isinstance(message, dict) else None
                future = self._pending.pop(rid, None) if isinstance(rid, (int, str)) else None
                if future is not None and not future.done():
                    future.set_result(message)
                else:
                    self.replies.put_nowait(message)
        except ConnectionClosed as exc:
            self.closed = exc
        finally:
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(ConnectionError(f"the connection closed: {self.closed}"))
            self._news.set()

    async def request(self, method: str, params: Any = None, *, rid: Any = None) -> dict[str, Any]:
        """Send one request and return its whole response object."""
        rid = next(self._ids) if rid is None else rid
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[rid] = future
        frame: dict[str, Any] = {"jsonrpc": "2.0", "id": rid, "method": method}
        if params is not None:
            frame["params"] = params
        await self.ws.send(json.dumps(frame))
        async with asyncio.timeout(EVENT_TIMEOUT):
            return await future

    async def call(self, method: str, params: Any = None) -> Any:
        return result_of(await self.request(method, params))

    async def error(self, method: str, params: Any = None) -> RpcError:
        response = await self.request(method, params)
        assert "error" in response and "result" not in response, response
        return RpcError(response)

    async def send_raw(self, frame: str | bytes) -> None:
        await self.ws.send(frame)

    async def reply(self, timeout: float = EVENT_TIMEOUT) -> Any:
        """The next response that no ``request`` is waiting for (an answer to ``send_raw``)."""
        async with asyncio.timeout(timeout):
            return await self.replies.get()

    async def event(self, type_: str, where: Callable[[dict[str, Any]], bool] | None = None,
                    timeout: float = EVENT_TIMEOUT) -> dict[str, Any]:
        """The next event of ``type_`` matching ``where``; events before it are passed over."""
        async with asyncio.timeout(timeout):
            while True:
                while self._cursor < len(self.events):
                    params = self.events[self._cursor]
                    self._cursor += 1
                    if params["type"] == type_ and (where is None or where(params)):
                        return params
                if self.closed is not None:
                    raise ConnectionError(f"the connection closed while waiting for {type_}: {self.closed}")
                self._news.clear()
                await self._news.wait()

    async def turn_ended(self, turn_id: str) -> dict[str, Any]:
        return await self.event("turn.ended", lambda e: e["turnId"] == turn_id)

    def seen(self, type_: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["type"] == type_]

    async def close(self) -> None:
        await self.ws.close()
        with contextlib.suppress(Exception):
            await self._reader


@dataclass
class Served:
    """A running in-process server and the handles a test needs."""

    url: str
    port: int
    token: str
    provider: ScriptedProvider
    data_dir: Path
    project: Path
    host: TestHost
    ready_checks: dict[str, Any]
    http: httpx.AsyncClient
    clients: list[WsClient] = field(default_factory=list)

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/rpc"

    def auth(self, token: str | None = None) -> dict[str, str]:
        return {"Authorization": f"Bearer {token or self.token}"}

    async def ws(self, *, query_token: bool = False, headers: dict[str, str] | None = None,
                 origin: str | None = None) -> WsClient:
        url = self.ws_url + (f"?token={self.token}" if query_token else "")
        hdrs = {} if query_token else self.auth()
        hdrs.update(headers or {})
        ws = await connect(url, additional_headers=hdrs, origin=origin, proxy=None, max_size=None,  # type: ignore[arg-type]
                           compression=None, open_timeout=5)
        client = WsClient(ws)
        self.clients.append(client)
        return client

    async def post(self, body: Any, headers: dict[str, str] | None = None, *, authed: bool = True,
                   raw: bool = False, path: str = "/rpc") -> httpx.Response:
        hdrs = {"Content-Type": "application/json", **(self.auth() if authed else {}), **(headers or {})}
        content = body if raw else json.dumps(body).encode()
        return await self.http.post(self.url + path, content=content, headers=hdrs)

    async def call(self, method: str, params: Any = None) -> Any:
        """One method over HTTP POST; the result, or RpcError."""
        frame: dict[str, Any] = {"jsonrpc": "2.0", "id": 1, "method": method}
        if params is not None:
            frame["params"] = params
        response = await self.post(frame)
        assert response.status_code == 200, (response.status_code, response.text)
        return result_of(response.json())

    async def snapshot(self) -> tuple[Any, Any]:
        """What the fuzz/auth tests compare before and after: every session and the whole audit log."""
        return (await self.call("session.list"))["sessions"], (await self.call("audit.list", {"limit": 10_000}))["entries"]


class TestHost(Host):
    """The real Host, plus a record of which connections the server reported closed."""

    __test__ = False
    instances: list[TestHost] = []

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.closed_clients: list[str] = []
        self.client_closed_event = asyncio.Event()
        TestHost.instances.append(self)

    def client_closed(self, client_id: str) -> None:
        super().client_closed(client_id)
        self.closed_clients.append(client_id)
        self.client_closed_event.set()

    async def wait_clients_closed(self, count: int) -> None:
        async with asyncio.timeout(EVENT_TIMEOUT):
            while len(self.closed_clients) < count:
                self.client_closed_event.clear()
                await self.client_closed_event.wait()


def http_client() -> httpx.AsyncClient:
    # No keep-alive: the server's accepted sockets lack TCP_NODELAY and uvicorn writes a response's
    # head and body apart, so every request after the first on a kept-alive connection waits out a
    # ~40 ms delayed ACK (reported). A fresh connection per request avoids the stall.
    return httpx.AsyncClient(trust_env=False, timeout=30, limits=httpx.Limits(max_keepalive_connections=0))


def lock_is_free(data_dir: Path) -> bool:
    try:
        DataDirLock(data_dir).release()
    except Exception:
        return False
    return True


@dataclass
class ServerHandle:
    served: Served
    task: asyncio.Task[None]

    async def stop(self) -> None:
        """Cancel the serve task (closing our clients first) and wait for it to finish."""
        for client in self.served.clients:
            with contextlib.suppress(Exception):
                await client.close()
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            async with asyncio.timeout(15):
                await self.task

    def leftovers(self) -> list[str]:
        """What a clean shutdown must not leave behind."""
        problems = []
        if (self.served.data_dir / "host.json").exists():
            problems.append("host.json left behind after the serve task was cancelled")
        if not lock_is_free(self.served.data_dir):
            problems.append("the data-dir lock is still held after the serve task was cancelled")
        return problems


async def launch(data_dir: Path, project: Path, http: httpx.AsyncClient, provider: ScriptedProvider | None = None,
                 limits: DoorLimits | None = None, **config: Any) -> ServerHandle:
    """Run ``serve`` as a task of the running loop and return once it has announced itself
    (``limits``: the door's, e.g. a short request deadline; PROTOCOL.md's by default)."""
    provider = provider or ScriptedProvider()
    ready = asyncio.Event()
    box: dict[str, Any] = {}

    def announce(url: str, token: str) -> None:
        port = int(url.rsplit(":", 1)[1])
        box["url"], box["token"], box["port"] = url, token, port
        # what is true at the moment of the announcement: host.json is on disk and the port accepts
        host_json = data_dir / "host.json"
        box["host_json_at_announce"] = json.loads(host_json.read_text()) if host_json.exists() else None
        box["host_json_mode"] = host_json.stat().st_mode & 0o777 if host_json.exists() else None
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            box["accepting_at_announce"] = True
        ready.set()

    TestHost.instances = []
    with pytest.MonkeyPatch.context() as patch:  # only while serve() opens its Host
        patch.setattr(serve_module, "Host", TestHost)
        task = asyncio.create_task(serve_module.serve(
            HostConfig(data_dir=data_dir, **config), provider,
            ServeOptions(port=0, token=TOKEN, limits=limits or DoorLimits()), announce,
        ))
        waiter = asyncio.create_task(ready.wait())
        await asyncio.wait({task, waiter}, timeout=15, return_when=asyncio.FIRST_COMPLETED)
    if not ready.is_set():
        waiter.cancel()
        if task.done():
            task.result()  # raise what serve raised
        raise AssertionError("the server did not announce itself within 15 s")
    served = Served(url=box["url"], port=box["port"], token=box["token"], provider=provider, data_dir=data_dir,
                    project=project, host=TestHost.instances[-1], ready_checks=box, http=http)
    return ServerHandle(served, task)


@pytest_asyncio.fixture
async def start_server(tmp_path: Path, project: Path) -> AsyncIterator[Callable[..., Any]]:
    """Start the real server in-process: ``await start_server(provider=…, limits=…, **HostConfig fields)``.

    Teardown cancels every serve task still running and fails the test if that left
    host.json or the data-dir lock behind."""
    handles: list[ServerHandle] = []
    http = http_client()

    async def start(provider: ScriptedProvider | None = None, data_dir: Path | None = None,
                    limits: DoorLimits | None = None, **config: Any) -> Served:
        handle = await launch(data_dir or tmp_path / f"data{len(handles)}", project, http, provider, limits,
                              **config)
        handles.append(handle)
        return handle.served

    start.handles = handles  # type: ignore[attr-defined]
    yield start
    problems = []
    for handle in handles:
        if not handle.task.done():
            await handle.stop()
        problems += handle.leftovers()
    await http.aclose()
    assert not problems, problems


@pytest_asyncio.fixture
async def served(start_server: Callable[..., Any], provider: ScriptedProvider) -> Served:
    return await start_server(provider=provider)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def shared_served(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Served]:
    """One server for a whole module (its tests run in the module's event loop)."""
    root = tmp_path_factory.mktemp("shared")
    project = root / "project"
    project.mkdir()
    (project / "README.md").write_text("# shared\n")
    http = http_client()
    handle = await launch(root / "data", project, http)
    yield handle.served
    await handle.stop()
    await http.aclose()
    assert not handle.leftovers(), handle.leftovers()


# ---- the real executable ------------------------------------------------------------------


@dataclass
class Proc:
    popen: subprocess.Popen[str]
    data_dir: Path
    line: str = ""
    url: str = ""
    token: str = ""

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def sigterm(self, timeout: float = 20) -> int:
        self.popen.send_signal(signal.SIGTERM)
        return self.popen.wait(timeout=timeout)

    def stderr(self) -> str:
        assert self.popen.stderr is not None
        return self.popen.stderr.read()


def clean_env(tmp_path: Path) -> dict[str, str]:
    """The environment for a pidesk subprocess: no PIDESK_* settings and no user config file."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIDESK_")}
    env["XDG_CONFIG_HOME"] = str(tmp_path / "xdg-config")
    return env


def pidesk_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "pidesk", *args]


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Callable[..., Proc]]:
    """Start ``pidesk serve`` as a subprocess and wait for its announced line (or its exit)."""
    procs: list[Proc] = []
    env = clean_env(tmp_path)

    def start(*args: str, data_dir: Path | None = None, wait: bool = True) -> Proc:
        data_dir = data_dir or tmp_path / "sub-data"
        popen = subprocess.Popen(
            pidesk_argv("serve", "--data-dir", str(data_dir), "--no-open", "--port", "0", *args),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        )
        proc = Proc(popen, data_dir)
        procs.append(proc)
        if wait:
            assert popen.stdout is not None
            proc.line = popen.stdout.readline().strip()  # the announcement, or "" when it exited first
            prefix = "pidesk serving at "
            assert proc.line.startswith(prefix), (proc.line, popen.poll(), popen.stderr and popen.stderr.read())
            page = proc.line[len(prefix):]
            base, _, query = page.partition("/?token=")
            proc.url, proc.token = base, query.split("&")[0]
        return proc

    yield start
    for proc in procs:
        if proc.popen.poll() is None:
            proc.popen.kill()  # only processes this fixture started, by their own handle
            proc.popen.wait(timeout=10)
        for stream in (proc.popen.stdout, proc.popen.stderr):
            if stream is not None:
                stream.close()


@pytest.fixture
def gate_script(tmp_path: Path) -> Path:
    """A model script whose first answer waits forever (a turn that stays running)."""
    path = tmp_path / "gate.json"
    path.write_text(json.dumps({"responses": [{"gate": "never", "text": "unreachable"}]}))
    return path
