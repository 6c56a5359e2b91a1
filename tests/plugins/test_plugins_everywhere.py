"""Issue 19, "plugins everywhere": MCP servers reach every entry point and never hold the host.

Real servers only, started by the tests: the stdio demo and hints servers (mcp_demo_server.py,
mcp_hints_server.py), a Streamable HTTP server on 127.0.0.1 (mcp_http_server.py), real
``pidesk run`` / ``pidesk serve`` subprocesses, and the npm server-everything where ``npx`` is.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from pidesk.core.errors import Code
from pidesk.core.policy import PluginRisk
from pidesk.plugins.mcp_tools import McpServerConfig, McpTools
from tests.scenario import ended, gone, pid_from_file, prompt, session, state, tool, tool_results

HERE = Path(__file__).parent
DEMO = str(HERE / "mcp_demo_server.py")
HINTS = str(HERE / "mcp_hints_server.py")
HTTP = str(HERE / "mcp_http_server.py")
TASKS = str(HERE / "mcp_tasks_server.py")
REPO = HERE.parents[1]


def hanging(pid_file: Path, *, stubborn: bool = False) -> list[str]:
    """A server that never answers and ignores its stdin closing (``stubborn``: SIGTERM too), and writes its pid."""
    trap = "trap '' TERM; " if stubborn else ""
    return ["sh", "-c", f"{trap}echo $$ > {pid_file}; exec sleep 300"]


def cli_env(tmp_path: Path, config: str) -> dict[str, str]:
    path = tmp_path / "config.toml"
    path.write_text(config)
    return {k: v for k, v in os.environ.items() if not k.startswith("PIDESK_")} | {
        "PIDESK_CONFIG": str(path), "XDG_CONFIG_HOME": str(tmp_path / "xdg"),
        "PIDESK_EMBEDDED": "1"}  # (each command's host in its own process: tests/conftest.py)


def toml_list(argv: list[str]) -> str:
    return json.dumps(argv)


@pytest.fixture
def http_server() -> Iterator[str]:
    """The Streamable HTTP test server's /mcp URL; it wants ``Authorization: Bearer s3cret-t0ken``."""
    proc = subprocess.Popen([sys.executable, HTTP], stdout=subprocess.PIPE, text=True,
                            env=os.environ | {"EXPECTED_TOKEN": "s3cret-t0ken"})
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().split()
        assert line[:1] == ["port"], line
        yield f"http://127.0.0.1:{line[1]}/mcp"
    finally:
        proc.terminate()  # the process this fixture started, by its own handle
        proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()


# ---- item 1: embedded hosts -----------------------------------------------------------------------

