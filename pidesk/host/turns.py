"""Turns: start, run, end once; abort, graceful stop, steer.

Invariants (seed 003 §1–§3):

- One active turn per session. A turn is registered in ``live.turns`` before
  the first await of ``start``, so a second prompt sees the session busy.
- The terminal reason is decided once. ``LiveTurn.decided`` flips before any
  await of an ending, and the store only moves a *running* turn row to ended:
  an abort records its decision before it cancels the task, so the task's late
  completion cannot restate it.
- A normal end commits, in one transaction: the turn row, the session back to
  idle, the execution state, and the notification for an unseen result
  (never for a focused session or an aborted turn). Events follow the commit.
- A turn has a task of its own from the commit of its row: the caller of ``start``
  (an RPC, or the end of the previous turn starting the next) only waits for the
  prompt to be stored, so no caller's fate can strand a turn. Only an abort (or
  the shutdown, which aborts) cancels that task; a stray cancellation ends the
  turn as an ``INTERNAL`` error instead of leaving its session running.
- Nothing runs after an abort is acknowledged: ``abort`` cancels the task and
  waits for it (Bash process groups are killed by the tool on cancellation).
  An execution the aborted turn's contract was approved for, and that has not
  started yet, is aborted with it: it would otherwise stay queued behind a turn
  end that never dispatches, and keep the session busy for good.
- After every turn end but an abort, ``after_turn`` runs: a queued execution
  starts first, else one queue entry is released.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from pidesk.core.errors import Code, Conflict, StoreError
from pidesk.core.events import (
    ExecutionChanged,
    MessageAppended,
    NotificationCreated,
    PermissionResolved,
    PlanResolved,
    QueueChanged,
    SessionTruncated,
    TurnEnded,
    TurnStarted,
)
from pidesk.core.modes import ExecutionState, NotificationKind, SessionStatus, TurnOrigin, TurnReason
from pidesk.core.records import Block, Draft, Message, Notification
from pidesk.host import checkpoints
from pidesk.host.delegates import Delegates
from pidesk.host.delegates import cancel as cancel_delegates
from pidesk.host.live import GoalProgress, LiveTurn
from pidesk.host.parts import Parts
from pidesk.ids import new_id
from pidesk.runtime.loop import Completed, Failed, TurnEnd, run_turn
from pidesk.store import repo

log = logging.getLogger("pidesk.turns")

ABORT_GRACE_SECONDS = 30.0


@dataclass(frozen=True)
class AbortResult:
    aborted: bool
    restored_draft: Draft | None = None


ContextFactory = Callable[[LiveTurn], Awaitable[object]]  # prepared for the turn's first request


class Turns:
    def __init__(self, parts: Parts) -> None:
        self.p = parts
        self.context_factory: ContextFactory | None = None  # wired by the Host
        self.after_turn: Callable[[str], Awaitable[None]] | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(
        self,
        session_id: str,
        content: list[Block],
        *,
        origin: TurnOrigin,
        unattended: bool = False,
        draft: Draft | None = None,
        approval_id: str | None = None,
        criteria: list[str] | None = None,
        consume_entry: str | None = None,
        fail_before_model: str | None = None,
    ) -> tuple[str, str]:
        """Start a turn on an idle session (the caller checked it is idle); returns (turn id, message id)
        once its prompt is durable.

        From the commit of its row on, the turn belongs to a task of its own, which stores the prompt,
        runs the agent loop and ends the turn. The caller only waits for the prompt: a caller
        cancelled meanwhile (the end of the previous turn starting the next one, say) can never
        leave the session running a turn that nobody drives.

        Starting a turn is turn work: it holds a slot of the step gate (``runtime/gate.py``) until its
        prompt is durable, so a burst of prompts is let in at the pace of the store. 64 at once made
        one loop iteration of 64 durable commits, then another of 64 turns' first steps, and held every
        other client's request behind them for 100-250 ms (bench/scale_checkpoints.py).
        """
        async with self.p.gate.slot() as slot:
            if session_id in self.p.live.turns:
                raise Conflict("the session already has an active turn", Code.AGENT_BUSY)
            turn_id = new_id("t")
            live = LiveTurn(
                session_id=session_id, turn_id=turn_id, origin=origin, unattended=unattended, draft=draft,
                approval_id=approval_id, goal=GoalProgress(criteria) if criteria else None,
            )
            self.p.live.turns[session_id] = live
            try:
                with self.p.store.db.tx() as db:
                    repo.insert_turn(db, turn_id, session_id, origin, approval_id, consume_entry)
                    if not repo.set_status(db, session_id, SessionStatus.IDLE, SessionStatus.RUNNING, turn_id):
                        raise Conflict("the session is not idle", Code.AGENT_BUSY)
                    if approval_id is not None:
                        repo.set_execution_state(db, approval_id, ExecutionState.QUEUED, ExecutionState.RUNNING)
            except BaseException:
                del self.p.live.turns[session_id]
                raise
            self.p.store.faults.hit("turn.after_start")
            self.p.bus.publish(TurnStarted(session_id=session_id, turn_id=turn_id, origin=origin.value))
            self.p.publish_session(session_id)
            if approval_id is not None:
                self.publish_execution(approval_id)
            # The prompt's write runs as a task of its own: nobody's cancellation can interrupt it.
            write: asyncio.Future[Message] = asyncio.ensure_future(
                self.p.in_thread(self.p.store.append_message, session_id, turn_id, "user", content))
            stored: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
            task = asyncio.create_task(self._drive(live, write, stored, consume_entry, fail_before_model),
                                       name=f"turn {turn_id}")
            live.task = task
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            either: set[asyncio.Future[Any]] = {stored, task}
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)  # (cancels neither)
            if stored.done():
                return turn_id, stored.result().id
            # The task ended without answering: aborted before its first step. The prompt is still written.
            return turn_id, (await asyncio.shield(write)).id

    async def _drive(self, live: LiveTurn, write: asyncio.Future[Message], stored: asyncio.Future[Message],
                     consume_entry: str | None, fail_before_model: str | None) -> None:
        """The task that owns one turn: store its prompt, run the agent loop, end the turn with its outcome.

        ``stored`` answers the caller of ``start``: the prompt's message once it is durable and
        announced, or the ``StoreError`` that failed it once the turn has ended.
        """
        try:
            if not await self._store_prompt(live, write, stored, consume_entry):
                return
            if fail_before_model is not None:
                end: TurnEnd = Failed(fail_before_model)
            else:
                checkpoints.of(self.p).before_turn(live)  # the workspace before the turn (issue 17)
                assert self.context_factory is not None
                ctx = await self.context_factory(live)
                end = await run_turn(ctx, self.p.provider, self.p.gate)  # type: ignore[arg-type]
                await Delegates.settle(live, end)  # seed 003 §3 rule 17
        except asyncio.CancelledError:
            if live.decided:  # aborted (an abort, or the host's shutdown, decides before it cancels)
                return
            # Nothing else may cancel a turn. Should something (a library's stray cancellation) do
            # it anyway, the turn ends as an error rather than leave its session running forever.
            log.error("turn %s was cancelled without an abort; it ends as an internal error", live.turn_id,
                      exc_info=True)
            end = Failed(Code.INTERNAL)
        except StoreError:
            log.exception("turn %s could not persist", live.turn_id)
            end = Failed(Code.PERSISTENCE_FAILURE)
        except Exception:
            log.exception("turn %s failed inside the host", live.turn_id)
            end = Failed(Code.INTERNAL)
        await self.finish(live, end)

    async def _store_prompt(self, live: LiveTurn, write: asyncio.Future[Message], stored: asyncio.Future[Message],
                            consume_entry: str | None) -> bool:
        """Wait for the prompt's write and announce it; False if the turn is over before it could run."""
        try:
            message = await asyncio.shield(write)
        except Exception as exc:
            try:
                code = Code.PERSISTENCE_FAILURE if isinstance(exc, StoreError) else Code.INTERNAL
                await self.finish(live, Failed(code))
            finally:
                stored.set_exception(exc)
            return False
        live.root_message_id, live.root_seq = message.id, message.seq
        if live.decided:  # aborted (or shut down) while its prompt was being written: nothing runs
            stored.set_result(message)
            return False
        if consume_entry is not None:  # spent only once its prompt is in the transcript
            with self.p.store.db.tx() as db:
                repo.queue_remove(db, live.session_id, consume_entry)
            self._publish_queue(live.session_id)
        self.p.bus.publish(MessageAppended(session_id=live.session_id, turn_id=live.turn_id, message=message))
        stored.set_result(message)
        return True

    async def finish(self, live: LiveTurn, end: TurnEnd) -> None:
        """End a turn as completed or error — once; a turn already decided is left alone."""
        if live.decided:
            return
        live.decided = True
        reason = TurnReason.COMPLETED if isinstance(end, Completed) else TurnReason.ERROR
        code = end.code if isinstance(end, Failed) else None
        message = (end.message or None) if isinstance(end, Failed) else None  # Turn.errorMessage
        notification: Notification | None = None
        execution = None
        with self.p.store.db.tx() as db:
            if repo.end_turn_row(db, live.turn_id, reason, code, message):
                repo.end_activity(db, live.session_id, live.turn_id)
                if live.approval_id is not None:
                    execution = ExecutionState.COMPLETED if reason is TurnReason.COMPLETED else ExecutionState.FAILED
                    repo.set_execution_state(db, live.approval_id, ExecutionState.RUNNING, execution)
                if not self.p.live.visible(live.session_id):
                    kind = NotificationKind.COMPLETED if reason is TurnReason.COMPLETED else NotificationKind.FAILED
                    notification = repo.insert_notification(db, live.session_id, live.turn_id, kind)
        self.p.store.faults.hit("turn.after_end")
        self._release(live)
        self.p.bus.publish(TurnEnded(session_id=live.session_id, turn_id=live.turn_id, reason=reason.value, error_code=code,
                                     error_message=message))
        if notification is not None:
            self.p.bus.publish(NotificationCreated(notification=notification))
        if live.approval_id is not None and execution is not None:
            self.publish_execution(live.approval_id)
        self.p.publish_session(live.session_id)
        if self.after_turn is not None:
            await self.after_turn(live.session_id)

    async def abort(self, session_id: str, smart: bool = False) -> AbortResult:
        """Abort the active turn (idempotent). A smart abort before any output restores the draft."""
        live = self.p.live.turns.get(session_id)
        if live is None or live.decided:
            return AbortResult(aborted=False)
        live.decided = True  # decided before the cancel is issued
        restore = smart and not live.has_output and live.root_message_id is not None and live.draft is not None
        with self.p.store.db.tx() as db:
            repo.end_turn_row(db, live.turn_id, TurnReason.ABORTED, None)
            requests, approvals = repo.interrupt_turn_waits(db, live.turn_id)
            # approved in this turn but not yet dispatched: dropped, or it would wait forever
            dropped = repo.abort_queued_executions(db, turn_id=live.turn_id)
            if live.approval_id is not None:
                repo.set_execution_state(db, live.approval_id, ExecutionState.RUNNING, ExecutionState.ABORTED)
            repo.audit(db, "turn.aborted", session_id, live.turn_id, smart=smart, restored=restore)
        self.p.store.faults.hit("abort.after_decision")
        await cancel_delegates(live)
        if live.task is not None and live.task is not asyncio.current_task():
            live.task.cancel()
            _done, pending = await asyncio.wait({live.task}, timeout=ABORT_GRACE_SECONDS)
            if pending:
                log.error("turn %s did not stop within %ss of its abort", live.turn_id, ABORT_GRACE_SECONDS)
        if restore:
            assert live.root_message_id is not None
            cut = await self.p.in_thread(self.p.store.cut_from, session_id, live.root_message_id, lambda _db: None)
            self.p.bus.publish(SessionTruncated(session_id=session_id, from_seq=cut))
        with self.p.store.db.tx() as db:
            repo.end_activity(db, session_id, live.turn_id)
        self._release(live)
        with self.p.store.db.read() as db:
            for request_id in requests:
                request = repo.get_request(db, request_id)
                if request is not None:
                    self.p.bus.publish(PermissionResolved(request=request))
            for approval_id in approvals:
                approval = repo.get_approval(db, approval_id)
                if approval is not None:
                    self.p.bus.publish(PlanResolved(approval=approval))
        self.p.bus.publish(TurnEnded(session_id=session_id, turn_id=live.turn_id, reason=TurnReason.ABORTED.value))
        for approval_id in [*dropped, *([live.approval_id] if live.approval_id else [])]:
            self.publish_execution(approval_id)
        self.p.publish_session(session_id)
        return AbortResult(aborted=True, restored_draft=live.draft if restore else None)

    def _release(self, live: LiveTurn) -> None:
        if self.p.live.turns.get(live.session_id) is live:
            del self.p.live.turns[live.session_id]
        checkpoints.of(self.p).turn_ended(live)  # its list of changes is stored (issue 33 §1)
        for future in live.permission_waiters.values():
            if not future.done():
                future.cancel()
        if live.approval_waiter is not None and not live.approval_waiter[1].done():
            live.approval_waiter[1].cancel()

    def publish_execution(self, approval_id: str) -> None:
        with self.p.store.db.read() as db:
            approval = repo.get_approval(db, approval_id)
        if approval is not None and approval.execution_id is not None:
            self.p.bus.publish(ExecutionChanged(
                approval_id=approval.id, session_id=approval.session_id, execution_id=approval.execution_id,
                execution_state=approval.execution_state.value,
            ))

    def _publish_queue(self, session_id: str) -> None:
        with self.p.store.db.read() as db:
            entries = repo.queue_entries(db, session_id)
        self.p.bus.publish(QueueChanged(session_id=session_id, entries=entries))

    async def shutdown(self) -> None:
        """Abort every running turn (recorded as aborted) before the store closes."""
        for session_id in list(self.p.live.turns):
            await self.abort(session_id)
