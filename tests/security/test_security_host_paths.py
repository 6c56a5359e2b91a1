"""Paths the host must own (issue 15, authority holes 11-13), through the real Host.

- 11: a ``.pi`` or ``.pi/<kind>`` that is a symlink (shipped in a cloned repo, or
  swapped in after approval) is never followed: SubmitPlan/SubmitGoal fail with
  ``WORKSPACE_PATH_DENIED`` writing nothing, and an execution whose artifact now
  sits behind a link fails before any model call.
- 12: the host's data directory inside a project root (a project at ``$HOME``)
  is off limits to the path tools, decided by the gate before any Ask, in every
  permission mode and whatever the grants.
- 13: the data directory is 0700 and every file pidesk keeps in it 0600.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import stat
from pathlib import Path
from typing import Any

import pytest

from pidesk.core import events as ev
from pidesk.host import validate
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
DENIED = "WORKSPACE_PATH_DENIED"


def tree(path: Path) -> list[str]:
    return sorted(p.relative_to(path).as_posix() for p in path.rglob("*"))


async def first_of_turn(sub: Any, turn_id: str) -> Any:
    """The turn's end or its plan request, whichever comes first (a submission that went through waits)."""
    return await sub.wait_for(lambda e: isinstance(e, ev.PlanRequested) or
                              (isinstance(e, ev.TurnEnded) and e.turn_id == turn_id))


# ---- hole 11: a symlinked .pi ------------------------------------------------------------------------


@pytest.mark.parametrize(("kind", "link", "points"), [
    ("plan", ".pi", "outside"),
    ("plan", ".pi/plan", "outside"),
    ("goal", ".pi/goal", "outside"),
    ("plan", ".pi", "inside"),
])
async def test_a_symlinked_pi_makes_the_submission_fail_and_writes_nothing(
        host, provider, project, tmp_path, kind, link, points):
    """Authority hole 11: ``.pi -> /elsewhere`` (or ``.pi/<kind> -> …``, even a link to a directory inside
    the root) made SubmitPlan create the artifact through the link, and approval went ahead. Now the
    submission is ``WORKSPACE_PATH_DENIED``, telling the user to remove the link; nothing is written
    anywhere, no approval is pending, and the session stays in its contract mode."""
    target = tmp_path / "elsewhere" if points == "outside" else project / "docs"
    target.mkdir()
    if link == ".pi":
        os.symlink(target, project / ".pi")
    else:
        (project / ".pi").mkdir()
        os.symlink(target, project / link)
    s = await session(host, project, mode=kind)
    sub = host.subscribe()
    provider.enqueue(s["id"], submit_plan() if kind == "plan" else submit_goal(["NOTES.md exists"]), {"text": "ok"})
    turn = await prompt(host, s["id"])
    event = await first_of_turn(sub, turn["turnId"])
    assert isinstance(event, ev.TurnEnded), "the submission went through the link and waits for approval"
    [result] = tool_results((await state(host, s["id"]))["messages"], "SubmitPlan" if kind == "plan" else "SubmitGoal")
    assert result["errorCode"] == DENIED
    assert "symbolic link" in result["output"] and "remove the link" in result["output"]
    assert tree(target) == []
    assert (await host.call("plans.list", {"sessionId": s["id"]}))["approvals"] == []
    assert (await host.call("plans.pending", {}))["approvals"] == []
    assert (await state(host, s["id"]))["session"]["mode"] == kind


async def test_an_artifact_whose_pi_became_a_symlink_after_approval_does_not_execute(
        host, provider, project, tmp_path):
    """Authority hole 11, the execution re-read: after approval ``.pi`` is swapped for a link to a copy
    holding the very same bytes, so the sha256 still matches. The re-read no longer follows links:
    the artifact at ``artifactPath`` is gone as far as the host is concerned, and the execution fails
    with ``PLAN_ARTIFACT_HASH_MISMATCH`` (the code for an approved artifact that changed or vanished,
    which clients already handle) before any model call."""
    s = await session(host, project, mode="plan")
    sub = host.subscribe()
    provider.enqueue(s["id"], submit_plan(), tool("Write", path="should-not.txt", content="x"), {"text": "done"})
    turn = await prompt(host, s["id"])
    approval = (await plan_requested(sub)).approval
    copy = tmp_path / "copy"
    shutil.move(project / ".pi", copy)
    os.symlink(copy, project / ".pi")
    assert (project / approval.artifact_path).is_file()  # the same bytes, reached through the link
    await host.call("plans.resolve", {"approvalId": approval.id, "sessionId": s["id"], "turnId": turn["turnId"],
                                      "decision": "approve", "permissionMode": "auto"})
    execution = await sub.wait_for(lambda e: isinstance(e, ev.TurnStarted) and e.origin == "execution")
    calls = provider.calls(s["id"])
    end = await ended(sub, execution.turn_id)
    assert (end.reason, end.error_code) == ("error", "PLAN_ARTIFACT_HASH_MISMATCH")
    assert provider.calls(s["id"]) == calls
    assert not (project / "should-not.txt").exists()


