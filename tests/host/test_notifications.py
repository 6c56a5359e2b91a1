"""``notifications.list`` paged, ``unseenOnly`` honoured, old notifications pruned (issue 33 §4).

Notifications are put in the real index with the creation times a test needs (a month of them,
several in one millisecond); everything else goes through ``host.call`` as a client's would.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pidesk.config import HostConfig
from pidesk.core.errors import InvalidParams
from pidesk.host import notifications as notifications_module
from pidesk.ids import iso, new_id

pytestmark = pytest.mark.asyncio

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)


async def _session(host: Any) -> str:
    return (await host.call("session.create", {"title": "notified"}))["id"]


def _put(host: Any, session_id: str, created: datetime, *, seen: bool = False) -> str:
    """One notification, as a turn's end would record it, created at ``created``."""
    note_id = new_id("n")
    stamp = iso(created)
    with host.store.db.tx() as db:
        db.execute("INSERT INTO notifications (id, session_id, turn_id, kind, created_at, seen_at)"
                   " VALUES (?,?,?,?,?,?)", (note_id, session_id, new_id("t"), "task.completed", stamp,
                                             stamp if seen else None))
    return note_id


async def _pages(host: Any, limit: int, **params: Any) -> list[list[dict[str, Any]]]:
    pages: list[list[dict[str, Any]]] = []
    cursor = None
    for _ in range(10_000):
        got = await host.call("notifications.list", {"limit": limit, **params} | ({"cursor": cursor} if cursor else {}))
        pages.append(got["notifications"])
        cursor = got["nextCursor"]
        if cursor is None:
            return pages
    raise AssertionError("paging did not end")


def _newest_first(notes: list[dict[str, Any]]) -> list[str]:
    return [n["id"] for n in sorted(notes, key=lambda n: (n["createdAt"], n["id"]), reverse=True)]


