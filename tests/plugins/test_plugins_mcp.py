"""McpTools against a real MCP stdio server (mcp_demo_server.py, run with this interpreter).

Spawning a server costs about a second (Python imports), so the tests that leave
their registry healthy share one, on a module-scoped event loop.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from pidesk.core.errors import Code, InvalidParams
from pidesk.core.policy import PluginRisk
from pidesk.plugins.mcp_tools import McpServerConfig, McpTools
from tests.scenario import gone

SERVER = str(Path(__file__).with_name("mcp_demo_server.py"))
DEMO_TOOLS = ["echo", "write_marker", "fail", "pid", "sleep", "big", "crash"]


def demo(name: str = "demo", risk: PluginRisk = PluginRisk.MEDIUM, *, enabled: bool = True) -> McpServerConfig:
    return McpServerConfig(name=name, command=[sys.executable, SERVER], env=None, risk=risk, enabled=enabled)


def live_demo_children() -> list[int]:
    """Live processes of ours running the demo server script."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] not in ("Z", "X") and int(fields[1]) == os.getpid() and SERVER.encode() in cmdline:
            found.append(int(entry.name))
    return found


async def server_pid(tools: McpTools, name: str = "demo") -> int:
    result = await tools.call(f"mcp__{name}__pid", {})
    assert result.ok, result.output
    return int(result.output)


shared = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def registry() -> AsyncIterator[McpTools]:
    tools = McpTools([demo(), demo("other", PluginRisk.LOW)])
    await tools.start()
    yield tools
    await tools.close()


@shared
async def test_tools_are_namespaced_with_the_declared_risk_and_provider_specs(registry: McpTools) -> None:
    offered = {t.name: t for t in registry.tools()}
    assert sorted(offered) == sorted(
        [f"mcp__demo__{n}" for n in DEMO_TOOLS] + [f"mcp__other__{n}" for n in DEMO_TOOLS]
    )
    echo = offered["mcp__demo__echo"]
    assert (echo.server, echo.risk) == ("demo", PluginRisk.MEDIUM)
    assert echo.spec["name"] == "mcp__demo__echo"
    assert echo.spec["description"] == "Return the text unchanged."
    assert echo.spec["parameters"]["type"] == "object"
    assert echo.spec["parameters"]["required"] == ["text"]
    assert registry.risk_of("mcp__demo__echo") is PluginRisk.MEDIUM
    assert registry.risk_of("mcp__other__echo") is PluginRisk.LOW
    for not_a_plugin in ("Read", "echo", "mcp__demo__nope", "mcp__ghost__echo"):
        assert registry.risk_of(not_a_plugin) is None
    assert registry.listing() == [
        {"name": "demo", "tools": [{"name": f"mcp__demo__{n}", "risk": "medium", "riskFrom": "config"}
                                   for n in DEMO_TOOLS],
         "enabled": True, "state": "ready", "transport": "stdio"},
        {"name": "other", "tools": [{"name": f"mcp__other__{n}", "risk": "low", "riskFrom": "config"}
                                    for n in DEMO_TOOLS],
         "enabled": True, "state": "ready", "transport": "stdio"},
    ]


@shared
async def test_calls_reach_the_server_and_errors_come_back_as_results(registry: McpTools, tmp_path: Path) -> None:
    echoed = await registry.call("mcp__demo__echo", {"text": "hello"})
    assert (echoed.ok, echoed.output, echoed.error_code) == (True, "hello", None)

    marker = tmp_path / "marker.txt"
    written = await registry.call("mcp__other__write_marker", {"path": str(marker)})
    assert written.ok and marker.read_text() == "marker\n"

    failed = await registry.call("mcp__demo__fail", {"message": "boom"})
    assert (failed.ok, failed.output, failed.error_code) == (False, "Error executing tool fail: boom", "TOOL_ERROR")

    bad_args = await registry.call("mcp__demo__echo", {})
    assert not bad_args.ok and "text" in bad_args.output

    unknown = await registry.call("mcp__demo__nope", {})
    assert (unknown.ok, unknown.error_code) == (False, Code.TOOL_NOT_FOUND.value)


