"""The index's integrity check, as ``host.doctor`` runs it while a host serves."""

from __future__ import annotations

import threading
from pathlib import Path

from pidesk.store.db import Database


def test_the_integrity_check_never_waits_for_the_shared_connection(tmp_path: Path) -> None:
    """``host.doctor`` ran ``PRAGMA integrity_check`` on the host's one shared connection from a worker
    thread: for as long as it ran (seconds on a large index) every ``read``/``tx`` of the event loop
    waited for the connection's lock — the loop stalled. The check has a read-only connection of its
    own: it answers while another holder keeps the shared connection busy."""
    db = Database(tmp_path / "index.db")
    db.migrate()
    answered: list[str] = []
    with db.read():  # the event loop, say, holds the shared connection
        checker = threading.Thread(target=lambda: answered.append(db.integrity()))
        checker.start()
        checker.join(timeout=10)
    assert answered == ["ok"], "the integrity check waited for the shared connection"
    db.close()
