"""Every Host method validates its arguments: bad input raises the PROTOCOL.md code and changes nothing."""

from __future__ import annotations

import hashlib

import pytest

from pidesk.core.errors import PideskError
from pidesk.host import METHODS
from tests.scenario import session


UNKNOWN = "x_unknown"

# method -> (params, expected code); "{sid}" is replaced by a real idle session id.
CASES: list[tuple[str, dict, str]] = [
    ("host.hello", {"protocolVersion": 99}, "PROTOCOL_MISMATCH"),
    ("host.hello", {}, "INVALID_PARAMS"),
    ("host.status", {"verbose": True}, "INVALID_PARAMS"),
    ("host.doctor", {"repair": True}, "INVALID_PARAMS"),
    ("notifications.list", {"unseenOnly": "yes"}, "INVALID_PARAMS"),
    ("session.create", {"projectPath": "relative/path"}, "INVALID_PARAMS"),
    ("session.create", {"projectPath": "/definitely/not/here"}, "INVALID_PARAMS"),
    ("session.create", {"mode": "chat"}, "INVALID_PARAMS"),
    ("session.create", {"mode": "plan"}, "PLAN_WORKSPACE_REQUIRED"),
    ("session.create", {"permissionMode": "yolo"}, "INVALID_PARAMS"),
    ("session.create", {"title": 7}, "INVALID_PARAMS"),
    ("session.create", {"bogus": 1}, "INVALID_PARAMS"),
    ("session.list", {"projectPath": 3}, "INVALID_PARAMS"),
    ("session.get", {"sessionId": UNKNOWN}, "NOT_FOUND"),
    ("session.get", {"sessionId": "{sid}", "limit": 0}, "INVALID_PARAMS"),
    ("session.get", {"sessionId": "{sid}", "beforeSeq": "3"}, "INVALID_PARAMS"),
    ("session.get", {}, "INVALID_PARAMS"),
    ("session.turns", {"sessionId": UNKNOWN}, "NOT_FOUND"),
    ("session.turns", {"sessionId": "{sid}", "limit": -1}, "INVALID_PARAMS"),
    ("session.delete", {"sessionId": UNKNOWN}, "NOT_FOUND"),
    ("session.rename", {"sessionId": "{sid}", "title": "  "}, "INVALID_PARAMS"),
    ("session.rename", {"sessionId": UNKNOWN, "title": "t"}, "NOT_FOUND"),
    ("projects.check", {"path": 3}, "INVALID_PARAMS"),
    ("session.changes", {"sessionId": UNKNOWN}, "NOT_FOUND"),
    ("session.changes", {"sessionId": "{sid}", "turnId": 5}, "INVALID_PARAMS"),
    ("session.changes", {"sessionId": "{sid}", "turnId": UNKNOWN}, "NOT_FOUND"),
    ("session.revert", {"sessionId": "{sid}"}, "INVALID_PARAMS"),
    ("session.revert", {"sessionId": "{sid}", "turnId": UNKNOWN}, "NOT_FOUND"),
    ("session.revert", {"sessionId": UNKNOWN, "turnId": UNKNOWN}, "NOT_FOUND"),
    ("session.compact", {}, "INVALID_PARAMS"),
    ("session.compact", {"sessionId": UNKNOWN}, "NOT_FOUND"),
    ("session.compact", {"sessionId": "{sid}", "instructions": 5}, "INVALID_PARAMS"),
    ("session.setPlugins", {}, "INVALID_PARAMS"),
    ("session.setPlugins", {"sessionId": UNKNOWN, "servers": []}, "NOT_FOUND"),
    ("session.setPlugins", {"sessionId": "{sid}", "servers": {"name": "x"}}, "INVALID_PARAMS"),
    ("session.setPlugins", {"sessionId": "{sid}", "servers": [{"name": "x", "command": []}]}, "INVALID_PARAMS"),
    ("session.setPlugins", {"sessionId": "{sid}", "servers": [{"name": "x", "url": "ftp://nope"}]}, "INVALID_PARAMS"),
    ("session.setMode", {"sessionId": "{sid}", "mode": "chat"}, "INVALID_PARAMS"),
    ("session.setMode", {"sessionId": UNKNOWN, "mode": "plan"}, "NOT_FOUND"),
    ("session.setPermissionMode", {"sessionId": "{sid}", "permissionMode": "never"}, "INVALID_PARAMS"),
    ("session.fork", {"sessionId": UNKNOWN}, "NOT_FOUND"),
    ("session.fork", {"sessionId": "{sid}", "throughMessageId": UNKNOWN}, "NOT_FOUND"),
    ("session.focus", {"sessionId": UNKNOWN}, "NOT_FOUND"),
    ("session.context", {"sessionId": UNKNOWN}, "NOT_FOUND"),
    ("session.context", {"sessionId": 7}, "INVALID_PARAMS"),
    ("agent.prompt", {"sessionId": "{sid}", "text": ""}, "INVALID_PARAMS"),
    ("agent.prompt", {"sessionId": "{sid}", "text": ["not", "text"]}, "INVALID_PARAMS"),
    ("agent.prompt", {"sessionId": "{sid}", "text": "hi", "attachments": [{"kind": "file"}]}, "INVALID_PARAMS"),
    ("agent.prompt", {"sessionId": UNKNOWN, "text": "hi"}, "NOT_FOUND"),
    ("agent.steer", {"sessionId": "{sid}", "turnId": UNKNOWN, "text": "x"}, "NOT_FOUND"),
    ("agent.stop", {"sessionId": UNKNOWN}, "NOT_FOUND"),
    ("agent.abort", {"sessionId": UNKNOWN}, "NOT_FOUND"),
    ("agent.queue.push", {"sessionId": "{sid}", "text": None}, "INVALID_PARAMS"),
    ("agent.queue.push", {"sessionId": UNKNOWN, "text": "x"}, "NOT_FOUND"),
    ("agent.queue.list", {"sessionId": UNKNOWN}, "NOT_FOUND"),
    ("agent.queue.remove", {"sessionId": "{sid}", "entryId": UNKNOWN}, "NOT_FOUND"),
    ("agent.queue.prioritize", {"sessionId": "{sid}", "entryId": UNKNOWN}, "NOT_FOUND"),
    ("agent.queue.sendNow", {"sessionId": "{sid}", "entryId": UNKNOWN}, "NOT_FOUND"),
    ("permissions.pending", {"sessionId": UNKNOWN}, "NOT_FOUND"),
    ("permissions.resolve", {"requestId": UNKNOWN, "sessionId": "{sid}", "turnId": UNKNOWN, "decision": "allow"}, "NOT_FOUND"),
    ("permissions.resolve", {"requestId": UNKNOWN, "sessionId": "{sid}", "turnId": UNKNOWN, "decision": "maybe"}, "INVALID_PARAMS"),
    ("plans.pending", {"sessionId": UNKNOWN}, "NOT_FOUND"),
    ("plans.list", {"sessionId": UNKNOWN}, "NOT_FOUND"),
    ("plans.get", {"approvalId": UNKNOWN}, "PLAN_NOT_FOUND"),
    ("plans.resolve", {"approvalId": UNKNOWN, "sessionId": "{sid}", "turnId": UNKNOWN, "decision": "approve"}, "PLAN_NOT_FOUND"),
    ("plans.resolve", {"approvalId": UNKNOWN, "sessionId": "{sid}", "turnId": UNKNOWN, "decision": "revise"}, "INVALID_PARAMS"),
    ("notifications.markSeen", {"ids": "n_1"}, "INVALID_PARAMS"),
    ("notifications.markSeen", {"sessionId": UNKNOWN}, "NOT_FOUND"),
    ("audit.list", {"sessionId": UNKNOWN}, "NOT_FOUND"),
    ("audit.list", {"limit": "ten"}, "INVALID_PARAMS"),
    ("attachments.put", {"name": "a", "mime": "text/plain", "data": "not base64!"}, "INVALID_PARAMS"),
    ("attachments.put", {"name": "a", "mime": "text/plain", "data": "YQ==", "kind": "video"}, "INVALID_PARAMS"),
    ("agent.prompt", {"sessionId": "{sid}", "text": "hi", "attachments": [
        {"kind": "file", "name": "a", "mime": "text/plain", "size": 1, "ref": "sha256:" + "0" * 64}]}, "INVALID_PARAMS"),
    ("schedules.create", {"name": "n", "cron": "61 * * * *", "projectPath": "/tmp", "prompt": "p"}, "INVALID_PARAMS"),
    ("schedules.create", {"name": "n", "cron": "* * * * *", "projectPath": "rel", "prompt": "p"}, "INVALID_PARAMS"),
    ("schedules.create", {"name": "n", "cron": "* * * * *", "projectPath": "/tmp", "prompt": "p", "mode": "x"},
     "INVALID_PARAMS"),
    # issue 29 item 10: one limit wherever a name is set (rename allowed 200, create 100,000)
    ("session.create", {"title": "t" * 201}, "INVALID_PARAMS"),
    ("schedules.create", {"name": "n" * 201, "cron": "* * * * *", "projectPath": "/usr", "prompt": "p"},
     "INVALID_PARAMS"),
    ("schedules.list", {"x": 1}, "INVALID_PARAMS"),
    ("schedules.delete", {"scheduleId": UNKNOWN}, "NOT_FOUND"),
    ("schedules.runNow", {"scheduleId": UNKNOWN}, "NOT_FOUND"),
    ("markdown.render", {"text": 42}, "INVALID_PARAMS"),
    ("plugins.list", {"all": True}, "INVALID_PARAMS"),
    ("no.such.method", {}, "METHOD_NOT_FOUND"),
]


