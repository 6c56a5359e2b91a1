"""The event vocabulary: a closed union of frozen structs, one per PROTOCOL.md event.

Events are emitted only after what they announce is durable. The bus stamps each
with a host-wide rising ``seq`` when it is published (``encode_event``).
"""

from __future__ import annotations

import msgspec

from pidesk.core.records import (
    Message,
    Notification,
    PermissionRequest,
    PlanApproval,
    QueueEntry,
    Session,
)


class Event(msgspec.Struct, rename="camel", kw_only=True, frozen=True, tag_field="type"):
    pass


class SessionUpdated(Event, tag="session.updated", frozen=True):
    session: Session


class SessionDeleted(Event, tag="session.deleted", frozen=True):
    session_id: str


class SessionTruncated(Event, tag="session.truncated", frozen=True):
    """A smart stop cut the transcript: messages with seq >= ``from_seq`` are gone."""

    session_id: str
    from_seq: int


class TurnStarted(Event, tag="turn.started", frozen=True):
    session_id: str
    turn_id: str
    origin: str


class MessageDelta(Event, tag="message.delta", frozen=True):
    session_id: str
    turn_id: str
    message_id: str
    text: str


class MessageAppended(Event, tag="message.appended", frozen=True):
    session_id: str
    turn_id: str | None
    message: Message


class ToolStarted(Event, tag="tool.started", frozen=True):
    session_id: str
    turn_id: str
    tool_call_id: str
    name: str
    args: dict[str, object]


class ToolFinished(Event, tag="tool.finished", frozen=True):
    session_id: str
    turn_id: str
    tool_call_id: str
    name: str
    ok: bool
    duration_ms: int
    error_code: str | None = None


class PermissionRequested(Event, tag="permission.requested", frozen=True):
    request: PermissionRequest


class PermissionResolved(Event, tag="permission.resolved", frozen=True):
    request: PermissionRequest


class PlanRequested(Event, tag="plan.requested", frozen=True):
    approval: PlanApproval


class PlanResolved(Event, tag="plan.resolved", frozen=True):
    approval: PlanApproval


class ExecutionChanged(Event, tag="execution.changed", frozen=True):
    approval_id: str
    session_id: str
    execution_id: str
    execution_state: str


class QueueChanged(Event, tag="queue.changed", frozen=True):
    session_id: str
    entries: list[QueueEntry]


class TurnEnded(Event, tag="turn.ended", frozen=True):
    session_id: str
    turn_id: str
    reason: str
    error_code: str | None = None
    # the human-readable cause of an ``error`` outcome (the provider's status and message, the
    # connection failure, the retries spent), secrets redacted (PROTOCOL.md "Additions")
    error_message: str | None = None


class TurnRetrying(Event, tag="turn.retrying", frozen=True):
    """A model request failed in a way worth trying again and is sent again after ``wait_s`` seconds."""

    session_id: str
    turn_id: str
    attempt: int
    of: int
    wait_s: float
    reason: str


class ContextCompacted(Event, tag="context.compacted", frozen=True):
    session_id: str
    turn_id: str | None
    message_id: str
    reason: str
    tokens_before: int
    tokens_after: int
    summary: str


class NotificationCreated(Event, tag="notification.created", frozen=True):
    notification: Notification


AnyEvent = (
    SessionUpdated
    | SessionDeleted
    | SessionTruncated
    | TurnStarted
    | MessageDelta
    | MessageAppended
    | ToolStarted
    | ToolFinished
    | PermissionRequested
    | PermissionResolved
    | PlanRequested
    | PlanResolved
    | ExecutionChanged
    | QueueChanged
    | TurnEnded
    | TurnRetrying
    | ContextCompacted
    | NotificationCreated
)


def event_payload(event: AnyEvent, seq: int) -> dict[str, object]:
    """The ``params`` of an ``event`` notification: the event's fields plus ``seq``."""
    payload: dict[str, object] = msgspec.to_builtins(event)
    payload["seq"] = seq
    return payload