# ---- hole 12: the data directory inside the root ----------------------------------------------------


async def session_holding_the_data_dir(host: Any, root: Path, **params: Any) -> dict[str, Any]:
    """A session whose root holds the data dir: ``session.create`` refuses one now (PROTOCOL.md turn-3 limits),
    but one made before that rule can still exist, and the path tools' own guard must hold for it."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(host.parts, "project", lambda value, name="projectPath": validate.project_dir(value, name))
        return await session(host, root, **params)


def data_dir_calls(sid: str, data: Path, root: Path) -> list[dict[str, Any]]:
    transcript = f"data/transcripts/{sid}.jsonl"
    return [
        tool("Write", path=transcript, content="garbage\n"),
        tool("Edit", path=transcript, oldText='"t":"session"', newText='"t":"broken"'),
        tool("Write", path=str(data / "transcripts" / f"{sid}.jsonl"), content="garbage\n"),
        tool("Write", path="data/blobs/planted", content="x"),
        tool("Write", path="data/index.db", content="x"),
        tool("Write", path="transcripts_link/planted.jsonl", content="x"),  # a link in the root into the data dir
        tool("Read", path="data/host.json"),
        tool("Read", path=f"{data}/transcripts/{sid}.jsonl"),
        tool("Grep", pattern="TOKEN", path="data"),
        tool("Glob", pattern="**", path="data"),
    ]


@pytest.mark.parametrize("permission_mode", ["auto", "ask"])
async def test_tools_cannot_touch_the_hosts_data_dir_inside_the_root(
        host, provider, data_dir, tmp_path, permission_mode):
    """Authority hole 12: with the project at ``$HOME`` and the data dir under it, Write of the session's own
    transcript succeeded and ``session.get`` failed with INTERNAL until a restart. Now every path tool
    call into the data dir — as written, absolute, or through a link — is ``WORKSPACE_PATH_DENIED``,
    decided by the gate before any Ask; the transcript is untouched and ``session.get`` keeps working."""
    root = tmp_path  # holds ``data`` (the host's data dir) and ``project``
    (data_dir / "host.json").write_text(json.dumps({"token": "HOST-TOKEN-93ab"}))
    os.symlink(data_dir / "transcripts", root / "transcripts_link")
    s = await session_holding_the_data_dir(host, root, permissionMode=permission_mode)
    sid = s["id"]
    transcript = host.store.transcripts.path(sid)
    before = transcript.read_bytes()
    calls = data_dir_calls(sid, data_dir, root)
    sub = host.subscribe()
    provider.enqueue(sid, *calls, {"text": "done"})
    await ended(sub, (await prompt(host, sid))["turnId"])
    assert not [e for _, e in sub.pending() if isinstance(e, ev.PermissionRequested)]
    got = await state(host, sid)  # session.get works: the transcript is the host's alone
    results = tool_results(got["messages"])
    assert [r["errorCode"] for r in results] == [DENIED] * len(calls), results
    assert transcript.read_bytes().startswith(before)
    assert not (data_dir / "blobs" / "planted").exists() and not (data_dir / "transcripts" / "planted.jsonl").exists()
    assert "HOST-TOKEN-93ab" not in json.dumps(got["messages"])
    audit = (await host.call("audit.list", {"limit": 1000}))["entries"]
    assert sum(e["action"] == "tool.denied" and e["detail"]["code"] == DENIED for e in audit) == len(calls)


async def test_a_grant_does_not_open_the_data_dir(host, provider, data_dir, tmp_path):
    """Authority hole 12 with a grant: "always allow Write" for the session still leaves the data dir denied,
    without asking again."""
    s = await session_holding_the_data_dir(host, tmp_path)  # permission mode ask
    sub = host.subscribe()
    provider.enqueue(s["id"], tool("Write", path="ok.txt", content="fine\n"),
                     tool("Write", path=f"data/transcripts/{s['id']}.jsonl", content="garbage\n"), {"text": "done"})
    turn = await prompt(host, s["id"])
    request = (await permission_requested(sub)).request
    await host.call("permissions.resolve", {"requestId": request.id, "sessionId": s["id"], "turnId": turn["turnId"],
                                            "decision": "allow", "remember": "session"})
    await ended(sub, turn["turnId"])
    assert len([e for _, e in sub.pending() if isinstance(e, ev.PermissionRequested)]) == 0
    ok, denied = tool_results((await state(host, s["id"]))["messages"], "Write")
    assert ok["ok"] is True and denied["errorCode"] == DENIED


async def test_a_temporary_session_still_works_in_its_scratch_root_inside_the_data_dir(host, provider):
    """The data-dir rule leaves a temporary session its own scratch root (which lies in the data dir),
    and nothing else of it."""
    s = await session(host, permissionMode="auto")
    sub = host.subscribe()
    provider.enqueue(s["id"], tool("Write", path="a.txt", content="mine\n"), tool("Read", path="a.txt"),
                     tool("Read", path="../../index.db"), {"text": "done"})
    await ended(sub, (await prompt(host, s["id"]))["turnId"])
    write, read, escape = tool_results((await state(host, s["id"]))["messages"])
    assert write["ok"] is True and read["ok"] is True and "mine" in read["output"]
    assert escape["errorCode"] == "PATH_OUTSIDE_WORKSPACE"


# ---- hole 13: modes ----------------------------------------------------------------------------------


def loose_modes(data_dir: Path) -> list[str]:
    """Every entry of the data dir that is not private: directories 0700, files 0600 — or tighter for
    a file (git keeps its objects read-only, 0400) — and nothing executable."""
    found = []
    for path in [data_dir, *data_dir.rglob("*")]:
        mode = stat.S_IMODE(path.lstat().st_mode)
        private = mode == 0o700 if path.is_dir() else mode in (0o600, 0o400)
        if not private:
            found.append(f"{path.relative_to(data_dir.parent)}: {oct(mode)}")
    return found


async def test_the_data_dir_is_private_after_a_session_with_messages_a_blob_a_plan_and_a_quarantine(
        make_host, provider, project, data_dir):
    """Authority hole 13: the data dir was 0755 and index.db, transcripts and blobs 0644 — readable by
    every user of the machine. After a session with messages, an attachment, a plan, a temporary
    session's scratch root and a quarantined transcript tail, the dir and every directory in it are
    0700 and every file 0600 (index.db's -wal and -shm included)."""
    host = make_host()
    s = await session(host, project, mode="plan")
    await session(host)  # a temporary session: its scratch root
    sub = host.subscribe()
    uploaded = await host.call("attachments.put", {"name": "a.txt", "mime": "text/plain",
                                                   "data": base64.b64encode(b"pasted secret").decode()})
    provider.enqueue(s["id"], submit_plan())
    turn = await host.call("agent.prompt", {"sessionId": s["id"], "text": "plan it", "attachments": [uploaded]})
    approval = (await plan_requested(sub)).approval
    await host.call("plans.resolve", {"approvalId": approval.id, "sessionId": s["id"], "turnId": turn["turnId"],
                                      "decision": "reject"})
    await ended(sub, turn["turnId"])
    await host.close()
    with host.store.transcripts.path(s["id"]).open("ab") as f:
        f.write(b'{"t":"message","id":"torn')  # boot moves it to a quarantine file
    host = make_host()
    assert host.recovery.boot.quarantined
    assert {p.name for p in data_dir.iterdir()} >= {"index.db", "index.db-wal", "index.db-shm", "transcripts",
                                                    "blobs", "scratch"}
    assert loose_modes(data_dir) == []


async def test_an_existing_data_dir_left_readable_is_tightened_at_open(make_host, data_dir):
    """Authority hole 13, an upgrade: a data dir an older pidesk made 0755 (and its index 0644) is made
    private when the host opens it."""
    for path in (data_dir, data_dir / "transcripts", data_dir / "blobs", data_dir / "scratch"):
        path.mkdir(mode=0o755)
        os.chmod(path, 0o755)
    (data_dir / "index.db").touch(mode=0o644)
    os.chmod(data_dir / "index.db", 0o644)
    make_host()
    assert loose_modes(data_dir) == []


async def test_a_search_of_the_whole_root_passes_the_data_dir_by(host, provider, data_dir, tmp_path):
    """Authority hole 12, the searches' side: a Grep or Glob of a root holding the data dir (a project at
    $HOME) walked into it and showed host.json's token and the transcripts. They now pass it by, and
    still find the project's own files — even a directory named like the data dir deeper down."""
    (data_dir / "host.json").write_text(json.dumps({"token": "HOST-TOKEN-93ab"}))
    (tmp_path / "notes.txt").write_text("HOST-TOKEN-93ab is a string in my notes\n")
    (tmp_path / "sub" / "data").mkdir(parents=True)
    (tmp_path / "sub" / "data" / "kept.txt").write_text("HOST-TOKEN-93ab kept\n")
    s = await session_holding_the_data_dir(host, tmp_path, permissionMode="auto")
    sub = host.subscribe()
    provider.enqueue(s["id"], tool("Grep", pattern="HOST-TOKEN"), tool("Glob", pattern="**/*.json*"),
                     tool("Glob", pattern="**/*.txt"), {"text": "done"})
    await ended(sub, (await prompt(host, s["id"]))["turnId"])
    grep, glob_json, glob_txt = tool_results((await state(host, s["id"]))["messages"])
    assert grep["ok"] and sorted(grep["output"].splitlines()) == [
        "notes.txt:1:HOST-TOKEN-93ab is a string in my notes", "sub/data/kept.txt:1:HOST-TOKEN-93ab kept"]
    assert glob_json["ok"] and "data/" not in glob_json["output"], glob_json["output"]
    assert glob_txt["output"].splitlines() == ["notes.txt", "sub/data/kept.txt"]
