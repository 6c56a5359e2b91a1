"""`pidesk acp` driven by the official ACP Python SDK's client side (`acp.spawn_agent_process`), as an
editor drives it: a real `pidesk acp` process on pipes, with its host embedded (the suite's
PIDESK_EMBEDDED=1) or a real `pidesk serve` it attaches to. The model is the scripted provider
(`--model scripted/<file>`): what the agent does is fixed, what pidesk and the editor make of it
is under test.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import acp
from acp.schema import AllowedOutcome, DeniedOutcome, RequestPermissionResponse

pytestmark = pytest.mark.timeout(90)

ATTACHED_ENV = {k: v for k, v in os.environ.items() if k != "PIDESK_EMBEDDED"}
PLUGIN_SERVER = Path(__file__).parents[1] / "plugins" / "mcp_demo_server.py"


@dataclass
class Editor:
    """The editor's side: it records every session/update and answers each request_permission with the
    next of ``answers`` (an option id, or None: the request is cancelled)."""

    answers: list[str | None] = field(default_factory=list)
    updates: list[dict[str, Any]] = field(default_factory=list)
    asked: list[dict[str, Any]] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    async def request_permission(self, options: Any, session_id: str, tool_call: Any, **_: Any) -> Any:
        self.asked.append({"options": [(o.option_id, o.kind, o.name) for o in options],
                           "toolCall": tool_call.model_dump(by_alias=True, exclude_none=True)})
        self.changed.set()
        choice = self.answers.pop(0) if self.answers else None
        if choice is None:
            return RequestPermissionResponse(outcome=DeniedOutcome(outcome="cancelled"))
        return RequestPermissionResponse(outcome=AllowedOutcome(outcome="selected", option_id=choice))

    async def session_update(self, session_id: str, update: Any, **_: Any) -> None:
        self.updates.append(update.model_dump(by_alias=True, exclude_none=True))
        self.changed.set()

    def on_connect(self, conn: Any) -> None:
        pass

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [u for u in self.updates if u["sessionUpdate"] == kind]

    def said(self) -> str:
        return "".join(u["content"]["text"] for u in self.of("agent_message_chunk"))

    async def wait_for(self, check: Callable[[], bool], timeout: float = 30.0) -> None:
        async with asyncio.timeout(timeout):
            while not check():
                self.changed.clear()
                await self.changed.wait()


def script(tmp_path: Path, *responses: dict[str, Any]) -> str:
    path = tmp_path / "model.json"
    path.write_text(json.dumps({"responses": list(responses)}))
    return f"scripted/{path}"


@asynccontextmanager
async def pidesk_acp(editor: Editor, data_dir: Path, model: str, *, env: dict[str, str] | None = None
                     ) -> AsyncIterator[Any]:
    async with acp.spawn_agent_process(editor, sys.executable, "-m", "pidesk", "acp", "--data-dir", str(data_dir),
                                       "--model", model, env=env or dict(os.environ)) as (conn, _process):
        init = await conn.initialize(protocol_version=1)
        assert init.protocol_version == 1
        yield conn


@asynccontextmanager
async def served_host(data_dir: Path, model: str) -> AsyncIterator[None]:
    """A real `pidesk serve` on the data dir, as a user runs one: `pidesk acp` attaches to it."""
    server = subprocess.Popen([sys.executable, "-m", "pidesk", "serve", "--no-open", "--data-dir", str(data_dir),
                               "--model", model], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                              env=ATTACHED_ENV)
    try:
        assert server.stdout is not None and server.stdout.readline().startswith("pidesk serving at ")
        yield
    finally:
        server.terminate()
        server.wait(timeout=30)


@asynccontextmanager
async def _nothing() -> AsyncIterator[None]:
    yield


@asynccontextmanager
async def editor_on(editor: Editor, data_dir: Path, model: str, attached: bool) -> AsyncIterator[Any]:
    """`pidesk acp` with its host embedded, or attached to a `pidesk serve` of the same data dir."""
    async with served_host(data_dir, model) if attached else _nothing(), \
            pidesk_acp(editor, data_dir, model, env=ATTACHED_ENV if attached else None) as conn:
        yield conn


BOTH = pytest.mark.parametrize("attached", [False, True], ids=["embedded", "attached"])


PLAN = {"text": "Here is my plan.", "toolCalls": [{"name": "SubmitPlan", "args": {
    "title": "Add notes", "markdown": "# Add notes\n\n1. Write NOTES.md saying hello.", "question": "Shall I?"}}]}
WRITE = {"text": "Writing it.", "toolCalls": [{"name": "Write", "args": {"path": "NOTES.md", "content": "hello\n"}}]}


@BOTH
@pytest.mark.asyncio
async def test_a_plan_is_approved_in_the_editor_and_runs_in_the_same_prompt(project, data_dir, tmp_path, attached):
    """Plan mode → the contract as session/request_permission (its Markdown, approve under ask /
    accept-edits / auto, reject) → approve (ask) → the execution streams in the same prompt, the editor
    told the mode is Agent now, and the execution's Write asks in turn."""
    model = script(tmp_path, PLAN, WRITE, {"text": "Done: NOTES.md says hello."})
    editor = Editor(answers=["approve-ask", "allow-once"])
    async with editor_on(editor, data_dir, model, attached) as conn:
        session = await conn.new_session(cwd=str(project), mcp_servers=[])
        assert session.modes is not None
        assert [m.id for m in session.modes.available_modes] == ["agent", "plan", "goal"]
        assert session.modes.current_mode_id == "agent"
        await conn.set_session_mode(session_id=session.session_id, mode_id="plan")
        done = await conn.prompt(session_id=session.session_id, prompt=[acp.text_block("add a notes file")])
        if attached:  # the session is the host's: any other client of it sees it
            listed = subprocess.run([sys.executable, "-m", "pidesk", "sessions", "list", "--data-dir", str(data_dir),
                                     "--json"], capture_output=True, text=True, env=ATTACHED_ENV, timeout=60)
            assert session.session_id in listed.stdout

    assert done.stop_reason == "end_turn"
    assert (project / "NOTES.md").read_text() == "hello\n"
    contract, write = editor.asked
    assert [o[0] for o in contract["options"]] == ["approve-ask", "approve-accept-edits", "approve-auto", "reject"]
    assert [o[1] for o in contract["options"]] == ["allow_once"] * 3 + ["reject_once"]
    assert "dangerous" in contract["options"][2][2]
    assert "1. Write NOTES.md saying hello." in contract["toolCall"]["content"][0]["content"]["text"]
    assert write["toolCall"]["title"] == "Write NOTES.md"
    assert [o[1] for o in write["options"]] == ["allow_once", "allow_always", "reject_once"]
    modes = [u["currentModeId"] for u in editor.of("current_mode_update")]
    assert modes == ["plan", "agent"]  # set by the editor, then the approval's switch
    assert "Here is my plan." in editor.said() and "Done: NOTES.md says hello." in editor.said()
    edit = next(u for u in editor.of("tool_call") if u["title"] == "Write NOTES.md")
    assert edit["kind"] == "edit"
    assert edit["content"] == [{"type": "diff", "path": str(project / "NOTES.md"), "newText": "hello\n"}]
    assert edit["locations"] == [{"path": str(project / "NOTES.md")}]


