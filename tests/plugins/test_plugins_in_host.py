"""Plugin tools and event hooks inside a real Host: Agent-only tools, turnEnded exactly once."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from pidesk.plugins.hooks import EventHooks
from pidesk.providers.scripted import ScriptedProvider
from tests.scenario import (
    die,
    ended,
    permission_requested,
    plan_requested,
    prompt,
    session,
    state,
    submit_plan,
    tool,
    tool_results,
)

pytestmark = pytest.mark.asyncio
SERVER = str(Path(__file__).parent / "mcp_demo_server.py")


def mcp(risk: str) -> dict:
    return {"demo": {"command": [sys.executable, SERVER], "risk": risk}}


@pytest.mark.parametrize(("risk", "asks"), [("low", False), ("medium", True), ("high", True)])
async def test_plugin_tools_are_offered_and_run_in_agent_mode_by_risk(make_host, provider, project, risk, asks):
    host = make_host(mcp_servers=mcp(risk))
    await host.start_plugins()
    s = await session(host, project)
    sub = host.subscribe()
    marker = project / "marker.txt"
    provider.enqueue(s["id"], tool("mcp__demo__write_marker", path=str(marker)), {"text": "done"})
    turn = await prompt(host, s["id"])
    if asks:
        request = (await permission_requested(sub)).request
        await host.call("permissions.resolve", {"requestId": request.id, "sessionId": s["id"],
                                                "turnId": turn["turnId"], "decision": "allow"})
    await ended(sub, turn["turnId"])
    assert marker.read_text() == "marker\n"
    assert "mcp__demo__write_marker" in [spec["name"] for spec in provider.requests[0].tools]
    listed = (await host.call("plugins.list", {}))["plugins"]
    assert listed[0]["name"] == "demo" and {"name": "mcp__demo__echo", "risk": risk, "riskFrom": "config"} in listed[0]["tools"]


@pytest.mark.parametrize("mode", ["plan", "goal"])
async def test_plugin_tools_are_hidden_and_denied_in_contract_modes_even_under_auto_with_a_grant(
        make_host, provider, project, mode):
    host = make_host(mcp_servers=mcp("low"))
    await host.start_plugins()
    s = await session(host, project, permissionMode="auto")
    sub = host.subscribe()
    marker = project / "marker.txt"
    call = tool("mcp__demo__write_marker", path=str(marker))
    provider.enqueue(s["id"], call, {"text": "ok"})
    await ended(sub, (await prompt(host, s["id"]))["turnId"])  # low risk in Agent mode: allowed
    marker.unlink()
    with host.store.db.tx() as db:  # a session grant for the tool, as "always allow" would leave
        db.execute("INSERT INTO grants VALUES (?, 'mcp__demo__write_marker', 'now')", (s["id"],))
    await host.call("session.setMode", {"sessionId": s["id"], "mode": mode})
    provider.enqueue(s["id"], call, {"text": "ok"})
    await ended(sub, (await prompt(host, s["id"]))["turnId"])
    assert tool_results((await state(host, s["id"]))["messages"], "mcp__demo__write_marker")[-1]["errorCode"] == \
        "PLUGIN_DISABLED_IN_PLAN"
    assert not marker.exists()
    assert "mcp__demo__write_marker" not in [spec["name"] for spec in provider.requests[-1].tools]


class Recorder:
    name = "recorder"

    def __init__(self) -> None:
        self.ended: list[tuple[str, str, str | None]] = []

    async def on_event(self, event: dict) -> None:
        if event["type"] == "session:turnEnded":
            self.ended.append((event["turnId"], event["reason"], event["errorCode"]))


async def test_session_turn_ended_fires_exactly_once_per_turn_whatever_ends_it(make_host, project):
    provider = ScriptedProvider()
    recorder = Recorder()
    hooks = EventHooks([recorder])
    host = make_host(provider=provider, hooks=hooks, approval_timeout=0.05)
    s = await session(host, project)
    p = await session(host, project, mode="plan")
    sub = host.subscribe()
    provider.enqueue(s["id"], {"text": "ok"}, {"error": "PROVIDER_ERROR"}, {"gate": "hold"}, {"gate": "crash"})
    provider.enqueue(p["id"], submit_plan())
    completed = await prompt(host, s["id"])
    await ended(sub, completed["turnId"])
    errored = await prompt(host, s["id"])
    await ended(sub, errored["turnId"])
    aborted = await prompt(host, s["id"])
    await provider.wait_reached("hold")
    await host.call("agent.abort", {"sessionId": s["id"]})
    expired = await prompt(host, p["id"])
    await plan_requested(sub)
    await ended(sub, expired["turnId"])
    crashed = await prompt(host, s["id"])
    await provider.wait_reached("crash")
    await hooks.drain()
    await die(host)
    restarted = make_host(provider=provider, hooks=hooks)
    await restarted.start_plugins()
    await restarted.start_plugins()  # announced once, however often plugins start
    await hooks.drain()
    assert sorted(recorder.ended) == sorted([
        (completed["turnId"], "completed", None), (errored["turnId"], "error", "PROVIDER_ERROR"),
        (aborted["turnId"], "aborted", None), (expired["turnId"], "completed", None),
        (crashed["turnId"], "aborted", "INTERRUPTED"),
    ])