def test_an_embedded_run_offers_and_runs_plugin_tools(tmp_path: Path, project: Path, data_dir: Path) -> None:
    """Issue 19 item 1: `pidesk run … --json` without a running host never started an MCP server, so every
    plugin call was TOOL_NOT_FOUND; now the embedded host starts them with its first turn, which sees them."""
    marker = project / "marker.txt"
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"responses": [
        {"toolCalls": [{"name": "mcp__demo__write_marker", "args": {"path": str(marker)}}]},
        {"text": "Done."},
    ]}))
    env = cli_env(tmp_path, f'[plugins.mcp.demo]\ncommand = {toml_list([sys.executable, DEMO])}\nrisk = "low"\n')
    done = subprocess.run(
        [sys.executable, "-m", "pidesk", "run", str(project), "mark it", "--model", f"scripted/{script}", "--json",
         "--data-dir", str(data_dir)], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    finished = [json.loads(line) for line in done.stdout.splitlines() if '"tool.finished"' in line]
    assert [(e["name"], e["ok"], e.get("errorCode")) for e in finished] == [("mcp__demo__write_marker", True, None)]
    assert marker.read_text() == "marker\n"


# ---- item 2: servers start in the background --------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rpc(url: str, token: str, method: str, params: dict | None = None) -> dict:
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params or {}}).encode()
    request = urllib.request.Request(f"{url}/rpc", data=body, method="POST", headers={
        "Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        return json.loads(answer.read())["result"]


def test_serve_answers_at_once_with_a_hanging_plugin_and_sigterm_leaves_no_plugin(tmp_path: Path) -> None:
    """Issue 19 item 2: `serve` waited for every MCP server before it listened (35 s with a hanging one),
    and SIGTERM in that window left the plugin orphaned. Now /healthz answers within 1 s of the hanging
    server being spawned, plugins.list says which server is starting and which is ready, and SIGTERM
    while it still starts exits 0 with no plugin process left."""
    pid_file = tmp_path / "hang.pid"
    env = cli_env(tmp_path, (
        f'[plugins.mcp.hang]\ncommand = {toml_list(hanging(pid_file, stubborn=True))}\nrisk = "low"\n'
        f'[plugins.mcp.demo]\ncommand = {toml_list([sys.executable, DEMO])}\nrisk = "low"\n'))
    port = free_port()
    popen = subprocess.Popen(
        [sys.executable, "-m", "pidesk", "serve", "--data-dir", str(tmp_path / "data"), "--no-open",
         "--port", str(port), "--token", "test-token-for-issue-19"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        hang_pid = asyncio.run(pid_from_file(pid_file, timeout=30))
        spawned = time.monotonic()
        answered = None
        while time.monotonic() - spawned < 1.0:  # bounded: one second
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=0.5) as health:
                    answered = health.status
                    break
            except OSError:
                time.sleep(0.02)
        assert answered == 200, "the host did not answer /healthz within 1 s of starting its MCP servers"
        url = f"http://127.0.0.1:{port}"
        states: dict[str, str] = {}
        for _ in range(300):  # bounded: the demo server starts in about a second
            states = {p["name"]: p["state"] for p in rpc(url, "test-token-for-issue-19", "plugins.list")["plugins"]}
            if states.get("demo") == "ready":
                break
            time.sleep(0.05)
        assert states == {"hang": "starting", "demo": "ready"}
        assert not gone(hang_pid)
        popen.send_signal(signal.SIGTERM)
        assert popen.wait(timeout=30) == 0
        assert gone(hang_pid), "the hanging MCP server outlived the host"
    finally:
        if popen.poll() is None:
            popen.kill()  # only the process this test started, by its own handle
            popen.wait(timeout=10)
        for stream in (popen.stdout, popen.stderr):
            if stream is not None:
                stream.close()


@pytest.mark.asyncio
async def test_a_turn_before_a_server_is_ready_sees_the_ready_ones_and_close_stops_a_starting_one(
        make_host, provider, project, tmp_path) -> None:
    """Issue 19 item 2: plugins start in the background; a turn that begins while one server still
    starts is offered the tools of those ready, and closing the host stops the one still starting."""
    pid_file = tmp_path / "hang.pid"
    host = make_host(mcp_servers={"hang": {"command": hanging(pid_file), "risk": "low"},
                                  "demo": {"command": [sys.executable, DEMO], "risk": "low"}})
    await host.start_plugins("background")
    plugins = host.parts.plugin_tools
    async with asyncio.timeout(20):
        while {p["name"]: p["state"] for p in plugins.listing()}.get("demo") != "ready":
            await asyncio.sleep(0.02)
    hang_pid = await pid_from_file(pid_file)
    s = await session(host, project)
    sub = host.subscribe()
    provider.enqueue(s["id"], tool("mcp__demo__echo", text="ready already"), {"text": "done"})
    await ended(sub, (await prompt(host, s["id"]))["turnId"])
    offered = {spec["name"] for spec in provider.requests[0].tools}
    assert "mcp__demo__echo" in offered and not any(name.startswith("mcp__hang__") for name in offered)
    assert tool_results((await state(host, s["id"]))["messages"], "mcp__demo__echo")[-1]["ok"]
    assert {p["name"]: p["state"] for p in (await host.call("plugins.list", {}))["plugins"]} == {
        "hang": "starting", "demo": "ready"}
    await plugins.close()
    assert gone(hang_pid)


# ---- item 4 is in test_plugins_mcp.py (a server that died while idle) --------------------------------

# ---- items 5 and 7: task-only tools, risk from the server's hints -----------------------------------

@pytest.mark.asyncio
async def test_risk_comes_from_the_tools_hints_unless_the_config_says() -> None:
    """Issue 19 item 7: with no risk in the config, readOnlyHint → low (read), destructiveHint → medium
    (write), no hint → high (the risk was the config's, required); a configured risk overrides the hints."""
    tools = McpTools([McpServerConfig("hints", [sys.executable, HINTS], None, None),
                      McpServerConfig("strict", [sys.executable, HINTS], None, PluginRisk.HIGH)])
    try:
        await tools.start()
        risks = {t.name: t.risk for t in tools.tools()}
        assert {n: risks[f"mcp__hints__{n}"] for n in ("lookup", "wipe", "append", "plain")} == {
            "lookup": PluginRisk.LOW, "wipe": PluginRisk.MEDIUM, "append": PluginRisk.MEDIUM,
            "plain": PluginRisk.HIGH}
        assert tools.risk_of("mcp__strict__lookup") is PluginRisk.HIGH  # the config overrides the hints
        hints, strict = tools.listing()
        assert {t["name"]: t["riskFrom"] for t in hints["tools"]} == {
            "mcp__hints__lookup": "readOnlyHint", "mcp__hints__wipe": "hints", "mcp__hints__append": "hints",
            "mcp__hints__plain": "unannotated", "mcp__hints__peek": "readOnlyHint"}
        assert {t["riskFrom"] for t in strict["tools"]} == {"config"}
    finally:
        await tools.close()


@pytest.mark.asyncio
async def test_a_tool_that_requires_task_support_is_left_out_and_listed_as_skipped() -> None:
    """Issue 19 item 5: a tool with execution.taskSupport "required" was offered and always failed
    with -32601; it is left out, plugins.list says why, and the server's other tools work."""
    tools = McpTools([McpServerConfig("tasks", [sys.executable, TASKS], None, PluginRisk.LOW)])
    try:
        await tools.start()
        assert [t.name for t in tools.tools()] == ["mcp__tasks__echo"]
        [entry] = tools.listing()
        [skipped] = entry["skipped"]
        assert skipped["name"] == "research" and 'taskSupport = "required"' in skipped["reason"]
        assert (await tools.call("mcp__tasks__research", {"topic": "x"})).error_code == Code.TOOL_NOT_FOUND.value
        assert (await tools.call("mcp__tasks__echo", {"text": "fine"})).ok
    finally:
        await tools.close()


@pytest.mark.asyncio
async def test_a_read_only_hint_runs_without_asking_in_agent_mode_and_is_still_denied_in_plan_and_goal(
        make_host, provider, project) -> None:
    """Issue 19 item 7: with no risk in the config, a tool hinted read-only is allowed like Read in Agent
    mode; Plan and Goal still deny it (here a server whose read-only hint lies: the tool writes a file)."""
    host = make_host(mcp_servers={"hints": {"command": [sys.executable, HINTS]}})
    await host.start_plugins()
    marker = project / "marker.txt"
    call = tool("mcp__hints__peek", path=str(marker))
    s = await session(host, project)
    sub = host.subscribe()
    provider.enqueue(s["id"], call, {"text": "ok"})
    await ended(sub, (await prompt(host, s["id"]))["turnId"])  # no permission asked: it would hang here
    assert marker.read_text() == "marker\n"
    marker.unlink()
    for mode in ("plan", "goal"):
        await host.call("session.setMode", {"sessionId": s["id"], "mode": mode})
        provider.enqueue(s["id"], call, {"text": "ok"})
        await ended(sub, (await prompt(host, s["id"]))["turnId"])
        assert tool_results((await state(host, s["id"]))["messages"], "mcp__hints__peek")[-1]["errorCode"] == \
            "PLUGIN_DISABLED_IN_PLAN"
        assert not marker.exists()


# ---- item 6: Streamable HTTP, and a broken entry disables only its plugin ----------------------------

@pytest.mark.asyncio
async def test_a_streamable_http_server_is_reached_with_headers_from_the_environment(
        http_server: str, caplog: pytest.LogCaptureFixture) -> None:
    """Issue 19 item 6: `url` (+ `headers` with ${ENV}) reaches a Streamable HTTP server; the token
    is sent, never listed nor logged; a header naming an unset variable fails that server, saying which."""
    caplog.set_level(logging.DEBUG)
    tables = {
        "web": {"url": http_server, "headers": {"Authorization": "Bearer ${WEB_TOKEN}"}, "risk": "low"},
        "unset": {"url": http_server, "headers": {"Authorization": "Bearer ${NOT_SET_ANYWHERE}"}},
        "wrong": {"url": http_server, "headers": {"Authorization": "Bearer nope"}},
    }
    tools = McpTools.from_config(tables, source="config file /x.toml", environ={"WEB_TOKEN": "s3cret-t0ken"})
    try:
        await tools.start()
        web, unset, wrong = tools.listing()
        assert (web["state"], web["transport"]) == ("ready", "http")
        assert {t["name"] for t in web["tools"]} == {"mcp__web__echo", "mcp__web__refusals"}
        echoed = await tools.call("mcp__web__echo", {"text": "over http"})
        assert (echoed.ok, echoed.output) == (True, "over http")
        assert unset["state"] == "failed" and "${NOT_SET_ANYWHERE}" in unset["error"]
        assert "export NOT_SET_ANYWHERE" in unset["error"]
        assert wrong["state"] == "failed"
        refused = await tools.call("mcp__web__refusals", {})
        assert refused.ok and int(refused.output) >= 1  # the wrong token was sent and refused
    finally:
        await tools.close()
    assert "s3cret-t0ken" not in json.dumps(tools.listing())
    assert "s3cret-t0ken" not in caplog.text


@pytest.mark.asyncio
async def test_a_broken_plugin_entry_disables_that_plugin_only(make_host, provider, project) -> None:
    """Issue 19 item 6: a config error in one [plugins.mcp.<name>] table stopped the whole host; now that
    server is listed as failed with the file, the key and the fix, and the others work."""
    host = make_host(mcp_servers={"demo": {"command": [sys.executable, DEMO], "risk": "low"},
                                  "bad": {"url": "http://127.0.0.1:1/mcp", "command": ["x"]},
                                  "typo": {"comand": ["x"]}},
                     mcp_source="config file /home/me/.config/pidesk/config.toml")
    await host.start_plugins()
    listed = {p["name"]: p for p in (await host.call("plugins.list", {}))["plugins"]}
    assert listed["demo"]["state"] == "ready"
    assert (listed["bad"]["state"], listed["bad"]["enabled"]) == ("failed", False)
    assert listed["bad"]["error"].startswith(
        "config file /home/me/.config/pidesk/config.toml [plugins.mcp.bad]: command and url both given")
    assert "unknown key(s) comand: remove or correct them" in listed["typo"]["error"]
    s = await session(host, project)
    sub = host.subscribe()
    provider.enqueue(s["id"], tool("mcp__demo__echo", text="still works"), {"text": "done"})
    await ended(sub, (await prompt(host, s["id"]))["turnId"])
    assert tool_results((await state(host, s["id"]))["messages"], "mcp__demo__echo")[-1]["ok"]


def test_run_with_the_demo_model_works_whatever_the_plugin_config_says(tmp_path: Path, project: Path,
                                                                        data_dir: Path) -> None:
    """Issue 19 item 6: `url` was an unknown key and that config error stopped every command, even
    `run --model demo`; now the run completes and stderr names the file, the key and the fix."""
    env = cli_env(tmp_path, (
        '[plugins.mcp.web]\nurl = "http://127.0.0.1:1/mcp"\nheaders = { Authorization = "Bearer ${NOPE}" }\n'
        '[plugins.mcp.broken]\ncommand = "uvx my-server"\n'))
    done = subprocess.run(
        [sys.executable, "-m", "pidesk", "run", str(project), "document the project", "--model", "demo",
         "--permission", "auto", "--json", "--data-dir", str(data_dir)],
        capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    assert all(json.loads(line) for line in done.stdout.splitlines())  # stdout stays JSON
    assert f"config file {tmp_path / 'config.toml'} [plugins.mcp.broken]: command must be a list of strings" \
        in done.stderr


# ---- an npm server ----------------------------------------------------------------------------------

def node_in_ci() -> bool:
    return "nodejs" in (REPO / ".ci" / "run").read_text()


@pytest.mark.asyncio
async def test_the_npm_server_everything_runs_without_its_task_only_tool() -> None:
    """Issue 19 items 5 and 7 against a real npm server: server-everything's tools come with the risk
    its hints give, `simulate-research-query` (task support required) is left out, and echo runs."""
    if shutil.which("npx") is None:
        if os.environ.get("CI") == "true" and node_in_ci():
            pytest.fail(".ci/run installs node, but npx is not on PATH")
        pytest.skip("npx is not installed: the npm server-everything test needs Node.js (apt-get install nodejs npm)")
    tools = McpTools([McpServerConfig("everything", ["npx", "-y", "@modelcontextprotocol/server-everything"],
                                      None, None)], start_timeout=120)  # a first download takes ~15 s
    try:
        await tools.start()
        [entry] = tools.listing()
        assert entry["state"] == "ready", entry.get("error")
        assert "simulate-research-query" in [s["name"] for s in entry.get("skipped", [])]
        assert tools.risk_of("mcp__everything__echo") is PluginRisk.LOW  # readOnlyHint
        echoed = await tools.call("mcp__everything__echo", {"message": "hi"})
        assert (echoed.ok, echoed.output) == (True, "Echo: hi")
    finally:
        await tools.close()


def test_a_stdio_server_that_ignores_eof_dies_with_a_host_killed_9(tmp_path: Path) -> None:
    """Issue 29 item 9: a stdio MCP server that ignores its stdin closing (and SIGTERM) outlived kill -9 of
    the host for ever, and a restart started a second copy beside it. Its process group is guarded from
    the moment it is spawned, as a Bash call's is: the host's watchdog kills it when the host dies, and
    should the host die before the watchdog heard of it, the restarted host kills it at boot."""
    pid_file = tmp_path / "hang.pid"
    env = cli_env(tmp_path, f'[plugins.mcp.hang]\ncommand = {toml_list(hanging(pid_file, stubborn=True))}\n'
                            'risk = "low"\n')
    argv = [sys.executable, "-m", "pidesk", "serve", "--data-dir", str(tmp_path / "data"), "--no-open", "--port", "0"]
    hosts = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)]
    try:
        hang_pid = asyncio.run(pid_from_file(pid_file, timeout=30))
        record = tmp_path / "data" / "process-groups"
        deadline = time.monotonic() + 30  # guarded: in the host's durable record
        while f"+ {hang_pid} " not in (record.read_text() if record.exists() else "") \
                and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not gone(hang_pid)
        pid_file.unlink()
        hosts[0].kill()
        hosts[0].wait(timeout=10)
        hosts.append(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
        second = asyncio.run(pid_from_file(pid_file, timeout=30))  # the restarted host's own copy
        assert second != hang_pid and gone(hang_pid), "the first MCP server outlived its host's kill -9"
    finally:
        for popen in hosts:
            if popen.poll() is None:
                popen.kill()
                popen.wait(timeout=10)
            for stream in (popen.stdout, popen.stderr):
                if stream is not None:
                    stream.close()


@pytest.mark.asyncio
async def test_an_http_server_gone_away_is_a_tool_error_that_says_it_reconnects() -> None:
    """Issue 30 §5: a plugin's failure carries TOOL_ERROR, and an HTTP server's message says the next call
    reconnects (there is no process of pidesk's to restart)."""
    proc = subprocess.Popen([sys.executable, HTTP], stdout=subprocess.PIPE, text=True,
                            env=os.environ | {"EXPECTED_TOKEN": "s3cret-t0ken"})
    assert proc.stdout is not None
    port = proc.stdout.readline().split()[1]
    tables = {"web": {"url": f"http://127.0.0.1:{port}/mcp", "headers": {"Authorization": "Bearer s3cret-t0ken"},
                      "risk": "low"}}
    tools = McpTools.from_config(tables, source="config file /x.toml", environ={})
    try:
        await tools.start()
        assert (await tools.call("mcp__web__echo", {"text": "up"})).ok
        proc.terminate()
        proc.wait(timeout=10)
        gone = await tools.call("mcp__web__echo", {"text": "down"})
        assert (gone.ok, gone.error_code) == (False, "TOOL_ERROR")
        assert "reconnect" in gone.output and "restart" not in gone.output, gone.output
    finally:
        await tools.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        proc.stdout.close()
