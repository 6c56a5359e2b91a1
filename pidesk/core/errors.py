"""One error tree with stable codes.

::

    PideskError                      (code: Code, message)
     ├── InvalidParams               INVALID_PARAMS — a caller sent a malformed argument
     ├── NotFound                    NOT_FOUND / PLAN_NOT_FOUND
     ├── Conflict                    the state forbids the call: AGENT_BUSY, TURN_ENDED,
     │                               STALE_REQUEST, PLAN_ALREADY_RESOLVED, PLAN_APPROVAL_STALE,
     │                               PLAN_WORKSPACE_REQUIRED, PLAN_REQUIRES_INTERACTIVE_SESSION, …
     ├── IllegalTransition           a state machine was asked for a move its table forbids
     │                               (a bug in the host, never a user error): INTERNAL
     ├── StoreError                  PERSISTENCE_FAILURE — the store could not commit; nothing changed
     └── StartupRefused              the host cannot start (failed migration, newer schema, a second
                                     host on the data dir, a port or address it may not use)

Tool-level outcomes (``WRITE_DISABLED_IN_PLAN`` …) are not exceptions: they are
values (``policy.Deny``, tool results with an ``errorCode``) the model can read.
Every code here is a PROTOCOL.md string, plus ``INVALID_ARGUMENTS`` (a tool call
whose arguments do not fit its schema; PROTOCOL.md has no tool-level code for
that) and ``TOOL_ERROR`` (a plugin tool failed). Clients match on ``code``, never on text.
"""

from __future__ import annotations

from enum import StrEnum


class Code(StrEnum):
    # RPC error codes (error.data.code)
    METHOD_NOT_FOUND = "METHOD_NOT_FOUND"
    INVALID_PARAMS = "INVALID_PARAMS"
    AGENT_BUSY = "AGENT_BUSY"
    NOT_FOUND = "NOT_FOUND"
    TURN_ENDED = "TURN_ENDED"
    STALE_REQUEST = "STALE_REQUEST"
    PLAN_NOT_FOUND = "PLAN_NOT_FOUND"
    PLAN_ALREADY_RESOLVED = "PLAN_ALREADY_RESOLVED"
    PLAN_APPROVAL_STALE = "PLAN_APPROVAL_STALE"
    PLAN_PERMISSION_MODE_REQUIRED = "PLAN_PERMISSION_MODE_REQUIRED"
    PLAN_PERMISSION_MODE_INVALID = "PLAN_PERMISSION_MODE_INVALID"
    PLAN_WORKSPACE_REQUIRED = "PLAN_WORKSPACE_REQUIRED"
    PLAN_REQUIRES_INTERACTIVE_SESSION = "PLAN_REQUIRES_INTERACTIVE_SESSION"
    PROTOCOL_MISMATCH = "PROTOCOL_MISMATCH"
    PERSISTENCE_FAILURE = "PERSISTENCE_FAILURE"
    LIMIT_EXCEEDED = "LIMIT_EXCEEDED"
    # tool-level outcomes
    WRITE_DISABLED_IN_PLAN = "WRITE_DISABLED_IN_PLAN"
    EDIT_DISABLED_IN_PLAN = "EDIT_DISABLED_IN_PLAN"
    PLUGIN_DISABLED_IN_PLAN = "PLUGIN_DISABLED_IN_PLAN"
    TOOL_DISABLED_IN_PLAN = "TOOL_DISABLED_IN_PLAN"
    TOOL_NOT_FOUND = "TOOL_NOT_FOUND"
    TOOL_ERROR = "TOOL_ERROR"  # a plugin tool failed (its server said so, crashed or could not start)
    TOOL_DENIED = "TOOL_DENIED"
    INVALID_ARGUMENTS = "INVALID_ARGUMENTS"
    PATH_OUTSIDE_WORKSPACE = "PATH_OUTSIDE_WORKSPACE"
    WORKSPACE_PATH_DENIED = "WORKSPACE_PATH_DENIED"
    PLAN_KIND_MISMATCH = "PLAN_KIND_MISMATCH"
    PLAN_NOT_ACTIVE = "PLAN_NOT_ACTIVE"
    TOOL_BATCH_EXCLUSIVE = "TOOL_BATCH_EXCLUSIVE"
    PLAN_APPROVAL_TIMEOUT = "PLAN_APPROVAL_TIMEOUT"
    PLAN_APPROVAL_INTERRUPTED = "PLAN_APPROVAL_INTERRUPTED"
    PLAN_REJECTED = "PLAN_REJECTED"
    PLAN_ARTIFACT_HASH_MISMATCH = "PLAN_ARTIFACT_HASH_MISMATCH"
    FILE_NOT_FOUND = "FILE_NOT_FOUND"
    TOOL_TIMEOUT = "TOOL_TIMEOUT"
    TOOL_ABORTED = "TOOL_ABORTED"
    TOOL_BINARY_CONTENT = "TOOL_BINARY_CONTENT"
    PLAN_ALREADY_ACTIVE = "PLAN_ALREADY_ACTIVE"
    PERMISSION_REQUIRED = "PERMISSION_REQUIRED"
    GOAL_UNREPORTED = "GOAL_UNREPORTED"
    BASH_ESCALATION_DENIED_IN_PLAN = "BASH_ESCALATION_DENIED_IN_PLAN"
    SANDBOX_UNAVAILABLE = "SANDBOX_UNAVAILABLE"
    # turn error codes (turn.ended.errorCode)
    PROVIDER_ERROR = "PROVIDER_ERROR"
    PROVIDER_UNAUTHORIZED = "PROVIDER_UNAUTHORIZED"
    PROVIDER_RATE_LIMITED = "PROVIDER_RATE_LIMITED"
    PROVIDER_SECRET_MISSING = "PROVIDER_SECRET_MISSING"
    MODEL_NOT_CONFIGURED = "MODEL_NOT_CONFIGURED"
    STREAM_FAILED = "STREAM_FAILED"
    PLAN_EXECUTION_INTERRUPTED = "PLAN_EXECUTION_INTERRUPTED"
    INTERRUPTED = "INTERRUPTED"
    GOAL_BLOCKED = "GOAL_BLOCKED"
    INTERNAL = "INTERNAL"


class PideskError(Exception):
    """Base of every error pidesk raises on purpose; ``code`` is the stable contract."""

    default_code = Code.INTERNAL

    def __init__(self, message: str, code: Code | None = None) -> None:
        super().__init__(message)
        self.code: Code = code if code is not None else self.default_code
        self.message = message

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.code.value}: {self.message})"


class InvalidParams(PideskError):
    default_code = Code.INVALID_PARAMS


class NotFound(PideskError):
    default_code = Code.NOT_FOUND


class Conflict(PideskError):
    default_code = Code.AGENT_BUSY


class IllegalTransition(PideskError):
    default_code = Code.INTERNAL


class StoreError(PideskError):
    default_code = Code.PERSISTENCE_FAILURE


class StartupRefused(PideskError):
    """The host cannot start; the message says why and what to do. Never a wire error."""
