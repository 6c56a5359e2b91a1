"""Every legal state move of a session, turn, approval and execution — one table.

The host never assigns a state field directly: it calls ``advance(current, target)``,
which returns ``target`` or raises ``IllegalTransition``. Staying in a state is
not a move and is refused too, so a repeated terminal call cannot restate a
decision; callers that must be idempotent check first (see ``is_terminal``).

Mode moves carry a cause, because *why* the mode changes is the rule: a user may
pick any mode while idle; the agent may only enter a contract mode; only an
approval leaves one for Agent (seed 003 §0).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final, TypeVar

from pidesk.core.errors import IllegalTransition
from pidesk.core.modes import (
    ApprovalStatus,
    ExecutionState,
    Mode,
    PermissionStatus,
    SessionStatus,
    TurnState,
)

S = TypeVar("S", bound=StrEnum)

_A, _R, _W = SessionStatus.IDLE, SessionStatus.RUNNING, SessionStatus.WAITING_PERMISSION
_P = ApprovalStatus
_E = ExecutionState
_Q = PermissionStatus

_MOVES: Final[tuple[tuple[StrEnum, StrEnum], ...]] = (
    # a tuple, not a set: equal strings of different machines must not collapse
    # session status (seed 003 §1): idle <-> running <-> waiting_permission; both end idle
    (_A, _R), (_R, _W), (_W, _R), (_R, _A), (_W, _A),
    # turn: a turn starts running and ends once
    (TurnState.RUNNING, TurnState.ENDED),
    # approval row: pending is settled exactly once
    (_P.PENDING, _P.APPROVED), (_P.PENDING, _P.REJECTED),
    (_P.PENDING, _P.EXPIRED), (_P.PENDING, _P.INTERRUPTED),
    # execution: assigned queued by approval, started by the dispatcher; an abort of the
    # approving turn before the dispatch drops it (nothing runs that the user stopped)
    (_E.NONE, _E.QUEUED),
    (_E.QUEUED, _E.RUNNING), (_E.QUEUED, _E.INTERRUPTED), (_E.QUEUED, _E.ABORTED),
    (_E.RUNNING, _E.COMPLETED), (_E.RUNNING, _E.FAILED),
    (_E.RUNNING, _E.ABORTED), (_E.RUNNING, _E.INTERRUPTED),
    # permission request
    (_Q.PENDING, _Q.ALLOWED), (_Q.PENDING, _Q.DENIED), (_Q.PENDING, _Q.INTERRUPTED),
)

_TERMINAL: Final[tuple[StrEnum, ...]] = (
    TurnState.ENDED,
    _P.APPROVED, _P.REJECTED, _P.EXPIRED, _P.INTERRUPTED,
    _E.COMPLETED, _E.FAILED, _E.ABORTED, _E.INTERRUPTED,
    _Q.ALLOWED, _Q.DENIED, _Q.INTERRUPTED,
)


# StrEnum members hash as their strings ("running" is a turn, session and execution
# state), so the tables are keyed by (machine, value): no move crosses machines.
TRANSITIONS: Final[frozenset[tuple[type[StrEnum], str, str]]] = frozenset(
    (type(a), a.value, b.value) for a, b in _MOVES
)
TERMINAL: Final[frozenset[tuple[type[StrEnum], str]]] = frozenset((type(s), s.value) for s in _TERMINAL)


def advance(current: S, target: S) -> S:
    """Return ``target`` if ``current -> target`` is in the table, else raise."""
    if type(current) is not type(target) or (type(current), current.value, target.value) not in TRANSITIONS:
        raise IllegalTransition(f"illegal transition {type(current).__name__}: {current} -> {target}")
    return target


def is_terminal(state: StrEnum) -> bool:
    return (type(state), state.value) in TERMINAL


class ModeCause(StrEnum):
    USER = "user"  # session.setMode while idle
    AGENT = "agent"  # EnterPlanMode / EnterGoalMode
    APPROVAL = "approval"  # plans.resolve approve


def change_mode(current: Mode, target: Mode, cause: ModeCause) -> Mode:
    """The mode machine: who may move a session from ``current`` to ``target``."""
    if cause is ModeCause.USER:
        return target
    if cause is ModeCause.AGENT and current is Mode.AGENT and target.is_contract:
        return target
    if cause is ModeCause.APPROVAL and current.is_contract and target is Mode.AGENT:
        return target
    raise IllegalTransition(f"mode {current} -> {target} is not allowed by {cause}")
