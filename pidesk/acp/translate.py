"""What a pidesk session's records and events look like in ACP: pure functions, no I/O.

``pidesk.acp.agent`` feeds them the host's wire payloads (camelCase, PROTOCOL.md) and sends what
they return; keeping them here makes every mapping readable in one place and testable alone.
"""

from __future__ import annotations

import json
import os
from typing import Any, Literal

from acp.schema import (
    AgentMessageChunk,
    AgentThoughtChunk,
    ContentToolCallContent,
    FileEditToolCallContent,
    PermissionOption,
    PlanEntry,
    SessionMode,
    SessionModeState,
    TextContentBlock,
    ToolCallLocation,
    ToolCallProgress,
    ToolCallStart,
    UserMessageChunk,
)

ToolKind = Literal["read", "edit", "delete", "move", "search", "execute", "think", "fetch", "switch_mode", "other"]
StopReason = Literal["end_turn", "max_tokens", "max_turn_requests", "refusal", "cancelled"]

MAX_TOOL_TEXT = 20_000  # characters of a tool's output shown in the editor (the model saw it all)

# The seeds' meaning of each mode, as an editor's mode picker shows it.
MODES = [
    SessionMode(id="agent", name="Agent",
                description="Works on the project: reads, edits and runs commands, asking as the permission mode says."),
    SessionMode(id="plan", name="Plan",
                description="Investigates without changing anything, then submits a plan for you to approve; "
                            "approving switches to Agent and runs it."),
    SessionMode(id="goal", name="Goal",
                description="Investigates, then submits a goal with acceptance criteria; once approved it works "
                            "until every criterion is met or one is blocked."),
]
MODE_IDS = frozenset(mode.id for mode in MODES)

_KINDS: dict[str, ToolKind] = {
    "Read": "read", "Glob": "search", "Grep": "search", "Write": "edit", "Edit": "edit", "Bash": "execute",
    "BrowserPreview": "fetch", "EnterPlanMode": "switch_mode", "EnterGoalMode": "switch_mode",
    "SubmitPlan": "switch_mode", "SubmitGoal": "switch_mode", "ReportCriteria": "think", "NewContext": "think",
    "Task": "think", "TaskWait": "think",
}

# A contract's approval, as options of session/request_permission: which permission mode the
# execution runs under, or a rejection.
CONTRACT_OPTIONS = [
    PermissionOption(option_id="approve-ask", name="Approve — ask before each edit or command", kind="allow_once"),
    PermissionOption(option_id="approve-accept-edits", name="Approve — accept edits, ask before commands",
                     kind="allow_once"),
    PermissionOption(option_id="approve-auto", name="Approve — auto: run everything without asking (dangerous)",
                     kind="allow_once"),
    PermissionOption(option_id="reject", name="Reject (say why in your next message)", kind="reject_once"),
]
CONTRACT_CHOICES: dict[str, str | None] = {
    "approve-ask": "ask", "approve-accept-edits": "accept-edits", "approve-auto": "auto", "reject": None,
}

PERMISSION_CHOICES: dict[str, tuple[str, str | None]] = {
    "allow-once": ("allow", None), "allow-session": ("allow", "session"), "reject": ("deny", None),
}


def mode_state(current: str) -> SessionModeState:
    return SessionModeState(current_mode_id=current, available_modes=MODES)


def tool_kind(name: str) -> ToolKind:
    return _KINDS.get(name, "other")


def tool_title(name: str, args: dict[str, Any]) -> str:
    """``Read src/app.py``, ``$ pytest -q``: the call as a person reads it (plugins: their name)."""
    def text(key: str) -> str:
        value = args.get(key)
        return value if isinstance(value, str) else ""

    if name == "Bash":
        first = text("command").splitlines()[0] if text("command") else ""
        outside = " (outside the sandbox)" if args.get("escalate") is True else ""
        return f"$ {first}{' …' if chr(10) in text('command') else ''}{outside}"
    summary = {
        "Read": text("path"), "Write": text("path"), "Edit": text("path"), "Glob": text("pattern"),
        "Grep": repr(text("pattern")) + (f" in {text('path')}" if text("path") else ""),
        "BrowserPreview": text("url"), "Task": text("description"),
        "SubmitPlan": text("title"), "SubmitGoal": text("title"),
    }.get(name, "")
    return f"{name} {summary}".strip()


