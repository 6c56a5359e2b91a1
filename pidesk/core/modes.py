"""The closed vocabularies of pidesk's state: every value a stored field may hold.

Values are the exact strings of PROTOCOL.md and of the store's columns.
"""

from __future__ import annotations

from enum import StrEnum


class Mode(StrEnum):
    """A session's durable operating mode (seed 003 §0)."""

    AGENT = "agent"
    PLAN = "plan"
    GOAL = "goal"

    @property
    def is_contract(self) -> bool:
        return self is not Mode.AGENT


class PermissionMode(StrEnum):
    ASK = "ask"
    ACCEPT_EDITS = "accept-edits"
    AUTO = "auto"


class PlanKind(StrEnum):
    PLAN = "plan"
    GOAL = "goal"

    @property
    def mode(self) -> Mode:
        return Mode(self.value)


class PlanState(StrEnum):
    """A projection, never stored: see ``plan_state``."""

    INACTIVE = "inactive"
    PLANNING = "planning"
    AWAITING_APPROVAL = "awaiting_approval"


class SessionStatus(StrEnum):
    IDLE = "idle"
    RUNNING = "running"
    WAITING_PERMISSION = "waiting_permission"


class TurnState(StrEnum):
    RUNNING = "running"
    ENDED = "ended"


class TurnReason(StrEnum):
    COMPLETED = "completed"
    ABORTED = "aborted"
    ERROR = "error"


class TurnOrigin(StrEnum):
    INTERACTIVE = "interactive"
    QUEUED = "queued"
    EXECUTION = "execution"
    SCHEDULED = "scheduled"


class ApprovalStatus(StrEnum):
    PENDING = "pending"
    APPROVED = "approved"
    REJECTED = "rejected"
    EXPIRED = "expired"
    INTERRUPTED = "interrupted"


class ExecutionState(StrEnum):
    NONE = "none"
    QUEUED = "queued"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    ABORTED = "aborted"
    INTERRUPTED = "interrupted"


class PermissionStatus(StrEnum):
    PENDING = "pending"
    ALLOWED = "allowed"
    DENIED = "denied"
    INTERRUPTED = "interrupted"


class NotificationKind(StrEnum):
    COMPLETED = "task.completed"
    FAILED = "task.failed"


def plan_state(mode: Mode, approval_pending: bool) -> PlanState:
    """The live planning state is a projection of the durable mode and approval row."""
    if not mode.is_contract:
        return PlanState.INACTIVE
    return PlanState.AWAITING_APPROVAL if approval_pending else PlanState.PLANNING
