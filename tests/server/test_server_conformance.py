"""PROTOCOL.md on the wire: every method, object shape, event shape and RPC error code,
through the real server on a loopback port, a real WebSocket client and HTTP POST.

Object and event shapes are checked field for field against PROTOCOL.md; the only extra
fields accepted are the additions pidesk documents in docs/protocol-notes.md
(``Session.usage``, the ``session.deleted`` event, ``agent.prompt``'s ``unattended``)."""

from __future__ import annotations

import asyncio
import json
import re
import sqlite3
from typing import Any

import pytest
from websockets.exceptions import ConnectionClosed

from pidesk.config import HostConfig
from pidesk.host import Host
from pidesk.providers.scripted import ScriptedProvider
from pidesk.server.rpc import MAX_FRAME
from tests.scenario import submit_plan, tool

pytestmark = pytest.mark.asyncio

# ---- PROTOCOL.md "Objects", field names exactly ------------------------------------------

SESSION = {"id", "title", "projectPath", "root", "mode", "permissionMode", "status", "planState", "currentTurnId",
           "forkedFrom", "createdAt", "updatedAt"}
MESSAGE = {"id", "sessionId", "turnId", "seq", "role", "content", "createdAt"}
APPROVAL = {"id", "kind", "sessionId", "turnId", "toolCallId", "title", "question", "artifactPath", "artifactSha256",
            "artifactSize", "status", "deadline", "permissionMode", "executionId", "executionState", "createdAt",
            "resolvedAt", "revises", "feedback",
            "context"}  # + criteria? ("context": PROTOCOL.md "Turn-3 additions", what an execution starts from)
PERMISSION = {"id", "sessionId", "turnId", "toolCallId", "tool", "args", "status", "createdAt", "resolvedAt",
              "preview",  # PROTOCOL.md "Additions": {diff, overwrites} for Write and Edit, else null
              "escalated"}  # PROTOCOL.md "Turn-3 additions": a Bash command asking to leave the sandbox
NOTIFICATION = {"id", "sessionId", "turnId", "kind", "createdAt", "seenAt"}
QUEUE_ENTRY = {"id", "sessionId", "position", "text", "attachments", "createdAt"}
TURN = {"id", "sessionId", "seq", "origin", "state", "reason", "errorCode", "startedAt", "endedAt", "usage",
        "errorMessage"}
USAGE = {"inputTokens", "outputTokens", "cacheTokens", "cacheReadTokens", "cacheWriteTokens"}
BLOCKS = {"text": ({"type", "text"}, set()),
          "toolCall": ({"type", "id", "name", "args"}, set()),
          "toolResult": ({"type", "toolCallId", "name", "ok", "output"}, {"errorCode", "durationMs"}),
          "attachment": ({"type", "kind", "name", "mime", "size", "ref"}, set()),
          # PROTOCOL.md "Turn-3 additions"; keptFromSeq is docs/protocol-notes.md's
          "compaction": ({"type", "summary", "reason", "tokensBefore", "tokensAfter"}, {"keptFromSeq"})}
# Additions pidesk documents in docs/protocol-notes.md (accepted, and checked, beside PROTOCOL.md's fields)
SESSION_ADDED = {"usage"}
TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$")

# PROTOCOL.md "Events": type -> (required extra params, optional extra params)
EVENTS = {
    "session.updated": ({"session"}, set()),
    "turn.started": ({"sessionId", "turnId", "origin"}, set()),
    "message.delta": ({"sessionId", "turnId", "messageId", "text"}, set()),
    "message.appended": ({"sessionId", "turnId", "message"}, set()),
    "tool.started": ({"sessionId", "turnId", "toolCallId", "name", "args"}, set()),
    "tool.finished": ({"sessionId", "turnId", "toolCallId", "name", "ok", "durationMs"}, {"errorCode"}),
    "permission.requested": ({"request"}, set()),
    "permission.resolved": ({"request"}, set()),
    "plan.requested": ({"approval"}, set()),
    "plan.resolved": ({"approval"}, set()),
    "execution.changed": ({"approvalId", "sessionId", "executionId", "executionState"}, set()),
    "queue.changed": ({"sessionId", "entries"}, set()),
    "turn.ended": ({"sessionId", "turnId", "reason"}, {"errorCode", "errorMessage"}),
    "notification.created": ({"notification"}, set()),
    "session.deleted": ({"sessionId"}, set()),  # docs/protocol-notes.md; not in PROTOCOL.md's table
    "session.truncated": ({"sessionId", "fromSeq"}, set()),  # docs/protocol-notes.md, likewise
    "context.compacted": ({"sessionId", "turnId", "messageId", "reason", "tokensBefore", "tokensAfter", "summary"},
                          set()),  # PROTOCOL.md "Turn-3 additions"
    "turn.retrying": ({"sessionId", "turnId", "attempt", "of", "waitS", "reason"}, set()),  # protocol-notes.md
}


def times(obj: dict[str, Any], *names: str) -> None:
    for name in names:
        value = obj[name]
        assert value is None or TIME.match(value), (name, value)


def is_session(s: dict[str, Any]) -> dict[str, Any]:
    assert SESSION <= set(s) <= SESSION | SESSION_ADDED, set(s) ^ SESSION
    if "usage" in s:
        assert set(s["usage"]) == USAGE and all(isinstance(v, int) for v in s["usage"].values())
    assert s["mode"] in ("agent", "plan", "goal") and s["permissionMode"] in ("ask", "accept-edits", "auto")
    assert s["status"] in ("idle", "running", "waiting_permission")
    assert s["planState"] in ("inactive", "planning", "awaiting_approval")
    assert s["forkedFrom"] is None or set(s["forkedFrom"]) == {"sessionId", "throughMessageId"}
    times(s, "createdAt", "updatedAt")
    return s


