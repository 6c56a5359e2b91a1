"""Lists that grow without end, paged the one way: by (created_at, id).

``session.list`` and ``notifications.list`` take ``limit`` (1–1000) and ``cursor``. With either,
a page newest first and ``nextCursor`` for the next one (None after the last); ``cursor`` without
``limit`` pages by ``DEFAULT_PAGE``. A cursor is the (created_at, id) of the last row of the page
before, joined by ``SEP``: opaque to clients, and one this host did not make is INVALID_PARAMS.
Rows added after the first page are not on later pages; deleted ones simply drop out. Without
either: every row, oldest first, as before paging — read ``SLICE`` rows at a time with the loop
given a turn between (one read of 100,000 rows held it for 0.4 s). ``session.changes`` pages with
the same pieces, its pages oldest first (a session's turns read in order).

A list's answer is ``Ready``: its rows made JSON-ready as they are read, a slice at a time, so
``Host.call`` hands it on as it is (converting 100,000 rows in one go held the loop 100 ms).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

import msgspec

from pidesk.core.errors import InvalidParams
from pidesk.host import validate

DEFAULT_PAGE = 100
MAX_PAGE = 1000
SLICE = 500
SEP = "|"
MOST = 1_000_000  # rows an unpaged list reads at most

Key = tuple[str, str]  # (created_at, id)
Row = TypeVar("Row")


class Ready(dict[str, Any]):
    """An answer already JSON-ready (builtins only): ``Host.call`` returns it without converting it again."""


def page_size(limit: Any) -> int:
    return validate.positive_int(limit, "limit", DEFAULT_PAGE, MAX_PAGE)


def next_cursor(key: Key) -> str:
    return SEP.join(key)


def parse_cursor(value: Any, method: str) -> Key:
    """A ``nextCursor`` given back: INVALID_PARAMS if it is not one this host made."""
    if isinstance(value, str) and len(value) <= 200:
        created_at, sep, row_id = value.partition(SEP)
        if sep and created_at and row_id:
            return created_at, row_id
    raise InvalidParams(f"cursor must be a nextCursor from {method}; got {validate.brief(value)}")


def page(rows: list[Row], count: int, key: Callable[[Row], Key]) -> tuple[list[Row], str | None]:
    """Up to ``count`` of ``rows`` (read with ``count + 1`` to learn whether more follow) and the next cursor."""
    shown = rows[:count]
    return shown, next_cursor(key(shown[-1])) if len(rows) > count else None


async def every(read: Callable[[Key | None, int], list[Row]], key: Callable[[Row], Key]) -> list[Row]:
    """Every row, oldest first: ``read(after, limit)`` a slice at a time, the loop given a turn between."""
    rows: list[Row] = []
    async for part in _slices(read, key):
        rows += part
    return rows


async def listing(read: Callable[[Key | None, int, bool], list[Row]], key: Callable[[Row], Key], limit: Any,
                  cursor: Any, method: str) -> tuple[list[Any], str | None]:
    """A list call's rows, JSON-ready, and its ``nextCursor``: a page when ``limit`` or ``cursor`` is given,
    else every row. ``read(after, count, newest_first)`` reads ``count`` rows past ``after`` in that order."""
    if limit is None and cursor is None:
        rows: list[Any] = []
        async for part in _slices(lambda after, count: read(after, count, False), key):
            rows += msgspec.to_builtins(part)
        return rows, None
    count = page_size(limit)
    after = parse_cursor(cursor, method) if cursor is not None else None
    shown, next_page = page(read(after, count + 1, True), count, key)
    return msgspec.to_builtins(shown), next_page


async def _slices(read: Callable[[Key | None, int], list[Row]], key: Callable[[Row], Key]) -> AsyncIterator[list[Row]]:
    """Every row, oldest first, ``SLICE`` at a time, the loop given a turn after each but the last."""
    last: Row | None = None
    for _ in range(MOST // SLICE):
        part = read(key(last) if last is not None else None, SLICE)
        yield part
        if len(part) < SLICE:
            return
        last = part[-1]
        await asyncio.sleep(0)