@pytest.mark.asyncio
async def test_a_rejected_plan_is_revised_from_the_next_prompt(project, data_dir, tmp_path):
    """Reject → the prompt ends, nothing written, the session still in Plan; the next prompt is the
    feedback, and the agent's revised plan is asked again."""
    revised = {"toolCalls": [{"name": "SubmitPlan", "args": {
        "title": "Add notes and a test", "markdown": "# Add notes\n\n1. Write NOTES.md.\n2. Test it.",
        "question": "Better?"}}]}
    editor = Editor(answers=["reject", "reject"])
    async with pidesk_acp(editor, data_dir, script(tmp_path, PLAN, revised)) as conn:
        session = await conn.new_session(cwd=str(project), mcp_servers=[])
        await conn.set_session_mode(session_id=session.session_id, mode_id="plan")
        first = await conn.prompt(session_id=session.session_id, prompt=[acp.text_block("add notes")])
        second = await conn.prompt(session_id=session.session_id, prompt=[acp.text_block("also add a test")])
    assert (first.stop_reason, second.stop_reason) == ("end_turn", "end_turn")
    assert [a["toolCall"]["title"] for a in editor.asked] == ["Plan: Add notes", "Plan: Add notes and a test"]
    assert "2. Test it." in editor.asked[1]["toolCall"]["content"][0]["content"]["text"]
    assert [u["currentModeId"] for u in editor.of("current_mode_update")] == ["plan"]  # never left Plan
    assert not (project / "NOTES.md").exists()
    rejected = next(u for u in editor.of("tool_call_update") if u.get("status") == "failed")
    assert "PLAN_REJECTED" in rejected["content"][0]["content"]["text"]


