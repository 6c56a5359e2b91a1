"""``session.list`` paged (issue 29 item 7, issue 33 item 4): every session exactly once, newest first,
a project's only when asked; the unpaged call as before paging (every session, oldest first)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pidesk.core.errors import InvalidParams

pytestmark = pytest.mark.asyncio


async def _pages(host: Any, limit: int, **params: Any) -> list[list[str]]:
    pages: list[list[str]] = []
    cursor = None
    for _ in range(1000):
        got = await host.call("session.list", {"limit": limit, **params} | ({"cursor": cursor} if cursor else {}))
        pages.append([s["id"] for s in got["sessions"]])
        cursor = got["nextCursor"]
        if cursor is None:
            return pages
    raise AssertionError("paging did not end")


async def _make(host: Any, count: int, project: Path | None = None) -> list[str]:
    """``count`` new sessions, oldest first: by creation time, then by id (several share a millisecond)."""
    made = []
    for n in range(count):
        params = {"title": f"s{n}"} | ({"projectPath": str(project)} if project else {})
        made.append(await host.call("session.create", params))
    return [s["id"] for s in sorted(made, key=lambda s: (s["createdAt"], s["id"]))]


async def test_pages_hold_every_session_once_newest_first_and_the_last_says_so(host, project, tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    mine = await _make(host, 13, project)
    theirs = await _make(host, 9, other)
    every = (await host.call("session.list", {}))
    assert every["nextCursor"] is None
    oldest_first = [s["id"] for s in every["sessions"]]
    assert sorted(oldest_first) == sorted(mine + theirs) and len(oldest_first) == 22
    for limit in (1, 5, 22, 100):
        pages = await _pages(host, limit)
        assert [i for page in pages for i in page] == oldest_first[::-1], limit
        assert all(len(page) == limit for page in pages[:-1]) and 0 < len(pages[-1]) <= limit
    pages = await _pages(host, 4, projectPath=str(project))
    assert sorted(i for page in pages for i in page) == sorted(mine) and len(pages) == 4


async def test_a_session_made_or_deleted_between_pages_neither_repeats_nor_skips_another(host, project):
    made = await _make(host, 10, project)
    first = await host.call("session.list", {"limit": 4})
    await _make(host, 3, project)  # newer than the cursor: on a first page asked again, not on the next
    await host.call("session.delete", {"sessionId": made[2]})
    rest = await _pages(host, 4, cursor=first["nextCursor"])
    seen = [s["id"] for s in first["sessions"]] + [i for page in rest for i in page]
    assert seen == [i for i in made[::-1] if i != made[2]]


@pytest.mark.parametrize("params", [{"limit": 0}, {"limit": 1001}, {"limit": "10"}, {"cursor": "nonsense"},
                                    {"cursor": 5}, {"cursor": "x" * 300}])
async def test_a_bad_limit_or_cursor_is_invalid_params(host, params):
    with pytest.raises(InvalidParams):
        await host.call("session.list", params)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(count=st.integers(0, 30), limit=st.integers(1, 12))
async def test_property_paging_returns_every_session_exactly_once(host, count, limit):
    for old in (await host.call("session.list", {}))["sessions"]:
        await host.call("session.delete", {"sessionId": old["id"]})
    made = await _make(host, count)
    pages = await _pages(host, limit)
    assert [i for page in pages for i in page] == made[::-1]
