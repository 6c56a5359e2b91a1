"""``pidesk chat`` driven through a real pseudo-terminal, as a person would type."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path

SCRIPT = {"responses": [
    {"text": "Let me look.", "toolCalls": [{"name": "Read", "args": {"path": "README.md"}}]},
    {"toolCalls": [{"name": "SubmitPlan", "args": {
        "title": "Add notes", "markdown": "# Plan\n\n1. Write **NOTES.md**\n", "question": "Shall I write it?"}}]},
    {"toolCalls": [{"name": "Write", "args": {"path": "NOTES.md", "content": "notes\n"}}]},
    {"text": "NOTES.md written."},
    {"toolCalls": [{"name": "Bash", "args": {"command": "echo from-bash > bash.txt"}}]},
    {"text": "bash done."},
]}
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


class Terminal:
    def __init__(self, args: list[str]) -> None:
        self.master, slave = pty.openpty()
        self.proc = subprocess.Popen(args, stdin=slave, stdout=slave, stderr=slave, close_fds=True,
                                     env={**os.environ, "COLUMNS": "120", "TERM": "xterm"})
        os.close(slave)
        self.seen = ""

    def expect(self, text: str, timeout: float = 20.0) -> None:
        """Read the screen until ``text`` appears (bounded); fail with what was shown."""
        deadline = time.monotonic() + timeout
        while text not in ANSI.sub("", self.seen):
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"never saw {text!r}; screen:\n{ANSI.sub('', self.seen)[-2000:]}"
            ready, _, _ = select.select([self.master], [], [], remaining)
            if ready:
                try:
                    self.seen += os.read(self.master, 65536).decode("utf-8", "replace")
                except OSError:
                    break
        self.seen = ANSI.sub("", self.seen).split(text, 1)[1]

    def type(self, keys: str) -> None:
        os.write(self.master, keys.encode())

    def close(self) -> int:
        code = self.proc.wait(timeout=30)
        os.close(self.master)
        return code


def test_chat_plans_approves_with_accept_edits_and_executes(project, data_dir, tmp_path):
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))
    term = Terminal([sys.executable, "-m", "pidesk", "chat", str(project), "--data-dir", str(data_dir),
                     "--model", f"scripted/{script}"])
    term.expect("agent · ask · idle ›")
    term.type("\x1b[Z")  # Shift+Tab: Agent → Plan
    term.expect("plan · ask · idle ›")
    term.type("plan the notes\r")
    term.expect("✓ Read")
    term.expect("Shall I write it?")
    term.expect("approve? [a] ask  [e] accept-edits  [u] auto  [r] reject")
    term.type("e")
    term.expect("[plan approved]")
    term.expect("✓ Write")
    term.expect("NOTES.md written.")
    term.expect("[turn completed]")
    assert (project / "NOTES.md").read_text() == "notes\n"
    term.type("run bash\r")  # accept-edits still asks for Bash
    term.expect("allow? [y] once  [s] for this session  [n] deny")
    term.type("s")
    term.expect("✓ Bash")
    term.expect("[turn completed]")
    assert (project / "bash.txt").read_text().strip() == "from-bash"
    term.type("\x03")  # Ctrl+C while idle quits
    assert term.close() == 0


def test_chat_queues_while_running_esc_stops_at_the_boundary_and_ctrl_c_aborts(project, data_dir, tmp_path):
    wait_for_go = "while [ ! -f go ]; do sleep 0.02; done; echo released"
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"responses": [
        {"toolCalls": [{"name": "Bash", "args": {"command": wait_for_go}}]},
        {"text": "answer to the queued prompt"},
    ]}))
    term = Terminal([sys.executable, "-m", "pidesk", "chat", str(project), "--data-dir", str(data_dir),
                     "--model", f"scripted/{script}"])
    term.expect("agent · ask · idle ›")
    term.type("/auto\r")
    term.expect("agent · auto · idle ›")
    term.type("wait for go\r")
    term.expect("▸ Bash")
    term.type("queued prompt\r")
    term.expect("[queued: 1]")
    term.type("\x1b")  # Esc: graceful stop
    term.expect("[stopping at the next boundary]")
    (project / "go").write_text("")
    term.expect("✓ Bash")
    term.expect("[turn completed]")
    term.expect("answer to the queued prompt")
    term.expect("[turn completed]")
    term.type("\x03")
    assert term.close() == 0
    messages = subprocess.run([sys.executable, "-m", "pidesk", "sessions", "list", "--json", "--data-dir",
                               str(data_dir)], capture_output=True, text=True, check=True)
    session_id = json.loads(messages.stdout)[0]["id"]
    shown = subprocess.run([sys.executable, "-m", "pidesk", "sessions", "show", session_id, "--json",
                            "--data-dir", str(data_dir)], capture_output=True, text=True, check=True)
    # the stopped turn made no model call after its tool boundary: the queued prompt came next
    rows = [(m["role"], m["content"]) for m in json.loads(shown.stdout)]
    assert [role for role, _ in rows] == ["user", "assistant", "tool", "user", "assistant"]
    assert rows[3][1] == "queued prompt" and rows[4][1] == "answer to the queued prompt"


def test_chat_ctrl_c_aborts_a_running_turn(project, data_dir, tmp_path):
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"responses": [
        {"toolCalls": [{"name": "Bash", "args": {"command": "sleep 60"}}]}]}))
    term = Terminal([sys.executable, "-m", "pidesk", "chat", str(project), "--data-dir", str(data_dir),
                     "--model", f"scripted/{script}"])
    term.expect("idle ›")
    term.type("/auto\r")
    term.expect("auto · idle ›")
    term.type("sleep\r")
    term.expect("▸ Bash")
    term.type("\x03")
    term.expect("✗ TOOL_ABORTED Bash")
    term.expect("[turn aborted]")
    term.type("\x03")
    assert term.close() == 0