def is_message(m: dict[str, Any]) -> dict[str, Any]:
    assert set(m) == MESSAGE, set(m) ^ MESSAGE
    assert m["role"] in ("user", "assistant", "tool") and isinstance(m["seq"], int)
    for block in m["content"]:
        required, optional = BLOCKS[block["type"]]
        assert required <= set(block) <= required | optional, block
    times(m, "createdAt")
    return m


def is_approval(a: dict[str, Any], *, markdown: bool = False) -> dict[str, Any]:
    keys = set(a) - {"criteria"} - ({"markdown", "html"} if markdown else set())
    assert keys == APPROVAL, keys ^ APPROVAL
    assert a["kind"] in ("plan", "goal")
    assert a["status"] in ("pending", "approved", "rejected", "expired", "interrupted")
    assert a["executionState"] in ("none", "queued", "running", "completed", "failed", "aborted", "interrupted")
    assert re.fullmatch(r"[0-9a-f]{64}", a["artifactSha256"])
    assert re.fullmatch(r"\.pi/plan/\d{8}T\d{6}Z-[^/]+\.md", a["artifactPath"]), a["artifactPath"]
    times(a, "createdAt", "resolvedAt", "deadline")
    return a


def is_permission(r: dict[str, Any]) -> dict[str, Any]:
    assert set(r) == PERMISSION, set(r) ^ PERMISSION
    assert r["status"] in ("pending", "allowed", "denied", "interrupted")
    if r["tool"] in ("Write", "Edit"):
        assert set(r["preview"]) == {"diff", "overwrites"} and isinstance(r["preview"]["overwrites"], bool), r
    else:
        assert r["preview"] is None, r
    times(r, "createdAt", "resolvedAt")
    return r


def is_notification(n: dict[str, Any]) -> dict[str, Any]:
    assert set(n) == NOTIFICATION, set(n) ^ NOTIFICATION
    assert n["kind"] in ("task.completed", "task.failed")
    times(n, "createdAt", "seenAt")
    return n


def is_entry(e: dict[str, Any]) -> dict[str, Any]:
    assert set(e) == QUEUE_ENTRY, set(e) ^ QUEUE_ENTRY
    assert isinstance(e["position"], int) and isinstance(e["attachments"], list)
    times(e, "createdAt")
    return e


def is_turn(t: dict[str, Any]) -> dict[str, Any]:
    assert set(t) == TURN, set(t) ^ TURN
    assert set(t["usage"]) == USAGE
    assert t["origin"] in ("interactive", "queued", "execution", "scheduled")
    assert t["state"] in ("running", "ended") and t["reason"] in ("completed", "aborted", "error", None)
    times(t, "startedAt", "endedAt")
    return t


def check_events(events: list[dict[str, Any]]) -> None:
    """Every event is a documented type with exactly its documented params (plus type and seq)."""
    nested = {"session": is_session, "message": is_message, "request": is_permission, "approval": is_approval,
              "notification": is_notification}
    for e in events:
        assert e["type"] in EVENTS, f"event type {e['type']!r} is not in PROTOCOL.md's event table"
        required, optional = EVENTS[e["type"]]
        extra = set(e) - {"type", "seq"}
        assert required <= extra <= required | optional, (e["type"], extra ^ required)
        for key, check in nested.items():
            if key in e:
                check(e[key])
        for entry in e.get("entries", []):
            is_entry(entry)


def rpc_error(err: Any, code: int, data_code: str | None) -> None:
    assert (err.code, err.data_code) == (code, data_code), err.response
    assert isinstance(err.response["error"]["message"], str) and err.response["error"]["message"]


# ---- host.* and the HTTP transport -------------------------------------------------------------


async def test_host_methods_over_websocket_and_http(served):
    c = await served.ws()
    hello = await c.call("host.hello", {"protocolVersion": 1, "client": {"name": "conformance"}})
    assert set(hello) == {"protocolVersion", "schemaVersion", "hostVersion", "strictPlanning", "sandbox"}
    assert hello["protocolVersion"] == 1 and hello["strictPlanning"] is False  # off unless configured
    status = await c.call("host.status")
    assert status == {"sessions": 0, "running": 0, "pendingApprovals": 0, "queued": 0}
    rpc_error(await c.error("host.hello", {"protocolVersion": 2}), -32000, "PROTOCOL_MISMATCH")
    # a version that is not an integer is a wrong type, not another version (authority hole 16)
    rpc_error(await c.error("host.hello", {"protocolVersion": "1"}), -32602, "INVALID_PARAMS")

    assert await served.call("host.hello", {"protocolVersion": 1}) == hello
    created = is_session(await served.call("session.create", {"projectPath": str(served.project), "title": "http"}))
    assert [s["id"] for s in (await served.call("session.list"))["sessions"]] == [created["id"]]
    # a batch over HTTP: answers for the requests, none for the notification, in order
    batch = await served.post([
        {"jsonrpc": "2.0", "id": "a", "method": "host.status"},
        {"jsonrpc": "2.0", "method": "host.status"},
        {"jsonrpc": "2.0", "id": "b", "method": "no.such"},
        {"jsonrpc": "2.0", "id": "c", "method": "session.get", "params": {"sessionId": created["id"]}},
    ])
    assert batch.status_code == 200 and batch.headers["content-type"].startswith("application/json")
    answers = batch.json()
    assert [a["id"] for a in answers] == ["a", "b", "c"]
    assert answers[0]["result"]["sessions"] == 1
    assert answers[1]["error"]["code"] == -32601 and answers[1]["error"]["data"]["code"] == "METHOD_NOT_FOUND"
    assert is_session(answers[2]["result"]["session"])["id"] == created["id"]
    only_notification = await served.post({"jsonrpc": "2.0", "method": "host.status"})
    assert only_notification.status_code == 204 and only_notification.content == b""
    assert (await served.http.get(served.url + "/healthz")).json() == {"ok": True}
    # the WebSocket saw the HTTP-made session as an event
    assert (await c.event("session.updated"))["session"]["id"] == created["id"]
    check_events(c.events)


