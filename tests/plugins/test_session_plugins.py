"""MCP servers a client brings for one session (`session.setPlugins`, ACP's `mcpServers`): validated
whole, kept apart from the config file's servers and from other sessions, their secrets never written,
and stopped when their client goes."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from pidesk.core.errors import Code, PideskError
from tests.scenario import ended, gone, prompt, session, state, tool, tool_results

pytestmark = pytest.mark.asyncio
SERVER = str(Path(__file__).parent / "mcp_demo_server.py")


def demo(name: str = "mine", **extra: object) -> dict:
    return {"name": name, "command": [sys.executable, SERVER], **extra}


async def test_a_sessions_servers_serve_that_session_only_and_keep_their_env_unwritten(make_host, provider, project):
    host = make_host()
    mine, other = await session(host, project), await session(host, project)
    listed = await host.call("session.setPlugins", {"sessionId": mine["id"], "servers": [
        demo(env={"DEMO_TOKEN": "s3cret-value"}, risk="low")]}, client_id="editor")
    assert [p["name"] for p in listed["plugins"]] == ["mine"]
    sub = host.subscribe()
    for s in (mine, other):
        provider.enqueue(s["id"], tool("mcp__mine__echo", text="hi"), {"text": "done"})
        started = await prompt(host, s["id"], "echo")
        await ended(sub, started["turnId"], timeout=30)
    mine_result, = tool_results((await state(host, mine["id"]))["messages"])
    other_result, = tool_results((await state(host, other["id"]))["messages"])
    assert mine_result["ok"] and mine_result["output"] == "hi"
    assert not other_result["ok"] and other_result["errorCode"] == "TOOL_NOT_FOUND"
    audit = await host.call("audit.list", {"sessionId": mine["id"]})
    written = str(audit) + "".join(p.read_text() for p in (host.store.data_dir).rglob("*.jsonl"))
    assert "plugins.session" in str(audit) and "s3cret-value" not in written


async def test_a_bad_set_changes_nothing(make_host, project):
    host = make_host(mcp_servers={"docs": {"command": [sys.executable, SERVER]}})
    s = await session(host, project)
    await host.call("session.setPlugins", {"sessionId": s["id"], "servers": [demo()]})
    for servers, says in [([demo("docs")], "name of a server of the config file"),
                          ([demo(), {"name": "x", "command": "not a list"}], "command must be a list"),
                          ([demo("a__b")], "server name may hold only"),
                          ("nope", "servers must be a list")]:
        with pytest.raises(PideskError) as refused:
            await host.call("session.setPlugins", {"sessionId": s["id"], "servers": servers})
        assert refused.value.code is Code.INVALID_PARAMS and says in refused.value.message
    assert host.parts.session_plugins.of(s["id"]) is not None  # the earlier set stands


async def test_a_sessions_servers_stop_with_the_client_that_set_them(make_host, provider, project):
    host = make_host()
    s = await session(host, project)
    await host.call("session.setPlugins", {"sessionId": s["id"], "servers": [demo(risk="low")]}, client_id="editor")
    sub = host.subscribe()
    provider.enqueue(s["id"], tool("mcp__mine__pid"), {"text": "done"})
    started = await prompt(host, s["id"], "which pid?")
    await ended(sub, started["turnId"], timeout=30)
    pid = int(tool_results((await state(host, s["id"]))["messages"])[0]["output"])
    host.client_closed("editor")
    await host.parts.session_plugins.close()  # (waits for the stops under way)
    assert host.parts.session_plugins.of(s["id"]) is None
    assert gone(pid)
