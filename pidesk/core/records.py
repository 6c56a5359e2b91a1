"""The values pidesk stores and sends: PROTOCOL.md's objects as msgspec Structs.

Field names are snake_case in Python and camelCase on the wire and on disk
(``rename="camel"``). Values are pure; the store assigns identity (ids, seq).
"""

from __future__ import annotations

from typing import Any

import msgspec

from pidesk.core.modes import (
    ApprovalStatus,
    ExecutionState,
    Mode,
    NotificationKind,
    PermissionMode,
    PermissionStatus,
    PlanKind,
    PlanState,
    SessionStatus,
    TurnOrigin,
    TurnReason,
    TurnState,
)


class Record(msgspec.Struct, rename="camel", kw_only=True, omit_defaults=False):
    pass


# ---- message content blocks -------------------------------------------------------


class TextBlock(Record, tag="text", tag_field="type"):
    text: str


class ToolCallBlock(Record, tag="toolCall", tag_field="type"):
    id: str
    name: str
    args: dict[str, Any]


class ToolResultBlock(Record, tag="toolResult", tag_field="type"):
    tool_call_id: str
    name: str
    ok: bool
    output: str
    error_code: str | None = None
    duration_ms: int | None = None  # how long the tool ran (a pidesk addition)


class AttachmentBlock(Record, tag="attachment", tag_field="type"):
    kind: str  # "file" | "image"
    name: str
    mime: str
    size: int
    ref: str


class ThinkingBlock(Record, tag="thinking", tag_field="type"):
    """Model reasoning, kept in the transcript in order (PROTOCOL.md "Additions").

    ``redacted``: the vendor sent the reasoning encrypted (``text`` is empty). ``opaque``
    holds what the vendor needs to receive the block back unchanged, keyed by the vendor
    that wrote it: ``{"vendor": "anthropic", "signature": …}`` or ``{"vendor": "anthropic",
    "data": …}`` (redacted_thinking), ``{"vendor": "openai-responses", "id": …,
    "encrypted_content": …, "summary": [...]}``. It is for the host only: clients ignore it,
    and a provider sends a block back only when the block is its own vendor's.
    """

    text: str
    redacted: bool = False
    opaque: dict[str, Any] | None = None


class CompactionBlock(Record, tag="compaction", tag_field="type"):
    """Where the model's view of a session starts again (PROTOCOL.md "Turn-3 additions"): the
    messages before it reach the model only as ``summary``. The host's own message (role
    ``user``); the transcript keeps every message before it. ``reason``: ``auto`` (the window
    was filling), ``manual`` (``session.compact``, an approval with ``context: "compact"``),
    ``fresh`` (an approval with ``context: "fresh"``: no summary, the view starts at the
    contract)."""

    summary: str
    reason: str
    tokens_before: int
    tokens_after: int
    # the view keeps the messages from this seq on (up to this message) verbatim: the request being
    # worked on, or an execution's instructions; None: none (a pidesk addition)
    kept_from_seq: int | None = None


Block = TextBlock | ToolCallBlock | ToolResultBlock | AttachmentBlock | ThinkingBlock | CompactionBlock


class Attachment(Record):
    """An attachment as a client sends it: a reference, never inline bytes."""

    kind: str
    name: str
    mime: str
    size: int
    ref: str


class Message(Record):
    id: str
    session_id: str
    turn_id: str | None
    seq: int
    role: str  # "user" | "assistant" | "tool"
    content: list[Block]
    created_at: str

    def text(self) -> str:
        return "".join(b.text for b in self.content if isinstance(b, TextBlock))

    def tool_calls(self) -> list[ToolCallBlock]:
        return [b for b in self.content if isinstance(b, ToolCallBlock)]


# ---- host objects -----------------------------------------------------------------


class ForkedFrom(Record):
    session_id: str
    through_message_id: str | None


class Usage(Record):
    input_tokens: int = 0
    output_tokens: int = 0
    cache_tokens: int = 0  # cache_read_tokens + cache_write_tokens
    cache_read_tokens: int = 0  # input read from the vendor's prompt cache
    cache_write_tokens: int = 0  # input written to it (Anthropic's cache_creation_input_tokens)


class Session(Record):
    id: str
    title: str
    project_path: str | None
    root: str
    mode: Mode
    permission_mode: PermissionMode
    status: SessionStatus
    plan_state: PlanState
    current_turn_id: str | None
    forked_from: ForkedFrom | None
    created_at: str
    updated_at: str
    usage: Usage = msgspec.field(default_factory=Usage)  # summed over the session's turns


class Turn(Record):
    id: str
    session_id: str
    seq: int
    origin: TurnOrigin
    state: TurnState
    reason: TurnReason | None
    error_code: str | None
    started_at: str
    ended_at: str | None
    usage: Usage
    error_message: str | None = None  # why an ``error`` turn failed, for a person (PROTOCOL.md "Additions")


class PlanApproval(Record):
    id: str
    kind: PlanKind
    session_id: str
    turn_id: str
    tool_call_id: str
    title: str
    question: str
    criteria: list[str] | None
    artifact_path: str
    artifact_sha256: str
    artifact_size: int
    status: ApprovalStatus
    deadline: str
    permission_mode: PermissionMode | None
    execution_id: str | None
    execution_state: ExecutionState
    revises: str | None
    feedback: str | None
    created_at: str
    resolved_at: str | None
    # what the execution's view of the conversation starts from (issue 30): "keep" | "compact" | "fresh"
    context: str = "keep"


class PermissionRequest(Record):
    id: str
    session_id: str
    turn_id: str
    tool_call_id: str
    tool: str
    args: dict[str, Any]
    status: PermissionStatus
    created_at: str
    resolved_at: str | None
    preview: dict[str, Any] | None = None  # {diff, overwrites} for Write and Edit (issue 17)
    escalated: bool = False  # a Bash command asking to run outside the sandbox (issue 28; args carry why)


class Notification(Record, gc=False):  # (scalars only: never in a cycle, so never walked by the collector)
    id: str
    session_id: str
    turn_id: str
    kind: NotificationKind
    created_at: str
    seen_at: str | None


class QueueEntry(Record):
    id: str
    session_id: str
    position: int
    text: str
    attachments: list[Attachment]
    created_at: str


class AuditEntry(Record):
    id: int
    session_id: str | None
    turn_id: str | None
    action: str
    detail: dict[str, Any]
    created_at: str


class Draft(Record):
    """A composer snapshot returned by a smart stop: the text and attachment refs as sent."""

    text: str
    attachments: list[Attachment]


class ScheduleRun(Record):
    id: str
    at: str
    status: str  # "running" | "ok" | "failed" | "skipped"
    error_code: str | None
    session_id: str | None


class Schedule(Record):
    id: str
    name: str
    cron: str
    project_path: str
    prompt: str
    mode: Mode
    permission_mode: PermissionMode
    enabled: bool
    next_run_at: str
    last_run: ScheduleRun | None
