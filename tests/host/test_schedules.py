"""Schedules with an injected clock: due runs fire once, contract modes fail fast, missed runs are skipped."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from pidesk.core import events as ev
from pidesk.providers.scripted import ScriptedProvider
from tests.scenario import ended, tool

pytestmark = pytest.mark.asyncio
T0 = datetime(2026, 12, 2, 9, 0, 30, tzinfo=UTC)


class Clock:
    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock(T0)


async def schedule(host, project, **params):
    return await host.call("schedules.create", {"name": "nightly", "cron": "*/5 * * * *",
                                                "projectPath": str(project), "prompt": "check things", **params})


async def test_a_due_run_fires_once_as_an_unattended_scheduled_turn(make_host, clock, project):
    provider = ScriptedProvider([{"text": "all good"}])
    host = make_host(provider=provider, clock=clock)
    created = await schedule(host, project)
    assert created["nextRunAt"] == "2026-12-02T09:05:00.000Z" and created["lastRun"] is None
    sub = host.subscribe()
    assert await host.schedules.tick(clock.now) == []  # not due yet
    clock.now += timedelta(minutes=5)
    fired = await host.schedules.tick(clock.now)
    assert len(fired) == 1 and fired[0]["errorCode"] is None
    started = await sub.wait_for(lambda e: isinstance(e, ev.TurnStarted))
    assert started.origin == "scheduled"
    await ended(sub, fired[0]["turnId"])
    assert await host.schedules.tick(clock.now) == []  # once
    await host.schedules.settled()
    listed = (await host.call("schedules.list", {}))["schedules"][0]
    assert listed["lastRun"]["status"] == "ok" and listed["lastRun"]["sessionId"] == fired[0]["sessionId"]
    assert listed["nextRunAt"] == "2026-12-02T09:10:00.000Z"
    assert provider.calls(fired[0]["sessionId"]) == 1


@pytest.mark.parametrize("mode", ["plan", "goal"])
async def test_a_contract_schedule_fails_before_any_model_request(make_host, clock, project, mode):
    provider = ScriptedProvider([{"text": "must never be asked"}])
    host = make_host(provider=provider, clock=clock)
    created = await schedule(host, project, mode=mode)
    sub = host.subscribe()
    result = await host.call("schedules.runNow", {"scheduleId": created["id"]})
    assert result["errorCode"] == "PLAN_REQUIRES_INTERACTIVE_SESSION"
    end = await ended(sub, result["turnId"])
    assert (end.reason, end.error_code) == ("error", "PLAN_REQUIRES_INTERACTIVE_SESSION")
    note = await sub.wait_for(lambda e: isinstance(e, ev.NotificationCreated))
    assert (note.notification.kind, note.notification.turn_id) == ("task.failed", result["turnId"])
    await host.schedules.settled()
    run = (await host.call("schedules.list", {}))["schedules"][0]["lastRun"]
    assert (run["status"], run["errorCode"]) == ("failed", "PLAN_REQUIRES_INTERACTIVE_SESSION")
    assert provider.requests == []


async def test_an_ask_fails_the_run_fast_instead_of_hanging(make_host, clock, project):
    provider = ScriptedProvider([tool("Write", path="x.txt", content="x")])
    host = make_host(provider=provider, clock=clock)
    created = await schedule(host, project, permissionMode="ask")
    sub = host.subscribe()
    result = await host.call("schedules.runNow", {"scheduleId": created["id"]})
    end = await ended(sub, result["turnId"])
    assert (end.reason, end.error_code) == ("error", "PERMISSION_REQUIRED")
    assert not (project / "x.txt").exists()
    assert (await host.call("permissions.pending", {}))["requests"] == []


async def test_runs_missed_while_the_host_was_down_are_skipped_not_replayed(make_host, clock, project):
    provider = ScriptedProvider([{"text": "ran"}])
    host = make_host(provider=provider, clock=clock)
    created = await schedule(host, project)
    await host.close()
    clock.now += timedelta(hours=3)
    again = make_host(provider=provider, clock=clock)
    listed = (await again.call("schedules.list", {}))["schedules"][0]
    assert listed["lastRun"]["status"] == "skipped" and listed["lastRun"]["at"] == created["nextRunAt"]
    assert listed["nextRunAt"] == "2026-12-02T12:05:00.000Z"
    assert await again.schedules.tick(clock.now) == []
    assert provider.requests == []
    await again.call("schedules.delete", {"scheduleId": created["id"]})
    assert (await again.call("schedules.list", {}))["schedules"] == []
