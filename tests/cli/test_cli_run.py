"""``pidesk run`` as a user runs it: a real subprocess, a real data dir, a scripted model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).parents[2] / "examples" / "notes.json"


def pidesk(*args: str, data_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pidesk", *args, "--data-dir", str(data_dir)],
        capture_output=True, text=True, timeout=60,
    )


def test_unattended_run_streams_the_turn_and_exits_zero(project, data_dir):
    done = pidesk("run", str(project), "write notes", "--model", f"scripted/{EXAMPLE}", "--permission", "auto",
                  data_dir=data_dir)
    assert done.returncode == 0, done.stderr
    assert "Done: NOTES.md is in place." in done.stdout and "✓ Write" in done.stdout
    assert (project / "NOTES.md").read_text().startswith("# Notes")


def test_an_ask_nobody_can_answer_fails_fast_with_permission_required(project, data_dir):
    done = pidesk("run", str(project), "write notes", "--model", f"scripted/{EXAMPLE}", "--json", data_dir=data_dir)
    assert done.returncode == 1
    assert "PERMISSION_REQUIRED" in done.stderr
    events = [json.loads(line) for line in done.stdout.splitlines()]
    assert [e["seq"] for e in events] == list(range(events[0]["seq"], events[0]["seq"] + len(events)))
    assert events[-1]["type"] == "turn.ended" and events[-1]["errorCode"] == "PERMISSION_REQUIRED"
    assert not (project / "NOTES.md").exists()


def test_plan_and_goal_runs_are_refused_before_anything_happens(project, data_dir):
    for mode in ("plan", "goal"):
        done = pidesk("run", str(project), "plan it", "--mode", mode, data_dir=data_dir)
        assert done.returncode == 2
        assert "PLAN_REQUIRES_INTERACTIVE_SESSION" in done.stderr
    status = pidesk("status", data_dir=data_dir)
    assert "sessions: 0" in status.stdout


def test_a_bad_model_script_is_a_clear_error(project, data_dir, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    done = pidesk("run", str(project), "x", "--model", f"scripted/{bad}", data_dir=data_dir)
    assert done.returncode == 2 and "MODEL_NOT_CONFIGURED" in done.stderr and "Traceback" not in done.stderr


def test_an_unattended_demo_run_does_the_work_instead_of_waiting_for_an_approval(project, data_dir):
    """Authority hole 2: `pidesk run PROJECT "…" --permission auto` with the default demo model ended
    up awaiting a plan approval nobody could give. Unattended, the demo model is refused the
    contract tools and does its Agent-mode work: NOTES.md is written and the run exits 0."""
    done = pidesk("run", str(project), "document the project", "--permission", "auto", "--json",
                  data_dir=data_dir)
    assert done.returncode == 0, done.stderr
    events = [json.loads(line) for line in done.stdout.splitlines()]
    assert events[-1]["type"] == "turn.ended" and events[-1]["reason"] == "completed"
    assert not [e for e in events if e["type"] == "plan.requested"]
    assert (project / "NOTES.md").read_text().startswith("# Notes")
    assert not (project / ".pi").exists()


FREEZE_PROBE = """
import gc, sys, threading
from pidesk.cli.connect import _warm_up

collections = []
gc.callbacks.append(lambda phase, info: phase == "start" and collections.append(info["generation"]))

class Provider:
    def warm_up(self):
        self.imported = [[] for _ in range(50_000)]  # what a vendor SDK's import leaves alive
        if sys.argv[1] == "fails":
            raise RuntimeError("the SDK is broken")

provider = Provider()
_warm_up(provider)
for thread in threading.enumerate():
    if thread.name == "sdk-warm-up":
        thread.join(30)
print(hasattr(provider, "imported"), len(collections), gc.get_freeze_count(), gc.isenabled())
"""


@pytest.mark.parametrize("warm_up", ["succeeds", "fails"])
def test_an_embedded_host_collects_nothing_while_the_sdk_comes_in_then_freezes_it(warm_up: str):
    """`pidesk run` and `pidesk chat` import the SDK beside the first turn. Its ~100k objects live as
    long as the process: collecting as they came took 45–55 ms of the first request's wait and freed
    next to nothing, so the collector is off until the import is done. What is alive then goes to its
    permanent generation (as `serve` does), so a long turn's full collections stop walking them (the
    second, ~60 calls in, stalled one tool call 60–70 ms); and the collector is on again."""
    done = subprocess.run([sys.executable, "-c", FREEZE_PROBE, warm_up], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    warmed, collected, frozen, enabled = done.stdout.split()
    assert warmed == "True" and collected == "0" and int(frozen) >= 50_000 and enabled == "True"