# ---- session.*, notifications.*, audit.list, a completed turn -------------------------------------


async def test_session_methods_objects_and_a_completed_turn(served):
    c = await served.ws()
    provider, project = served.provider, served.project
    s = is_session(await c.call("session.create", {"projectPath": str(project), "title": "conf",
                                                     "mode": "agent", "permissionMode": "ask"}))
    assert (s["title"], s["projectPath"], s["status"], s["planState"], s["currentTurnId"]) == \
        ("conf", str(project.resolve()), "idle", "inactive", None)
    scratch = is_session(await c.call("session.create"))
    assert scratch["projectPath"] is None and scratch["root"]
    listed = (await c.call("session.list"))["sessions"]
    assert {x["id"] for x in listed} == {s["id"], scratch["id"]} and all(is_session(x) for x in listed)
    assert [x["id"] for x in (await c.call("session.list", {"projectPath": str(project)}))["sessions"]] == [s["id"]]

    provider.enqueue(s["id"], {"text": "Looking at the readme.", "toolCalls": [{"name": "Read", "args": {"path": "README.md"}}],
                               "usage": {"inputTokens": 11, "outputTokens": 3}},
                     {"text": "All done."})
    uploaded = await c.call("attachments.put", {"name": "a.txt", "mime": "text/plain", "data": "YWJj"})
    assert uploaded == {"kind": "file", "name": "a.txt", "mime": "text/plain", "size": 3,
                        "ref": "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"}
    started = await c.call("agent.prompt", {"sessionId": s["id"], "text": "read it", "attachments": [uploaded]})
    assert set(started) == {"turnId", "messageId"}
    assert (await c.event("turn.started", lambda e: e["turnId"] == started["turnId"]))["origin"] == "interactive"
    end = await c.turn_ended(started["turnId"])
    assert (end["reason"], end.get("errorCode")) == ("completed", None)
    for kind in ("message.delta", "message.appended", "tool.started", "tool.finished"):
        assert c.seen(kind), kind
    finished = c.seen("tool.finished")[0]
    assert (finished["name"], finished["ok"]) == ("Read", True) and isinstance(finished["durationMs"], int)

    got = await c.call("session.get", {"sessionId": s["id"]})
    assert set(got) == {"session", "messages", "hasMore", "queue", "pendingApproval", "pendingPermissions"}
    is_session(got["session"])
    messages = [is_message(m) for m in got["messages"]]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant"]
    assert [m["seq"] for m in messages] == sorted(m["seq"] for m in messages)
    assert messages[0]["id"] == started["messageId"]
    assert [b["type"] for b in messages[0]["content"]] == ["text", "attachment"]
    assert [b["type"] for b in messages[1]["content"]] == ["text", "toolCall"]
    assert messages[2]["content"][0]["type"] == "toolResult" and messages[2]["content"][0]["ok"] is True
    assert (got["hasMore"], got["queue"], got["pendingApproval"], got["pendingPermissions"]) == (False, [], None, [])
    page = await c.call("session.get", {"sessionId": s["id"], "beforeSeq": messages[-1]["seq"], "limit": 2})
    assert [m["id"] for m in page["messages"]] == [m["id"] for m in messages[1:3]] and page["hasMore"] is True

    turns = (await c.call("session.turns", {"sessionId": s["id"]}))["turns"]
    assert [is_turn(t)["id"] for t in turns] == [started["turnId"]]
    assert (turns[0]["state"], turns[0]["reason"], turns[0]["usage"]["inputTokens"]) == ("ended", "completed", 11)
    assert len((await c.call("session.turns", {"sessionId": s["id"], "limit": 1}))["turns"]) == 1

    # nobody focused the session: its result is a notification
    note = is_notification((await c.event("notification.created"))["notification"])
    listed_notes = (await c.call("notifications.list"))["notifications"]
    assert [is_notification(n)["id"] for n in listed_notes] == [note["id"]]
    assert (note["sessionId"], note["turnId"], note["kind"], note["seenAt"]) == \
        (s["id"], started["turnId"], "task.completed", None)
    assert await c.call("notifications.markSeen", {"ids": [note["id"]]}) == {}
    assert (await c.call("notifications.list", {"unseenOnly": True}))["notifications"] == []
    assert (await c.call("notifications.list"))["notifications"][0]["seenAt"] is not None
    assert await c.call("notifications.markSeen", {"sessionId": s["id"]}) == {}

    fork = is_session(await c.call("session.fork", {"sessionId": s["id"], "throughMessageId": messages[1]["id"]}))
    assert fork["forkedFrom"] == {"sessionId": s["id"], "throughMessageId": messages[1]["id"]}
    assert fork["status"] == "idle" and fork["id"] != s["id"]
    assert len((await c.call("session.get", {"sessionId": fork["id"]}))["messages"]) == 2
    whole = is_session(await c.call("session.fork", {"sessionId": s["id"]}))
    assert whole["forkedFrom"] == {"sessionId": s["id"], "throughMessageId": None}

    planned = is_session(await c.call("session.setMode", {"sessionId": s["id"], "mode": "plan"}))
    assert (planned["mode"], planned["planState"]) == ("plan", "planning")
    auto = is_session(await c.call("session.setPermissionMode", {"sessionId": s["id"], "permissionMode": "auto"}))
    assert auto["permissionMode"] == "auto"
    assert await c.call("session.focus", {"sessionId": s["id"]}) == {}
    assert await c.call("session.focus", {"sessionId": None}) == {}
    assert await c.call("session.focus") == {}

    audit = (await c.call("audit.list", {"sessionId": s["id"]}))["entries"]
    actions = [e["action"] for e in audit]
    assert "mode.changed" in actions and "permission_mode.changed" in actions
    assert len((await c.call("audit.list", {"limit": 1}))["entries"]) == 1

    assert await c.call("session.delete", {"sessionId": whole["id"]}) == {}
    rpc_error(await c.error("session.get", {"sessionId": whole["id"]}), -32000, "NOT_FOUND")
    assert whole["id"] not in {x["id"] for x in (await c.call("session.list"))["sessions"]}
    status = await c.call("host.status")
    assert status == {"sessions": 3, "running": 0, "pendingApprovals": 0, "queued": 0}
    check_events(c.events)


