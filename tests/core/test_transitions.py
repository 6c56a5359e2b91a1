"""State machines against the moves the documents allow.

The expected table is written here from seed 003 and DESIGN.md, not read from
``transitions.TRANSITIONS``:

- Session status (seed 003 §1): ``idle <-> running <-> waiting_permission``; a turn
  ending in aborted/error "then returns idle" — and abort is allowed from
  waiting_permission too (§3 rule 4), so waiting_permission -> idle.
- Turn (§2, PROTOCOL.md Turn.state): running -> ended, decided once.
- Approval (§0, §3 rules 13-14, DESIGN.md): pending settles once, to approved,
  rejected, expired or interrupted.
- Execution (§0 diagram, DESIGN.md "Fail closed"): approve puts it *queued*; "Agent /
  queued -- dispatcher starts --> Agent / running"; "Agent / running -- complete |
  fail | abort --> inactive"; startup recovery moves queued/running to interrupted.
  Nothing else: a queued execution has not run, so it cannot complete, fail or abort.
- Permission request (§3 rule 5, PROTOCOL.md): pending -> allowed | denied (a
  timeout is a deny) | interrupted (abort, turn end).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from itertools import product

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from pidesk.core.errors import Code, IllegalTransition
from pidesk.core.modes import (
    ApprovalStatus,
    ExecutionState,
    Mode,
    PermissionMode,
    PermissionStatus,
    PlanKind,
    PlanState,
    SessionStatus,
    TurnState,
    plan_state,
)
from pidesk.core.policy import Allow, Ask, Deny, decide
from pidesk.core.transitions import ModeCause, advance, change_mode, is_terminal

Ss, Ts, As, Es, Ps = SessionStatus, TurnState, ApprovalStatus, ExecutionState, PermissionStatus

LEGAL: dict[type[StrEnum], set[tuple[StrEnum, StrEnum]]] = {
    SessionStatus: {
        (Ss.IDLE, Ss.RUNNING),
        (Ss.RUNNING, Ss.IDLE),
        (Ss.RUNNING, Ss.WAITING_PERMISSION),
        (Ss.WAITING_PERMISSION, Ss.RUNNING),
        (Ss.WAITING_PERMISSION, Ss.IDLE),
    },
    TurnState: {(Ts.RUNNING, Ts.ENDED)},
    ApprovalStatus: {
        (As.PENDING, As.APPROVED),
        (As.PENDING, As.REJECTED),
        (As.PENDING, As.EXPIRED),
        (As.PENDING, As.INTERRUPTED),
    },
    ExecutionState: {
        (Es.NONE, Es.QUEUED),
        (Es.QUEUED, Es.RUNNING),
        (Es.QUEUED, Es.INTERRUPTED),
        (Es.QUEUED, Es.ABORTED),
        (Es.RUNNING, Es.COMPLETED),
        (Es.RUNNING, Es.FAILED),
        (Es.RUNNING, Es.ABORTED),
        (Es.RUNNING, Es.INTERRUPTED),
    },
    PermissionStatus: {
        (Ps.PENDING, Ps.ALLOWED),
        (Ps.PENDING, Ps.DENIED),
        (Ps.PENDING, Ps.INTERRUPTED),
    },
}

TERMINAL_STATES: set[StrEnum] = {
    Ts.ENDED,
    As.APPROVED, As.REJECTED, As.EXPIRED, As.INTERRUPTED,
    Es.COMPLETED, Es.FAILED, Es.ABORTED, Es.INTERRUPTED,
    Ps.ALLOWED, Ps.DENIED, Ps.INTERRUPTED,
}  # fmt: skip

PAIRS = [
    pytest.param(a, b, (a, b) in LEGAL[enum], id=f"{enum.__name__}-{a.value}->{b.value}")
    for enum in LEGAL
    for a, b in product(list(enum), repeat=2)
]


def _same_state(a: StrEnum, b: StrEnum) -> bool:
    return type(a) is type(b) and a.value == b.value


@pytest.mark.parametrize(("current", "target", "legal"), PAIRS)
def test_advance_allows_exactly_the_documented_moves(current: StrEnum, target: StrEnum, legal: bool) -> None:
    if legal:
        result = advance(current, target)
        assert result is target
    else:
        with pytest.raises(IllegalTransition) as raised:
            advance(current, target)
        assert raised.value.code is Code.INTERNAL


def test_pair_grid_is_exhaustive() -> None:
    assert len(PAIRS) == sum(len(enum) ** 2 for enum in LEGAL)


@pytest.mark.parametrize(
    "state", [pytest.param(s, id=f"{type(s).__name__}-{s.value}") for enum in LEGAL for s in enum]
)
def test_terminal_states_have_no_successors(state: StrEnum) -> None:
    successors = [b for a, b in LEGAL[type(state)] if _same_state(a, state)]
    assert is_terminal(state) is (state in TERMINAL_STATES)
    assert (state in TERMINAL_STATES) is (not successors)
    if is_terminal(state):
        for target in type(state):
            with pytest.raises(IllegalTransition):
                advance(state, target)


def test_staying_put_is_not_a_move() -> None:
    # "a repeated terminal call cannot restate a decision"
    for enum in LEGAL:
        for state in enum:
            with pytest.raises(IllegalTransition):
                advance(state, state)


def test_advance_refuses_moves_between_different_state_machines() -> None:
    """A move from one machine's state to another's is never legal.

    The states are StrEnums, so e.g. ``TurnState.RUNNING == "running" ==
    ExecutionState.RUNNING``; a table keyed by value alone would accept
    ``advance(TurnState.RUNNING, SessionStatus.IDLE)``.
    """
    accepted = []
    enums = list(LEGAL)
    for source, dest in product(enums, repeat=2):
        if source is dest:
            continue
        for a, b in product(list(source), list(dest)):
            try:
                advance(a, b)  # mypy accepts this too: S widens to StrEnum
            except IllegalTransition:
                continue
            accepted.append(f"{source.__name__}.{a.name} -> {dest.__name__}.{b.name}")
    assert accepted == []


# --- mode changes: who may move the mode (seed 003 §0) -------------------------------------

AGENT, PLAN, GOAL = Mode.AGENT, Mode.PLAN, Mode.GOAL


def _mode_legal(current: Mode, target: Mode, cause: ModeCause) -> bool:
    if cause is ModeCause.USER:
        return True  # "user selects ... while idle" — idleness is the host's check
    if cause is ModeCause.AGENT:
        return (current, target) in {(AGENT, PLAN), (AGENT, GOAL)}  # EnterPlanMode / EnterGoalMode
    return (current, target) in {(PLAN, AGENT), (GOAL, AGENT)}  # approve -> Agent


@pytest.mark.parametrize(
    ("current", "target", "cause"),
    [
        pytest.param(c, t, k, id=f"{k.value}-{c.value}->{t.value}")
        for k in ModeCause
        for c in Mode
        for t in Mode
    ],
)
def test_change_mode_rules(current: Mode, target: Mode, cause: ModeCause) -> None:
    if _mode_legal(current, target, cause):
        assert change_mode(current, target, cause) is target
    else:
        with pytest.raises(IllegalTransition):
            change_mode(current, target, cause)


def test_only_an_approval_leaves_a_contract_mode_without_the_user() -> None:
    for contract in (PLAN, GOAL):
        with pytest.raises(IllegalTransition):
            change_mode(contract, AGENT, ModeCause.AGENT)
        with pytest.raises(IllegalTransition):
            change_mode(contract, PLAN if contract is GOAL else GOAL, ModeCause.AGENT)
        assert change_mode(contract, AGENT, ModeCause.APPROVAL) is AGENT


# --- one session's plan lifecycle, as a pure model over the core functions -----------------


@dataclass
class Approval:
    kind: PlanKind
    status: ApprovalStatus = ApprovalStatus.PENDING
    execution_id: int | None = None
    execution_state: ExecutionState = ExecutionState.NONE


ENTER_TOOL = {PlanKind.PLAN: "EnterPlanMode", PlanKind.GOAL: "EnterGoalMode"}
SUBMIT_TOOL = {PlanKind.PLAN: "SubmitPlan", PlanKind.GOAL: "SubmitGoal"}
LIVE_EXECUTION = (ExecutionState.QUEUED, ExecutionState.RUNNING)


class PlanLifecycle(RuleBasedStateMachine):
    """A project session: prompts, mode changes, submissions, resolutions, executions, recovery."""

    def __init__(self) -> None:
        super().__init__()
        self.mode = Mode.AGENT
        self.permission_mode = PermissionMode.ASK
        self.status = SessionStatus.IDLE
        self.turn: TurnState | None = None
        self.execution_turn = False
        self.approvals: list[Approval] = []
        self.settled: dict[int, ApprovalStatus] = {}
        self.next_execution_id = 1

    # -- helpers ----------------------------------------------------------------------------

    def pending(self) -> Approval | None:
        if self.approvals and self.approvals[-1].status is ApprovalStatus.PENDING:
            return self.approvals[-1]
        return None

    def live_execution(self) -> Approval | None:
        for approval in self.approvals:
            if approval.execution_state in LIVE_EXECUTION:
                return approval
        return None

    def busy(self) -> bool:
        # seed 003 §3 rule 15: active turn, pending approval, or queued/running execution
        return self.turn is TurnState.RUNNING or self.pending() is not None or self.live_execution() is not None

    def agent_may_call(self) -> bool:
        return self.status is SessionStatus.RUNNING and self.pending() is None

    def end_turn(self) -> None:
        assert self.turn is not None
        self.turn = advance(self.turn, TurnState.ENDED)
        self.status = advance(self.status, SessionStatus.IDLE)
        self.execution_turn = False

    def settle(self, status: ApprovalStatus) -> Approval:
        approval = self.pending()
        assert approval is not None
        approval.status = advance(approval.status, status)
        self.settled[len(self.approvals) - 1] = status
        return approval

    # -- rules ------------------------------------------------------------------------------

    @precondition(lambda self: not self.busy())
    @rule()
    def prompt(self) -> None:
        self.status = advance(self.status, SessionStatus.RUNNING)
        self.turn = TurnState.RUNNING

    @precondition(lambda self: not self.busy())
    @rule(new_mode=st.sampled_from(Mode))
    def user_set_mode(self, new_mode: Mode) -> None:
        self.mode = change_mode(self.mode, new_mode, ModeCause.USER)
        assert self.mode is new_mode

    @precondition(lambda self: not self.busy())
    @rule(permission_mode=st.sampled_from(PermissionMode))
    def user_set_permission_mode(self, permission_mode: PermissionMode) -> None:
        self.permission_mode = permission_mode

    @precondition(lambda self: self.agent_may_call())
    @rule(kind=st.sampled_from(PlanKind))
    def agent_enter(self, kind: PlanKind) -> None:
        decision = decide(self.mode, self.permission_mode, ENTER_TOOL[kind])
        before = self.mode
        if self.mode is Mode.AGENT:
            assert decision == Allow()
            self.mode = change_mode(self.mode, kind.mode, ModeCause.AGENT)
            assert plan_state(self.mode, False) is PlanState.PLANNING
        else:
            assert decision == Deny(Code.PLAN_ALREADY_ACTIVE)
            for target in Mode:
                if target is not before:
                    try:
                        change_mode(before, target, ModeCause.AGENT)
                    except IllegalTransition:
                        continue
                    raise AssertionError(f"agent moved {before} -> {target}")
            assert self.mode is before

    @precondition(lambda self: self.agent_may_call())
    @rule(kind=st.sampled_from(PlanKind))
    def submit(self, kind: PlanKind) -> None:
        decision = decide(self.mode, self.permission_mode, SUBMIT_TOOL[kind])
        count = len(self.approvals)
        if self.mode is Mode.AGENT:
            assert decision == Deny(Code.PLAN_NOT_ACTIVE)
        elif self.mode is not kind.mode:
            assert decision == Deny(Code.PLAN_KIND_MISMATCH)  # "writes nothing"
        else:
            assert decision == Allow()
            # seed 003 §3 rule 15: the host refuses a second submission while an
            # execution is queued/running (e.g. an execution turn that re-entered a mode)
            if self.live_execution() is None:
                self.approvals.append(Approval(kind))
        assert len(self.approvals) == count + (decision == Allow() and self.live_execution() is None)

    @precondition(lambda self: self.agent_may_call())
    @rule()
    def bash(self) -> None:
        decision = decide(self.mode, self.permission_mode, "Bash", granted=True)
        if self.mode.is_contract and self.permission_mode is not PermissionMode.AUTO:
            assert decision == Ask()
            self.status = advance(self.status, SessionStatus.WAITING_PERMISSION)  # the grant is ignored
        else:
            assert decision == Allow()

    @precondition(lambda self: self.status is SessionStatus.WAITING_PERMISSION)
    @rule(allow=st.booleans())
    def answer_permission(self, allow: bool) -> None:
        answered = advance(PermissionStatus.PENDING, PermissionStatus.ALLOWED if allow else PermissionStatus.DENIED)
        assert is_terminal(answered)
        self.status = advance(self.status, SessionStatus.RUNNING)

    @precondition(lambda self: self.mode.is_contract and self.agent_may_call())
    @rule(tool=st.sampled_from(["Write", "Edit"]), granted=st.booleans())
    def write_in_contract_mode(self, tool: str, granted: bool) -> None:
        assert isinstance(decide(self.mode, self.permission_mode, tool, granted=granted), Deny)

    @precondition(lambda self: self.pending() is not None)
    @rule(permission_mode=st.sampled_from(PermissionMode))
    def approve(self, permission_mode: PermissionMode) -> None:
        approval = self.settle(ApprovalStatus.APPROVED)
        # one transaction: mode -> Agent, permission mode, execution id, queued
        self.mode = change_mode(self.mode, Mode.AGENT, ModeCause.APPROVAL)
        self.permission_mode = permission_mode
        approval.execution_id = self.next_execution_id
        self.next_execution_id += 1
        approval.execution_state = advance(approval.execution_state, ExecutionState.QUEUED)
        self.end_turn()  # the submitting turn ends completed
        assert self.mode is Mode.AGENT

    @precondition(lambda self: self.pending() is not None)
    @rule(outcome=st.sampled_from([ApprovalStatus.REJECTED, ApprovalStatus.EXPIRED]))
    def reject_or_expire(self, outcome: ApprovalStatus) -> None:
        before = self.mode
        approval = self.settle(outcome)
        self.end_turn()
        assert self.mode is before is approval.kind.mode
        assert plan_state(self.mode, False) is PlanState.PLANNING

    @precondition(lambda self: self.busy())
    @rule()
    def interrupt(self) -> None:
        """Abort, or startup recovery: fail closed, never replay."""
        before = self.mode
        pending = self.pending()
        if pending is not None:
            self.settle(ApprovalStatus.INTERRUPTED)
            assert before is pending.kind.mode
        live = self.live_execution()
        if live is not None:
            live.execution_state = advance(live.execution_state, ExecutionState.INTERRUPTED)
        if self.turn is TurnState.RUNNING:
            self.end_turn()
        assert self.mode is before

    @precondition(
        lambda self: self.status is SessionStatus.IDLE
        and (live := self.live_execution()) is not None
        and live.execution_state is ExecutionState.QUEUED
    )
    @rule()
    def abort_before_dispatch(self) -> None:
        """An abort landing between the approval and the dispatch (authority hole 1): the queued
        execution is dropped, the session stays in Agent and is free again."""
        execution = self.live_execution()
        assert execution is not None
        execution.execution_state = advance(execution.execution_state, ExecutionState.ABORTED)
        assert self.mode is Mode.AGENT and not self.busy()

    @precondition(
        lambda self: self.status is SessionStatus.IDLE
        and (live := self.live_execution()) is not None
        and live.execution_state is ExecutionState.QUEUED
    )
    @rule()
    def dispatch(self) -> None:
        execution = self.live_execution()
        assert execution is not None
        assert self.mode is Mode.AGENT
        execution.execution_state = advance(execution.execution_state, ExecutionState.RUNNING)
        self.status = advance(self.status, SessionStatus.RUNNING)
        self.turn = TurnState.RUNNING
        self.execution_turn = True

    @precondition(lambda self: self.agent_may_call())
    @rule(outcome=st.sampled_from([ExecutionState.COMPLETED, ExecutionState.FAILED, ExecutionState.ABORTED]))
    def finish(self, outcome: ExecutionState) -> None:
        if self.execution_turn:
            execution = self.live_execution()
            assert execution is not None and execution.execution_state is ExecutionState.RUNNING
            execution.execution_state = advance(execution.execution_state, outcome)
        self.end_turn()

    # -- invariants -------------------------------------------------------------------------

    @invariant()
    def approval_status_settles_once(self) -> None:
        for index, status in self.settled.items():
            assert self.approvals[index].status is status
        pending = [a for a in self.approvals if a.status is ApprovalStatus.PENDING]
        assert len(pending) <= 1
        assert not pending or pending[0] is self.approvals[-1]

    @invariant()
    def execution_id_exists_iff_approved(self) -> None:
        ids = []
        for approval in self.approvals:
            approved = approval.status is ApprovalStatus.APPROVED
            assert (approval.execution_id is not None) is approved
            assert (approval.execution_state is not ExecutionState.NONE) is approved
            if approval.execution_id is not None:
                ids.append(approval.execution_id)
        assert len(ids) == len(set(ids))

    @invariant()
    def pending_approval_means_awaiting_in_its_own_contract_mode(self) -> None:
        pending = self.pending()
        assert plan_state(self.mode, pending is not None) is (
            PlanState.INACTIVE
            if self.mode is Mode.AGENT
            else PlanState.AWAITING_APPROVAL
            if pending
            else PlanState.PLANNING
        )
        if pending is not None:
            assert self.mode is pending.kind.mode
            assert self.status is SessionStatus.RUNNING and self.turn is TurnState.RUNNING

    @invariant()
    def queued_execution_runs_in_agent_mode(self) -> None:
        live = [a for a in self.approvals if a.execution_state in LIVE_EXECUTION]
        assert len(live) <= 1
        if live and live[0].execution_state is ExecutionState.QUEUED:
            assert self.mode is Mode.AGENT
            assert self.status is SessionStatus.IDLE

    @invariant()
    def idle_iff_no_running_turn(self) -> None:
        assert (self.status is SessionStatus.IDLE) is (self.turn is not TurnState.RUNNING)


PlanLifecycle.TestCase.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)
TestPlanLifecycle = PlanLifecycle.TestCase
