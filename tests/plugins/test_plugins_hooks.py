"""EventHooks: entry-point plugins get host events, isolated from the host and from each other."""

from __future__ import annotations

import asyncio
import logging
import sys
from pathlib import Path
from typing import Any

import pytest

from pidesk.core.events import TurnEnded, TurnStarted, event_payload
from pidesk.plugins.hooks import ENTRY_POINT_GROUP, TURN_ENDED, EventHooks, turn_ended_payload


class Recorder:
    def __init__(self, name: str = "recorder") -> None:
        self.name = name
        self.events: list[dict[str, Any]] = []

    async def on_event(self, event: dict[str, Any]) -> None:
        self.events.append(event)
        event["tampered"] = True  # each plugin has its own copy


class Raiser:
    name = "raiser"

    async def on_event(self, event: dict[str, Any]) -> None:
        raise RuntimeError(f"plugin bug on {event['type']}")


class Hanger:
    name = "hanger"

    def __init__(self) -> None:
        self.started = 0
        self.cancelled = 0

    async def on_event(self, event: dict[str, Any]) -> None:
        self.started += 1
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise


class Gate:
    """Holds every event until opened."""

    name = "gate"

    def __init__(self) -> None:
        self.open = asyncio.Event()
        self.seen: list[str] = []

    async def on_event(self, event: dict[str, Any]) -> None:
        await self.open.wait()
        self.seen.append(event["type"])


def turn_events(turn_id: str, reason: str, error_code: str | None = None) -> list[dict[str, Any]]:
    started = event_payload(TurnStarted(session_id="s1", turn_id=turn_id, origin="user"), 1)
    ended = event_payload(TurnEnded(session_id="s1", turn_id=turn_id, reason=reason, error_code=error_code), 2)
    return [started, ended, turn_ended_payload(ended)]


def test_turn_ended_payload_is_the_documented_shape() -> None:
    ended = event_payload(TurnEnded(session_id="s1", turn_id="t1", reason="error", error_code="PROVIDER_ERROR"), 7)
    assert turn_ended_payload(ended) == {
        "type": "session:turnEnded", "sessionId": "s1", "turnId": "t1", "reason": "error", "errorCode": "PROVIDER_ERROR",
    }
    completed = event_payload(TurnEnded(session_id="s1", turn_id="t2", reason="completed"), 8)
    assert turn_ended_payload(completed)["errorCode"] is None
    with pytest.raises(ValueError, match="needs a turn.ended event payload, got type 'turn.started'"):
        turn_ended_payload(event_payload(TurnStarted(session_id="s1", turn_id="t1", origin="user"), 1))


@pytest.mark.asyncio
async def test_every_plugin_gets_every_event_in_order_each_with_its_own_copy() -> None:
    first, second = Recorder("first"), Recorder("second")
    hooks = EventHooks([first, second])
    delivered = turn_events("t1", "completed") + turn_events("t2", "aborted")
    for event in delivered:
        hooks.deliver(event)
    await hooks.drain()
    for plugin in (first, second):
        assert [{k: v for k, v in e.items() if k != "tampered"} for e in plugin.events] == delivered
        assert [e["turnId"] for e in plugin.events if e["type"] == TURN_ENDED] == ["t1", "t2"]
    assert all("tampered" not in event for event in delivered)
    assert hooks.listing() == [{"name": "first", "enabled": True}, {"name": "second", "enabled": True}]
    await hooks.close()


@pytest.mark.asyncio
async def test_a_plugin_that_raises_or_hangs_is_isolated(caplog: pytest.LogCaptureFixture) -> None:
    recorder, raiser, hanger = Recorder(), Raiser(), Hanger()
    hooks = EventHooks([raiser, hanger, recorder], timeout=0.1)
    delivered = turn_events("t1", "error", "PROVIDER_ERROR")
    with caplog.at_level(logging.WARNING, logger="pidesk.plugins.hooks"):
        for event in delivered:
            hooks.deliver(event)  # never raises, never waits
        await hooks.drain()
    assert len(recorder.events) == 3
    assert (hanger.started, hanger.cancelled) == (3, 3)  # each event given up on after the timeout
    assert hooks.listing() == [
        {"name": "raiser", "enabled": True, "failures": 3},
        {"name": "hanger", "enabled": True, "failures": 3},
        {"name": "recorder", "enabled": True},
    ]
    messages = [r.getMessage() for r in caplog.records]
    assert "event plugin 'raiser' raised on a turn.started event" in messages
    assert "event plugin 'hanger' took longer than 0.1 s on a session:turnEnded event" in messages
    # they keep receiving later events
    hooks.deliver(delivered[0])
    await hooks.drain()
    assert len(recorder.events) == 4 and hanger.started == 4
    await hooks.close()


