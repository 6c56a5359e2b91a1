"""The plan flow of `pidesk acp` driven by the official TypeScript ACP SDK (`@agentclientprotocol/sdk`,
under Debian's node), so two independent clients — this and the Python SDK of test_acp.py — agree on
what pidesk says. The script is tests/acp/ts/plan_flow.mjs; its package-lock.json pins the SDK."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.acp.test_acp import PLAN, WRITE, script

HERE = Path(__file__).parent / "ts"


@pytest.mark.timeout(240)
def test_the_typescript_sdk_runs_a_whole_plan_flow(project, data_dir, tmp_path):
    if shutil.which("node") is None or shutil.which("npm") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("node and npm are required under CI (.ci/run installs Debian's nodejs and npm)")
        pytest.skip("needs node and npm: apt-get install nodejs npm")
    client = tmp_path / "client"
    shutil.copytree(HERE, client, ignore=shutil.ignore_patterns("node_modules"))
    installed = subprocess.run(["npm", "ci", "--no-audit", "--no-fund", "--prefer-offline"], cwd=client,
                               capture_output=True, text=True, timeout=180)
    assert installed.returncode == 0, installed.stderr
    model = script(tmp_path, PLAN, WRITE, {"text": "Done: NOTES.md says hello."})
    ran = subprocess.run(["node", "plan_flow.mjs", str(project), sys.executable, "-m", "pidesk", "acp",
                          "--data-dir", str(data_dir), "--model", model],
                         cwd=client, capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr
    seen = json.loads(ran.stdout)
    assert seen["protocolVersion"] == 1 and seen["stopReason"] == "end_turn"
    assert [m["id"] for m in seen["modes"]["availableModes"]] == ["agent", "plan", "goal"]
    assert [a["title"] for a in seen["asked"]] == ["Plan: Add notes", "Write NOTES.md"]
    assert seen["asked"][0]["options"][0] == ["approve-ask", "allow_once"]
    modes = [u["currentModeId"] for u in seen["updates"] if u["sessionUpdate"] == "current_mode_update"]
    assert modes == ["plan", "agent"]
    assert any(u["sessionUpdate"] == "tool_call" and u.get("content", [{}])[0].get("type") == "diff"
               for u in seen["updates"])
    assert (project / "NOTES.md").read_text() == "hello\n"
