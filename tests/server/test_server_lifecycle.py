"""`pidesk serve` as a user runs it (a real subprocess), and the in-process serve task's shutdown:
announcement, host.json, the data-dir lock, SIGTERM/SIGINT with a running turn, --allow-remote."""

from __future__ import annotations

import asyncio
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time

import pytest
from websockets.asyncio.client import connect

from pidesk.config import HostConfig
from pidesk.host import Host
from pidesk.providers.scripted import ScriptedProvider

HOST_JSON_KEYS = {"url", "port", "token", "pid", "protocolVersion", "startedAt", "idleExit"}  # (the last two:
# docs/protocol-notes.md, since when it serves and, started on demand, after how long idle it exits)


def run_pidesk(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIDESK_")} | {"XDG_CONFIG_HOME": "/nonexistent"}
    return subprocess.run([sys.executable, "-m", "pidesk", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


def refused_to_connect(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except OSError:
        return True
    return False


async def hello(url: str, token: str) -> dict:
    async with connect(url.replace("http://", "ws://") + "/rpc", proxy=None,
                       additional_headers={"Authorization": f"Bearer {token}"}) as ws:
        await ws.send(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "host.hello", "params": {"protocolVersion": 1}}))
        return json.loads(await ws.recv())


def test_serve_announces_its_url_and_describes_itself_in_host_json(spawn):
    proc = spawn()  # a random token
    assert proc.line == f"pidesk serving at {proc.url}/?token={proc.token}"
    assert proc.url.startswith("http://127.0.0.1:") and len(proc.token) >= 32
    host_json = proc.data_dir / "host.json"
    assert host_json.stat().st_mode & 0o777 == 0o600
    described = json.loads(host_json.read_text())
    assert set(described) == HOST_JSON_KEYS
    assert described.pop("startedAt").endswith("Z") and described.pop("idleExit") is None  # (run until stopped)
    assert described == {"url": proc.url, "port": proc.port, "token": proc.token, "pid": proc.popen.pid,
                         "protocolVersion": 1}
    assert asyncio.run(hello(proc.url, proc.token))["result"]["protocolVersion"] == 1
    assert proc.sigterm() == 0
    assert not host_json.exists()
    assert refused_to_connect(proc.port)
    assert proc.token not in proc.stderr()  # the token is never logged


def test_a_given_token_is_used(spawn):
    proc = spawn("--token", "my-own-token-for-this-test")
    assert proc.token == "my-own-token-for-this-test"
    assert json.loads((proc.data_dir / "host.json").read_text())["token"] == proc.token
    assert proc.sigterm() == 0


@pytest.mark.asyncio
async def test_host_json_exists_and_the_port_accepts_when_the_url_is_announced(served):
    checks = served.ready_checks
    assert checks["accepting_at_announce"] is True
    assert checks["host_json_mode"] == 0o600
    announced = dict(checks["host_json_at_announce"])
    assert announced.pop("startedAt").endswith("Z") and announced.pop("idleExit") is None
    assert announced == {"url": served.url, "port": served.port, "token": served.token, "pid": os.getpid(),
                         "protocolVersion": 1}


def test_a_second_host_on_the_same_data_dir_refuses_to_start(spawn):
    first = spawn()
    before = (first.data_dir / "host.json").read_text()
    second = run_pidesk("serve", "--data-dir", str(first.data_dir), "--no-open", "--port", "0")
    assert second.returncode != 0
    assert "already serving" in second.stderr and str(first.data_dir) in second.stderr
    assert "Traceback" not in second.stderr and "pidesk serving at" not in second.stdout
    assert (first.data_dir / "host.json").read_text() == before  # the running host is untouched
    assert asyncio.run(hello(first.url, first.token))["result"]["protocolVersion"] == 1
    assert first.sigterm() == 0


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_aborts_the_running_turn_records_it_and_exits_zero(spawn, gate_script, project, signum):
    proc = spawn("--model", f"scripted/{gate_script}")

    async def start_a_turn() -> tuple[str, str]:
        async with connect(proc.url.replace("http://", "ws://") + f"/rpc?token={proc.token}", proxy=None) as ws:
            async def call(rid: int, method: str, params: dict) -> dict:
                await ws.send(json.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params}))
                while True:
                    message = json.loads(await ws.recv())
                    if message.get("id") == rid:
                        return message["result"]

            session = await call(1, "session.create", {"projectPath": str(project)})
            turn = await call(2, "agent.prompt", {"sessionId": session["id"], "text": "wait forever"})
            got = await call(3, "session.get", {"sessionId": session["id"]})
            assert got["session"]["status"] == "running" and got["session"]["currentTurnId"] == turn["turnId"]
            return session["id"], turn["turnId"]

    session_id, turn_id = asyncio.run(start_a_turn())
    proc.popen.send_signal(signum)
    assert proc.popen.wait(timeout=20) == 0, proc.stderr()
    assert not (proc.data_dir / "host.json").exists()
    assert "Traceback" not in proc.stderr()

    async def reopen() -> None:
        host = Host.open(HostConfig(data_dir=proc.data_dir), ScriptedProvider())
        try:
            assert host.recovery is not None and not any(host.recovery.interrupted.values()), host.recovery
            turns = (await host.call("session.turns", {"sessionId": session_id}))["turns"]
            assert [(t["id"], t["state"], t["reason"], t["errorCode"]) for t in turns] == \
                [(turn_id, "ended", "aborted", None)]  # recorded by the clean shutdown, not by boot recovery
            session = (await host.call("session.get", {"sessionId": session_id}))["session"]
            assert (session["status"], session["currentTurnId"]) == ("idle", None)
            actions = [e["action"] for e in (await host.call("audit.list", {"sessionId": session_id}))["entries"]]
            assert "turn.aborted" in actions
        finally:
            await host.close()

    asyncio.run(reopen())