def locations(name: str, args: dict[str, Any], root: str) -> list[ToolCallLocation] | None:
    """The file a call works on, absolute, so an editor can follow along."""
    path = args.get("path")
    if name not in ("Read", "Write", "Edit") or not isinstance(path, str) or not path:
        return None
    line = args.get("offset") if name == "Read" and isinstance(args.get("offset"), int) else None
    return [ToolCallLocation(path=os.path.join(root, path), line=line)]


def call_content(name: str, args: dict[str, Any], root: str) -> list[Any] | None:
    """What a call shows before it runs: a Write or Edit as the change it makes; a Bash command's text."""
    path = args.get("path")
    if name == "Write" and isinstance(path, str) and isinstance(args.get("content"), str):
        return [FileEditToolCallContent(type="diff", path=os.path.join(root, path), old_text=None,
                                        new_text=args["content"])]
    if name == "Edit" and isinstance(path, str) and isinstance(args.get("newText"), str):
        old = args.get("oldText")
        return [FileEditToolCallContent(type="diff", path=os.path.join(root, path),
                                        old_text=old if isinstance(old, str) else None, new_text=args["newText"])]
    return None


def text_content(text: str) -> ContentToolCallContent:
    return ContentToolCallContent(type="content", content=TextContentBlock(type="text", text=text))


def clip(text: str, limit: int = MAX_TOOL_TEXT) -> str:
    return text if len(text) <= limit else text[:limit] + f"\n… ({len(text) - limit:,} more characters)"


def tool_started(call_id: str, name: str, args: dict[str, Any], root: str) -> ToolCallStart:
    return ToolCallStart(session_update="tool_call", tool_call_id=call_id, title=tool_title(name, args),
                         kind=tool_kind(name), status="in_progress", raw_input=args,
                         locations=locations(name, args, root), content=call_content(name, args, root))


def tool_result(result: dict[str, Any]) -> ToolCallProgress:
    """A ``toolResult`` block as the call's last update: its status, and its output as text (a Write or
    Edit keeps its diff: its output only says it was done)."""
    ok = bool(result.get("ok"))
    output = result.get("output")
    text = output if isinstance(output, str) else json.dumps(output)
    if not ok and result.get("errorCode") and result["errorCode"] not in text:
        text = f"{result['errorCode']}: {text}"
    shows_output = result.get("name") not in ("Write", "Edit") or not ok
    return ToolCallProgress(session_update="tool_call_update", tool_call_id=str(result.get("toolCallId")),
                            status="completed" if ok else "failed",
                            content=[text_content(clip(text))] if shows_output and text else None)


def permission_call(request: dict[str, Any], root: str) -> ToolCallProgress:
    """The ``toolCall`` of a permission's session/request_permission: what would run, and, for a command
    outside the sandbox, that it would and the agent's reason."""
    name, args = str(request.get("tool")), request.get("args") or {}
    content: list[Any] = []
    if request.get("escalated"):
        why = args.get("justification")
        content.append(text_content(
            "The agent asks to run this command WITHOUT the sandbox: it would have your full power (every file "
            "you can touch, the network).\nIts reason: " + (why.strip() if isinstance(why, str) and why.strip()
                                                            else "(none given)")))
    preview = request.get("preview") or {}
    if isinstance(preview.get("diff"), str) and preview["diff"]:
        content.append(text_content(clip(preview["diff"])))
    else:
        content += call_content(name, args, root) or []
    if name == "Bash" and isinstance(args.get("command"), str):
        content.append(text_content("$ " + args["command"]))
    return ToolCallProgress(session_update="tool_call_update", tool_call_id=str(request.get("toolCallId")),
                            title=tool_title(name, args), kind=tool_kind(name), raw_input=args,
                            locations=locations(name, args, root), content=content or None)


