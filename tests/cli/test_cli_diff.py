"""``pidesk diff`` and ``pidesk revert`` (issue 17), run as the real executable against a real data dir."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def pidesk(*args: str, data_dir: Path, stdin: str = "", check: bool = True,
           cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, "-m", "pidesk", *args, "--data-dir", str(data_dir)],
                          capture_output=True, text=True, timeout=60, input=stdin, cwd=cwd)
    if check:
        assert done.returncode == 0, done.stderr
    return done


def test_issue17_diff_shows_a_runs_changes_and_revert_asks_then_takes_them_back(project, data_dir, tmp_path):
    """Issue 17: after a run that rewrote README.md and added a file, `pidesk diff` prints the unified diff
    (--stat the counts, --json the protocol's shape); `pidesk revert` lists the files and asks, does nothing
    on "n", and restores the workspace on "y", printing how to undo the revert."""
    script = tmp_path / "model.json"
    script.write_text(json.dumps({"responses": [
        {"toolCalls": [{"name": "Write", "args": {"path": "README.md", "content": "# renamed project\n"}},
                       {"name": "Write", "args": {"path": "notes/todo.md", "content": "- one\n- two\n"}}]},
        {"text": "Done."}]}))
    pidesk("run", str(project), "change things", "--model", f"scripted/{script}", "--permission", "auto",
           data_dir=data_dir)
    session_id = json.loads(pidesk("sessions", "list", "--json", data_dir=data_dir).stdout)[0]["id"]
    changes = json.loads(pidesk("diff", session_id, "--json", data_dir=data_dir).stdout)
    [turn] = changes["turns"]
    assert {f["path"]: (f["status"], f["additions"], f["deletions"]) for f in turn["files"]} == {
        "README.md": ("modified", 1, 1), "notes/todo.md": ("added", 2, 0)}
    text = pidesk("diff", session_id, data_dir=data_dir).stdout
    assert "-# demo project" in text and "+# renamed project" in text and "+- two" in text
    stat = pidesk("diff", session_id, "--turn", turn["turnId"], "--stat", data_dir=data_dir).stdout
    assert "2 files changed, +3 -1" in stat and "notes/todo.md" in stat and "@@" not in stat

    declined = pidesk("revert", session_id, "--turn", turn["turnId"], data_dir=data_dir, stdin="n\n")
    assert "README.md" in declined.stdout and "notes/todo.md" in declined.stdout and "by hand" in declined.stdout
    assert (project / "README.md").read_text() == "# renamed project\n"
    done = pidesk("revert", session_id, "--turn", turn["turnId"], data_dir=data_dir, stdin="y\n")
    assert (project / "README.md").read_text() == "# demo project\n" and not (project / "notes").exists()
    assert "Reverted 2 files" in done.stdout and "--turn rv_" in done.stdout


def test_issue17_revert_of_an_unknown_turn_is_a_code_not_a_traceback(project, data_dir):
    """Issue 17: a wrong turn id ends with NOT_FOUND and a message, exit status 2."""
    session_id = json.loads(pidesk("sessions", "new", str(project), "--json", data_dir=data_dir).stdout)["id"]
    done = pidesk("revert", session_id, "--turn", "t_missing", "--yes", data_dir=data_dir, check=False)
    assert done.returncode == 2 and "NOT_FOUND" in done.stderr and "Traceback" not in done.stderr


def test_issue17_a_relative_data_dir_still_records_changes(project, tmp_path):
    """A data dir given as a relative path (`--data-dir data`) is the same place for every part of the
    host: checkpoints ran git in the project's root, where `data` named another folder, and every
    checkpoint failed."""
    script = tmp_path / "model.json"
    script.write_text(json.dumps({"responses": [
        {"toolCalls": [{"name": "Write", "args": {"path": "made.txt", "content": "made\n"}}]}, {"text": "Done."}]}))
    relative = Path("data")
    run = pidesk("run", str(project), "make a file", "--model", f"scripted/{script}", "--permission", "auto",
                 data_dir=relative, cwd=tmp_path)
    assert "checkpoint" not in run.stderr, run.stderr
    session_id = json.loads(pidesk("sessions", "list", "--json", data_dir=relative, cwd=tmp_path).stdout)[0]["id"]
    [turn] = json.loads(pidesk("diff", session_id, "--json", data_dir=relative, cwd=tmp_path).stdout)["turns"]
    assert [f["path"] for f in turn["files"]] == ["made.txt"]
    assert (tmp_path / "data" / "checkpoints").is_dir() and not (project / "data").exists()


def test_a_file_too_large_to_checkpoint_is_named_by_diff_and_left_by_revert(project, data_dir, tmp_path):
    """Issue 29 item 6: a run that makes a file over the 10 MiB checkpoint cap: `pidesk diff --stat` says it
    is too large to checkpoint, `pidesk diff` says what that means, and `pidesk revert` names it among
    the files it left as they are (the rest of the turn is reverted)."""
    script = tmp_path / "model.json"
    script.write_text(json.dumps({"responses": [
        {"toolCalls": [{"name": "Bash", "args": {"command": "head -c 11000000 /dev/zero > big.bin; echo more >> README.md"}}]},
        {"text": "Done."}]}))
    pidesk("run", str(project), "make a big file", "--model", f"scripted/{script}", "--permission", "auto",
           data_dir=data_dir)
    session_id = json.loads(pidesk("sessions", "list", "--json", data_dir=data_dir).stdout)[0]["id"]
    stat = pidesk("diff", session_id, "--stat", data_dir=data_dir).stdout
    assert "big.bin" in stat and "too large to checkpoint" in stat
    text = pidesk("diff", session_id, data_dir=data_dir).stdout
    assert "big.bin is 10.5 MiB, over the 10.0 MiB checkpoint limit" in text and "+more" in text
    turn = json.loads(pidesk("diff", session_id, "--json", data_dir=data_dir).stdout)["turns"][0]["turnId"]
    done = pidesk("revert", session_id, "--turn", turn, data_dir=data_dir, stdin="y\n").stdout
    assert "Reverted 1 file:\n  README.md" in done
    assert "Left as they are (too large to checkpoint" in done and "  big.bin" in done
    assert (project / "README.md").read_text() == "# demo project\n" and (project / "big.bin").stat().st_size == 11000000


def test_issue33_status_shows_the_shadow_repositories_size_and_the_retention_policy(project, data_dir, tmp_path):
    """Issue 33 §3: `pidesk status` says how much the checkpoints take and what the retention policy
    keeps, naming its settings (PIDESK_CHECKPOINT_KEEP_TURNS / _DAYS like every setting)."""
    script = tmp_path / "model.json"
    script.write_text(json.dumps({"responses": [
        {"toolCalls": [{"name": "Write", "args": {"path": "README.md", "content": "# renamed\n"}}]},
        {"text": "Done."}]}))
    pidesk("run", str(project), "change things", "--model", f"scripted/{script}", "--permission", "auto",
           data_dir=data_dir)
    shown = pidesk("status", data_dir=data_dir).stdout
    assert "checkpoints: 1 shadow repository, " in shown
    assert "kept: the last 200 turns of each session made in the last 30 days (checkpoint_keep_turns" in shown
    env = {**os.environ, "PIDESK_CHECKPOINT_KEEP_TURNS": "0", "PIDESK_CHECKPOINT_KEEP_DAYS": "7"}
    done = subprocess.run([sys.executable, "-m", "pidesk", "status", "--json", "--data-dir", str(data_dir)],
                          capture_output=True, text=True, timeout=60, env=env, check=True)
    found = json.loads(done.stdout)["checkpoints"]
    assert found["repositories"] == 1 and found["bytes"] > 0 and (found["keepTurns"], found["keepDays"]) == (0, 7)
    bad = subprocess.run([sys.executable, "-m", "pidesk", "status", "--data-dir", str(data_dir)], capture_output=True,
                         text=True, timeout=60, env={**env, "PIDESK_CHECKPOINT_KEEP_TURNS": "lots"})
    assert bad.returncode != 0 and "PIDESK_CHECKPOINT_KEEP_TURNS" in bad.stderr and "Traceback" not in bad.stderr