async def test_session_deleted_reaches_other_connections(served):
    """`session.deleted` is a pidesk addition (docs/protocol-notes.md), so other clients can drop the session."""
    a, b = await served.ws(), await served.ws()
    doomed = await a.call("session.create")
    assert await a.call("session.delete", {"sessionId": doomed["id"]}) == {}
    gone = await b.event("session.deleted")
    assert gone["sessionId"] == doomed["id"]
    check_events(b.events)


# ---- agent.*: a running turn, AGENT_BUSY, steer, stop, abort, the queue ------------------------------


async def test_agent_and_queue_methods_on_a_running_session(served):
    c = await served.ws()
    provider = served.provider
    s = await c.call("session.create", {"projectPath": str(served.project)})
    sid = s["id"]
    provider.enqueue(sid, {"gate": "run-1", "text": "thinking"})
    t1 = await c.call("agent.prompt", {"sessionId": sid, "text": "first"})
    await provider.wait_reached("run-1")
    assert (await c.call("session.get", {"sessionId": sid}))["session"]["currentTurnId"] == t1["turnId"]
    assert (await c.call("host.status"))["running"] == 1
    busy = [("agent.prompt", {"text": "again"}), ("session.delete", {}), ("session.setMode", {"mode": "plan"}),
            ("session.setPermissionMode", {"permissionMode": "auto"}), ("session.fork", {})]
    for method, params in busy:
        rpc_error(await c.error(method, {"sessionId": sid, **params}), -32000, "AGENT_BUSY")

    assert await c.call("agent.steer", {"sessionId": sid, "turnId": t1["turnId"], "text": "also this"}) == {}
    rpc_error(await c.error("agent.steer", {"sessionId": sid, "turnId": "t_nope", "text": "x"}), -32000, "NOT_FOUND")
    first = await c.call("agent.queue.push", {"sessionId": sid, "text": "queued one"})
    second = await c.call("agent.queue.push", {"sessionId": sid, "text": "queued two"})
    assert set(first) == {"entryId", "position"} and second["position"] > first["position"]
    entries = (await c.call("agent.queue.list", {"sessionId": sid}))["entries"]
    assert [is_entry(e)["id"] for e in entries] == [first["entryId"], second["entryId"]]
    assert [e["text"] for e in (await c.event("queue.changed", lambda e: len(e["entries"]) == 2))["entries"]] == \
        ["queued one", "queued two"]
    reordered = (await c.call("agent.queue.prioritize", {"sessionId": sid, "entryId": second["entryId"]}))["entries"]
    assert [e["id"] for e in reordered] == [second["entryId"], first["entryId"]]
    assert await c.call("agent.queue.remove", {"sessionId": sid, "entryId": first["entryId"]}) == {}
    rpc_error(await c.error("agent.queue.remove", {"sessionId": sid, "entryId": first["entryId"]}), -32000, "NOT_FOUND")
    assert [e["id"] for e in (await c.call("session.get", {"sessionId": sid}))["queue"]] == [second["entryId"]]
    assert (await c.call("host.status"))["queued"] == 1
    # sendNow on a running session: the turn stops at its next boundary, then that entry runs
    assert await c.call("agent.queue.sendNow", {"sessionId": sid, "entryId": second["entryId"]}) == {}
    provider.release("run-1")
    assert (await c.turn_ended(t1["turnId"]))["reason"] == "completed"
    queued = await c.event("turn.started", lambda e: e["origin"] == "queued")
    await c.turn_ended(queued["turnId"])
    assert (await c.call("agent.queue.list", {"sessionId": sid}))["entries"] == []
    user_texts = [m["content"][0].get("text") for m in (await c.call("session.get", {"sessionId": sid}))["messages"]
                  if m["role"] == "user"]
    assert "queued two" in user_texts and "queued one" not in user_texts
    rpc_error(await c.error("agent.steer", {"sessionId": sid, "turnId": t1["turnId"], "text": "late"}),
              -32000, "TURN_ENDED")

    # push on an idle session with an empty queue starts at once
    pushed = await c.call("agent.queue.push", {"sessionId": sid, "text": "right away"})
    started = await c.event("turn.started", lambda e: e["origin"] == "queued" and e["turnId"] != queued["turnId"])
    await c.turn_ended(started["turnId"])
    assert pushed["entryId"] not in [e["id"] for e in (await c.call("agent.queue.list", {"sessionId": sid}))["entries"]]

    # stop and abort on an idle session are no-ops, never errors
    assert await c.call("agent.stop", {"sessionId": sid}) == {}
    assert await c.call("agent.abort", {"sessionId": sid}) == {"aborted": False}

    # agent.stop: the running turn finishes at its next boundary, as completed
    provider.enqueue(sid, {"gateAfter": "run-2", "text": "working", "toolCalls": [{"name": "Read", "args": {"path": "README.md"}}]})
    t2 = await c.call("agent.prompt", {"sessionId": sid, "text": "second"})
    await provider.wait_reached("run-2")
    assert await c.call("agent.stop", {"sessionId": sid}) == {}
    provider.release("run-2")
    assert (await c.turn_ended(t2["turnId"]))["reason"] == "completed"

    # a smart abort before any output restores the draft; a second abort is a no-op
    provider.enqueue(sid, {"gate": "run-3", "text": "never shown"})
    t3 = await c.call("agent.prompt", {"sessionId": sid, "text": "take it back"})
    await provider.wait_reached("run-3")
    aborted = await c.call("agent.abort", {"sessionId": sid, "smart": True})
    assert aborted == {"aborted": True, "restoredDraft": {"text": "take it back", "attachments": []}}
    end = await c.turn_ended(t3["turnId"])
    assert (end["reason"], end.get("errorCode")) == ("aborted", None)
    assert await c.call("agent.abort", {"sessionId": sid}) == {"aborted": False}
    provider.release("run-3")
    turns = (await c.call("session.turns", {"sessionId": sid}))["turns"]
    assert [(t["origin"], t["reason"]) for t in turns] == [
        ("interactive", "completed"), ("queued", "completed"), ("queued", "completed"),
        ("interactive", "completed"), ("interactive", "aborted")]
    check_events(c.events)


