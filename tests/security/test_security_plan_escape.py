"""Plan-mode escape corpus (issue 7 item 3): no route out of Plan/Goal changes the project.

Every case runs through the real Host with the scripted provider and is judged
by a before/after snapshot of the project tree (every path, its size and the
sha256 of its bytes), leaving out ``.pi/`` where the host itself writes the
submitted artifacts. The expected difference is none, in both contract modes.

The one documented exception: Bash under ``auto`` in Plan/Goal does run and
can change files (the seeds' choice; the UI says so). It is asserted here as
an exception, and ``strict_planning`` (bubblewrap) is asserted to close it.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from pidesk.core.errors import PideskError
from pidesk.providers.scripted import ScriptedProvider
from tests.scenario import (
    ended,
    permission_requested,
    plan_requested,
    prompt,
    session,
    state,
    submit_goal,
    submit_plan,
    tool,
    tool_results,
)

pytestmark = pytest.mark.asyncio
MODES = ["plan", "goal"]
MCP_SERVER = str(Path(__file__).parent.parent / "plugins" / "mcp_demo_server.py")
MARKER = "mcp__demo__write_marker"
WRITE_CODES = {"Write": "WRITE_DISABLED_IN_PLAN", "Edit": "EDIT_DISABLED_IN_PLAN", MARKER: "PLUGIN_DISABLED_IN_PLAN"}


def snapshot(root: Path) -> dict[str, tuple[str, int, str]]:
    """Every entry under ``root`` but ``.pi/``: kind, size and sha256 (symlinks by their target)."""
    found: dict[str, tuple[str, int, str]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        if here == root:
            dirnames[:] = [d for d in dirnames if d != ".pi"]
        for name in dirnames + filenames:
            path = here / name
            rel = path.relative_to(root).as_posix()
            if path.is_symlink():
                found[rel] = ("link", 0, os.readlink(path))
            elif path.is_dir():
                found[rel] = ("dir", 0, "")
            else:
                data = path.read_bytes()
                found[rel] = ("file", len(data), hashlib.sha256(data).hexdigest())
    return found


def writes(project: Path) -> list[dict[str, Any]]:
    """Model answers that try to change the project, one call each: new file, overwrite, edit, absolute path."""
    return [
        tool("Write", path="NOTES.md", content="escaped\n"),
        tool("Write", path="README.md", content="overwritten\n"),
        tool("Edit", path="src/app.py", oldText="hello", newText="pwned"),
        tool("Write", path=str(project / "abs.txt"), content="escaped\n"),
    ]


def codes(messages: list[dict[str, Any]], name: str) -> list[str | None]:
    return [r.get("errorCode") for r in tool_results(messages, name)]


async def rejected(coro: Any) -> str:
    with pytest.raises(PideskError) as error:
        await coro
    return str(error.value.code.value if hasattr(error.value.code, "value") else error.value.code)


async def grant(host: Any, provider: Any, sid: str, sub: Any, *calls: dict[str, Any]) -> None:
    """In Agent mode under ask, allow each call with remember: "session" (a real grant row)."""
    provider.enqueue(sid, *calls, {"text": "granted"})
    turn = await prompt(host, sid)
    for _ in calls:
        request = (await permission_requested(sub)).request
        await host.call("permissions.resolve", {"requestId": request.id, "sessionId": sid, "turnId": turn["turnId"],
                                                "decision": "allow", "remember": "session"})
    await ended(sub, turn["turnId"])


# ---- Write/Edit under every permission mode, with and without a session grant ---------------


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("permission_mode", ["ask", "accept-edits", "auto"])
@pytest.mark.parametrize("granted", [False, True], ids=["no-grant", "grant"])
async def test_write_and_edit_change_nothing_in_contract_modes(make_host, provider, project, mode,
                                                             permission_mode, granted):
    host = make_host()
    sub = host.subscribe()
    s = await session(host, project)
    if granted:
        await grant(host, provider, s["id"], sub, tool("Write", path="granted.txt", content="g\n"),
                    tool("Edit", path="granted.txt", oldText="g", newText="h"))
        assert (project / "granted.txt").read_text() == "h\n"
        with host.store.db.read() as db:
            rows = db.execute("SELECT tool FROM grants WHERE session_id = ?", (s["id"],)).fetchall()
        assert sorted(r[0] for r in rows) == ["Edit", "Write"]
    await host.call("session.setPermissionMode", {"sessionId": s["id"], "permissionMode": permission_mode})
    await host.call("session.setMode", {"sessionId": s["id"], "mode": mode})
    before = snapshot(project)
    provider.enqueue(s["id"], *writes(project), {"text": "done"})
    turn = await prompt(host, s["id"])
    end = await ended(sub, turn["turnId"])
    assert snapshot(project) == before
    assert end.reason == "completed"
    messages = (await state(host, s["id"]))["messages"]
    assert codes(messages, "Write")[-3:] == ["WRITE_DISABLED_IN_PLAN"] * 3
    assert codes(messages, "Edit")[-1:] == ["EDIT_DISABLED_IN_PLAN"]
    assert not (await host.call("permissions.pending", {}))["requests"]  # denied outright, never asked


# ---- plugin tools --------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
async def test_plugin_tool_changes_nothing_in_contract_modes_under_auto_with_a_grant(make_host, provider,
                                                                                    project, mode):
    host = make_host(mcp_servers={"demo": {"command": [sys.executable, MCP_SERVER], "risk": "medium"}})
    await host.start_plugins()
    sub = host.subscribe()
    s = await session(host, project)
    await grant(host, provider, s["id"], sub, tool(MARKER, path=str(project / "granted.txt")))
    assert (project / "granted.txt").read_text() == "marker\n"
    await host.call("session.setPermissionMode", {"sessionId": s["id"], "permissionMode": "auto"})
    await host.call("session.setMode", {"sessionId": s["id"], "mode": mode})
    before = snapshot(project)
    provider.enqueue(s["id"], tool(MARKER, path=str(project / "escaped.txt")),
                     tool(MARKER, path="granted.txt"), {"text": "done"})
    await ended(sub, (await prompt(host, s["id"]))["turnId"])
    assert snapshot(project) == before
    assert codes((await state(host, s["id"]))["messages"], MARKER)[-2:] == ["PLUGIN_DISABLED_IN_PLAN"] * 2
    assert MARKER not in [spec["name"] for spec in provider.requests[-1].tools]


# ---- delegates -----------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
async def test_a_delegate_in_a_contract_mode_changes_nothing(make_host, provider, project, mode):
    host = make_host(mcp_servers={"demo": {"command": [sys.executable, MCP_SERVER], "risk": "medium"}})
    await host.start_plugins()
    sub = host.subscribe()
    s = await session(host, project)
    await grant(host, provider, s["id"], sub, tool("Write", path="g.txt", content="g\n"),
                tool("Edit", path="g.txt", oldText="g", newText="h"), tool(MARKER, path=str(project / "g2.txt")))
    await host.call("session.setPermissionMode", {"sessionId": s["id"], "permissionMode": "auto"})
    await host.call("session.setMode", {"sessionId": s["id"], "mode": mode})
    before = snapshot(project)
    # a forged mode in the Task arguments changes nothing either
    provider.enqueue(s["id"], tool("Task", description="edit", prompt="change files", mode="agent",
                                   permissionMode="auto"),
                     tool("TaskWait", taskIds=["task_1"]), {"text": "done"})
    provider.enqueue(f"{s['id']}/task_1", *writes(project), tool(MARKER, path=str(project / "m.txt")),
                     tool("EnterPlanMode", reason="x"), tool("SubmitPlan", title="t", markdown="m", question="q"),
                     {"text": "delegate done"})
    turn = await prompt(host, s["id"])
    await ended(sub, turn["turnId"])
    assert snapshot(project) == before
    assert (await state(host, s["id"]))["session"]["mode"] == mode
    assert not (await host.call("plans.pending", {}))["approvals"]
    audit = (await host.call("audit.list", {"sessionId": s["id"], "limit": 1000}))["entries"]
    denied = sorted((e["detail"]["tool"], e["detail"]["code"]) for e in audit
                    if e["action"] == "tool.denied" and e["turnId"] == turn["turnId"])
    assert ("Write", "WRITE_DISABLED_IN_PLAN") in denied and ("Edit", "EDIT_DISABLED_IN_PLAN") in denied
    assert (MARKER, "PLUGIN_DISABLED_IN_PLAN") in denied
    assert provider.calls(f"{s['id']}/task_1") >= 5


# ---- forged mode / permission fields -------------------------------------------------------


FORGED_RPC = [
    ("agent.prompt", {"text": "go", "mode": "agent"}),
    ("agent.prompt", {"text": "go", "permissionMode": "auto"}),
    ("agent.prompt", {"text": "go", "planState": "inactive"}),
    ("agent.queue.push", {"text": "go", "mode": "agent"}),
    ("agent.steer", {"text": "go", "mode": "agent"}),
    ("session.setPermissionMode", {"permissionMode": "auto", "mode": "agent"}),
    ("session.focus", {"mode": "agent"}),
]


@pytest.mark.parametrize("mode", MODES)
async def test_a_forged_mode_in_rpc_params_is_an_unknown_param_and_nothing_runs(make_host, provider, project, mode):
    host = make_host()
    s = await session(host, project, mode=mode)
    provider.enqueue(s["id"], *writes(project))
    before = snapshot(project)
    for method, params in FORGED_RPC:
        assert await rejected(host.call(method, {"sessionId": s["id"], **params})) == "INVALID_PARAMS", method
    assert await rejected(host.call("session.create", {"projectPath": str(project), "mode": mode,
                                                       "planState": "inactive", "tools": ["Write"]})) == "INVALID_PARAMS"
    got = (await state(host, s["id"]))["session"]
    assert (got["mode"], got["permissionMode"], got["status"]) == (mode, "ask", "idle")
    assert provider.calls(s["id"]) == 0
    assert not (await host.call("agent.queue.list", {"sessionId": s["id"]}))["entries"]
    assert len((await host.call("session.list", {}))["sessions"]) == 1
    assert snapshot(project) == before


@pytest.mark.parametrize("mode", MODES)
async def test_a_forged_mode_in_tool_arguments_changes_nothing(make_host, provider, project, mode):
    host = make_host()
    sub = host.subscribe()
    s = await session(host, project, mode=mode, permissionMode="auto")
    before = snapshot(project)
    forged = {"mode": "agent", "permissionMode": "auto", "granted": True, "sessionId": s["id"]}
    provider.enqueue(s["id"], tool("Write", path="NOTES.md", content="x", **forged),
                     tool("Edit", path="README.md", oldText="demo", newText="x", **forged),
                     tool("Read", path="README.md", **forged), {"text": "done"})
    await ended(sub, (await prompt(host, s["id"]))["turnId"])
    assert snapshot(project) == before
    messages = (await state(host, s["id"]))["messages"]
    assert codes(messages, "Write") == ["WRITE_DISABLED_IN_PLAN"]
    assert codes(messages, "Edit") == ["EDIT_DISABLED_IN_PLAN"]
    assert (await state(host, s["id"]))["session"]["mode"] == mode


# ---- stale, replayed and cross-session resolves -------------------------------------------


def submission(mode: str) -> dict[str, Any]:
    return submit_plan() if mode == "plan" else submit_goal(["NOTES.md exists"])


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("outcome", ["expired", "rejected", "interrupted"])
async def test_resolving_a_settled_approval_is_refused_and_executes_nothing(make_host, provider, project,
                                                                            mode, outcome):
    host = make_host(approval_timeout=0.05 if outcome == "expired" else 60)
    sub = host.subscribe()
    s = await session(host, project, mode=mode)
    provider.enqueue(s["id"], submission(mode))
    turn = await prompt(host, s["id"])
    approval = (await plan_requested(sub)).approval
    ids = {"approvalId": approval.id, "sessionId": s["id"], "turnId": turn["turnId"]}
    if outcome == "rejected":
        await host.call("plans.resolve", {**ids, "decision": "reject", "feedback": "no"})
    elif outcome == "interrupted":
        await host.call("agent.abort", {"sessionId": s["id"]})
    await ended(sub, turn["turnId"])
    assert (await host.call("plans.get", {"approvalId": approval.id}))["status"] == outcome
    provider.enqueue(s["id"], *writes(project), tool("Bash", command="echo x > bash.txt"))
    before, calls = snapshot(project), provider.calls(s["id"])
    for decision in ({"decision": "approve", "permissionMode": "auto"}, {"decision": "reject"}):
        assert await rejected(host.call("plans.resolve", {**ids, **decision})) == "PLAN_ALREADY_RESOLVED"
    got = await state(host, s["id"])
    assert (got["session"]["mode"], got["session"]["permissionMode"], got["session"]["status"]) == (mode, "ask", "idle")
    assert (await host.call("plans.get", {"approvalId": approval.id}))["status"] == outcome
    assert provider.calls(s["id"]) == calls
    assert snapshot(project) == before
    turns = (await host.call("session.turns", {"sessionId": s["id"]}))["turns"]
    assert [t["origin"] for t in turns if t["origin"] == "execution"] == []


@pytest.mark.parametrize("mode", MODES)
async def test_a_replayed_approve_is_refused_and_starts_one_execution(make_host, provider, project, mode):
    host = make_host()
    sub = host.subscribe()
    s = await session(host, project, mode=mode)
    provider.enqueue(s["id"], submission(mode), {"gate": "executing", "text": "working"})
    turn = await prompt(host, s["id"])
    approval = (await plan_requested(sub)).approval
    params = {"approvalId": approval.id, "sessionId": s["id"], "turnId": turn["turnId"], "decision": "approve",
              "permissionMode": "ask"}
    await host.call("plans.resolve", params)
    await provider.wait_reached("executing")
    for replay in (params, {**params, "permissionMode": "auto"}, {**params, "decision": "reject"}):
        assert await rejected(host.call("plans.resolve", replay)) == "PLAN_ALREADY_RESOLVED"
    got = (await state(host, s["id"]))["session"]
    assert (got["mode"], got["permissionMode"]) == ("agent", "ask")  # the replay's auto was not applied
    provider.release("executing")
    turns = (await host.call("session.turns", {"sessionId": s["id"]}))["turns"]
    assert len([t for t in turns if t["origin"] == "execution"]) == 1
    assert (await host.call("plans.get", {"approvalId": approval.id}))["permissionMode"] == "ask"


@pytest.mark.parametrize("mode", MODES)
async def test_a_cross_session_resolve_is_stale_and_changes_no_mode(make_host, provider, project, mode):
    host = make_host()
    sub = host.subscribe()
    a = await session(host, project, mode=mode)
    b = await session(host, project, mode=mode)
    provider.enqueue(a["id"], submission(mode))
    provider.enqueue(b["id"], submission(mode))
    turn_a = await prompt(host, a["id"])
    approval_a = (await plan_requested(sub)).approval
    turn_b = await prompt(host, b["id"])
    approval_b = (await plan_requested(sub)).approval
    before = snapshot(project)
    crossed = [
        {"approvalId": approval_a.id, "sessionId": b["id"], "turnId": turn_b["turnId"]},
        {"approvalId": approval_a.id, "sessionId": b["id"], "turnId": turn_a["turnId"]},
        {"approvalId": approval_a.id, "sessionId": a["id"], "turnId": turn_b["turnId"]},
        {"approvalId": approval_b.id, "sessionId": a["id"], "turnId": turn_a["turnId"]},
    ]
    for ids in crossed:
        for decision in ({"decision": "approve", "permissionMode": "auto"}, {"decision": "reject"}):
            assert await rejected(host.call("plans.resolve", {**ids, **decision})) == "PLAN_APPROVAL_STALE"
    for sid, approval in ((a["id"], approval_a), (b["id"], approval_b)):
        assert (await state(host, sid))["session"]["mode"] == mode
        assert (await host.call("plans.get", {"approvalId": approval.id}))["status"] == "pending"
    assert snapshot(project) == before
    for sid in (a["id"], b["id"]):
        await host.call("agent.abort", {"sessionId": sid})


# ---- approve and reject racing -------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("first", ["approve", "reject"])
async def test_approve_and_reject_racing_one_wins_and_the_durable_outcome_is_its(make_host, provider, project,
                                                                                mode, first):
    host = make_host()
    sub = host.subscribe()
    s = await session(host, project, mode=mode)
    provider.enqueue(s["id"], submission(mode), {"text": "executing"})
    turn = await prompt(host, s["id"])
    approval = (await plan_requested(sub)).approval
    ids = {"approvalId": approval.id, "sessionId": s["id"], "turnId": turn["turnId"]}
    calls = {"approve": {**ids, "decision": "approve", "permissionMode": "auto"},
             "reject": {**ids, "decision": "reject", "feedback": "no"}}
    order = [first, "reject" if first == "approve" else "approve"]
    # two clients: each call runs as its own task, gathered, like two connections' handlers
    results = await asyncio.gather(*(host.call("plans.resolve", calls[d], client_id=f"c{i}")
                                     for i, d in enumerate(order)), return_exceptions=True)
    winners = [d for d, r in zip(order, results) if not isinstance(r, BaseException)]
    losers = [r for r in results if isinstance(r, BaseException)]
    assert len(winners) == 1 and len(losers) == 1
    assert isinstance(losers[0], PideskError) and losers[0].code.value in ("PLAN_ALREADY_RESOLVED",
                                                                          "PLAN_APPROVAL_STALE")
    await ended(sub, turn["turnId"])
    durable = await host.call("plans.get", {"approvalId": approval.id})
    session_now = (await state(host, s["id"]))["session"]
    if winners == ["approve"]:
        assert durable["status"] == "approved" and session_now["mode"] == "agent"
    else:
        assert durable["status"] == "rejected" and durable["feedback"] == "no"
        assert (session_now["mode"], session_now["planState"]) == (mode, "planning")
    audit = [e["action"] for e in (await host.call("audit.list", {"sessionId": s["id"]}))["entries"]]
    assert len([a for a in audit if a.endswith((".approved", ".rejected"))]) == 1


# ---- switching mode while a permission request is pending ---------------------------------


@pytest.mark.parametrize("mode", MODES)
async def test_switching_mode_while_a_permission_request_is_pending_is_busy(make_host, provider, project, mode):
    host = make_host()
    sub = host.subscribe()
    s = await session(host, project, mode=mode)  # permission mode ask: Bash asks in Plan/Goal
    provider.enqueue(s["id"], tool("Bash", command="echo x > bash.txt"), *writes(project), {"text": "done"})
    before = snapshot(project)
    turn = await prompt(host, s["id"])
    request = (await permission_requested(sub)).request
    assert request.tool == "Bash"
    for method, params in (("session.setMode", {"mode": "agent"}),
                           ("session.setPermissionMode", {"permissionMode": "auto"}),
                           ("session.setPermissionMode", {"permissionMode": "accept-edits"})):
        assert await rejected(host.call(method, {"sessionId": s["id"], **params})) == "AGENT_BUSY"
    await host.call("permissions.resolve", {"requestId": request.id, "sessionId": s["id"], "turnId": turn["turnId"],
                                            "decision": "deny"})
    await ended(sub, turn["turnId"])
    assert snapshot(project) == before
    got = (await state(host, s["id"]))["session"]
    assert (got["mode"], got["permissionMode"]) == (mode, "ask")


# ---- Bash: the documented exception, and strict planning ----------------------------------


@pytest.mark.parametrize("mode", MODES)
async def test_bash_under_auto_in_a_contract_mode_does_change_files_the_documented_exception(
        make_host, provider, project, mode):
    host = make_host()
    sub = host.subscribe()
    s = await session(host, project, mode=mode, permissionMode="auto")
    before = snapshot(project)
    provider.enqueue(s["id"], tool("Bash", command="echo x > bash.txt"), {"text": "done"})
    await ended(sub, (await prompt(host, s["id"]))["turnId"])
    after = snapshot(project)
    assert set(after) - set(before) == {"bash.txt"}  # the seeds' choice: auto means Bash runs unasked
    assert (project / "bash.txt").read_text() == "x\n"


def need_bwrap() -> None:
    if shutil.which("bwrap") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("strict planning needs bubblewrap in CI: apt-get install bubblewrap")
        pytest.skip("strict planning needs bubblewrap: apt-get install bubblewrap")


@pytest.mark.parametrize("mode", MODES)
async def test_strict_planning_keeps_bash_under_auto_from_changing_the_project(make_host, provider, project, mode):
    need_bwrap()
    host = make_host(strict_planning=True)
    sub = host.subscribe()
    s = await session(host, project, mode=mode, permissionMode="auto")
    before = snapshot(project)
    provider.enqueue(s["id"], tool("Bash", command="echo x > bash.txt; rm README.md; mkdir d; cat src/app.py"),
                     {"text": "done"})
    await ended(sub, (await prompt(host, s["id"]))["turnId"])
    assert snapshot(project) == before
    result = tool_results((await state(host, s["id"]))["messages"], "Bash")[-1]
    assert "print('hello')" in str(result)  # it could look


@pytest.mark.parametrize("mode", MODES)
async def test_approve_and_reject_racing_from_two_websocket_connections_of_a_real_server(tmp_path, project,
                                                                                        mode):
    """The same race over the wire: two authenticated WebSocket clients send their frames back to back."""
    from tests.server.conftest import http_client, launch  # the real server harness (no fixtures imported)

    http = http_client()
    provider = ScriptedProvider()
    handle = await launch(tmp_path / "wsdata", project, http, provider)
    try:
        served = handle.served
        one, two = await served.ws(), await served.ws()
        s = await one.call("session.create", {"projectPath": str(project), "mode": mode})
        provider.enqueue(s["id"], submission(mode), {"text": "executing"})
        before = snapshot(project)
        turn = await one.call("agent.prompt", {"sessionId": s["id"], "text": "go"})
        approval = (await one.event("plan.requested"))["approval"]
        ids = {"approvalId": approval["id"], "sessionId": s["id"], "turnId": turn["turnId"]}
        responses = await asyncio.gather(
            one.request("plans.resolve", {**ids, "decision": "approve", "permissionMode": "ask"}),
            two.request("plans.resolve", {**ids, "decision": "reject", "feedback": "no"}))
        ok = [i for i, r in enumerate(responses) if "result" in r]
        errors = [r["error"]["data"]["code"] for r in responses if "error" in r]
        assert len(ok) == 1 and errors in (["PLAN_ALREADY_RESOLVED"], ["PLAN_APPROVAL_STALE"]), responses
        await one.turn_ended(turn["turnId"])
        durable = await one.call("plans.get", {"approvalId": approval["id"]})
        got = (await one.call("session.get", {"sessionId": s["id"]}))["session"]
        if ok == [0]:
            assert durable["status"] == "approved" and got["mode"] == "agent"
        else:
            assert durable["status"] == "rejected" and (got["mode"], got["planState"]) == (mode, "planning")
            assert snapshot(project) == before
        audit = [e["action"] for e in (await one.call("audit.list", {"sessionId": s["id"]}))["entries"]]
        assert len([a for a in audit if a.endswith((".approved", ".rejected"))]) == 1
    finally:
        await handle.stop()
        await http.aclose()
        assert not handle.leftovers()
