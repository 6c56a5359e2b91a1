"""Issue 18 items 6–9, "CLI truths": the command line as a person drives it — real `pidesk` subprocesses,
a real `pidesk serve` holding the data dir where the item is about a running host, a scripted model."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from websockets.sync.client import ClientConnection, connect

EXAMPLE = Path(__file__).parents[2] / "examples" / "notes.json"
PLAN = {"responses": [
    {"toolCalls": [{"name": "SubmitPlan", "args": {
        "title": "Add notes", "markdown": "# Plan\n\n1. Write NOTES.md\n", "question": "Shall I write it?"}}]},
    {"toolCalls": [{"name": "Write", "args": {"path": "NOTES.md", "content": "notes\n"}}]},
    {"text": "NOTES.md written."},
]}
EVENT_WAIT = 20.0


def pidesk(*args: str, data_dir: Path, columns: int = 80) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pidesk", *args, "--data-dir", str(data_dir)],
                          capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": str(columns)})


def ok(*args: str, data_dir: Path, columns: int = 80) -> str:
    done = pidesk(*args, data_dir=data_dir, columns=columns)
    assert done.returncode == 0, done.stderr
    return done.stdout


@contextmanager
def serving(data_dir: Path, *args: str) -> Iterator[str]:
    """`pidesk serve` on ``data_dir`` until the block ends (SIGTERM, exit 0); yields its URL."""
    server = subprocess.Popen([sys.executable, "-m", "pidesk", "serve", "--no-open", "--data-dir", str(data_dir),
                               *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        line = server.stdout.readline()  # the announcement, once host.json is written
        assert line.startswith("pidesk serving at http://127.0.0.1:"), line
        yield line.split()[-1].split("/?")[0]
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=30) == 0


@contextmanager
def watching(data_dir: Path) -> Iterator[ClientConnection]:
    """The running host's event stream over its WebSocket (url and token from host.json)."""
    info = json.loads((data_dir / "host.json").read_text())
    with connect(info["url"].replace("http://", "ws://") + f"/rpc?token={info['token']}") as ws:
        yield ws


def wait_for(ws: ClientConnection, kind: str, **match: Any) -> dict[str, Any]:
    for _ in range(10_000):
        message = json.loads(ws.recv(timeout=EVENT_WAIT))
        event = message.get("params") or {}
        if message.get("method") == "event" and event.get("type") == kind and \
                all(event.get(k) == v for k, v in match.items()):
            return event
    raise AssertionError(f"no {kind} event")


def test_run_refuses_a_model_the_running_host_would_ignore(project, data_dir):
    """Issue 18 item 6: `pidesk run --model X` while a host served the data dir silently ran the host's model.
    Now a model other than the host's is refused before anything is created — exit 2, naming the host's
    model and the ways out — and the host's own model named with --model goes through."""
    theirs = f"scripted/{EXAMPLE}"
    with serving(data_dir, "--model", theirs):
        refused = pidesk("run", str(project), "write notes", "--model", "demo", "--permission", "auto",
                         data_dir=data_dir)
        assert refused.returncode == 2 and "MODEL_NOT_CONFIGURED" in refused.stderr
        for words in (theirs, "Drop --model", "stop that host", "--data-dir"):
            assert words in refused.stderr
        chat = pidesk("chat", str(project), "--model", "demo", data_dir=data_dir)
        assert chat.returncode == 2 and "MODEL_NOT_CONFIGURED" in chat.stderr and theirs in chat.stderr
        assert json.loads(ok("sessions", "list", "--json", data_dir=data_dir)) == []
        assert not (project / "NOTES.md").exists()

        ok("run", str(project), "write notes", "--model", theirs, "--permission", "auto", data_dir=data_dir)
        assert (project / "NOTES.md").read_text().startswith("# Notes\n\nWritten by the pidesk example script.")