@BOTH
@pytest.mark.asyncio
async def test_bash_asks_and_the_editor_allows_or_rejects(project, data_dir, tmp_path, attached):
    """A Bash call under ask is a request_permission: allowed, its output is shown as text; rejected, the
    call fails and says so. An escalated one (outside the sandbox) shows the agent's reason."""
    model = script(tmp_path,
                   {"toolCalls": [{"name": "Bash", "args": {"command": "echo from-bash"}}]},
                   {"toolCalls": [{"name": "Bash", "args": {"command": "echo never"}}]},
                   {"toolCalls": [{"name": "Bash", "args": {"command": "echo outside", "escalate": True,
                                                            "justification": "needs the network"}}]},
                   {"text": "That is all."})
    editor = Editor(answers=["allow-once", "reject", "reject"])
    async with editor_on(editor, data_dir, model, attached) as conn:
        session = await conn.new_session(cwd=str(project), mcp_servers=[])
        done = await conn.prompt(session_id=session.session_id, prompt=[acp.text_block("run things")])
    assert done.stop_reason == "end_turn"
    ran, refused, escalated = editor.asked
    assert ran["toolCall"]["title"] == "$ echo from-bash" and ran["toolCall"]["kind"] == "execute"
    ends = [u for u in editor.of("tool_call_update") if u.get("status") in ("completed", "failed")]
    assert ends[0]["status"] == "completed" and "from-bash" in ends[0]["content"][0]["content"]["text"]
    assert ends[1]["status"] == "failed" and "TOOL_DENIED" in ends[1]["content"][0]["content"]["text"]
    assert escalated["toolCall"]["title"] == "$ echo outside (outside the sandbox)"
    shown = " ".join(c["content"]["text"] for c in escalated["toolCall"]["content"] if c["type"] == "content")
    assert "WITHOUT the sandbox" in shown and "needs the network" in shown
    assert "commands outside the sandbox" in escalated["options"][1][2]


@BOTH
@pytest.mark.asyncio
async def test_cancel_mid_turn_ends_the_prompt_cancelled(project, data_dir, tmp_path, attached):
    """session/cancel while the model is still answering: the host aborts the turn and the prompt ends
    `cancelled`; the session takes the next prompt."""
    model = script(tmp_path, {"text": "Working on it.", "gateAfter": "never-released"}, {"text": "Back again."})
    editor = Editor()
    async with editor_on(editor, data_dir, model, attached) as conn:
        session = await conn.new_session(cwd=str(project), mcp_servers=[])
        prompt = asyncio.create_task(conn.prompt(session_id=session.session_id, prompt=[acp.text_block("wait")]))
        await editor.wait_for(lambda: "Working on it." in editor.said())  # the model now holds, mid-answer
        await conn.cancel(session_id=session.session_id)
        cancelled = await prompt
        again = await conn.prompt(session_id=session.session_id, prompt=[acp.text_block("and now?")])
    assert cancelled.stop_reason == "cancelled"
    assert again.stop_reason == "end_turn" and "Back again." in editor.said()


