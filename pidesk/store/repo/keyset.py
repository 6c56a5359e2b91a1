"""Keyset pages by (created_at, id): the one way growing tables are read a page at a time (host/paging.py)."""

from __future__ import annotations

from typing import Any


def keyset(alias: str, where: list[str], args: list[Any], after: tuple[str, str] | None, newest_first: bool,
           limit: int) -> tuple[str, list[Any]]:
    """The ``WHERE … ORDER BY … LIMIT ?`` of a page of rows of table ``alias`` (``"s."`` or ``""``):
    ``where`` and ``args`` the caller's own conditions, then those past ``after`` in the page's order."""
    if after is not None:
        where = [*where, f"({alias}created_at, {alias}id) {'<' if newest_first else '>'} (?, ?)"]
        args = [*args, *after]
    order = "DESC" if newest_first else "ASC"
    clause = ("WHERE " + " AND ".join(where) if where else "") + \
        f" ORDER BY {alias}created_at {order}, {alias}id {order} LIMIT ?"
    return clause, [*args, limit]