@shared
async def test_a_cancelled_call_raises_in_its_task_and_the_server_stays_usable(registry: McpTools) -> None:
    sleeping = asyncio.create_task(registry.call("mcp__demo__sleep", {"seconds": 30}))
    # Requests go out in order, so once this returns the sleep is running on the server.
    assert (await registry.call("mcp__demo__echo", {"text": "in flight"})).ok
    sleeping.cancel()
    with pytest.raises(asyncio.CancelledError):
        await sleeping
    after = await registry.call("mcp__demo__echo", {"text": "still here"})
    assert (after.ok, after.output) == (True, "still here")


@shared
async def test_a_crash_is_reported_and_the_next_call_restarts_the_server(registry: McpTools) -> None:
    first_pid = await server_pid(registry)

    crashed = await registry.call("mcp__demo__crash", {})
    assert not crashed.ok
    assert "MCP server 'demo' crashed" in crashed.output
    assert "It restarts on the next call" in crashed.output and crashed.error_code == "TOOL_ERROR"
    assert "crashing on purpose" in crashed.output  # its stderr, quoted
    [entry] = [e for e in registry.listing() if e["name"] == "demo"]
    assert "crashed" in entry["error"] and len(entry["tools"]) == len(DEMO_TOOLS)  # still offered
    assert registry.risk_of("mcp__demo__echo") is PluginRisk.MEDIUM
    assert gone(first_pid)

    again = await registry.call("mcp__demo__echo", {"text": "back"})
    assert (again.ok, again.output) == (True, "back")
    assert await server_pid(registry) != first_pid
    assert all("error" not in entry for entry in registry.listing())
    assert (await registry.call("mcp__other__echo", {"text": "unaffected"})).ok


@shared
async def test_a_server_that_died_while_idle_is_restarted_and_the_call_runs(registry: McpTools) -> None:
    """Issue 19 item 4: a server killed while idle failed the next call with "crashed while running …,
    what the call did is unknown" although no call reached it; it is restarted and the call runs."""
    pid = await server_pid(registry, "other")
    os.kill(pid, signal.SIGKILL)
    for _ in range(500):  # bounded: SIGKILL lands within milliseconds
        if gone(pid):
            break
        await asyncio.sleep(0.01)
    assert gone(pid)
    [entry] = [e for e in registry.listing() if e["name"] == "other"]
    assert (entry["state"], entry["error"]) == ("failed", "exited while idle; restarts on the next call")
    answered = await registry.call("mcp__other__echo", {"text": "x"})
    assert (answered.ok, answered.output) == (True, "x")
    assert await server_pid(registry, "other") != pid
    [entry] = [e for e in registry.listing() if e["name"] == "other"]
    assert entry["state"] == "ready" and "error" not in entry


@pytest.mark.asyncio
async def test_servers_that_fail_to_start_are_listed_with_their_error_and_the_rest_work() -> None:
    tools = McpTools([
        McpServerConfig("missing", ["/nonexistent/pidesk-mcp-server"], None, PluginRisk.LOW),
        McpServerConfig("notmcp", [sys.executable, "-c", "import sys; sys.stderr.write('no MCP here')"],
                        None, PluginRisk.LOW),
        demo(),
        demo("off", enabled=False),
    ])
    try:
        await tools.start()
        listing = {e["name"]: e for e in tools.listing()}
        assert listing["missing"]["tools"] == [] and listing["missing"]["enabled"]
        assert listing["missing"]["error"] == "failed to start: command not found: /nonexistent/pidesk-mcp-server"
        assert "closed the connection" in listing["notmcp"]["error"]
        assert "no MCP here" in listing["notmcp"]["error"]  # its stderr, quoted
        assert listing["off"] == {"name": "off", "tools": [], "enabled": False, "state": "disabled",
                                  "transport": "stdio"}
        assert [listing[n]["state"] for n in ("missing", "notmcp", "demo")] == ["failed", "failed", "ready"]
        assert "error" not in listing["demo"]
        assert {t.server for t in tools.tools()} == {"demo"}
        assert (await tools.call("mcp__demo__echo", {"text": "fine"})).ok
        assert (await tools.call("mcp__off__echo", {"text": "x"})).error_code == Code.TOOL_NOT_FOUND.value
    finally:
        await tools.close()