@pytest.mark.asyncio
async def test_load_replays_the_session(project, data_dir, tmp_path):
    """session/load of a session from an earlier connection replays its history as session/updates: the
    user's prompt, the agent's words and its tool call with its result."""
    model = script(tmp_path, {"text": "Reading.", "toolCalls": [{"name": "Read", "args": {"path": "README.md"}}]},
                   {"text": "It is a sample."})
    first = Editor()
    async with pidesk_acp(first, data_dir, model) as conn:
        session = await conn.new_session(cwd=str(project), mcp_servers=[])
        await conn.prompt(session_id=session.session_id, prompt=[acp.text_block("what is this project?")])
    later = Editor()
    async with pidesk_acp(later, data_dir, model) as conn:
        loaded = await conn.load_session(cwd=str(project), session_id=session.session_id, mcp_servers=[])
        listed = await conn.list_sessions(cwd=str(project))
    assert loaded is not None and loaded.modes is not None and loaded.modes.current_mode_id == "agent"
    kinds = [u["sessionUpdate"] for u in later.updates]
    assert kinds[0] == "user_message_chunk" and later.updates[0]["content"]["text"] == "what is this project?"
    assert "tool_call" in kinds and "tool_call_update" in kinds
    read = next(u for u in later.of("tool_call"))
    assert read["title"] == "Read README.md" and read["kind"] == "read"
    assert "Reading." in later.said() and "It is a sample." in later.said()
    assert [s.session_id for s in listed.sessions] == [session.session_id]


@BOTH
@pytest.mark.asyncio
async def test_an_editors_mcp_server_is_offered_in_agent_mode_and_denied_in_plan(project, data_dir, tmp_path, attached):
    """mcpServers in session/new run for that session under the configured servers' rules: in Agent mode
    the model's call reaches the server (asking first: its tools carry no hints); in Plan mode the same
    call is denied whatever the editor would answer."""
    call = {"toolCalls": [{"name": "mcp__demo__echo", "args": {"text": "from the editor's server"}}]}
    model = script(tmp_path, call, {"text": "Echoed."}, call, {"text": "Denied, as expected."})
    editor = Editor(answers=["allow-once", "allow-once"])
    server = acp.schema.McpServerStdio(name="demo", command=sys.executable, args=[str(PLUGIN_SERVER)], env=[])
    async with editor_on(editor, data_dir, model, attached) as conn:
        session = await conn.new_session(cwd=str(project), mcp_servers=[server])
        await conn.prompt(session_id=session.session_id, prompt=[acp.text_block("echo something")])
        await conn.set_session_mode(session_id=session.session_id, mode_id="plan")
        await conn.prompt(session_id=session.session_id, prompt=[acp.text_block("echo again")])
    ends = [u for u in editor.of("tool_call_update") if u.get("status") in ("completed", "failed")]
    assert ends[0]["status"] == "completed"
    assert "from the editor's server" in ends[0]["content"][0]["content"]["text"]
    assert ends[1]["status"] == "failed" and "DISABLED_IN_PLAN" in ends[1]["content"][0]["content"]["text"]
    assert len(editor.asked) == 1  # Plan mode denied it before anyone was asked


