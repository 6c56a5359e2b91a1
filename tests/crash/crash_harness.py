"""The parent side of the crash tests: run a child to its death, then inspect what survived.

``crash(...)`` runs ``crash_driver.py`` in a real subprocess (``sys.executable``),
asserts it died by SIGKILL — proof that it reached the persistence point — and
returns the acknowledgements it printed before dying. The test then opens a
fresh Host in-process on the same data directory and checks the durable state
with the helpers here.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from scenario import submit_goal, submit_plan

from pidesk.host import Host
from pidesk.providers.scripted import ScriptedProvider

DRIVER = Path(__file__).resolve().with_name("crash_driver.py")
CHILD_TIMEOUT = 20.0  # generous; a child that reaches its point dies in well under a second

PLAN_MARKDOWN = "# Plan  \n\n1. Write NOTES.md\n2. Say \u201cdone\u201d \u2014 \u00fcn\u00efcode, trailing spaces  \n\n"
GOAL_CRITERIA = ["NOTES.md exists", "README.md is unchanged"]
_PNG = "iVBORw0KGgoAAAANSUhEUg=="
ATTACHMENT: dict[str, Any] = {"kind": "image", "name": "shot.png", "mime": "image/png",
                              "size": len(base64.b64decode(_PNG)),
                              "ref": "sha256:" + hashlib.sha256(base64.b64decode(_PNG)).hexdigest(), "data": _PNG}
"""An image attachment as a client sends it, with a transient base64 ``data`` field that must never persist."""


def contract(kind: str, markdown: str | None = None) -> dict[str, Any]:
    """The scripted SubmitPlan / SubmitGoal response of the crash scenarios."""
    if kind == "plan":
        return submit_plan(markdown=markdown or PLAN_MARKDOWN)
    return submit_goal(GOAL_CRITERIA)


def contract_markdown(kind: str) -> str:
    markdown: str = contract(kind)["toolCalls"][0]["args"]["markdown"]
    return markdown


def crash(scenario: str, data_dir: Path, project: Path, point: str, *, nth: int = 1, **options: Any) -> dict[str, Any]:
    """Run ``scenario`` in a child armed to SIGKILL itself at ``point``; return its acknowledgements."""
    acks: dict[str, Any] = {}
    for line in crash_log(scenario, data_dir, project, point, nth=nth, **options):
        acks.update(line)
    return acks


def crash_log(scenario: str, data_dir: Path, project: Path, point: str, *, nth: int = 1,
              **options: Any) -> list[dict[str, Any]]:
    """``crash``, returning every acknowledgement line in order (a key may repeat)."""
    spec = {"dataDir": str(data_dir), "project": str(project), "point": point, "nth": nth, "options": options}
    return run_to_death([str(DRIVER), scenario, json.dumps(spec)], f"the child of {scenario!r} at {point} (hit {nth})")


def crash_script(script: Path, spec: dict[str, Any], timeout: float = 60.0) -> dict[str, Any]:
    """Run ``script`` (a test file that is its own child: ``python script SPEC``) to its death at the point
    ``spec`` arms it for; its acknowledgements merged."""
    acks: dict[str, Any] = {}
    for line in run_to_death([str(script), json.dumps(spec)], f"{script.name} at {spec.get('point')}", timeout):
        acks.update(line)
    return acks


def run_to_death(argv: list[str], what: str, timeout: float = CHILD_TIMEOUT) -> list[dict[str, Any]]:
    """Run ``python argv`` — a child armed to SIGKILL itself at a persistence point, in an environment with no
    ``PIDESK_`` settings — and assert it died by SIGKILL (it reached the point) and never said "survived";
    its acknowledgement lines, in order."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIDESK_")}
    proc = subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=timeout, env=env,
                          check=False, cwd=DRIVER.parents[2])
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == -signal.SIGKILL, (
        f"{what} should have died by SIGKILL, but exited with {proc.returncode}; it acknowledged {lines}\n"
        f"--- stderr ---\n{proc.stderr[-4000:]}"
    )
    assert not any("survived" in line for line in lines)
    return lines


def rows(host: Host, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    with host.store.db.read() as db:
        return [tuple(r) for r in db.execute(sql, params).fetchall()]


def transcript(data_dir: Path, session_id: str) -> Path:
    return data_dir / "transcripts" / f"{session_id}.jsonl"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def audit_actions(host: Host, session_id: str | None = None) -> list[str]:
    if session_id is None:
        return [r[0] for r in rows(host, "SELECT action FROM audit ORDER BY id")]
    return [r[0] for r in rows(host, "SELECT action FROM audit WHERE session_id = ? ORDER BY id", session_id)]


def assert_fail_closed(host: Host, provider: ScriptedProvider) -> None:
    """After recovery: no model call made, nothing live, nothing running or pending anywhere."""
    assert provider.requests == [], "a model request was replayed after the restart"
    assert host.parts.live.turns == {}
    assert rows(host, "SELECT id FROM turns WHERE state = 'running'") == []
    assert rows(host, "SELECT id FROM sessions WHERE status != 'idle' OR current_turn_id IS NOT NULL") == []
    assert rows(host, "SELECT id FROM plan_approvals WHERE status = 'pending'") == []
    assert rows(host, "SELECT id FROM plan_approvals WHERE execution_state IN ('queued', 'running')") == []
    assert rows(host, "SELECT id FROM permission_requests WHERE status = 'pending'") == []


def snapshot(host: Host, data_dir: Path) -> dict[str, Any]:
    """The durable state, without timestamps: equal snapshots mean equal recoveries."""
    return {
        "sessions": rows(host, "SELECT id, title, project_path, root, mode, permission_mode, status,"
                               " current_turn_id, forked_from, forked_through, last_seq, indexed_bytes"
                               " FROM sessions ORDER BY id"),
        "messages": rows(host, "SELECT id, session_id, turn_id, seq, role, offset, length FROM messages"
                               " ORDER BY session_id, seq"),
        "turns": rows(host, "SELECT id, session_id, seq, origin, state, reason, error_code, approval_id"
                            " FROM turns ORDER BY id"),
        "approvals": rows(host, "SELECT id, status, permission_mode, execution_id, execution_state, artifact_path,"
                                " artifact_sha256 FROM plan_approvals ORDER BY id"),
        "permissions": rows(host, "SELECT id, status FROM permission_requests ORDER BY id"),
        "queue": rows(host, "SELECT id, session_id, position, text FROM queue ORDER BY id"),
        "notifications": rows(host, "SELECT session_id, turn_id, kind, seen_at IS NULL FROM notifications"
                                    " ORDER BY turn_id"),
        "audit": rows(host, "SELECT session_id, turn_id, action FROM audit ORDER BY id"),
        "files": {re.sub(r"quarantine-[^-]+-", "quarantine-*-", p.name): sha256(p)
                  for p in sorted((data_dir / "transcripts").iterdir())},
    }