def _fingerprint(host) -> str:
    """Every index row and every transcript byte: bad input must leave all of it unchanged."""
    digest = hashlib.sha256()
    with host.store.db.read() as db:
        for table in ("sessions", "turns", "messages", "plan_approvals", "permission_requests", "grants",
                      "queue", "notifications", "audit", "schedules", "schedule_runs"):
            for row in db.execute(f"SELECT * FROM {table} ORDER BY rowid"):
                digest.update(repr(row).encode())
    for path in sorted((host.store.data_dir / "transcripts").iterdir()):
        digest.update(path.name.encode() + path.read_bytes())
    return digest.hexdigest()


def test_the_cases_cover_every_method():
    assert {method for method, _, _ in CASES} >= set(METHODS)


@pytest.mark.asyncio
@pytest.mark.parametrize(("method", "params", "code"), CASES, ids=[f"{m}-{c}-{i}" for i, (m, _, c) in enumerate(CASES)])
async def test_bad_input_raises_its_protocol_code_and_changes_nothing(host, project, method, params, code):
    s = await session(host, project)
    params = {k: (s["id"] if v == "{sid}" else v) for k, v in params.items()}
    before = _fingerprint(host)
    with pytest.raises(PideskError) as error:
        await host.call(method, params)
    assert error.value.code == code
    assert _fingerprint(host) == before