def test_a_non_loopback_address_needs_allow_remote(tmp_path):
    data_dir = tmp_path / "remote"
    refused = run_pidesk("serve", "--data-dir", str(data_dir), "--no-open", "--host", "0.0.0.0", "--port", "0")
    assert refused.returncode != 0
    assert "--allow-remote" in refused.stderr and "Traceback" not in refused.stderr
    assert "pidesk serving at" not in refused.stdout
    assert not (data_dir / "host.json").exists()


def test_startup_refusals_are_not_labelled_persistence_failure(spawn, tmp_path):
    remote = run_pidesk("serve", "--data-dir", str(tmp_path / "r"), "--no-open", "--host", "0.0.0.0")
    first = spawn()
    second = run_pidesk("serve", "--data-dir", str(first.data_dir), "--no-open")
    first.sigterm()
    for refused in (remote, second):
        assert "PERSISTENCE_FAILURE" not in refused.stderr, refused.stderr
    assert "warning: listening on" not in remote.stderr


def test_a_taken_port_is_a_clear_error(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = run_pidesk("serve", "--data-dir", str(tmp_path / "p"), "--no-open", "--port", str(port))
    assert done.returncode != 0
    assert "Traceback" not in done.stderr and str(port) in done.stderr, done.stderr


@pytest.mark.asyncio
async def test_cancelling_the_serve_task_shuts_down_cleanly_with_a_turn_running(start_server, provider):
    served = await start_server(provider=provider)
    c = await served.ws()
    s = await c.call("session.create", {"projectPath": str(served.project)})
    provider.enqueue(s["id"], {"gate": "cancel-me", "text": "never"})
    turn = await c.call("agent.prompt", {"sessionId": s["id"], "text": "hold"})
    await provider.wait_reached("cancel-me")
    handle = start_server.handles[0]
    handle.task.cancel()
    with pytest.raises(asyncio.CancelledError):
        async with asyncio.timeout(15):
            await handle.task
    assert handle.leftovers() == []
    assert refused_to_connect(served.port)
    async with asyncio.timeout(10):
        await c._reader  # the server closed our connection
    host = Host.open(HostConfig(data_dir=served.data_dir), ScriptedProvider())
    try:
        assert not any(host.recovery.interrupted.values())
        turns = (await host.call("session.turns", {"sessionId": s["id"]}))["turns"]
        assert [(t["id"], t["reason"], t["errorCode"]) for t in turns] == [(turn["turnId"], "aborted", None)]
    finally:
        await host.close()


def test_stale_host_json_does_not_announce_a_dead_host(tmp_path, spawn):
    data_dir = tmp_path / "stale"
    data_dir.mkdir()
    (data_dir / "host.json").write_text(json.dumps({"url": "http://127.0.0.1:1", "port": 1, "token": "old",
                                                    "pid": 999999, "protocolVersion": 1}))
    proc = spawn(data_dir=data_dir)
    described = json.loads((data_dir / "host.json").read_text())
    assert (described["pid"], described["token"]) == (proc.popen.pid, proc.token)
    assert (data_dir / "host.json").stat().st_mode & 0o777 == 0o600
    assert proc.sigterm() == 0
    assert not (data_dir / "host.json").exists()


def test_sigusr1_writes_what_each_turn_awaits_and_the_host_carries_on(spawn, gate_script, project):
    """The soak's tool for a turn that never ends: where is it waiting? (docs/reliability.md, "Load")"""
    proc = spawn("--model", f"scripted/{gate_script}")

    async def call(method: str, params: dict) -> dict:
        async with connect(proc.url.replace("http://", "ws://") + f"/rpc?token={proc.token}", proxy=None) as ws:
            await ws.send(json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}))
            while True:
                message = json.loads(await ws.recv())
                if message.get("id") == 1:
                    return message["result"]

    session = asyncio.run(call("session.create", {"projectPath": str(project)}))
    turn = asyncio.run(call("agent.prompt", {"sessionId": session["id"], "text": "wait forever"}))
    assert proc.popen.stderr is not None
    stderr = proc.popen.stderr.fileno()  # the raw pipe: nothing else reads it meanwhile
    deadline = time.monotonic() + 20

    def dump_turn() -> str:
        """One SIGUSR1's dump, cut to the turn's task."""
        proc.popen.send_signal(signal.SIGUSR1)
        dump = b""
        while b"pidesk: end of tasks\n" not in dump:
            assert select.select([stderr], [], [], max(0.0, deadline - time.monotonic()))[0], dump
            dump += os.read(stderr, 65536)
        return dump.decode().split(f"--- task turn {turn['turnId']}\n")[1].split("--- task ")[0]

    # the turn reads its history (in a worker thread), then parks in the model's stream at its gate
    def parked(stack: str) -> bool:
        return " in stream\n" in stack and stack.splitlines()[-1].startswith("  waiting on <async_generator_asend")

    turn_stack = dump_turn()
    while not parked(turn_stack) and time.monotonic() < deadline:
        select.select([], [], [], 0.05)  # a pause between dumps, not a wait for the turn: it is asked again
        turn_stack = dump_turn()
    # from the turn's task down to the await it is parked at: the model's stream (an async generator,
    # whose own frames the interpreter does not expose from outside)
    assert " in _drive\n" in turn_stack and " in stream\n" in turn_stack and " in wait_for\n" in turn_stack
    assert turn_stack.splitlines()[-1].startswith("  waiting on <async_generator_asend")
    assert asyncio.run(call("host.status", {}))["running"] == 1  # the signal changed nothing
    proc.popen.send_signal(signal.SIGTERM)
    assert proc.popen.wait(timeout=20) == 0


def test_a_restarted_host_keeps_its_token_and_port_unless_told_otherwise(spawn):
    """Issue 18 item 15: a restarted `pidesk serve` had a new port and a new token, so every open page
    stayed "reconnecting…" for good. The token is kept in the data dir (0600) and the last port is
    tried first; `--new-token` replaces the token, and a taken port falls back to a free one."""
    first = spawn()
    assert first.sigterm() == 0
    kept = first.data_dir / "token"
    assert kept.read_text() == first.token and kept.stat().st_mode & 0o777 == 0o600
    second = spawn(data_dir=first.data_dir)
    assert (second.url, second.token) == (first.url, first.token)
    assert asyncio.run(hello(second.url, first.token))["result"]["protocolVersion"] == 1
    assert second.sigterm() == 0
    renewed = spawn("--new-token", data_dir=first.data_dir)
    assert renewed.token != first.token and renewed.url == first.url
    assert renewed.sigterm() == 0
    with socket.socket() as squatter:  # someone else took the port meanwhile
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # past the last host's TIME_WAIT
        squatter.bind(("127.0.0.1", first.port))
        squatter.listen()
        moved = spawn(data_dir=first.data_dir)
        assert moved.port != first.port and moved.token == renewed.token
        assert moved.sigterm() == 0
