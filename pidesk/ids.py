"""Identity and time: prefixed random ids and ISO-8601 UTC timestamps with ``Z``."""

from __future__ import annotations

import itertools
import secrets
import time
from collections.abc import Callable
from datetime import UTC, datetime


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(8)}"


def ordered_ids(prefix: str) -> Callable[[], str]:
    """Ids of ``new_id``'s shape that sort in the order they are made, for keys indexed at a high rate.

    They count up by one, from a start drawn when this module was loaded: that millisecond
    in the high 44 bits, 20 random bits below. An index then inserts them at its right edge
    instead of at a random leaf (random ids cost the message index about 10 µs a row, ordered
    ones 4). One counter serves every generator of the process, so a store reopened in the
    same process never repeats an id. A later process starts 2**20 ids higher for every
    millisecond between the two starts, which an earlier process could only reach by making
    a million ids a millisecond.
    """
    return lambda: f"{prefix}_{next(_ordered):016x}"


_ordered = itertools.count((time.time_ns() // 1_000_000) << 20 | secrets.randbits(20))


def utcnow() -> datetime:
    return datetime.now(UTC)


def iso(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def now_iso() -> str:
    """``iso(utcnow())``, made without datetime: the store stamps every message with it.

    ``datetime.strftime`` looks ``time.strftime`` up through the import system on each
    call, which costs little alone but several times more when many threads append at
    once. Here the text of the current millisecond is kept and reused (fifty sessions
    appending at once stamp several messages a millisecond), and the text up to the
    second is formatted once a second.
    """
    global _milli, _second
    now = time.time_ns() // 1_000_000
    cached = _milli
    if cached[0] == now:
        return cached[1]
    second, milli = divmod(now, 1000)
    head = _second
    if head[0] != second:
        head = _second = (second, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second)))
    text = f"{head[1]}.{milli:03d}Z"
    _milli = (now, text)
    return text


_milli: tuple[int, str] = (-1, "")  # the millisecond now_iso last stamped, and its text
_second: tuple[int, str] = (-1, "")  # the second now_iso last formatted, and its text


def parse_iso(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))
