"""``host.doctor`` (a pidesk addition): the read-only half of ``pidesk doctor``, answered by the running host.

While a host serves a data dir it holds the dir's lock, so ``pidesk doctor`` cannot open the store
itself; it asks the host instead. This only looks — it changes no byte on disk:

- ``integrity``: SQLite's ``PRAGMA integrity_check`` of the index ("ok", else what it found);
- ``missingTranscripts``: sessions the index holds whose transcript is gone;
- ``quarantined``: torn transcript tails set aside at a boot (``*.jsonl.quarantine-*``);
- ``lostMessages``: sessions whose transcript no longer holds messages the index acknowledged
  (session id -> how many): something outside the host rewrote it;
- ``model``: the model this host runs (``pidesk run --model`` compares it with its own).

The repairs — rebuilding the index from the transcripts, quarantining a torn tail, restoring an
orphaned session — rewrite the store under the lock, so they stay with ``pidesk doctor`` on a
stopped host. The checks run in a worker thread, the integrity check on a connection of its own:
the event loop keeps serving and writing meanwhile.
"""

from __future__ import annotations

import asyncio
from typing import Any

from pidesk.host.parts import Parts
from pidesk.store import repo


async def look(parts: Parts) -> dict[str, Any]:
    return await asyncio.to_thread(_look, parts)


def _look(parts: Parts) -> dict[str, Any]:
    store = parts.store
    integrity = store.db.integrity()
    with store.db.read() as db:
        indexed = set(repo.session_watermarks(db))
    on_disk = set(store.transcripts.session_ids())  # listed after the rows: a session's transcript precedes its row
    gone = indexed - on_disk
    if gone:  # a delete renames the transcript away before it drops the row: only a row still there is missing
        with store.db.read() as db:
            gone &= set(repo.session_watermarks(db))
    return {
        "model": parts.config.model,
        "integrity": integrity,
        "sessions": len(indexed),
        "missingTranscripts": sorted(gone),
        "quarantined": [str(path) for path in store.transcripts.quarantined()],
        "lostMessages": store.lost_messages(),
    }