# ---- permissions.* -------------------------------------------------------------------------------


async def test_permission_methods_and_their_errors(served):
    c = await served.ws()
    provider = served.provider
    s = await c.call("session.create", {"projectPath": str(served.project), "permissionMode": "ask"})
    sid = s["id"]
    provider.enqueue(sid, tool("Bash", command="true"), {"gate": "perm-after", "text": "ran it"})
    turn = await c.call("agent.prompt", {"sessionId": sid, "text": "run true"})
    request = is_permission((await c.event("permission.requested"))["request"])
    assert (request["sessionId"], request["turnId"], request["tool"], request["status"]) == \
        (sid, turn["turnId"], "Bash", "pending")
    assert [r["id"] for r in (await c.call("permissions.pending"))["requests"]] == [request["id"]]
    assert [r["id"] for r in (await c.call("permissions.pending", {"sessionId": sid}))["requests"]] == [request["id"]]
    got = await c.call("session.get", {"sessionId": sid})
    assert got["session"]["status"] == "waiting_permission"
    assert [is_permission(r)["id"] for r in got["pendingPermissions"]] == [request["id"]]

    answer = {"requestId": request["id"], "sessionId": sid, "turnId": turn["turnId"], "decision": "allow"}
    rpc_error(await c.error("permissions.resolve", {**answer, "decision": "maybe"}), -32602, "INVALID_PARAMS")
    rpc_error(await c.error("permissions.resolve", {**answer, "remember": "forever"}), -32602, "INVALID_PARAMS")
    rpc_error(await c.error("permissions.resolve", {**answer, "requestId": "p_nope"}), -32000, "NOT_FOUND")
    rpc_error(await c.error("permissions.resolve", {**answer, "turnId": "t_nope"}), -32000, "NOT_FOUND")
    assert await c.call("permissions.resolve", answer) == {}
    resolved = await c.event("permission.resolved")
    assert is_permission(resolved["request"])["status"] == "allowed"
    await provider.wait_reached("perm-after")  # the turn is alive; the request is settled
    rpc_error(await c.error("permissions.resolve", answer), -32000, "STALE_REQUEST")
    provider.release("perm-after")
    await c.turn_ended(turn["turnId"])
    rpc_error(await c.error("permissions.resolve", answer), -32000, "TURN_ENDED")
    assert (await c.call("permissions.pending"))["requests"] == []
    check_events(c.events)


# ---- plans.*: the whole flow over the wire and every plan error code -----------------------------------