async def test_pages_hold_every_notification_once_newest_first_and_unseen_only_the_unseen(make_host):
    host = make_host(clock=lambda: NOW)
    sid = await _session(host)
    made = [_put(host, sid, NOW - timedelta(minutes=i // 3), seen=i % 4 == 0) for i in range(40)]  # 3 a minute
    every = await host.call("notifications.list", {})
    assert every["nextCursor"] is None and sorted(n["id"] for n in every["notifications"]) == sorted(made)
    assert [n["createdAt"] for n in every["notifications"]] == sorted(n["createdAt"] for n in every["notifications"])
    newest_first = _newest_first(every["notifications"])
    unseen = [i for i in newest_first if i not in {made[k] for k in range(0, 40, 4)}]
    for limit in (1, 7, 40, 100):
        pages = await _pages(host, limit)
        assert [n["id"] for page in pages for n in page] == newest_first, limit
        assert all(len(page) == limit for page in pages[:-1])
        pages = await _pages(host, limit, unseenOnly=True)
        assert [n["id"] for page in pages for n in page] == unseen, limit
        assert all(n["seenAt"] is None for page in pages for n in page)
    unpaged_unseen = await host.call("notifications.list", {"unseenOnly": True})
    assert sorted(n["id"] for n in unpaged_unseen["notifications"]) == sorted(unseen)  # the UI's call, as before
    first = await host.call("notifications.list", {"limit": 5})
    assert [n["id"] for n in first["notifications"]] == newest_first[:5] and first["nextCursor"]


async def test_marking_seen_between_pages_neither_repeats_nor_skips_an_unseen_one(make_host):
    host = make_host(clock=lambda: NOW)
    sid = await _session(host)
    made = [_put(host, sid, NOW - timedelta(seconds=i)) for i in range(12)]  # made[0] is the newest
    first = await host.call("notifications.list", {"limit": 4, "unseenOnly": True})
    await host.call("notifications.markSeen", {"ids": [made[6]]})
    rest = await _pages(host, 4, unseenOnly=True, cursor=first["nextCursor"])
    listed = [n["id"] for n in first["notifications"]] + [n["id"] for page in rest for n in page]
    assert listed == [i for i in made if i != made[6]]


@pytest.mark.parametrize("params", [{"limit": 0}, {"limit": 1001}, {"limit": "10"}, {"cursor": "nonsense"},
                                    {"cursor": 5}, {"cursor": "x" * 300}, {"unseenOnly": "yes"}])
async def test_a_bad_limit_cursor_or_flag_is_invalid_params(host, params):
    with pytest.raises(InvalidParams):
        await host.call("notifications.list", params)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(notes=st.lists(st.tuples(st.integers(0, 5), st.booleans()), max_size=60), limit=st.integers(1, 15))
async def test_property_paging_returns_every_notification_exactly_once(host, notes, limit):
    """Random notifications — creation times drawn from six milliseconds (so many share one), seen or
    not — listed in pages of a random size: every one exactly once, newest first; with unseenOnly,
    exactly the unseen ones, in the same order."""
    with host.store.db.tx() as db:
        db.execute("DELETE FROM notifications")
    sid = await _session(host)
    made = {_put(host, sid, NOW + timedelta(milliseconds=ms), seen=seen): seen for ms, seen in notes}
    listed = [n for page in await _pages(host, limit) for n in page]
    assert [n["id"] for n in listed] == _newest_first(listed) and sorted(n["id"] for n in listed) == sorted(made)
    unseen = [n["id"] for page in await _pages(host, limit, unseenOnly=True) for n in page]
    assert unseen == [n["id"] for n in listed if not made[n["id"]]]


async def test_retention_prunes_old_notifications_seen_or_not_and_keeps_recent_ones(make_host):
    host = make_host(clock=lambda: NOW, notification_retention_days=30)
    sid = await _session(host)
    old = [_put(host, sid, NOW - timedelta(days=days), seen=seen)
           for days in (400, 40, 30.01) for seen in (False, True)]
    kept = [_put(host, sid, NOW - timedelta(days=days), seen=seen)
            for days in (29.99, 3, 0) for seen in (False, True)]
    assert await host.notifications.prune() == len(old)
    remaining = (await host.call("notifications.list", {}))["notifications"]
    assert sorted(n["id"] for n in remaining) == sorted(kept)
    assert await host.notifications.prune() == 0  # nothing more to do


async def test_a_large_backlog_is_pruned_in_batches_with_the_loop_free_between(make_host, monkeypatch):
    """2,050 expired notifications and 10 recent ones: pruned in batches of 500, the event loop
    running other work between them (a ticker counts its turns), the recent ones kept."""
    monkeypatch.setattr(notifications_module, "PRUNE_BATCH", 500)
    host = make_host(clock=lambda: NOW)
    sid = await _session(host)
    with host.store.db.tx() as db:
        db.executemany("INSERT INTO notifications (id, session_id, turn_id, kind, created_at, seen_at)"
                       " VALUES (?,?,?,?,?,NULL)",
                       [(new_id("n"), sid, new_id("t"), "task.failed", iso(NOW - timedelta(days=31, seconds=i)))
                        for i in range(2050)])
    recent = [_put(host, sid, NOW - timedelta(hours=i)) for i in range(10)]
    turns = 0
    stop = asyncio.Event()

    async def ticker() -> None:
        nonlocal turns
        while not stop.is_set():
            turns += 1
            await asyncio.sleep(0)

    ticking = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    before = turns
    assert await host.notifications.prune() == 2050
    during = turns - before
    stop.set()
    await ticking
    assert during >= 4, f"the loop got {during} turns while five batches were deleted"
    assert sorted(n["id"] for n in (await host.call("notifications.list", {}))["notifications"]) == sorted(recent)


async def test_a_serving_host_prunes_when_it_starts(make_host):
    host = make_host(clock=lambda: NOW)
    sid = await _session(host)
    _put(host, sid, NOW - timedelta(days=31))
    kept = _put(host, sid, NOW - timedelta(days=1))
    host.start_scheduler()  # what serve does once it listens
    for _ in range(1000):  # bounded: the pruner's first pass runs as soon as the loop gets to it
        if len((await host.call("notifications.list", {}))["notifications"]) == 1:
            break
        await asyncio.sleep(0)
    assert [n["id"] for n in (await host.call("notifications.list", {}))["notifications"]] == [kept]


async def test_the_retention_period_is_configurable_and_checked(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text("notification_retention_days = 7\n")
    assert HostConfig.from_environ({"PIDESK_CONFIG": str(path)}).notification_retention_days == 7
    env = {"PIDESK_CONFIG": str(path), "PIDESK_NOTIFICATION_RETENTION_DAYS": "90"}
    assert HostConfig.from_environ(env).notification_retention_days == 90
    assert HostConfig.from_environ({"PIDESK_CONFIG": str(tmp_path / "none.toml")}).notification_retention_days == 30
    for bad in ("0", "-3", "soon", "inf"):
        with pytest.raises(InvalidParams, match="PIDESK_NOTIFICATION_RETENTION_DAYS"):
            HostConfig.from_environ({"PIDESK_CONFIG": str(path), "PIDESK_NOTIFICATION_RETENTION_DAYS": bad})
