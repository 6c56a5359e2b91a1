"""A plugin (MCP) tool call has a deadline, and stop and abort end it (issue 15, authority hole 3).

The server is a real MCP stdio server written here with the ``mcp`` package: its
``hang`` tool never answers; it notes when it starts (a file, since the test
must know the request reached the server) and when it is cancelled, which only
MCP's ``notifications/cancelled`` does while the server runs. ``cancellations``
answers, once at least ``n`` were seen (bounded), with the cancelled request ids.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from pidesk.core import events as ev
from pidesk.host import Host
from tests.scenario import ended, prompt, session, state, tool, tool_results

pytestmark = pytest.mark.asyncio

SERVER = '''
import json
import sys
from pathlib import Path

import anyio
from mcp.server.mcpserver import Context, MCPServer

server = MCPServer("slow")
started_file = Path(sys.argv[1])
cancelled: list[str] = []
seen = anyio.Event()


@server.tool()
async def hang(ctx: Context) -> str:
    """Never answer."""
    started_file.write_text(ctx.request_id)
    try:
        await anyio.sleep_forever()
    finally:
        cancelled.append(ctx.request_id)
        seen.set()


@server.tool()
async def cancellations(n: int) -> str:
    """The ids of the hang calls cancelled so far, once there are at least n (waits at most 5 s)."""
    global seen
    with anyio.move_on_after(5):
        while len(cancelled) < n:
            await seen.wait()
            seen = anyio.Event()
    return json.dumps(cancelled)


if __name__ == "__main__":
    server.run("stdio")
'''


def slow_server(tmp_path: Path, **extra: Any) -> tuple[dict[str, Any], Path]:
    script = tmp_path / "slow_mcp_server.py"
    script.write_text(SERVER)
    started = tmp_path / "hang.started"
    return {"slow": {"command": [sys.executable, str(script), str(started)], "risk": "low", **extra}}, started


async def request_reached_server(started: Path, timeout: float = 10.0) -> str:
    """The id of the hang request, once the server has it (an external process: its file, polled, bounded)."""
    async with asyncio.timeout(timeout):
        while not started.exists() or not started.read_text():
            await asyncio.sleep(0.01)
    return started.read_text()


async def cancelled_on_server(host: Host, n: int = 1) -> list[str]:
    assert host.parts.plugin_tools is not None
    result = await host.parts.plugin_tools.call("mcp__slow__cancellations", {"n": n})
    assert result.ok, result.output
    return [str(i) for i in json.loads(result.output)]


async def tool_finished(sub: Any, name: str) -> ev.ToolFinished:
    event = await sub.wait_for(lambda e: isinstance(e, ev.ToolFinished) and e.name == name, 10.0)
    assert isinstance(event, ev.ToolFinished)
    return event


async def test_a_plugin_call_that_never_answers_times_out_at_the_server_deadline(make_host, provider, project,
                                                                                 tmp_path):
    """Authority hole 3: an MCP tool that never answered kept its turn running forever. With the
    server's ``timeout = 0.5`` the call ends as TOOL_TIMEOUT after about 0.5 s (durationMs is the
    real time), the server is sent a cancellation for it, and the turn goes on to end normally."""
    servers, started = slow_server(tmp_path, timeout=0.5)
    host = make_host(mcp_servers=servers)
    await host.start_plugins()
    s = await session(host, project)
    sub = host.subscribe()
    provider.enqueue(s["id"], tool("mcp__slow__hang"), {"text": "the tool timed out"})
    began = time.monotonic()
    turn = await prompt(host, s["id"])
    finished = await tool_finished(sub, "mcp__slow__hang")
    wall_ms = (time.monotonic() - began) * 1000
    end = await ended(sub, turn["turnId"])
    assert (finished.ok, finished.error_code) == (False, "TOOL_TIMEOUT")
    assert 500 <= finished.duration_ms <= wall_ms
    assert end.reason == "completed"
    [result] = tool_results((await state(host, s["id"]))["messages"], "mcp__slow__hang")
    assert result["errorCode"] == "TOOL_TIMEOUT" and result["durationMs"] == finished.duration_ms
    assert "0.5 s" in result["output"]
    assert len(provider.requests) == 2  # the model saw the timeout and answered
    assert await cancelled_on_server(host) == [await request_reached_server(started)]


async def test_abort_ends_a_hanging_plugin_call_at_once(make_host, provider, project, tmp_path):
    """Authority hole 3: agent.abort during a plugin call that never answers ends the turn at once
    (the call is TOOL_ABORTED), and the server is sent a cancellation for the call."""
    servers, started = slow_server(tmp_path)  # the default deadline, 120 s: only the abort can end it
    host = make_host(mcp_servers=servers)
    await host.start_plugins()
    s = await session(host, project)
    sub = host.subscribe()
    provider.enqueue(s["id"], tool("mcp__slow__hang"), {"text": "never asked for"})
    began = time.monotonic()
    turn = await prompt(host, s["id"])
    request_id = await request_reached_server(started)
    async with asyncio.timeout(5):
        assert (await host.call("agent.abort", {"sessionId": s["id"]}))["aborted"] is True
    wall_ms = (time.monotonic() - began) * 1000
    assert (await ended(sub, turn["turnId"])).reason == "aborted"
    [result] = tool_results((await state(host, s["id"]))["messages"], "mcp__slow__hang")
    assert result["errorCode"] == "TOOL_ABORTED"
    assert 0 < result["durationMs"] <= wall_ms, "an aborted call's durationMs is not the time it ran"
    assert len(provider.requests) == 1
    assert await cancelled_on_server(host) == [request_id]


async def test_stop_ends_a_hanging_plugin_call_and_its_turn(make_host, provider, project, tmp_path):
    """Authority hole 3: agent.stop did not end a turn whose plugin call never answered (the stop
    waits for the next tool boundary, which never came). Now the call ends TOOL_ABORTED within
    moments of the stop, the turn ends completed with no further model call, and the server is
    sent a cancellation for the call."""
    servers, started = slow_server(tmp_path)
    host = make_host(mcp_servers=servers)
    await host.start_plugins()
    s = await session(host, project)
    sub = host.subscribe()
    provider.enqueue(s["id"], tool("mcp__slow__hang"), {"text": "never asked for"})
    turn = await prompt(host, s["id"])
    request_id = await request_reached_server(started)
    stopped = time.monotonic()
    await host.call("agent.stop", {"sessionId": s["id"]})
    end = await ended(sub, turn["turnId"], timeout=5)
    assert time.monotonic() - stopped < 5
    assert end.reason == "completed"
    [result] = tool_results((await state(host, s["id"]))["messages"], "mcp__slow__hang")
    assert result["errorCode"] == "TOOL_ABORTED" and "stopped" in result["output"]
    assert len(provider.requests) == 1
    assert await cancelled_on_server(host) == [request_id]