async def test_plan_flow_over_the_wire(served):
    c = await served.ws()
    provider, project = served.provider, served.project
    rpc_error(await c.error("session.create", {"mode": "plan"}), -32000, "PLAN_WORKSPACE_REQUIRED")
    rpc_error(await c.error("session.create", {"mode": "goal"}), -32000, "PLAN_WORKSPACE_REQUIRED")
    scratch = await c.call("session.create")
    rpc_error(await c.error("session.setMode", {"sessionId": scratch["id"], "mode": "plan"}),
              -32000, "PLAN_WORKSPACE_REQUIRED")

    s = is_session(await c.call("session.create", {"projectPath": str(project), "mode": "plan"}))
    sid = s["id"]
    assert s["planState"] == "planning"
    provider.enqueue(sid, submit_plan(), {"text": "Executed the plan."})
    turn = await c.call("agent.prompt", {"sessionId": sid, "text": "plan notes"})
    approval = is_approval((await c.event("plan.requested"))["approval"])
    assert (approval["sessionId"], approval["turnId"], approval["status"], approval["kind"]) == \
        (sid, turn["turnId"], "pending", "plan")
    assert (approval["permissionMode"], approval["executionId"], approval["executionState"]) == (None, None, "none")

    waiting = await c.call("session.get", {"sessionId": sid})
    assert (waiting["session"]["status"], waiting["session"]["planState"], waiting["session"]["currentTurnId"]) == \
        ("running", "awaiting_approval", turn["turnId"])
    assert is_approval(waiting["pendingApproval"])["id"] == approval["id"]
    assert [a["id"] for a in (await c.call("plans.pending"))["approvals"]] == [approval["id"]]
    assert [a["id"] for a in (await c.call("plans.pending", {"sessionId": sid}))["approvals"]] == [approval["id"]]
    assert [a["id"] for a in (await c.call("plans.list", {"sessionId": sid}))["approvals"]] == [approval["id"]]
    full = is_approval(await c.call("plans.get", {"approvalId": approval["id"]}), markdown=True)
    assert full["markdown"] == "# Plan\n\n1. Write NOTES.md\n"
    assert full["html"] == "<h1>Plan</h1>\n<ol>\n<li>Write NOTES.md</li>\n</ol>\n"
    assert (project / full["artifactPath"]).read_text() == full["markdown"]
    assert (await c.call("host.status"))["pendingApprovals"] == 1

    decision = {"approvalId": approval["id"], "sessionId": sid, "turnId": turn["turnId"], "decision": "approve"}
    rpc_error(await c.error("plans.get", {"approvalId": "pa_nope"}), -32000, "PLAN_NOT_FOUND")
    rpc_error(await c.error("plans.resolve", {**decision, "approvalId": "pa_nope", "permissionMode": "auto"}),
              -32000, "PLAN_NOT_FOUND")
    rpc_error(await c.error("plans.resolve", {**decision, "turnId": "t_other", "permissionMode": "auto"}),
              -32000, "PLAN_APPROVAL_STALE")
    rpc_error(await c.error("plans.resolve", {**decision, "sessionId": scratch["id"], "permissionMode": "auto"}),
              -32000, "PLAN_APPROVAL_STALE")
    rpc_error(await c.error("plans.resolve", decision), -32000, "PLAN_PERMISSION_MODE_REQUIRED")
    rpc_error(await c.error("plans.resolve", {**decision, "permissionMode": "yolo"}),
              -32000, "PLAN_PERMISSION_MODE_INVALID")
    rpc_error(await c.error("plans.resolve", {**decision, "decision": "maybe"}), -32602, "INVALID_PARAMS")
    rpc_error(await c.error("session.setMode", {"sessionId": sid, "mode": "agent"}), -32000, "AGENT_BUSY")
    assert (await c.call("plans.get", {"approvalId": approval["id"]}))["status"] == "pending"

    mark = len(c.events)
    approved = is_approval(await c.call("plans.resolve", {**decision, "permissionMode": "auto"}))
    assert (approved["status"], approved["permissionMode"], approved["executionState"]) == ("approved", "auto", "queued")
    assert approved["executionId"] and approved["resolvedAt"]
    execution = await c.event("turn.started", lambda e: e["origin"] == "execution")
    exec_end = await c.turn_ended(execution["turnId"])
    assert (exec_end["reason"], exec_end.get("errorCode")) == ("completed", None)
    await c.event("execution.changed", lambda e: e["executionState"] == "completed")
    flow = c.events[mark:]

    def at(kind: str, where: Any = lambda e: True) -> int:
        return next(i for i, e in enumerate(flow) if e["type"] == kind and where(e))

    assert flow[at("plan.resolved")]["approval"]["status"] == "approved"
    queued = at("execution.changed", lambda e: e["executionState"] == "queued")
    assert flow[queued]["approvalId"] == approval["id"] and flow[queued]["executionId"] == approved["executionId"]
    submit_end = at("turn.ended", lambda e: e["turnId"] == turn["turnId"])
    assert flow[submit_end]["reason"] == "completed"
    started = at("turn.started", lambda e: e["origin"] == "execution")
    running = at("execution.changed", lambda e: e["executionState"] == "running")
    ended = at("turn.ended", lambda e: e["turnId"] == execution["turnId"])
    completed = at("execution.changed", lambda e: e["executionState"] == "completed")
    assert queued < submit_end < started < running < ended < completed
    assert [e["seq"] for e in flow] == list(range(flow[0]["seq"], flow[0]["seq"] + len(flow)))

    rpc_error(await c.error("plans.resolve", {**decision, "permissionMode": "auto"}), -32000, "PLAN_ALREADY_RESOLVED")
    history = (await c.call("plans.list", {"sessionId": sid}))["approvals"]
    assert [(a["status"], a["executionState"]) for a in history] == [("approved", "completed")]
    after = await c.call("session.get", {"sessionId": sid})
    assert (after["session"]["mode"], after["session"]["permissionMode"], after["session"]["planState"]) == \
        ("agent", "auto", "inactive")
    exec_first = next(m for m in after["messages"] if m["turnId"] == execution["turnId"])
    text = exec_first["content"][0]["text"]
    assert exec_first["role"] == "user" and approval["artifactPath"] in text and approval["artifactSha256"] in text
    assert "1. Write NOTES.md" in text
    turns = (await c.call("session.turns", {"sessionId": sid}))["turns"]
    assert [(t["origin"], t["reason"]) for t in turns] == [("interactive", "completed"), ("execution", "completed")]
    check_events(c.events)


async def test_plan_requires_interactive_session_for_an_unattended_prompt(served):
    """PROTOCOL.md's own path to this code is a scheduled run (schedules: issue 6); pidesk also
    refuses `agent.prompt` with `unattended: true` on a Plan/Goal session (docs/protocol-notes.md)."""
    c = await served.ws()
    for mode in ("plan", "goal"):
        s = await c.call("session.create", {"projectPath": str(served.project), "mode": mode})
        rpc_error(await c.error("agent.prompt", {"sessionId": s["id"], "text": "go", "unattended": True}),
                  -32000, "PLAN_REQUIRES_INTERACTIVE_SESSION")
        assert (await c.call("session.turns", {"sessionId": s["id"]}))["turns"] == []
        assert served.provider.calls(s["id"]) == 0
    rpc_error(await c.error("agent.prompt", {"sessionId": s["id"], "text": "go", "unattended": "yes"}),
              -32602, "INVALID_PARAMS")
    assert not c.seen("turn.started")


SCHEDULE_KEYS = {"id", "name", "cron", "projectPath", "prompt", "mode", "permissionMode", "enabled", "nextRunAt",
                 "lastRun"}