def permission_options(request: dict[str, Any]) -> list[PermissionOption]:
    tool = "commands outside the sandbox" if request.get("escalated") else str(request.get("tool"))
    return [
        PermissionOption(option_id="allow-once", name="Allow once", kind="allow_once"),
        PermissionOption(option_id="allow-session", name=f"Allow {tool} for this session", kind="allow_always"),
        PermissionOption(option_id="reject", name="Reject", kind="reject_once"),
    ]


def contract_call(approval: dict[str, Any], markdown: str) -> ToolCallProgress:
    """A submitted plan or goal as the toolCall of its session/request_permission: the contract's Markdown,
    its question, and a goal's criteria."""
    kind = "Goal" if approval.get("kind") == "goal" else "Plan"
    parts = [markdown.strip()]
    criteria = approval.get("criteria") or []
    if criteria:
        parts.append("Acceptance criteria:\n" + "\n".join(f"- {c}" for c in criteria))
    if approval.get("question"):
        parts.append(str(approval["question"]))
    parts.append(f"({approval.get('artifactPath')}, sha256 {str(approval.get('artifactSha256'))[:12]}…)")
    return ToolCallProgress(session_update="tool_call_update", tool_call_id=str(approval.get("toolCallId")),
                            title=f"{kind}: {approval.get('title')}", kind="switch_mode",
                            content=[text_content("\n\n".join(parts))])


def criteria_entries(criteria: list[str], reported: dict[str, str]) -> list[PlanEntry]:
    """A goal's criteria as an ACP plan: met ones completed, reported unmet ones in progress."""
    status = {"met": "completed", "unmet": "in_progress"}
    return [PlanEntry(content=c, priority="high", status=status.get(reported.get(c, ""), "pending"))  # type: ignore[arg-type]
            for c in criteria]


def stop_reason(reason: str | None, cancelled: bool) -> StopReason:
    if reason == "aborted" or cancelled:
        return "cancelled"
    if reason == "error":
        return "refusal"
    return "end_turn"


def failure_text(event: dict[str, Any]) -> str:
    """How a failed turn's cause reads in the editor (``refusal`` says only that it failed)."""
    code = event.get("errorCode") or "ERROR"
    message = event.get("errorMessage")
    return f"\n\n[the turn failed: {code}{': ' + message if message else ''}]"


def history(messages: list[dict[str, Any]], root: str) -> list[Any]:
    """A session's messages as the session/update notifications session/load replays, in order."""
    updates: list[Any] = []
    for message in messages:
        role = message.get("role")
        for block in message.get("content") or []:
            kind = block.get("type")
            if kind == "text" and block.get("text"):
                chunk = TextContentBlock(type="text", text=block["text"])
                updates.append(UserMessageChunk(session_update="user_message_chunk", content=chunk) if role == "user"
                               else AgentMessageChunk(session_update="agent_message_chunk", content=chunk))
            elif kind == "thinking" and block.get("text") and not block.get("redacted"):
                updates.append(AgentThoughtChunk(session_update="agent_thought_chunk",
                                                 content=TextContentBlock(type="text", text=block["text"])))
            elif kind == "toolCall":
                updates.append(tool_started(str(block.get("id")), str(block.get("name")), block.get("args") or {},
                                            root))
            elif kind == "toolResult":
                updates.append(tool_result(block))
            elif kind == "compaction":
                updates.append(AgentMessageChunk(session_update="agent_message_chunk", content=TextContentBlock(
                    type="text", text=f"\n\n── context compacted ({block.get('reason')}) ──\n\n")))
    return updates