def test_an_empty_prompt_is_refused_before_anything_is_created(project, data_dir):
    """Issue 18 item 7: `pidesk run PROJECT ""` answered INVALID_PARAMS but left an empty session behind. Now an
    empty or blank prompt is refused first: no data dir is made for an embedded host, no session on a running one."""
    for prompt in ("", "  \n\t"):
        done = pidesk("run", str(project), prompt, "--permission", "auto", data_dir=data_dir)
        assert done.returncode == 2 and "INVALID_PARAMS" in done.stderr
        assert not data_dir.exists()
        assert "the prompt is empty" in done.stderr
    with serving(data_dir):
        for prompt in ("", "  \n\t"):
            done = pidesk("run", str(project), prompt, "--permission", "auto", data_dir=data_dir)
            assert done.returncode == 2 and "INVALID_PARAMS" in done.stderr
        assert json.loads(ok("sessions", "list", "--json", data_dir=data_dir)) == []


def test_status_and_doctor_answer_through_a_running_host(project, data_dir):
    """Issue 18 item 8: `pidesk status` and `pidesk doctor` refused while a host ran. Now status asks the host,
    doctor runs its read-only checks through it (a transcript gone from under the host is found; exit 1) and
    says repairs need the host stopped; offline status reads as text, never a Python dict."""
    with serving(data_dir) as url:
        created = json.loads(ok("sessions", "new", str(project), "--json", data_dir=data_dir))
        status = ok("status", data_dir=data_dir)
        assert f"host: serving at {url}" in status and "sessions: 1" in status
        assert json.loads(ok("status", "--json", data_dir=data_dir))["sessions"] == 1

        doctor = ok("doctor", data_dir=data_dir)
        assert "integrity: ok" in doctor and "nothing repaired" in doctor and "need the host stopped" in doctor
        report = json.loads(ok("doctor", "--json", data_dir=data_dir))
        assert (report["integrity"], report["repaired"], report["missingTranscripts"]) == ("ok", False, [])

        (data_dir / "transcripts" / f"{created['id']}.jsonl").unlink()
        broken = pidesk("doctor", data_dir=data_dir)
        assert broken.returncode == 1 and f"session without a transcript: {created['id']}" in broken.stdout
    offline = ok("status", data_dir=data_dir)
    assert "host: not running" in offline and "interrupted at open: nothing" in offline
    assert "{" not in offline and "'" not in offline


def test_listings_print_ids_whole_and_plans_approve_says_what_it_did(project, data_dir, tmp_path):
    """Issue 18 item 9: at 80 columns tables cut ids (`pa_a9dfd…`) that `plans approve` needs whole, `plans show
    --json` printed null, `plans approve` printed the raw record (`criteria: None`) and `notifications list`
    did not say what finished. Now ids are whole at any width, every listing has --json, approve prints a
    summary, and a notification shows its outcome, session and task."""
    script = tmp_path / "plan.json"
    script.write_text(json.dumps(PLAN))
    with serving(data_dir, "--model", f"scripted/{script}"):
        session = json.loads(ok("sessions", "new", str(project), "--mode", "plan", "--json", data_dir=data_dir))
        with watching(data_dir) as ws:
            ok("queue", "push", session["id"], "plan the notes", data_dir=data_dir)
            approval_id = wait_for(ws, "plan.requested")["approval"]["id"]
            for columns in (80, 200):
                listed = ok("plans", "list", data_dir=data_dir, columns=columns)
                assert approval_id in listed and session["id"] in listed and "…" not in listed
                assert session["id"] in ok("sessions", "list", data_dir=data_dir, columns=columns)
            shown = json.loads(ok("plans", "show", approval_id, "--json", data_dir=data_dir))
            assert (shown["id"], shown["title"]) == (approval_id, "Add notes")

            approved = ok("plans", "approve", approval_id, "--permission", "auto", data_dir=data_dir)
            assert approved.startswith(f"approved plan {approval_id} “Add notes”\nexecution x_")
            assert "None" not in approved and "criteria" not in approved and "permission auto" in approved
            wait_for(ws, "execution.changed", approvalId=approval_id, executionState="completed")
        notes = ok("notifications", "list", data_dir=data_dir)
        planned, executed = json.loads(ok("notifications", "list", "--json", data_dir=data_dir))
        assert (planned["task"], planned["outcome"]) == ("plan the notes", "completed")
        assert executed["task"].startswith("Approved plan: .pi/plan/") and executed["outcome"] == "completed"
        assert planned["id"] in notes and executed["id"] in notes
        assert notes.count(f"outcome: completed  sessionId: {session['id']}  sessionTitle: plan the notes") == 2
        assert "task: plan the notes" in notes and "task: Approved plan: .pi/plan/" in notes