async def test_schedule_methods_over_the_wire(served):
    c = await served.ws()
    created = await c.call("schedules.create", {"name": "plan nightly", "cron": "0 3 * * *",
                                                "projectPath": str(served.project), "prompt": "plan it", "mode": "plan"})
    assert set(created) == SCHEDULE_KEYS and created["nextRunAt"].endswith("Z") and created["lastRun"] is None
    assert [s["id"] for s in (await c.call("schedules.list"))["schedules"]] == [created["id"]]
    run = await c.call("schedules.runNow", {"scheduleId": created["id"]})
    assert set(run) == {"runId", "sessionId", "turnId", "errorCode"}
    assert run["errorCode"] == "PLAN_REQUIRES_INTERACTIVE_SESSION"
    end = await c.turn_ended(run["turnId"])
    assert end["errorCode"] == "PLAN_REQUIRES_INTERACTIVE_SESSION"
    rpc_error(await c.error("schedules.runNow", {"scheduleId": "sc_missing"}), -32000, "NOT_FOUND")
    rpc_error(await c.error("schedules.create", {"name": "x", "cron": "nope", "projectPath": str(served.project),
                                                 "prompt": "p"}), -32602, "INVALID_PARAMS")
    assert await c.call("schedules.delete", {"scheduleId": created["id"]}) == {}
    assert (await c.call("schedules.list"))["schedules"] == []


# ---- framing errors ---------------------------------------------------------------------------------


async def test_framing_errors_over_websocket(served):
    c = await served.ws()

    async def raw(frame: str) -> dict[str, Any]:
        await c.send_raw(frame)
        return await c.reply()

    for frame in ("{not json", "", "[1,", '{"jsonrpc":"2.0","id":1,"method":"host.status"', "\xff"):
        answer = await raw(frame)
        assert answer["error"]["code"] == -32700 and answer["id"] is None, (frame, answer)
    await c.send_raw(b"\xff\xfe")  # a binary frame that is not UTF-8
    assert (await c.reply())["error"]["code"] == -32700
    invalid = [
        ("[]", None), ("5", None), ('"host.status"', None), ("null", None),
        ('{"id":1,"method":"host.status"}', 1),
        ('{"jsonrpc":"1.0","id":2,"method":"host.status"}', 2),
        ('{"jsonrpc":"2.0","id":3,"method":5}', 3),
        ('{"jsonrpc":"2.0","id":3.5,"method":"host.status"}', None),
        ('{"jsonrpc":"2.0","id":true,"method":"host.status"}', None),
        ('{"jsonrpc":"2.0","id":{"a":1},"method":"host.status"}', None),
        ('{"jsonrpc":"2.0","id":9007199254740993,"method":"host.status"}', None),
        ('{"jsonrpc":"2.0","id":"' + "x" * 300 + '","method":"host.status"}', None),
    ]
    for frame, rid in invalid:
        answer = await raw(frame)
        assert (answer["error"]["code"], answer["id"]) == (-32600, rid), (frame, answer)
    answer = await raw("[1, 2]")
    assert [a["error"]["code"] for a in answer] == [-32600, -32600]

    rpc_error(await c.error("no.such.method"), -32601, "METHOD_NOT_FOUND")
    rpc_error(await c.error("session.get", {"sessionId": 5}), -32602, "INVALID_PARAMS")
    rpc_error(await c.error("session.get", {}), -32602, "INVALID_PARAMS")
    rpc_error(await c.error("session.get", ["s_1"]), -32602, "INVALID_PARAMS")
    rpc_error(await c.error("session.get", {"sessionId": "s_1", "bogus": 1}), -32602, "INVALID_PARAMS")
    rpc_error(await c.error("session.create", {"mode": "chaos"}), -32602, "INVALID_PARAMS")
    rpc_error(await c.error("session.get", {"sessionId": "s_nope"}), -32000, "NOT_FOUND")
    rpc_error(await c.error("agent.prompt", {"sessionId": "s_nope", "text": "hi"}), -32000, "NOT_FOUND")
    rpc_error(await c.error("host.hello", {"protocolVersion": 99}), -32000, "PROTOCOL_MISMATCH")
    # ids come back exactly as sent
    assert (await c.request("host.status", rid="a-string-id"))["id"] == "a-string-id"
    assert (await c.request("host.status", rid=2**53 - 1))["id"] == 2**53 - 1
    assert (await c.call("session.list"))["sessions"] == []
    assert await c.call("host.hello", {"protocolVersion": 1})


async def test_the_same_errors_over_http_post(served):
    bad = await served.post(b"{nope", raw=True)
    assert bad.status_code == 200 and bad.json()["error"]["code"] == -32700
    assert (await served.post([])).json()["error"]["code"] == -32600
    unknown = (await served.post({"jsonrpc": "2.0", "id": 1, "method": "nope"})).json()
    assert unknown["error"] == {"code": -32601, "message": unknown["error"]["message"],
                                "data": {"code": "METHOD_NOT_FOUND"}}
    busy_free = (await served.post({"jsonrpc": "2.0", "id": 2, "method": "session.get",
                                    "params": {"sessionId": "s_x"}})).json()
    assert (busy_free["id"], busy_free["error"]["code"], busy_free["error"]["data"]["code"]) == (2, -32000, "NOT_FOUND")


@pytest.mark.parametrize("method, params", [
    ("session.list", {"projectPath": "/tmp/a\x00b"}),
    ("session.create", {"projectPath": "~\x00x"}),
])
async def test_a_nul_byte_in_a_path_is_invalid_params(served, method, params):
    c = await served.ws()
    rpc_error(await c.error(method, params), -32602, "INVALID_PARAMS")


# ---- LIMIT_EXCEEDED ----------------------------------------------------------------------------------


def _oversized_create() -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": 1, "method": "session.create",
                       "params": {"title": "x" * MAX_FRAME}}).encode()


