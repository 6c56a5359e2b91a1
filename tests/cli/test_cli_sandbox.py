"""Issue 28 from the terminal: ``pidesk run`` is sandboxed by default, ``--no-sandbox`` is not, and
``pidesk status`` / ``pidesk doctor`` say which sandbox is in force. Real subprocesses, a scripted model."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.sandboxing import require_sandbox


def pidesk(*args: str, data_dir: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k != "PIDESK_SANDBOX"}
    return subprocess.run([sys.executable, "-m", "pidesk", *args, "--data-dir", str(data_dir)],
                          capture_output=True, text=True, timeout=60, env={**environ, **env})


@pytest.fixture
def outside() -> Iterator[Path]:
    """Outside the project, and visible (read-only) in a sandbox: not under /tmp, which it replaces."""
    path = Path(tempfile.mkdtemp(prefix="pidesk-cli-outside-", dir="/var/tmp"))
    yield path
    shutil.rmtree(path)


def script(tmp_path: Path, command: str) -> Path:
    path = tmp_path / "model.json"
    path.write_text(json.dumps({"responses": [
        {"text": "Writing.", "toolCalls": [{"name": "Bash", "args": {"command": command}}]}, {"text": "Done."}]}))
    return path


def test_pidesk_run_runs_bash_in_the_sandbox_unless_told_not_to(project, data_dir, tmp_path, outside):
    require_sandbox()
    model = f"scripted/{script(tmp_path, f'echo here > here.txt; echo out > {outside}/out.txt')}"
    done = pidesk("run", str(project), "write", "--model", model, "--permission", "auto", data_dir=data_dir)
    assert done.returncode == 0, done.stderr
    assert (project / "here.txt").exists() and not (outside / "out.txt").exists()
    done = pidesk("run", str(project), "write", "--model", model, "--permission", "auto", "--no-sandbox",
                  data_dir=data_dir)
    assert done.returncode == 0, done.stderr
    assert (outside / "out.txt").read_text() == "out\n"


def test_status_and_doctor_say_which_sandbox_is_in_force(data_dir):
    require_sandbox()
    assert "Sandbox: bwrap (no network)" in pidesk("status", data_dir=data_dir).stdout
    off = pidesk("status", data_dir=data_dir, PIDESK_SANDBOX="off").stdout
    assert "Sandbox: OFF" in off and "host's token" in off
    report = json.loads(pidesk("doctor", "--json", data_dir=data_dir).stdout)
    assert report["sandbox"]["mode"] == "bwrap" and report["sandbox"]["available"] is True


def test_a_sandbox_that_cannot_start_is_said_so_by_status(data_dir, tmp_path):
    empty = tmp_path / "no-bwrap"
    empty.mkdir()
    shown = pidesk("status", data_dir=data_dir, PATH=str(empty)).stdout
    assert "Sandbox: UNAVAILABLE" in shown and "apt-get install bubblewrap" in shown


@pytest.mark.parametrize(("setting", "says"), [
    ('sandbox = "maybe"', 'sandbox = \'maybe\''),
    ('[sandbox]\nnetwork = "yes"', "sandbox.network"),
    ('[sandbox]\nwriteable = ["/x"]', "unknown key 'writeable'"),
])
def test_a_bad_sandbox_setting_is_refused_saying_where(data_dir, tmp_path, setting, says):
    config = tmp_path / "config.toml"
    config.write_text(setting + "\n")
    done = pidesk("status", data_dir=data_dir, PIDESK_CONFIG=str(config))
    assert done.returncode == 2 and says in done.stderr and "Traceback" not in done.stderr
