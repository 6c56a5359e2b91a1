"""What each turn and revert changed in the workspace (``turn_changes``, migration m014; issue 33 §1).

One row per turn once its checkpoints are settled, and one per revert; ``host/changes.py`` decides
what goes in them. A session's changes are listed in the order ``session.changes`` gives them: its
turns by start time and its reverts by the time each was made, merged (``(at, id)``, oldest first).
A turn with no row yet is listed with ``files`` None: the caller works it out.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

CHUNK = 500  # ids bound in one statement


@dataclass(frozen=True)
class ChangeItem:
    """A turn or a revert of a session as ``session.changes`` lists it."""

    id: str
    at: str  # a turn's start, a revert's time
    revert: bool
    revert_of: str | None
    prompt: str | None
    before: str | None  # the trees its files' diffs are made from (None: nothing was recorded)
    after: str | None
    files: list[dict[str, Any]] | None  # None: not worked out yet (no row, or a revert's row not filled)
    stored: bool  # whether it has a row


_ITEMS = (
    "SELECT k.id, k.at, k.revert, c.revert_of, c.prompt, c.before_tree, c.after_tree, c.files, c.id IS NOT NULL"
    " FROM (SELECT id, started_at AS at, 0 AS revert FROM turns WHERE session_id = :s AND (started_at, id) > (:at, :id)"
    "       UNION ALL"
    "       SELECT id, at, 1 FROM turn_changes WHERE session_id = :s AND revert_of IS NOT NULL AND (at, id) > (:at, :id))"
    " AS k LEFT JOIN turn_changes AS c ON c.id = k.id"
)


def _item(row: tuple[Any, ...]) -> ChangeItem:
    return ChangeItem(id=row[0], at=row[1], revert=bool(row[2]), revert_of=row[3], prompt=row[4], before=row[5],
                      after=row[6], files=json.loads(row[7]) if row[7] is not None else None, stored=bool(row[8]))


def change_items(db: sqlite3.Connection, session_id: str, after: tuple[str, str] | None = None,
                 limit: int | None = None) -> list[ChangeItem]:
    """A session's turns and reverts after ``after`` (an ``(at, id)``), oldest first; at most ``limit``."""
    at, item_id = after or ("", "")
    rows = db.execute(_ITEMS + " ORDER BY k.at, k.id LIMIT :n",
                      {"s": session_id, "at": at, "id": item_id, "n": -1 if limit is None else limit}).fetchall()
    return [_item(r) for r in rows]


def change_item(db: sqlite3.Connection, session_id: str, item_id: str) -> ChangeItem | None:
    """One turn or revert of a session, by its id."""
    row = db.execute(
        "SELECT t.id, t.started_at, 0, c.revert_of, c.prompt, c.before_tree, c.after_tree, c.files, c.id IS NOT NULL"
        " FROM turns AS t LEFT JOIN turn_changes AS c ON c.id = t.id WHERE t.id = ? AND t.session_id = ?"
        " UNION ALL"
        " SELECT id, at, 1, revert_of, prompt, before_tree, after_tree, files, 1 FROM turn_changes"
        " WHERE id = ? AND session_id = ? AND revert_of IS NOT NULL",
        (item_id, session_id, item_id, session_id),
    ).fetchone()
    return _item(row) if row else None


def put_turn_changes(db: sqlite3.Connection, turn_id: str, session_id: str, *, prompt: str | None,
                     before: str | None, after: str | None, files: list[dict[str, Any]], replace: bool) -> None:
    """A turn's row (its ``at`` is the turn's start). ``replace``: over one already there (the turn's
    own settling is the authority); else a row already there stays. Nothing for a turn gone."""
    verb = "INSERT OR REPLACE" if replace else "INSERT OR IGNORE"
    db.execute(
        f"{verb} INTO turn_changes (id, session_id, at, revert_of, prompt, before_tree, after_tree, files)"
        " SELECT id, session_id, started_at, NULL, ?, ?, ?, ? FROM turns WHERE id = ? AND session_id = ?",
        (prompt, before, after, _json(files), turn_id, session_id),
    )


def put_revert_changes(db: sqlite3.Connection, revert_id: str, session_id: str, *, at: str, revert_of: str | None,
                       before: str | None, after: str | None, files: list[dict[str, Any]] | None) -> None:
    """A revert's row, unless it has one (or its session is gone)."""
    db.execute(
        "INSERT OR IGNORE INTO turn_changes (id, session_id, at, revert_of, prompt, before_tree, after_tree, files)"
        " SELECT ?, ?, ?, ?, NULL, ?, ?, ? WHERE EXISTS (SELECT 1 FROM sessions WHERE id = ?)",
        (revert_id, session_id, at, revert_of or "", before, after, None if files is None else _json(files),
         session_id),
    )


def fill_changes(db: sqlite3.Connection, item_id: str, files: list[dict[str, Any]]) -> None:
    """The files of a row that had none yet."""
    db.execute("UPDATE turn_changes SET files = ? WHERE id = ? AND files IS NULL", (_json(files), item_id))


def stored_change_ids(db: sqlite3.Connection, ids: Iterable[str]) -> set[str]:
    """Of ``ids``, those that have a row."""
    wanted = list(ids)
    found: set[str] = set()
    for start in range(0, len(wanted), CHUNK):
        part = wanted[start:start + CHUNK]
        found |= {r[0] for r in db.execute(
            f"SELECT id FROM turn_changes WHERE id IN ({','.join('?' * len(part))})", part)}
    return found


def first_user_messages(db: sqlite3.Connection, session_id: str, turn_ids: Iterable[str]) -> dict[str, tuple[int, int]]:
    """(offset, length) in the transcript of each turn's first user message — its prompt."""
    wanted = list(turn_ids)
    found: dict[str, tuple[int, int]] = {}
    for start in range(0, len(wanted), CHUNK):
        part = wanted[start:start + CHUNK]
        rows = db.execute(
            "SELECT turn_id, offset, length FROM messages WHERE session_id = ? AND role = 'user'"
            f" AND turn_id IN ({','.join('?' * len(part))}) ORDER BY seq", (session_id, *part))
        for turn_id, offset, length in rows:
            found.setdefault(turn_id, (offset, length))
    return found


def _json(files: list[dict[str, Any]]) -> str:
    return json.dumps(files, separators=(",", ":"))  # (ASCII: a path not in UTF-8 keeps its escapes)
