"""Executions: the dispatcher that runs an approved contract, and Goal criteria reports.

An approved contract is queued in its approval row. After the submitting turn
ends, the dispatcher starts it as a new turn (origin ``execution``) whose first
message is a host-authored user message naming the artifact and carrying its
Markdown — after re-reading the artifact and checking its sha256: a changed or
missing artifact fails the execution with ``PLAN_ARTIFACT_HASH_MISMATCH`` and no
model call is made. A Goal execution ends completed when ReportCriteria reports
every criterion met, failed with ``GOAL_BLOCKED`` as soon as one is blocked, and
failed with ``GOAL_UNREPORTED`` if it tries to end unreported after one nudge.

An execution never stays ``queued`` without a turn that will dispatch it: one that
cannot start is interrupted here, and one whose approving turn is aborted before
the dispatch is aborted with it (``Turns.abort``).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from pidesk.core.errors import Code, PideskError
from pidesk.core.modes import ExecutionState, PlanKind, TurnOrigin
from pidesk.core.records import PlanApproval, TextBlock, ToolCallBlock
from pidesk.host.live import LiveTurn
from pidesk.host.parts import Parts
from pidesk.host.turns import Turns
from pidesk.runtime.loop import Completed, Failed, Nudge, ToolOutcome, TurnEnd
from pidesk.store import repo
from pidesk.store.artifacts import read_artifact, sha256_of
from pidesk.tools.base import ToolResult

OUTCOMES = ("met", "unmet", "blocked")
log = logging.getLogger("pidesk.executions")


class Executions:
    def __init__(self, parts: Parts, turns: Turns) -> None:
        self.p = parts
        self.turns = turns

    async def dispatch(self, session_id: str) -> bool:
        """Start the session's queued execution, if it has one and is otherwise idle."""
        if session_id in self.p.live.turns:
            return False
        with self.p.store.db.read() as db:
            queued = repo.queued_executions(db, session_id)
        if not queued:
            return False
        approval = queued[0]
        text, failure = self._instruction(approval)
        try:
            await self.turns.start(
                session_id, [TextBlock(text=text)], origin=TurnOrigin.EXECUTION, approval_id=approval.id,
                criteria=approval.criteria if approval.kind is PlanKind.GOAL else None,
                fail_before_model=failure,
            )
        except PideskError:
            # Not started (the store refused the turn's row): left queued, it would keep the session
            # busy with nothing to dispatch it until a restart. It is interrupted, as a restart would.
            log.exception("execution %s could not start; it is interrupted", approval.execution_id)
            with self.p.store.db.tx() as db:
                repo.set_execution_state(db, approval.id, ExecutionState.QUEUED, ExecutionState.INTERRUPTED)
            self.turns.publish_execution(approval.id)
            self.p.publish_session(session_id)
        return True

    def _instruction(self, approval: PlanApproval) -> tuple[str, str | None]:
        session = self.p.session(approval.session_id)
        assert session.project_path is not None
        try:
            data = read_artifact(Path(session.project_path), approval.artifact_path)
        except OSError:
            data = None
        if data is None or sha256_of(data) != approval.artifact_sha256:
            return (
                f"The approved {approval.kind.value} {approval.artifact_path} (sha256 "
                f"{approval.artifact_sha256}) changed or vanished after approval; nothing will run.",
                Code.PLAN_ARTIFACT_HASH_MISMATCH.value,
            )
        markdown = data.decode("utf-8", "replace")
        if approval.kind is PlanKind.PLAN:
            ask = "Carry out this approved plan, step by step."
        else:
            criteria = "\n".join(f"- {c}" for c in approval.criteria or [])
            ask = ("Work toward this approved goal, choosing your own approach, until every acceptance "
                   "criterion is verified or a boundary blocks you. Before you finish, call ReportCriteria "
                   f"with an outcome (met, unmet or blocked) and evidence for each criterion:\n{criteria}")
        header = f"Approved {approval.kind.value}: {approval.artifact_path} (sha256 {approval.artifact_sha256})."
        return f"{header}\n{ask}\n\n{markdown}", None

    def report(self, live: LiveTurn, call: ToolCallBlock) -> ToolOutcome:
        """ReportCriteria: record outcomes; end the turn when all are met or one is blocked."""
        if live.goal is None:
            return ToolOutcome(ToolResult.failure("ReportCriteria is only for a Goal execution; nothing to report"))
        results = call.args.get("results")
        problem = _check_results(results, live.goal.criteria)
        if problem is not None:
            return ToolOutcome(ToolResult.error(Code.INVALID_ARGUMENTS, problem))
        assert isinstance(results, list)
        for item in results:
            live.goal.outcomes[item["criterion"]] = item["outcome"]
        with self.p.store.db.tx() as db:
            repo.audit(db, "goal.reported", live.session_id, live.turn_id,
                       results=[{k: r.get(k) for k in ("criterion", "outcome", "evidence")} for r in results])
        outcomes = live.goal.outcomes
        blocked = [c for c, o in outcomes.items() if o == "blocked"]
        if blocked:
            return ToolOutcome(ToolResult(ok=True, output=f"Blocked: {', '.join(blocked)}. The execution stops."),
                               end=Failed(Code.GOAL_BLOCKED))
        if not live.goal.unreported() and all(o == "met" for o in outcomes.values()):
            return ToolOutcome(ToolResult(ok=True, output="Every criterion is met. The goal is complete."),
                               end=Completed())
        open_ = [c for c in live.goal.criteria if outcomes.get(c) != "met"]
        return ToolOutcome(ToolResult(ok=True, output="Keep working; not yet met: " + "; ".join(open_)))

    @staticmethod
    def may_end(live: LiveTurn, nudged: bool) -> TurnEnd | Nudge:
        """A Goal execution ends through ReportCriteria (all met, or one blocked), never by just stopping."""
        if live.goal is None:
            return Completed()
        if not nudged:
            missing = "; ".join(c for c in live.goal.criteria if live.goal.outcomes.get(c) != "met")
            return Nudge("Before this goal execution can end, call ReportCriteria with an outcome "
                         f"(met, unmet or blocked) and evidence for: {missing}")
        return Failed(Code.GOAL_UNREPORTED)


def _check_results(results: Any, criteria: list[str]) -> str | None:
    if not isinstance(results, list) or not results:
        return "results must be a non-empty list of {criterion, outcome, evidence}"
    for item in results:
        if not isinstance(item, dict) or not isinstance(item.get("criterion"), str):
            return "each result needs a criterion (the exact text of an acceptance criterion)"
        if item["criterion"] not in criteria:
            return f"unknown criterion {item['criterion']!r}; the criteria are: " + "; ".join(criteria)
        if item.get("outcome") not in OUTCOMES:
            return f"outcome must be one of met, unmet, blocked; got {item.get('outcome')!r}"
        if not isinstance(item.get("evidence", ""), str):
            return "evidence must be a string"
    return None
