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
from typing import Any

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
CSI = re.compile(r"\x1b\[[0-9;?]*([A-Za-z])")
PLAN_QUESTION = "approve? [a] ask [e] accept-edits [u] auto [r] reject ›"
PERMISSION_QUESTION = "allow? [y] once [s] this session [n] deny · Esc later ›"
CONTEXT_QUESTION = "· context? [k]eep (Enter) [c]ompact [f]resh ›"
OSC = re.compile(r"\x1b\][^\x07\x1b]*(\x07|\x1b\\)")


class Terminal:
    """``pidesk chat`` on a pseudo-terminal: keys in, and both the byte stream and the screen it draws out."""

    def __init__(self, args: list[str], env: dict[str, str] | None = None) -> None:
        self.master, slave = pty.openpty()
        self.proc = subprocess.Popen(args, stdin=slave, stdout=slave, stderr=slave, close_fds=True,
                                     env={**(env or os.environ), "COLUMNS": "120", "TERM": "xterm"})
        os.close(slave)
        self.seen = ""
        self.raw = ""

    def _read(self, remaining: float) -> bool:
        ready, _, _ = select.select([self.master], [], [], remaining)
        if ready:
            try:
                data = os.read(self.master, 65536).decode("utf-8", "replace")
            except OSError:
                return False
            self.seen += data
            self.raw += data
        return True

    def expect(self, text: str, timeout: float = 20.0) -> None:
        """Read the output until ``text`` appears (bounded); fail with what was shown."""
        deadline = time.monotonic() + timeout
        while text not in ANSI.sub("", self.seen):
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"never saw {text!r}; screen:\n{ANSI.sub('', self.seen)[-2000:]}"
            if not self._read(remaining):
                break
        self.seen = ANSI.sub("", self.seen).split(text, 1)[1]

    def screen(self) -> list[str]:
        """The lines as a terminal shows them: text drawn and then erased (\\r, ESC [K) is gone."""
        return render(self.raw)

    def expect_status(self, text: str, timeout: float = 20.0) -> None:
        """Read until the live bottom line (the status or decision prompt) starts with ``text`` (bounded)."""
        deadline = time.monotonic() + timeout
        while not self.screen()[-1].startswith(text):
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"status line never became {text!r}; it is {self.screen()[-1]!r}"
            if not self._read(remaining):
                break
        self.seen = ""

    def type(self, keys: str) -> None:
        os.write(self.master, keys.encode())

    def close(self) -> int:
        code = self.proc.wait(timeout=30)
        os.close(self.master)
        return code


def render(raw: str) -> list[str]:
    """A minimal terminal: printable text, CR, LF, erase-to-end-of-line; other escapes draw nothing."""
    lines, row, col = [""], 0, 0
    i = 0
    while i < len(raw):
        ch = raw[i]
        if ch == "\x1b":
            match = CSI.match(raw, i)
            if match:
                if match.group(1) == "K":
                    lines[row] = lines[row][:col]
                i = match.end()
                continue
            osc = OSC.match(raw, i)
            i = osc.end() if osc else i + 1
            continue
        if ch == "\r":
            col = 0
        elif ch == "\n":
            row += 1
            col = 0
            if row == len(lines):
                lines.append("")
        elif ch.isprintable():
            line = lines[row].ljust(col)
            lines[row] = line[:col] + ch + line[col + 1:]
            col += 1
        i += 1
    return [line.rstrip() for line in lines]


def chat(project: Path, data_dir: Path, model: str) -> Terminal:
    return Terminal([sys.executable, "-m", "pidesk", "chat", str(project), "--data-dir", str(data_dir),
                     "--model", model])


def scripted(tmp_path: Path, *responses: dict[str, Any]) -> str:
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"responses": list(responses)}))
    return f"scripted/{script}"