async def test_an_oversized_post_is_413_limit_exceeded_and_runs_nothing(served):
    body = _oversized_create()
    assert len(body) > MAX_FRAME
    refused = await served.post(body, raw=True)
    assert refused.status_code == 413
    assert refused.json() == {"jsonrpc": "2.0", "id": None, "error": {
        "code": -32600, "message": refused.json()["error"]["message"], "data": {"code": "LIMIT_EXCEEDED"}}}

    async def chunks():  # no Content-Length: the streaming bound must catch it too
        for i in range(0, len(body), 1 << 20):
            yield body[i:i + (1 << 20)]

    streamed = await served.http.post(served.url + "/rpc", content=chunks(),
                                      headers={**served.auth(), "Content-Type": "application/json"})
    assert streamed.status_code == 413 and streamed.json()["error"]["data"]["code"] == "LIMIT_EXCEEDED"
    batch = await served.post([{"jsonrpc": "2.0", "id": i, "method": "session.create"} for i in range(1001)])
    assert batch.status_code == 200
    assert (batch.json()["error"]["code"], batch.json()["error"]["data"]["code"]) == (-32600, "LIMIT_EXCEEDED")
    assert (await served.call("session.list"))["sessions"] == []
    assert (await served.call("host.hello", {"protocolVersion": 1}))["protocolVersion"] == 1


async def test_an_oversized_websocket_frame_closes_1009_and_the_host_stays_up(served):
    c = await served.ws()
    closed = None
    try:
        await c.send_raw(_oversized_create().decode())
    except ConnectionClosed as exc:  # the host may close while the frame is still going out
        closed = exc
    async with asyncio.timeout(10):
        await c._reader
    closed = closed or c.closed
    assert closed is not None and closed.rcvd is not None and closed.rcvd.code == 1009, closed
    again = await served.ws()
    assert (await again.call("host.hello", {"protocolVersion": 1}))["protocolVersion"] == 1
    assert (await again.call("session.list"))["sessions"] == []


# ---- PERSISTENCE_FAILURE -----------------------------------------------------------------------------


class DiskFull:
    """The index cannot grow (as on a full disk): a commit that needs a new page fails.

    The failure is SQLite's own SQLITE_FULL, raised inside the host's transaction; it is
    brought about with ``PRAGMA max_page_count`` on the host's connection (reached through
    the captured Host). Writes that fit the pages already there still succeed, so the
    requests below carry a large text."""

    def __init__(self, served) -> None:
        self.served = served

    def __enter__(self) -> DiskFull:
        with self.served.host.store.db.read() as conn:
            pages = conn.execute("PRAGMA page_count").fetchone()[0]
            conn.execute(f"PRAGMA max_page_count={pages}")
        return self

    def __exit__(self, *exc: object) -> None:
        with self.served.host.store.db.read() as conn:
            conn.execute("PRAGMA max_page_count=1073741823")


class StoreLocked:
    """Another process holds index.db's write lock (SQLITE_BUSY). The host's busy_timeout is
    shortened from 5 s to 50 ms through the captured Host so the test does not wait."""

    def __init__(self, served) -> None:
        self.served = served

    def __enter__(self) -> StoreLocked:
        with self.served.host.store.db.read() as conn:
            conn.execute("PRAGMA busy_timeout=50")
        self.blocker = sqlite3.connect(self.served.data_dir / "index.db", isolation_level=None)
        self.blocker.execute("BEGIN IMMEDIATE")
        return self

    def __exit__(self, *exc: object) -> None:
        self.blocker.execute("ROLLBACK")
        self.blocker.close()
        with self.served.host.store.db.read() as conn:
            conn.execute("PRAGMA busy_timeout=5000")


BIG = "x" * 300_000  # needs new pages in the index


async def test_persistence_failure_reaches_the_client_and_changes_nothing(served):
    c = await served.ws()
    s = await c.call("session.create", {"projectPath": str(served.project)})
    await c.event("session.updated")
    before = await served.snapshot()
    events = len(c.events)
    with DiskFull(served):
        rpc_error(await c.error("agent.queue.push", {"sessionId": s["id"], "text": BIG}), -32000, "PERSISTENCE_FAILURE")
    with StoreLocked(served):  # (a title is at most 200 characters now: too small to need a new page)
        rpc_error(await c.error("session.create", {"projectPath": str(served.project)}), -32000,
                  "PERSISTENCE_FAILURE")
    assert await served.snapshot() == before
    assert c.events[events:] == []
    got = await c.call("session.get", {"sessionId": s["id"]})
    assert (got["session"]["status"], got["messages"], got["queue"]) == ("idle", [], [])
    assert (await c.call("session.turns", {"sessionId": s["id"]}))["turns"] == []
    assert await c.call("host.status") == {"sessions": 1, "running": 0, "pendingApprovals": 0, "queued": 0}
    # and the host works again once the store does
    served.provider.enqueue(s["id"], {"text": "fine"})
    turn = await c.call("agent.prompt", {"sessionId": s["id"], "text": BIG})
    assert (await c.turn_ended(turn["turnId"]))["reason"] == "completed"


async def test_a_locked_store_is_persistence_failure(served):
    c = await served.ws()
    s = await c.call("session.create", {"projectPath": str(served.project)})
    before = await served.snapshot()
    with StoreLocked(served):
        for method, params in [("session.setMode", {"sessionId": s["id"], "mode": "plan"}),
                               ("agent.prompt", {"sessionId": s["id"], "text": "now"}),
                               ("session.create", {"projectPath": str(served.project)})]:
            err = await c.error(method, params)
            assert await served.snapshot() == before
            rpc_error(err, -32000, "PERSISTENCE_FAILURE")


async def test_a_failed_session_create_stays_absent_after_a_restart(start_server, provider):
    served = await start_server(provider=provider)
    c = await served.ws()
    with StoreLocked(served):
        rpc_error(await c.error("session.create", {"projectPath": str(served.project)}), -32000, "PERSISTENCE_FAILURE")
    assert (await c.call("session.list"))["sessions"] == []
    await start_server.handles[0].stop()
    host = Host.open(HostConfig(data_dir=served.data_dir), ScriptedProvider())
    try:
        assert (await host.call("session.list"))["sessions"] == []
    finally:
        await host.close()