def test_bad_messages_get_json_rpc_errors_and_the_process_keeps_serving(data_dir, tmp_path):
    """What a broken or hurried client sends: a line that is not JSON (-32700), JSON that is no request
    (-32600), a prompt before initialize (-32600), an unknown method (-32601), a prompt for a session
    never opened (-32002), bad params (-32602) — each answered, and then a real request still works."""
    lines = [
        b"this is not json\n",
        b"[1, 2, 3]\n",
        json.dumps({"jsonrpc": "2.0", "id": 1, "method": "session/prompt",
                    "params": {"sessionId": "s_nope", "prompt": []}}).encode() + b"\n",
        json.dumps({"jsonrpc": "2.0", "id": 2, "method": "initialize", "params": {"protocolVersion": 1}}).encode() + b"\n",
        json.dumps({"jsonrpc": "2.0", "id": 3, "method": "session/teleport", "params": {}}).encode() + b"\n",
        json.dumps({"jsonrpc": "2.0", "id": 4, "method": "session/prompt",
                    "params": {"sessionId": "s_nope", "prompt": [{"type": "text", "text": "hi"}]}}).encode() + b"\n",
        json.dumps({"jsonrpc": "2.0", "id": 5, "method": "session/new", "params": {"cwd": 42}}).encode() + b"\n",
        json.dumps({"jsonrpc": "2.0", "id": 6, "method": "session/list", "params": {}}).encode() + b"\n",
    ]
    process = subprocess.Popen([sys.executable, "-m", "pidesk", "acp", "--data-dir", str(data_dir), "--model",
                                script(tmp_path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL)
    try:
        assert process.stdin is not None and process.stdout is not None
        answers = []
        for line in lines:
            process.stdin.write(line)
            process.stdin.flush()
            answers.append(json.loads(process.stdout.readline()))
    finally:
        process.kill()
        process.wait(timeout=30)
    codes = [a.get("error", {}).get("code") for a in answers]
    assert codes == [-32700, -32600, -32600, None, -32601, -32002, -32602, None]
    assert answers[0]["id"] is None and answers[2]["id"] == 1
    assert answers[3]["result"]["protocolVersion"] == 1
    assert answers[7]["result"]["sessions"] == []


@pytest.mark.asyncio
async def test_a_goals_criteria_are_an_acp_plan_ticked_as_they_are_met(project, data_dir, tmp_path):
    """Goal mode: the approved goal's criteria become the editor's plan, each entry `completed` once the
    agent reports it met; the prompt ends when the execution does, with the window's usage reported."""
    criteria = ["NOTES.md exists", "it says hello"]
    goal = {"toolCalls": [{"name": "SubmitGoal", "args": {
        "title": "Notes", "markdown": "# Notes\n\nA NOTES.md saying hello.", "question": "Agreed?",
        "criteria": criteria}}]}

    def report(*met: str) -> dict[str, Any]:
        return {"toolCalls": [{"name": "ReportCriteria", "args": {"results": [
            {"criterion": c, "outcome": "met" if c in met else "unmet", "evidence": "checked"} for c in criteria]}}]}

    model = script(tmp_path, goal, {"toolCalls": [{"name": "Write", "args": {"path": "NOTES.md", "content": "hi\n"}}]},
                   report(criteria[0]), report(*criteria), {"text": "Both met."})
    editor = Editor(answers=["approve-accept-edits"])
    async with pidesk_acp(editor, data_dir, model) as conn:
        session = await conn.new_session(cwd=str(project), mcp_servers=[])
        await conn.set_session_mode(session_id=session.session_id, mode_id="goal")
        done = await conn.prompt(session_id=session.session_id, prompt=[acp.text_block("make notes")])
    assert done.stop_reason == "end_turn"
    assert "Acceptance criteria:\n- NOTES.md exists\n- it says hello" in \
        editor.asked[0]["toolCall"]["content"][0]["content"]["text"]
    plans = [[(e["content"], e["status"]) for e in u["entries"]] for u in editor.of("plan")]
    assert plans[0] == [("NOTES.md exists", "pending"), ("it says hello", "pending")]
    assert ("NOTES.md exists", "completed") in plans[1] and ("it says hello", "in_progress") in plans[1]
    assert plans[-1] == [("NOTES.md exists", "completed"), ("it says hello", "completed")]
    usage = editor.of("usage_update")[-1]
    assert usage["size"] == 128_000 and 0 < usage["used"] < usage["size"]
