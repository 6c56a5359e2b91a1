"""The thin commands and doctor, run as the real executable against a real data dir."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).parents[2] / "examples" / "notes.json"


def pidesk(*args: str, data_dir: Path, check: bool = True, columns: int | None = None
           ) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": str(columns)} if columns else None
    done = subprocess.run([sys.executable, "-m", "pidesk", *args, "--data-dir", str(data_dir)],
                          capture_output=True, text=True, timeout=60, env=env)
    if check:
        assert done.returncode == 0, done.stderr
    return done


def test_sessions_new_list_mode_and_delete(project, data_dir):
    created = json.loads(pidesk("sessions", "new", str(project), "--mode", "plan", "--json", data_dir=data_dir).stdout)
    assert (created["mode"], created["planState"], created["projectPath"]) == ("plan", "planning", str(project))
    listed = json.loads(pidesk("sessions", "list", "--json", data_dir=data_dir).stdout)
    assert [s["id"] for s in listed] == [created["id"]]
    table = pidesk("sessions", "list", data_dir=data_dir).stdout
    assert created["id"][:8] in table and "planning" in table
    pidesk("sessions", "mode", created["id"], "agent", data_dir=data_dir)
    audit = json.loads(pidesk("audit", "list", "--json", data_dir=data_dir).stdout)
    assert [(e["action"], e["detail"]["to"]) for e in audit] == [("mode.changed", "agent")]
    pidesk("sessions", "delete", created["id"], data_dir=data_dir)
    assert json.loads(pidesk("sessions", "list", "--json", data_dir=data_dir).stdout) == []


def test_errors_are_codes_not_tracebacks(data_dir):
    done = pidesk("plans", "approve", "pa_missing", "--permission", "ask", data_dir=data_dir, check=False)
    assert done.returncode == 2 and "PLAN_NOT_FOUND" in done.stderr and "Traceback" not in done.stderr


def test_doctor_rebuilds_the_index_and_reports_quarantined_tails(project, data_dir):
    pidesk("run", str(project), "notes", "--model", f"scripted/{EXAMPLE}", "--permission", "auto", data_dir=data_dir)
    session_id = json.loads(pidesk("sessions", "list", "--json", data_dir=data_dir).stdout)[0]["id"]
    before = json.loads(pidesk("sessions", "show", session_id, "--json", data_dir=data_dir).stdout)
    with sqlite3.connect(data_dir / "index.db") as db:
        db.execute("DELETE FROM messages")
    transcript = data_dir / "transcripts" / f"{session_id}.jsonl"
    with open(transcript, "ab") as f:
        f.write(b'{"t":"message","id":"m_torn"')
    done = pidesk("doctor", data_dir=data_dir)
    assert "integrity: ok" in done.stdout and "quarantined tail" in done.stdout
    assert json.loads(pidesk("sessions", "show", session_id, "--json", data_dir=data_dir).stdout) == before
    assert not transcript.read_bytes().endswith(b'"m_torn"')


def test_commands_reach_a_running_host_through_host_json(project, data_dir):
    server = subprocess.Popen([sys.executable, "-m", "pidesk", "serve", "--no-open", "--data-dir", str(data_dir)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = server.stdout.readline()
        assert line.startswith("pidesk serving at http://127.0.0.1:")
        created = json.loads(pidesk("sessions", "new", str(project), "--json", data_dir=data_dir).stdout)
        listed = json.loads(pidesk("sessions", "list", "--json", data_dir=data_dir).stdout)
        assert [s["id"] for s in listed] == [created["id"]]
        checked = pidesk("doctor", data_dir=data_dir)  # issue 18 item 8: checks through the host, repairs nothing
        assert "integrity: ok" in checked.stdout and "nothing repaired" in checked.stdout
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=30) == 0
    assert not (data_dir / "host.json").exists()


def test_run_goes_through_a_running_host_and_stays_unattended(project, data_dir):
    server = subprocess.Popen([sys.executable, "-m", "pidesk", "serve", "--no-open", "--data-dir", str(data_dir),
                               "--model", f"scripted/{EXAMPLE}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    try:
        assert server.stdout.readline().startswith("pidesk serving at")
        asked = pidesk("run", str(project), "notes", "--json", data_dir=data_dir, check=False)
        assert asked.returncode == 1 and "PERMISSION_REQUIRED" in asked.stderr
        done = pidesk("run", str(project), "notes", "--permission", "auto", data_dir=data_dir)
        assert "Done: NOTES.md is in place." in done.stdout
        assert (project / "NOTES.md").exists()
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=30) == 0


def test_schedules_create_list_run_and_delete(project, data_dir):
    created = json.loads(pidesk("schedules", "create", "nightly", "0 3 * * *", str(project), "plan it",
                                "--mode", "plan", "--json", data_dir=data_dir).stdout)
    assert created["mode"] == "plan"
    listed = pidesk("schedules", "list", data_dir=data_dir).stdout
    assert "nightly" in listed and "never" in listed  # (issue 31 §5: the last run and how it ended)
    run = json.loads(pidesk("schedules", "run", created["id"], "--json", data_dir=data_dir).stdout)
    assert run["errorCode"] == "PLAN_REQUIRES_INTERACTIVE_SESSION"
    [schedule] = json.loads(pidesk("schedules", "list", "--json", data_dir=data_dir).stdout)
    at = schedule["lastRun"]["at"][:16].replace("T", " ")
    listed = pidesk("schedules", "list", data_dir=data_dir, columns=200).stdout
    assert f"failed PLAN_REQUIRES_INTERACTIVE_SESSION {at}" in listed
    pidesk("schedules", "delete", created["id"], data_dir=data_dir)
    assert json.loads(pidesk("schedules", "list", "--json", data_dir=data_dir).stdout) == []


def test_plans_list_takes_the_session_as_an_argument(project, data_dir):
    """Issue 31 §5: `pidesk plans list SID` said "unexpected extra argument"; it lists that session's plans,
    as --session does."""
    session_id = json.loads(pidesk("sessions", "new", str(project), "--json", data_dir=data_dir).stdout)["id"]
    assert json.loads(pidesk("plans", "list", session_id, "--json", data_dir=data_dir).stdout) == []
    missing = pidesk("plans", "list", "s_missing", data_dir=data_dir, check=False)
    assert missing.returncode == 2 and "NOT_FOUND" in missing.stderr