def cli_json(data_dir: Path, *args: str) -> Any:
    done = subprocess.run([sys.executable, "-m", "pidesk", *args, "--json", "--data-dir", str(data_dir)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def approvals(data_dir: Path) -> list[dict[str, Any]]:
    session_id = cli_json(data_dir, "sessions", "list")[0]["id"]
    return cli_json(data_dir, "plans", "list", "--session", session_id)  # type: ignore[no-any-return]


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
    term.expect_status(PLAN_QUESTION)
    term.type("e")
    term.expect_status("approve with accept-edits? Enter confirms")
    term.type("\r")
    term.expect_status("accept-edits " + CONTEXT_QUESTION)
    term.type("\r")  # Enter alone keeps the conversation
    term.expect("[plan approved · accept-edits · context: keep]")
    term.expect("✓ Write")
    term.expect("NOTES.md written.")
    term.expect("[turn completed]")
    assert (project / "NOTES.md").read_text() == "notes\n"
    term.type("run bash\r")  # accept-edits still asks for Bash
    term.expect_status(PERMISSION_QUESTION)
    term.type("s\r")
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


PLAN = (
    {"text": "Looking around.", "toolCalls": [{"name": "Read", "args": {"path": "README.md"}}]},
    {"toolCalls": [{"name": "SubmitPlan", "args": {
        "title": "Add notes", "markdown": "# Plan\n\n1. Write NOTES.md\n", "question": "Shall I write it?"}}]},
)
WRITE = {"toolCalls": [{"name": "Write", "args": {"path": "NOTES.md", "content": "notes\n"}}]}


def test_typeahead_never_answers_a_plan_prompt(project, data_dir, tmp_path):
    """Issue 18 item 1: keys typed before the plan prompt was drawn (a queued prompt holding a `u`, then
    `a` Enter, `u` Enter, `y` Enter) were read as its answer and approved the plan with auto. Now they are
    dropped, a stray Enter or a word typed into the prompt (whose `u` approved at once) decides nothing, and
    only the key then Enter approves. (Where the type-ahead is when the prompt comes is up to scheduling
    here; test_cli_chat_decisions.py pins each place.)"""
    term = chat(project, data_dir, scripted(tmp_path, *PLAN))
    term.expect_status("agent · ask · idle ›")
    term.type("/plan\r")
    term.expect_status("plan · ask · idle ›")
    term.type("plan the notes\r")
    for keys in ("queued while running\r", "a\r", "u\r", "y\r", "\r"):  # type-ahead, as fast as it comes
        term.type(keys)
    term.expect("Shall I write it?")
    term.expect_status(PLAN_QUESTION)
    term.type("\r")  # a stray Enter …
    term.type("queued\r")  # … and a word ending in Enter, its u and e selecting along the way
    term.type("e")  # processed after them, in order: the prompt was still undecided
    term.expect_status("approve with accept-edits? Enter confirms")
    term.type("\r")
    term.expect_status("accept-edits " + CONTEXT_QUESTION)
    term.type("\r")
    term.expect("[plan approved · accept-edits · context: keep]")
    term.type("\x7f" * 40 + "\x04")  # whatever type-ahead was left on the line, then Ctrl+D on it empty: quit
    assert term.close() == 0
    assert [(a["status"], a["permissionMode"]) for a in approvals(data_dir)] == [("approved", "accept-edits")]


def test_auto_needs_a_second_confirmation(project, data_dir, tmp_path):
    """Issue 18 item 1: `u` alone approved with auto, which runs every tool unasked. Now `u` Enter asks once
    more; a stray Enter there does nothing, any other key goes back, and only `y` Enter approves with auto."""
    term = chat(project, data_dir, scripted(tmp_path, *PLAN))
    term.expect_status("agent · ask · idle ›")
    term.type("/plan\r")
    term.expect_status("plan · ask · idle ›")
    term.type("plan the notes\r")
    term.expect_status(PLAN_QUESTION)
    term.type("u")
    term.expect_status("approve with auto? Enter confirms")
    term.type("\r")
    term.expect_status("auto: all tools run unasked. Sure? [y]+Enter")
    term.type("\r")  # nothing selected: nothing happens …
    term.type("x")  # … and another key goes back to the question
    term.expect_status(PLAN_QUESTION)
    term.type("u\r")
    term.expect_status("auto: all tools run unasked. Sure?")
    term.type("y")
    term.expect_status("auto: all tools run unasked. Sure? [y]+Enter, else back › y")
    term.type("\r")
    term.expect_status("auto " + CONTEXT_QUESTION)
    term.type("\r")
    term.expect("[plan approved · auto · context: keep]")
    term.expect_status("agent · auto · ")
    term.type("\x04")
    assert term.close() == 0
    assert [(a["status"], a["permissionMode"]) for a in approvals(data_dir)] == [("approved", "auto")]


def test_typeahead_never_answers_a_permission_prompt(project, data_dir, tmp_path):
    """Issue 18 item 1: `y` Enter typed before a permission prompt was drawn would allow the Write it asks
    about. Now the prompt waits for a key pressed after it appeared, then Enter."""
    term = chat(project, data_dir, scripted(tmp_path, {"text": "Writing.", **WRITE}))
    term.expect_status("agent · ask · idle ›")
    term.type("write the notes\r")
    for keys in ("y\r", "s\r", "y", "\r"):
        term.type(keys)
    term.expect("permission: Write")
    term.expect_status(PERMISSION_QUESTION)
    term.type("\r")
    term.type("y")
    term.expect_status("allow once? Enter confirms")
    assert not (project / "NOTES.md").exists()
    term.type("\r")
    term.expect("✓ Write")
    term.type("\x7f" * 40 + "\x04")
    assert term.close() == 0
    assert (project / "NOTES.md").read_text() == "notes\n"


def test_esc_leaves_a_decision_pending_and_ctrl_c_aborts(project, data_dir, tmp_path):
    """Issue 18 item 2: Esc and Ctrl+C did nothing at a plan or permission prompt. Now Esc puts the prompt
    away (the request stays pending, /pending shows it again) and Ctrl+C aborts the turn."""
    term = chat(project, data_dir, scripted(tmp_path, PLAN[1], WRITE))
    term.expect_status("agent · ask · idle ›")
    term.type("/plan\r")
    term.expect_status("plan · ask · idle ›")
    term.type("plan the notes\r")
    term.expect_status(PLAN_QUESTION)
    term.type("\x1b")
    term.expect("[plan still pending — /pending shows it again]")
    term.expect_status("plan · ask · running · plan waiting: /pending ›")
    term.type("/pending\r")
    term.expect("Shall I write it?")
    term.expect_status(PLAN_QUESTION)
    term.type("\x03")
    term.expect("[turn aborted]")
    term.expect_status("plan · ask · idle ›")
    term.type("/agent\r")
    term.expect_status("agent · ask · idle ›")
    term.type("write the notes\r")
    term.expect_status(PERMISSION_QUESTION)
    term.type("\x1b")
    term.expect("[permission request still pending — /pending shows it again]")
    term.expect_status("agent · ask · running · permission waiting: /pending ›")
    term.type("/pending\r")
    term.expect_status(PERMISSION_QUESTION)
    term.type("\x03")
    term.expect("[turn aborted]")
    term.expect_status("agent · ask · idle ›")
    term.type("\x03")
    assert term.close() == 0
    assert [a["status"] for a in approvals(data_dir)] != ["approved"]
    assert not (project / "NOTES.md").exists()


def test_status_line_follows_the_mode_the_host_sets(project, data_dir):
    """Issue 18 item 3: every session.updated was dropped (the filter read `sessionId` from a Session, which
    carries `id`), so after a reject the line said agent while in plan, after an approval plan while in agent,
    and Shift+Tab cycled from the wrong mode."""
    term = chat(project, data_dir, "demo")
    term.expect_status("agent · ask · idle ›")
    term.type("do something\r")  # the demo model enters Plan mode itself, then submits a plan
    term.expect_status(PLAN_QUESTION)
    term.type("r\r")
    term.expect_status("feedback for the agent")
    term.type("not now\r")
    term.expect("[plan rejected · feedback: not now]")
    term.expect("[turn completed]")
    term.expect_status("plan · ask · idle ›")
    term.type("\x1b[Z")
    term.expect_status("goal · ask · idle ›")
    term.type("\x1b[Z")
    term.expect_status("agent · ask · idle ›")
    term.type("/plan\r")
    term.expect_status("plan · ask · idle ›")
    term.type("do something\r")
    term.expect_status(PLAN_QUESTION)
    term.type("e\r")
    term.expect_status("accept-edits " + CONTEXT_QUESTION)
    term.type("\r")
    term.expect("[plan approved · accept-edits · context: keep]")
    term.expect("Done: NOTES.md is written")
    term.expect("[turn completed]")
    term.expect_status("agent · accept-edits · idle ›")
    term.type("\x1b[Z")
    term.expect_status("plan · accept-edits · idle ›")
    term.type("\x03")
    assert term.close() == 0


def test_the_first_line_of_each_answer_stays_on_screen(project, data_dir, tmp_path):
    """Issue 18 item 4: the first line the agent wrote in a turn was drawn, then erased by the prompt line's
    redraw. Now the answer is printed above the prompt line once it is complete, never drawn over."""
    term = chat(project, data_dir, scripted(
        tmp_path, {"text": "First line of the answer.\n\nSecond line."},
        {"text": "Another turn, its first line.", "toolCalls": [{"name": "Read", "args": {"path": "README.md"}}]},
        {"text": "Read it."}))
    term.expect_status("agent · ask · idle ›")
    term.type("hello\r")
    term.expect("[turn completed]")
    term.type("again\r")
    term.expect("✓ Read")
    term.expect("[turn completed]")
    term.expect_status("agent · ask · idle ›")
    lines = term.screen()
    for line in ("First line of the answer.", "Another turn, its first line.", "Second line.", "Read it."):
        assert line in lines, f"{line!r} is not on the screen:\n" + "\n".join(lines)
    term.type("\x03")
    assert term.close() == 0


def test_idle_esc_mode_confirmation_help_quit_and_markdown(project, data_dir, tmp_path):
    """Issue 18 item 5: Esc while idle claimed "[stopping at the next boundary]", /plan said nothing, /quit
    was undocumented and answers showed raw Markdown. Now idle Esc is silent, /plan confirms the mode,
    /help lists /quit (which quits) and an answer is rendered."""
    term = chat(project, data_dir, scripted(tmp_path, {"text": "# Result\n\nSome **bold** words.\n\n- one\n- two\n"}))
    term.expect_status("agent · ask · idle ›")
    term.type("\x1b")
    term.type("/plan\r")
    term.expect("[mode: plan]")
    term.expect_status("plan · ask · idle ›")
    term.type("/help\r")
    term.expect("/quit")
    term.type("/agent\r")
    term.expect("[mode: agent]")
    term.type("show me\r")
    term.expect("[turn completed]")
    lines = term.screen()
    assert not any("stopping" in line for line in lines)
    assert "Some bold words." in lines and any(line.strip() == "• one" for line in lines)
    assert not any("**" in line or line.startswith("- one") for line in lines)
    term.type("/quit\r")
    assert term.close() == 0


def test_chat_without_a_project_says_it_works_in_a_scratch_folder(data_dir):
    """Issue 31 §5: `pidesk chat` with no PROJECT quietly made a session in a scratch folder of the data dir;
    it says so, and how to give a project."""
    term = Terminal([sys.executable, "-m", "pidesk", "chat", "--data-dir", str(data_dir), "--model", "demo"])
    term.expect("No PROJECT given: this session works in a scratch folder of its own")
    term.expect("Give one: pidesk chat PATH")
    term.expect_status("agent · ")  # the terminal is the chat's now: a key reaches it
    term.type("\x04")
    assert term.close() == 0


def test_a_chat_that_sends_nothing_leaves_no_session_behind(project, data_dir):
    """Issue 31 §3: opening `pidesk chat` and quitting left an empty session in every list (one that was
    sent a prompt stays: the other chat tests list theirs after quitting)."""
    term = chat(project, data_dir, "demo")
    term.expect_status("agent · ")
    term.type("\x04")
    assert term.close() == 0
    assert cli_json(data_dir, "sessions", "list") == []


def test_continue_resumes_the_projects_newest_session_showing_its_history_first(project, data_dir, tmp_path):
    """Issue 31 §3: `pidesk chat --session ID` showed an empty screen, so a person could not tell where they
    were; `--continue` did not exist. Now both resume with the recent history shown first."""
    model = scripted(tmp_path, {"text": "The answer to the first question."},
                     {"toolCalls": [{"name": "Read", "args": {"path": "README.md"}}]}, {"text": "Read it."})
    term = chat(project, data_dir, model)
    term.expect_status("agent · ")
    term.type("the first question\r")
    term.expect("[turn completed]")
    term.type("read the readme\r")
    term.expect("[turn completed]")
    term.type("\x04")
    assert term.close() == 0
    [session] = cli_json(data_dir, "sessions", "list")

    again = Terminal([sys.executable, "-m", "pidesk", "chat", str(project), "--continue", "--data-dir",
                      str(data_dir), "--model", model])
    again.expect("› the first question")
    again.expect("The answer to the first question.")
    again.expect("▸ Read")
    again.expect("✓ Read")
    again.expect("Read it.")
    again.expect_status("agent · ")
    again.type("\x04")
    assert again.close() == 0
    assert [s["id"] for s in cli_json(data_dir, "sessions", "list")] == [session["id"]]


def test_tool_calls_read_as_one_line_summaries_not_raw_json():
    """Issue 31 §3: `▸ Write {"path": "NOTES.md", "content": "# Notes\\n\\nWritten by…` became the JSON of the
    call; each is now the argument that says what it does."""
    from pidesk.cli.say import tool_line

    assert tool_line("Read", {"path": "src/app.py", "offset": 10}) == "▸ Read src/app.py"
    assert tool_line("Write", {"path": "NOTES.md", "content": "a\nb\nc\n"}) == "▸ Write NOTES.md (3 lines)"
    assert tool_line("Bash", {"command": "make test\nmake lint"}) == "▸ Bash $ make test …"
    assert tool_line("Grep", {"pattern": "def ", "path": "src"}) == "▸ Grep 'def ' in src"
    assert tool_line("mcp__web__fetch", {"url": "http://x"}) == "▸ mcp__web__fetch url='http://x'"
    assert len(tool_line("Bash", {"command": "x" * 500})) == 100
