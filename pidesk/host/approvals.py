"""Plan and Goal contracts: submission, the user's decision, expiry.

Submission (seed 003 §4): the exact Markdown bytes go to a new unique
``.pi/<kind>/*.md`` (exclusive create, fsync), then a pending ``plan_approvals``
row is committed, then ``plan.requested`` is emitted, then the submitting turn
waits on an in-memory one-shot with an absolute deadline. Only a matching
``resolve`` settles the row:

- approve — ONE transaction: row approved, ``sessions.mode = agent``, the chosen
  permission mode stored, an execution id assigned with state ``queued``, audit;
  then the waiter wakes, the turn ends completed, and the dispatcher starts the
  execution as a new turn;
- reject (optional feedback, stored) and expiry (``PLAN_APPROVAL_TIMEOUT``) close
  the row and leave the same contract mode, planning.

No model call follows a settled submission in the same turn, whatever the outcome.
A restart leaves no waiter, so recovery marks every pending row interrupted.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path
from typing import Any

from pidesk.core.errors import Code, Conflict, InvalidParams, NotFound
from pidesk.core.events import ExecutionChanged, PlanRequested, PlanResolved
from pidesk.core.modes import ApprovalStatus, ExecutionState, Mode, PermissionMode, PlanKind
from pidesk.core.records import PlanApproval, ToolCallBlock
from pidesk.core.transitions import ModeCause, change_mode
from pidesk.host import render, validate
from pidesk.host.live import LiveTurn
from pidesk.host.parts import Parts
from pidesk.ids import iso, new_id, now_iso, parse_iso, utcnow
from pidesk.runtime.loop import Completed, ToolOutcome
from pidesk.store import repo
from pidesk.store.artifacts import ArtifactPathDenied, read_artifact, write_artifact
from pidesk.tools.base import ToolResult

# what an execution's view of the conversation starts from (issue 30): all of it, a summary of it, or the contract
CONTEXTS = ("keep", "compact", "fresh")

_OUTCOMES = {
    "rejected": (Code.PLAN_REJECTED, "The user rejected this {kind}."),
    "expired": (Code.PLAN_APPROVAL_TIMEOUT, "Nobody decided on this {kind} before its deadline."),
}


class Approvals:
    def __init__(self, parts: Parts) -> None:
        self.p = parts

    async def submit(self, live: LiveTurn, call: ToolCallBlock, kind: PlanKind) -> ToolOutcome:
        problem = _check_contract_args(call.args, kind) or render.oversized_contract(call.args)
        if problem is not None:
            return ToolOutcome(ToolResult.error(Code.INVALID_ARGUMENTS, problem))
        session = self.p.session(live.session_id)
        if session.project_path is None:
            return ToolOutcome(ToolResult.error(Code.PLAN_WORKSPACE_REQUIRED, "this session has no project"))
        args = call.args
        moment = utcnow()
        try:
            artifact = await self.p.in_thread(
                write_artifact, Path(session.project_path), kind.value, args["title"], args["markdown"].encode(), moment
            )
        except ArtifactPathDenied as denied:  # a symlinked .pi or .pi/<kind>: nothing written, nothing pending
            return ToolOutcome(ToolResult.error(denied.code, denied.message))
        self.p.store.faults.hit("submit.after_artifact")
        with self.p.store.db.read() as db:
            revises = repo.latest_approval(db, session.id, kind)
        approval = PlanApproval(
            id=new_id("pa"), kind=kind, session_id=session.id, turn_id=live.turn_id, tool_call_id=call.id,
            title=args["title"], question=args["question"],
            criteria=list(args["criteria"]) if kind is PlanKind.GOAL else None,
            artifact_path=artifact.rel_path, artifact_sha256=artifact.sha256, artifact_size=artifact.size,
            status=ApprovalStatus.PENDING, deadline=iso(moment + timedelta(seconds=self.p.config.approval_timeout)),
            permission_mode=None, execution_id=None, execution_state=ExecutionState.NONE,
            revises=revises, feedback=None, created_at=iso(moment), resolved_at=None,
        )
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        live.approval_waiter = (approval.id, future)
        with self.p.store.db.tx() as db:
            repo.insert_approval(db, approval)
            repo.audit(db, f"{kind.value}.submitted", session.id, live.turn_id, approval=approval.id,
                       artifact=artifact.rel_path, sha256=artifact.sha256)
        self.p.store.faults.hit("submit.after_row")
        self.p.bus.publish(PlanRequested(approval=approval))
        self.p.publish_session(session.id)
        outcome = await self._wait(approval, future)
        live.approval_waiter = None
        return self._outcome(approval.id, kind, outcome)

    async def _wait(self, approval: PlanApproval, future: asyncio.Future[str]) -> str:
        remaining = (parse_iso(approval.deadline) - utcnow()).total_seconds()
        try:
            return await asyncio.wait_for(asyncio.shield(future), timeout=max(remaining, 0))
        except TimeoutError:
            pass
        with self.p.store.db.tx() as db:
            expired = repo.settle_approval(db, approval.id, ApprovalStatus.EXPIRED)
            if expired:
                repo.audit(db, f"{approval.kind.value}.expired", approval.session_id, approval.turn_id,
                           approval=approval.id, code=Code.PLAN_APPROVAL_TIMEOUT.value)
        if not expired:  # a resolve won the race in this same loop iteration
            return await future
        self._publish_resolved(approval.id)
        return "expired"

    def _outcome(self, approval_id: str, kind: PlanKind, outcome: str) -> ToolOutcome:
        if outcome == "approved":
            with self.p.store.db.read() as db:
                approval = repo.get_approval(db, approval_id)
            assert approval is not None and approval.permission_mode is not None
            text = (f"Approved with permission mode {approval.permission_mode.value}. The session is in Agent "
                    f"mode; the execution {approval.execution_id} is queued and starts as a new turn.")
            return ToolOutcome(ToolResult(ok=True, output=text), end=Completed())
        code, message = _OUTCOMES[outcome]
        text = message.format(kind=kind.value)
        with self.p.store.db.read() as db:
            approval = repo.get_approval(db, approval_id)
        if approval is not None and approval.feedback:
            text += f"\nFeedback: {approval.feedback}"
        text += f"\nYou are still in {kind.value.title()} mode: revise and submit again when asked."
        return ToolOutcome(ToolResult.error(code, text), end=Completed())

    def resolve(
        self, approval_id: Any, session_id: Any, turn_id: Any, decision: Any,
        permission_mode: Any = None, feedback: Any = None, context: Any = None,
    ) -> PlanApproval:
        approval_id = validate.ident(approval_id, "approvalId")
        session_id = validate.ident(session_id, "sessionId")
        turn_id = validate.ident(turn_id, "turnId")
        if decision not in ("approve", "reject"):
            raise InvalidParams(f"decision must be 'approve' or 'reject'; got {decision!r}")
        feedback = validate.optional_text(feedback, "feedback")
        if context is not None and context not in CONTEXTS:
            raise InvalidParams(f"context must be one of {', '.join(CONTEXTS)}; got {validate.brief(context)}")
        with self.p.store.db.read() as db:
            approval = repo.get_approval(db, approval_id)
        if approval is None:
            raise NotFound(f"no plan approval {approval_id!r}", Code.PLAN_NOT_FOUND)
        if approval.status is not ApprovalStatus.PENDING:
            raise Conflict(f"approval {approval_id} is already {approval.status.value}", Code.PLAN_ALREADY_RESOLVED)
        live = self.p.live.owns(approval.session_id, approval.turn_id)
        waiter = live.approval_waiter if live else None
        if (approval.session_id, approval.turn_id) != (session_id, turn_id) or waiter is None \
                or waiter[0] != approval.id or waiter[1].done():
            raise Conflict("this decision names another session or turn, or nobody is waiting for it",
                           Code.PLAN_APPROVAL_STALE)
        if decision == "approve":
            if permission_mode is None:
                raise InvalidParams("approving needs an explicit permissionMode: ask, accept-edits or auto",
                                    Code.PLAN_PERMISSION_MODE_REQUIRED)
            chosen = validate.enum(permission_mode, PermissionMode, "permissionMode", Code.PLAN_PERMISSION_MODE_INVALID)
            self._approve(approval, chosen, context or "keep")
            waiter[1].set_result("approved")
        else:
            with self.p.store.db.tx() as db:
                repo.settle_approval(db, approval.id, ApprovalStatus.REJECTED, feedback=feedback)
                repo.audit(db, f"{approval.kind.value}.rejected", session_id, turn_id, approval=approval.id,
                           feedback=feedback)
            waiter[1].set_result("rejected")
        return self._publish_resolved(approval.id)

    def _approve(self, approval: PlanApproval, chosen: PermissionMode, context: str) -> None:
        session = self.p.session(approval.session_id)
        mode = change_mode(session.mode, Mode.AGENT, ModeCause.APPROVAL)
        execution_id = new_id("x")
        with self.p.store.db.tx() as db:
            repo.settle_approval(db, approval.id, ApprovalStatus.APPROVED, permission_mode=chosen,
                                 execution_id=execution_id, context=context)
            repo.update_session(db, session.id, mode=mode.value, permission_mode=chosen.value)
            repo.audit(db, f"{approval.kind.value}.approved", session.id, approval.turn_id, approval=approval.id,
                       permission_mode=chosen.value, execution=execution_id, context=context)
            repo.audit(db, "mode.changed", session.id, approval.turn_id, frm=session.mode.value, to=mode.value,
                       cause="approval")
            self.p.store.faults.hit("approve.before_commit")
        self.p.store.faults.hit("approve.after_commit")
        self.p.bus.publish(ExecutionChanged(
            approval_id=approval.id, session_id=session.id, execution_id=execution_id,
            execution_state=ExecutionState.QUEUED.value,
        ))

    def _publish_resolved(self, approval_id: str) -> PlanApproval:
        with self.p.store.db.read() as db:
            approval = repo.get_approval(db, approval_id)
        assert approval is not None
        self.p.bus.publish(PlanResolved(approval=approval))
        self.p.publish_session(approval.session_id)
        return approval

    # ---- reads --------------------------------------------------------------------

    def pending(self, session_id: Any = None) -> list[PlanApproval]:
        if session_id is not None:
            session_id = self.p.session(validate.ident(session_id, "sessionId")).id
        with self.p.store.db.read() as db:
            return repo.approvals(db, session_id=session_id, pending=True)

    def history(self, session_id: Any) -> list[PlanApproval]:
        session = self.p.session(validate.ident(session_id, "sessionId"))
        with self.p.store.db.read() as db:
            return repo.approvals(db, session_id=session.id)

    def get(self, approval_id: Any) -> tuple[PlanApproval, str]:
        approval_id = validate.ident(approval_id, "approvalId")
        with self.p.store.db.read() as db:
            approval = repo.get_approval(db, approval_id)
        if approval is None:
            raise NotFound(f"no plan approval {approval_id!r}", Code.PLAN_NOT_FOUND)
        session = self.p.session(approval.session_id)
        assert session.project_path is not None
        try:
            markdown = read_artifact(Path(session.project_path), approval.artifact_path).decode("utf-8", "replace")
        except OSError:
            markdown = ""
        return approval, markdown


def _check_contract_args(args: dict[str, Any], kind: PlanKind) -> str | None:
    for name in ("title", "markdown", "question"):
        if not isinstance(args.get(name), str) or not args[name].strip():
            return f"{name} must be a non-empty string"
    if kind is PlanKind.GOAL:
        criteria = args.get("criteria")
        if not isinstance(criteria, list) or not criteria or not all(isinstance(c, str) and c.strip() for c in criteria):
            return "criteria must be a non-empty list of acceptance criteria (strings)"
        if len(set(criteria)) != len(criteria):
            return "criteria must be distinct"
    return None
