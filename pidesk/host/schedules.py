"""Schedules: prompts that run unattended on a cron expression, and fail fast when they cannot.

Every run is a new session in the schedule's project, with the schedule's mode
and permission mode, and one unattended turn (origin ``scheduled``):

- a Plan or Goal schedule is refused **before any model request**: its turn ends
  at once with ``PLAN_REQUIRES_INTERACTIVE_SESSION``, recorded as a failed run,
  with the ``task.failed`` notification any unseen failed turn gets — nothing in
  the background ever shows or approves a contract;
- an Ask the run cannot answer ends it with ``PERMISSION_REQUIRED`` (the turn is
  unattended), never a hang;
- runs missed while the host was down are recorded ``skipped``, not replayed, and
  a run cut short by a crash is recorded failed (``INTERRUPTED``).

Time comes from an injected clock; ``tick(now)`` fires what is due, so tests
drive the scheduler without waiting, and ``run_forever`` sleeps until the next
due time (at most ``MAX_SLEEP``) or a schedule change.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any


from pidesk.core.errors import Code, InvalidParams, NotFound
from pidesk.core.modes import Mode, PermissionMode, TurnOrigin, TurnReason
from pidesk.core.records import Schedule, TextBlock
from pidesk.host import validate
from pidesk.host.parts import Parts
from pidesk.host.sessions import Sessions
from pidesk.host.turns import Turns
from pidesk.ids import iso, new_id, parse_iso, utcnow
from pidesk.store import repo

log = logging.getLogger("pidesk.schedules")
MAX_SLEEP = 60.0


class Schedules:
    def __init__(self, parts: Parts, sessions: Sessions, turns: Turns,
                 clock: Callable[[], datetime] = utcnow) -> None:
        self.p = parts
        self.sessions = sessions
        self.turns = turns
        self.clock = clock
        self._changed = asyncio.Event()
        self._watchers: set[asyncio.Task[None]] = set()

    # ---- the wire methods --------------------------------------------------------------

    def create(self, name: Any, cron: Any, project_path: Any, prompt: Any, mode: Any = None,
               permission_mode: Any = None) -> Schedule:
        label = validate.label(name, "name")
        expression = validate.text(cron, "cron")
        from croniter import croniter  # type: ignore[import-untyped]  # 20 ms: only when schedules are used

        if not croniter.is_valid(expression):
            raise InvalidParams(f"cron {expression!r} is not a cron expression (e.g. '0 9 * * 1-5')")
        chosen_mode = validate.enum(mode or "agent", Mode, "mode")
        chosen_permission = validate.enum(permission_mode or "ask", PermissionMode, "permissionMode")
        text = validate.text(prompt, "prompt")
        project = self.p.project(project_path)  # (last: malformed input is INVALID_PARAMS first)
        schedule = Schedule(
            id=new_id("sc"), name=label, cron=expression, project_path=str(project.resolve()),
            prompt=text, mode=chosen_mode, permission_mode=chosen_permission,
            enabled=True, next_run_at=iso(_next(expression, self.clock())), last_run=None,
        )
        with self.p.store.db.tx() as db:
            repo.insert_schedule(db, schedule)
            repo.audit(db, "schedule.created", None, schedule=schedule.id, mode=schedule.mode.value)
        self._changed.set()
        return schedule

    def all(self) -> list[Schedule]:
        with self.p.store.db.read() as db:
            return repo.list_schedules(db)

    def delete(self, schedule_id: Any) -> None:
        with self.p.store.db.tx() as db:
            if not repo.delete_schedule(db, validate.ident(schedule_id, "scheduleId")):
                raise NotFound(f"no schedule {schedule_id!r}")
            repo.audit(db, "schedule.deleted", None, schedule=schedule_id)
        self._changed.set()

    async def run_now(self, schedule_id: Any) -> dict[str, Any]:
        with self.p.store.db.read() as db:
            schedule = repo.get_schedule(db, validate.ident(schedule_id, "scheduleId"))
        if schedule is None:
            raise NotFound(f"no schedule {schedule_id!r}")
        return await self._fire(schedule, self.clock())

    # ---- the scheduler ----------------------------------------------------------------------

    def skip_missed(self, now: datetime) -> int:
        """At boot: every schedule whose due time passed while the host was down gets one
        ``skipped`` run and its next due time in the future. Nothing is replayed."""
        skipped = 0
        with self.p.store.db.tx() as db:
            repo.interrupt_runs(db)
            for schedule in repo.list_schedules(db):
                due = parse_iso(schedule.next_run_at)
                if schedule.enabled and due <= now:
                    repo.insert_run(db, schedule.id, schedule.next_run_at, "skipped")
                    repo.set_next_run(db, schedule.id, iso(_next(schedule.cron, now)))
                    skipped += 1
        return skipped

    async def tick(self, now: datetime) -> list[dict[str, Any]]:
        """Fire every enabled schedule that is due at ``now``, once each."""
        fired = []
        for schedule in self.all():
            if schedule.enabled and parse_iso(schedule.next_run_at) <= now:
                with self.p.store.db.tx() as db:
                    repo.set_next_run(db, schedule.id, iso(_next(schedule.cron, now)))
                fired.append(await self._fire(schedule, parse_iso(schedule.next_run_at)))
        return fired

    async def run_forever(self) -> None:
        while True:
            try:
                await self.tick(self.clock())
            except Exception:
                log.exception("a scheduled run could not start")
            upcoming = [parse_iso(s.next_run_at) for s in self.all() if s.enabled]
            wait = min([(d - self.clock()).total_seconds() for d in upcoming] + [MAX_SLEEP])
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), timeout=max(wait, 0.0))
            except TimeoutError:
                pass

    async def settled(self, timeout: float = 10.0) -> None:
        """Wait until every started run has its outcome recorded (after its turn ended)."""
        if self._watchers:
            await asyncio.wait(set(self._watchers), timeout=timeout)

    async def close(self) -> None:
        """After the turns were shut down: record their runs, then stop watching."""
        await self.settled(timeout=5.0)
        for task in list(self._watchers):
            task.cancel()
        await asyncio.gather(*self._watchers, return_exceptions=True)

    async def _fire(self, schedule: Schedule, due: datetime) -> dict[str, Any]:
        session = self.sessions.create(schedule.project_path, f"{schedule.name} (scheduled)",
                                       schedule.mode.value, schedule.permission_mode.value)
        refusal = Code.PLAN_REQUIRES_INTERACTIVE_SESSION.value if session.mode.is_contract else None
        with self.p.store.db.tx() as db:
            run_id = repo.insert_run(db, schedule.id, iso(due), "running", session_id=session.id)
        turn_id, _ = await self.turns.start(
            session.id, [TextBlock(text=schedule.prompt)], origin=TurnOrigin.SCHEDULED, unattended=True,
            fail_before_model=refusal,
        )
        watcher = asyncio.create_task(self._record(run_id, session.id, turn_id))
        self._watchers.add(watcher)
        watcher.add_done_callback(self._watchers.discard)
        return {"runId": run_id, "sessionId": session.id, "turnId": turn_id, "errorCode": refusal}

    async def _record(self, run_id: str, session_id: str, turn_id: str) -> None:
        """Wait for the run's turn to end, then record how it went."""
        live = self.p.live.turns.get(session_id)
        if live is not None and live.turn_id == turn_id and live.task is not None:
            await asyncio.wait({live.task})
        with self.p.store.db.read() as db:
            turn = repo.get_turn(db, turn_id)
        if turn is None:
            return
        ok = turn.reason is TurnReason.COMPLETED
        with self.p.store.db.tx() as db:
            repo.finish_run(db, run_id, "ok" if ok else "failed", turn.error_code, turn_id)


def _next(expression: str, after: datetime) -> datetime:
    from croniter import croniter  # type: ignore[import-untyped]

    result: datetime = croniter(expression, after).get_next(datetime)
    return result
