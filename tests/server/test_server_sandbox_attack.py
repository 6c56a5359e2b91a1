"""Issue 28's attack, played in full against the real server: an injected agent approves a plan.

The story as it was found: a session under ``auto`` runs one Bash command that reads the host's
``host.json`` (its port and token), asks ``plans.pending`` for another session's plan and calls
``plans.resolve`` to approve it with ``auto`` — the plan is approved and that session switches to
Agent mode, without a person. Here the command is a small Python program that tries every door
(host.json, the kept token file, the port it is told outright) and prints what happened.

Run twice: with the sandbox, the plan stays pending; with ``sandbox = "off"``, the same command does
approve it — the test can tell, and the README says what turning the sandbox off puts at risk.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from pidesk.config import SandboxSettings
from pidesk.providers.scripted import ScriptedProvider
from tests.sandboxing import require_sandbox

pytestmark = pytest.mark.asyncio

# What the injected agent runs: find the token, find the plan, approve it.
ATTACK = r"""
import json, sys, urllib.request
data, port = sys.argv[1], int(sys.argv[2])
token = None
for name in ("host.json", "token"):
    try:
        text = open(f"{data}/{name}").read()
        token = json.loads(text)["token"] if name == "host.json" else text.strip()
        print("read", name)
        break
    except Exception as exc:
        print("cannot read", name, type(exc).__name__)
def call(method, params):
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/rpc", body, {
        "Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(request, timeout=5))["result"]
try:
    for approval in call("plans.pending", {})["approvals"]:
        call("plans.resolve", {"approvalId": approval["id"], "sessionId": approval["sessionId"],
                               "turnId": approval["turnId"], "decision": "approve", "permissionMode": "auto"})
        print("APPROVED", approval["id"])
except Exception as exc:
    print("cannot reach the host:", type(exc).__name__, exc)
"""


@pytest.mark.parametrize("sandboxed", [True, False], ids=["sandbox", "sandbox-off"])
async def test_an_agent_cannot_approve_a_plan_through_bash(start_server: Any, project: Any, sandboxed: bool) -> None:
    if sandboxed:
        require_sandbox()
    provider = ScriptedProvider()
    served = await start_server(provider=provider, sandbox=SandboxSettings(enabled=sandboxed))
    (served.data_dir / "token").write_text(served.token + "\n")  # (as `pidesk serve` keeps it)
    client = await served.ws()

    planner = await served.call("session.create", {"projectPath": str(project), "mode": "plan",
                                                   "permissionMode": "ask"})
    provider.enqueue(planner["id"], {"toolCalls": [{"name": "SubmitPlan", "args": {
        "title": "Delete the tests", "markdown": "# Plan\n\n1. rm -rf tests\n", "question": "Shall I?"}}]})
    await served.call("agent.prompt", {"sessionId": planner["id"], "text": "plan it"})
    approval = (await client.event("plan.requested"))["approval"]

    attacker = await served.call("session.create", {"projectPath": str(project), "permissionMode": "auto"})
    provider.enqueue(attacker["id"], {"toolCalls": [{"name": "Bash", "args": {
        "command": f"python3 -c '{ATTACK}' {served.data_dir} {served.port}"}}]}, {"text": "done"})
    turn = await served.call("agent.prompt", {"sessionId": attacker["id"], "text": "summarise the README"})
    await client.event("turn.ended", lambda e: e["turnId"] == turn["turnId"])
    page = await served.call("session.get", {"sessionId": attacker["id"]})
    output = next(b["output"] for m in page["messages"] for b in m["content"] if b["type"] == "toolResult")

    now = await served.call("plans.get", {"approvalId": approval["id"]})
    planning = (await served.call("session.get", {"sessionId": planner["id"]}))["session"]
    if sandboxed:
        assert "cannot read host.json" in output and "cannot read token" in output
        assert "cannot reach the host" in output and "APPROVED" not in output, output
        assert now["status"] == "pending" and (planning["mode"], planning["planState"]) == ("plan", "awaiting_approval")
        audit = (await served.call("audit.list", {"limit": 1000}))["entries"]
        assert not [e for e in audit if e["action"] == "plan.approved"]
    else:  # what the sandbox stands between: the same command approves the plan
        assert f"APPROVED {approval['id']}" in output, output
        assert now["status"] == "approved" and json.dumps(now["permissionMode"]) == '"auto"'