@pytest.mark.asyncio
@pytest.mark.parametrize("params", [["positional"], "text", 3])
async def test_params_must_be_an_object(host, params):
    with pytest.raises(PideskError) as error:
        await host.call("host.status", params)
    assert error.value.code == "INVALID_PARAMS"


@pytest.mark.asyncio
async def test_a_lone_surrogate_from_the_model_is_kept_as_a_replacement_character(host, provider, project):
    """Issue 29 item 10: "\\udcff" in a model's text or a tool call's arguments (a JSON escape decodes to it)
    could not be written as UTF-8: the turn ended INTERNAL and the answer was lost. It is kept, the
    surrogate shown as U+FFFD, and the turn goes on."""
    from tests.scenario import ended, prompt, state

    s = await session(host, project, permissionMode="auto")
    sub = host.subscribe()
    provider.enqueue(s["id"], {"text": "odd \udcff text", "toolCalls": [{"name": "Read", "args": {"path": "x\udcff.md"}}]},
                     {"text": "carried on"})
    end = await ended(sub, (await prompt(host, s["id"]))["turnId"])
    assert (end.reason, end.error_code) == ("completed", None)
    answer = [m for m in (await state(host, s["id"]))["messages"] if m["role"] == "assistant"]
    assert answer[0]["content"][0]["text"] == "odd \ufffd text"
    assert answer[0]["content"][1]["args"] == {"path": "x\ufffd.md"} and answer[-1]["content"][0]["text"] == "carried on"


@pytest.mark.asyncio
async def test_a_huge_bad_path_is_not_echoed_back(host):
    """Issue 29 item 10: an INVALID_PARAMS for a 100,000-character path echoed it, twice."""
    with pytest.raises(PideskError) as refused:
        await host.call("session.create", {"projectPath": "/" + "a" * 100_000})
    assert refused.value.code == "INVALID_PARAMS" and len(refused.value.message) < 300


@pytest.mark.asyncio
async def test_an_answer_that_goes_on_and_on_is_cut_kept_and_ends_the_turn(host, provider, project, monkeypatch):
    """Issue 29 item 7: a 120 MiB answer was kept and sent whole (0.4-1.4 s on the loop, 1.2 GB). Past
    MAX_ANSWER_CHARS (made small here) the answer is cut there, kept, and the turn ends PROVIDER_ERROR."""
    from pidesk.runtime import loop as runtime_loop
    from tests.scenario import ended, prompt, state

    monkeypatch.setattr(runtime_loop, "MAX_ANSWER_CHARS", 1000)
    s = await session(host, project)
    sub = host.subscribe()
    provider.enqueue(s["id"], {"text": "y" * 5000})
    end = await ended(sub, (await prompt(host, s["id"]))["turnId"])
    assert (end.reason, end.error_code) == ("error", "PROVIDER_ERROR") and "1,000 characters" in end.error_message
    answer = [m for m in (await state(host, s["id"]))["messages"] if m["role"] == "assistant"]
    assert answer[0]["content"][0]["text"] == "y" * 1000
