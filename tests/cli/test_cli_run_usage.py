"""`pidesk run --json` says what the turn cost (issue 16 §3)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def test_run_json_turn_ended_line_carries_the_turns_usage_with_cache_reads_and_writes_apart(
    project: Path, data_dir: Path, tmp_path: Path
) -> None:
    """Issue 16 §3: usage was only on session.turns; a script driving `pidesk run --json` could not
    see what its run cost, nor how much of it the prompt cache served."""
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"responses": [
        {"text": "Looking.", "toolCalls": [{"name": "Glob", "args": {"pattern": "*"}}],
         "usage": {"inputTokens": 100, "outputTokens": 10, "cacheTokens": 0}},
        {"text": "Done.", "usage": {"inputTokens": 20, "outputTokens": 5, "cacheTokens": 90}},
    ]}))
    done = subprocess.run(
        [sys.executable, "-m", "pidesk", "run", str(project), "look", "--model", f"scripted/{script}", "--json",
         "--data-dir", str(data_dir)], capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 0, done.stderr
    last = json.loads(done.stdout.splitlines()[-1])
    assert last["type"] == "turn.ended" and last["reason"] == "completed"
    assert last["usage"] == {"inputTokens": 120, "outputTokens": 15, "cacheTokens": 90, "cacheReadTokens": 90,
                             "cacheWriteTokens": 0}