@pytest.mark.asyncio
async def test_a_server_that_never_answers_times_out_and_is_stopped() -> None:
    tools = McpTools(
        [McpServerConfig("mute", ["sh", "-c", "cat > /dev/null"], None, PluginRisk.HIGH)], start_timeout=0.5
    )
    await tools.start()
    [entry] = tools.listing()
    assert entry["error"] == "failed to start: TimeoutError: no answer within 0.5 s"
    await tools.close()


@pytest.mark.asyncio
async def test_close_leaves_no_server_process() -> None:
    before = live_demo_children()  # the shared registry's, if it is still up
    tools = McpTools([demo(), demo("other")])
    await tools.start()
    pids = [await server_pid(tools), await server_pid(tools, "other")]
    assert all(not gone(pid) for pid in pids)
    assert set(live_demo_children()) == set(before) | set(pids)
    await tools.close()
    assert all(gone(pid) for pid in pids)
    assert live_demo_children() == before
    assert tools.risk_of("mcp__demo__echo") is PluginRisk.MEDIUM  # the tools stay known; a call restarts
    restarted = await tools.call("mcp__demo__echo", {"text": "again"})
    await tools.close()
    assert restarted.ok and live_demo_children() == before


def test_server_names_must_be_unique() -> None:
    with pytest.raises(InvalidParams, match="repeated: demo"):
        McpTools([demo(), demo()])


@shared
async def test_a_huge_answer_fails_its_call_at_once_and_the_server_answers_the_next(registry: McpTools) -> None:
    """Issue 29 item 8: the SDK joined a long stdout line chunk by chunk (quadratic): a 50 MB result took 41 s
    of the event loop and the server's later calls all timed out. Its lines are read whole and bounded now:
    an answer past 16 MiB fails its call at once, and the next call is answered as usual."""
    began = time.monotonic()
    huge = await registry.call("mcp__demo__big", {"megabytes": 40})
    assert not huge.ok and "longer than 16 MiB" in huge.output
    fits = await registry.call("mcp__demo__big", {"megabytes": 2})
    assert fits.ok and "more characters cut" in fits.output  # (read whole; the model gets its head)
    assert (await registry.call("mcp__demo__echo", {"text": "after"})).output == "after"
    assert time.monotonic() - began < 30


def test_whole_lines_splits_like_the_sdk_would_and_drops_only_what_is_too_long() -> None:
    from pidesk.plugins import mcp_lines

    lines = mcp_lines.WholeLines(None)
    assert lines._take(b'{"a":') == "" and lines._take(b'1}\n{"b":2}\n{"c"') == '{"a":1}\n{"b":2}\n'
    assert lines._take(b':3}\n') == '{"c":3}\n'
    start = b'{"jsonrpc":"2.0","id":7,"result":"'
    assert lines._take(start + b"x" * (mcp_lines.MAX_LINE + 10)) == ""  # too long: dropped as it comes
    assert lines._take(b"x" * 100) == ""
    answered = lines._take(b'"}\n{"jsonrpc":"2.0","id":8,"result":{}}\n')
    first, second = answered.splitlines()
    assert json.loads(first)["id"] == 7 and "longer than 16 MiB" in json.loads(first)["error"]["message"]
    assert json.loads(second) == {"jsonrpc": "2.0", "id": 8, "result": {}}
