"""Error codes are PROTOCOL.md's strings; the error tree carries its default codes."""

from __future__ import annotations

import pytest

from pidesk.core.errors import (
    Code,
    Conflict,
    IllegalTransition,
    InvalidParams,
    NotFound,
    PideskError,
    StartupRefused,
    StoreError,
)

# PROTOCOL.md "Errors": the prose above the table, then the table's data.code column.
RPC_CODES = [
    "METHOD_NOT_FOUND",
    "INVALID_PARAMS",
    "AGENT_BUSY",
    "NOT_FOUND",
    "TURN_ENDED",
    "STALE_REQUEST",
    "PLAN_NOT_FOUND",
    "PLAN_ALREADY_RESOLVED",
    "PLAN_APPROVAL_STALE",
    "PLAN_PERMISSION_MODE_REQUIRED",
    "PLAN_PERMISSION_MODE_INVALID",
    "PLAN_WORKSPACE_REQUIRED",
    "PLAN_REQUIRES_INTERACTIVE_SESSION",
    "PROTOCOL_MISMATCH",
    "PERSISTENCE_FAILURE",
    "LIMIT_EXCEEDED",
]

# PROTOCOL.md "Tool-level outcomes", in the order written there.
TOOL_CODES = [
    "WRITE_DISABLED_IN_PLAN",
    "EDIT_DISABLED_IN_PLAN",
    "PLUGIN_DISABLED_IN_PLAN",
    "TOOL_DISABLED_IN_PLAN",
    "TOOL_NOT_FOUND",
    "TOOL_DENIED",
    "PATH_OUTSIDE_WORKSPACE",
    "WORKSPACE_PATH_DENIED",
    "PLAN_KIND_MISMATCH",
    "PLAN_NOT_ACTIVE",
    "TOOL_BATCH_EXCLUSIVE",
    "PLAN_APPROVAL_TIMEOUT",
    "PLAN_APPROVAL_INTERRUPTED",
    "PLAN_REJECTED",
    "PLAN_ARTIFACT_HASH_MISMATCH",
    "FILE_NOT_FOUND",
    "TOOL_TIMEOUT",
    "TOOL_ABORTED",
    "TOOL_BINARY_CONTENT",
    "PLAN_ALREADY_ACTIVE",
    "PLAN_WORKSPACE_REQUIRED",
    "PERMISSION_REQUIRED",
    "GOAL_UNREPORTED",
    # PROTOCOL.md "Turn-3 additions", Sandbox (Bash)
    "BASH_ESCALATION_DENIED_IN_PLAN",
    "SANDBOX_UNAVAILABLE",
]

# PROTOCOL.md "Turn error codes (turn.ended.errorCode)".
TURN_CODES = [
    "PROVIDER_ERROR",
    "PROVIDER_UNAUTHORIZED",
    "PROVIDER_RATE_LIMITED",
    "PROVIDER_SECRET_MISSING",
    "MODEL_NOT_CONFIGURED",
    "STREAM_FAILED",
    "PERMISSION_REQUIRED",
    "PLAN_EXECUTION_INTERRUPTED",
    "INTERRUPTED",
    "PLAN_ARTIFACT_HASH_MISMATCH",
    "PLAN_REQUIRES_INTERACTIVE_SESSION",
    "GOAL_UNREPORTED",
    "GOAL_BLOCKED",
    "INTERNAL",
]

PROTOCOL_CODES = set(RPC_CODES) | set(TOOL_CODES) | set(TURN_CODES)


@pytest.mark.parametrize("code", list(Code), ids=lambda c: c.name)
def test_every_code_value_equals_its_name(code: Code) -> None:
    assert code.value == code.name
    assert Code(code.name) is code


@pytest.mark.parametrize(
    "name",
    [pytest.param(n, id=f"rpc-{n}") for n in RPC_CODES]
    + [pytest.param(n, id=f"tool-{n}") for n in TOOL_CODES]
    + [pytest.param(n, id=f"turn-{n}") for n in TURN_CODES],
)
def test_every_protocol_code_exists(name: str) -> None:
    assert Code(name).value == name


def test_every_code_is_a_protocol_string() -> None:
    # A code a client can receive but the protocol never names is an unannounced
    # protocol change; the additions are documented in errors.py and docs/protocol-notes.md.
    assert {code.value for code in Code} - PROTOCOL_CODES == {"INVALID_ARGUMENTS", "TOOL_ERROR"}


@pytest.mark.parametrize(
    ("cls", "code"),
    [
        (PideskError, Code.INTERNAL),
        (InvalidParams, Code.INVALID_PARAMS),
        (NotFound, Code.NOT_FOUND),
        (Conflict, Code.AGENT_BUSY),
        (IllegalTransition, Code.INTERNAL),
        (StoreError, Code.PERSISTENCE_FAILURE),
        (StartupRefused, Code.INTERNAL),
    ],
    ids=lambda v: v.__name__ if isinstance(v, type) else v.value,
)
def test_error_subclasses_carry_their_default_codes(cls: type[PideskError], code: Code) -> None:
    error = cls("something went wrong; do this")
    assert error.code is code
    assert error.message == "something went wrong; do this"
    assert str(error) == "something went wrong; do this"
    assert code.value in repr(error)


def test_an_explicit_code_overrides_the_default() -> None:
    assert NotFound("no such approval", Code.PLAN_NOT_FOUND).code is Code.PLAN_NOT_FOUND
    assert Conflict("turn is over", code=Code.TURN_ENDED).code is Code.TURN_ENDED
    assert InvalidParams("x").code is Code.INVALID_PARAMS  # the override did not leak to the class


def test_the_tree_is_shaped_as_drawn() -> None:
    for cls in (InvalidParams, NotFound, Conflict, IllegalTransition, StoreError):
        assert cls.__bases__ == (PideskError,)
    assert StartupRefused.__bases__ == (PideskError,)
    assert issubclass(PideskError, Exception)