@pytest.mark.asyncio
async def test_close_cancels_a_plugin_that_is_still_running() -> None:
    hanger = Hanger()
    hooks = EventHooks([hanger], timeout=0.1)
    hooks.deliver({"type": "turn.started"})
    hooks.deliver({"type": "turn.ended"})
    await hooks.close()
    assert hanger.cancelled == hanger.started >= 1
    hooks.deliver({"type": "turn.started"})  # after close: ignored
    await hooks.drain()
    assert hanger.started <= 2


@pytest.mark.asyncio
async def test_a_plugin_far_behind_loses_new_events_and_they_are_counted() -> None:
    gate = Gate()
    hooks = EventHooks([gate], queue_limit=2)
    for n in range(5):
        hooks.deliver({"type": f"e{n}"})
    gate.open.set()
    await hooks.drain()
    assert gate.seen == ["e0", "e1"]
    assert hooks.listing() == [{"name": "gate", "enabled": True, "dropped": 3}]
    await hooks.close()


@pytest.mark.asyncio
async def test_plugins_without_on_event_or_with_a_sync_one() -> None:
    class Quiet:
        name = "quiet"

    class Sync:
        def on_event(self, event: dict[str, Any]) -> None: ...

    hooks = EventHooks([Quiet(), Sync()])
    hooks.deliver({"type": "turn.started"})
    await hooks.drain()
    assert hooks.listing() == [
        {"name": "quiet", "enabled": True},
        {"name": "Sync", "enabled": False,
         "error": "on_event must be an async function: async def on_event(event) -> None"},
    ]
    await hooks.close()


PLUGIN_MODULE = '''
events = []

class Plugin:
    name = "fake-notify"

    async def on_event(self, event):
        events.append(event)

async def on_event(event):
    events.append(("module", event["type"]))
'''


@pytest.fixture
def installed_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A real installed distribution declaring ``pidesk.plugins`` entry points, found on sys.path."""
    module = "pidesk_fake_plugin_for_tests"
    (tmp_path / f"{module}.py").write_text(PLUGIN_MODULE)
    dist = tmp_path / "pidesk_fake_plugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: pidesk-fake-plugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        f"[{ENTRY_POINT_GROUP}]\n"
        f"notify = {module}:Plugin\n"
        f"as-module = {module}\n"
        f"broken = {module}_missing:plugin\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, module, raising=False)
    return module


@pytest.mark.asyncio
async def test_entry_points_are_loaded_and_a_broken_one_is_listed_disabled(installed_plugin: str) -> None:
    hooks = EventHooks.from_entry_points()
    ours = {e["name"]: e for e in hooks.listing() if e["name"] in ("fake-notify", "as-module", "broken")}
    assert ours["fake-notify"] == {"name": "fake-notify", "enabled": True}  # a class, instantiated; its own name
    assert ours["as-module"] == {"name": "as-module", "enabled": True}  # a module; the entry point's name
    assert not ours["broken"]["enabled"]
    assert ours["broken"]["error"].startswith("failed to load: ModuleNotFoundError")
    hooks.deliver({"type": "turn.started", "turnId": "t1"})
    await hooks.drain()
    events = sys.modules[installed_plugin].events
    assert {"type": "turn.started", "turnId": "t1"} in events and ("module", "turn.started") in events
    await hooks.close()


@pytest.mark.asyncio
async def test_entry_points_can_be_injected() -> None:
    recorder = Recorder("injected")

    class Point:
        name = "x"

        def load(self) -> object:
            return recorder

    asked: list[str] = []

    def entry_points(*, group: str) -> list[Point]:
        asked.append(group)
        return [Point()]

    hooks = EventHooks.from_entry_points(entry_points=entry_points)
    assert asked == [ENTRY_POINT_GROUP]
    hooks.deliver({"type": "turn.started"})
    await hooks.drain()
    assert recorder.events == [{"type": "turn.started", "tampered": True}]
    await hooks.close()
