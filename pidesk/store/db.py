"""The SQLite index: one connection, one writer, short transactions.

Pragmas: WAL journal, ``busy_timeout``, foreign keys on. Write transactions open
with ``BEGIN IMMEDIATE`` so a writer never upgrades a read lock mid-transaction.

Durability has two grades. State that is acknowledged only by the index — modes,
approvals, turns, queue, grants, notifications, audit — commits with
``synchronous=FULL``. Message index rows commit with ``synchronous=NORMAL``:
their truth is the transcript line, fsynced before the index transaction, and
an index row lost to a power cut is rebuilt from the transcript at boot
(``store.outbox``). The next FULL commit makes every earlier NORMAL commit durable
too, because a WAL sync covers every frame before it.

The index is 0600: it is created so before SQLite opens it, and SQLite gives
its ``-wal`` and ``-shm`` files the database file's mode.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pidesk.core.errors import StartupRefused, StoreError
from pidesk.faults import NO_FAULTS, Faults
from pidesk.store.migrations import MIGRATIONS


class Database:
    def __init__(self, path: Path, faults: Faults = NO_FAULTS) -> None:
        self.path = path
        self.faults = faults
        self._lock = threading.RLock()
        _private(path)
        try:
            self.conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            self.conn.execute("PRAGMA journal_mode=WAL")
            self.conn.execute("PRAGMA busy_timeout=5000")
            self.conn.execute("PRAGMA foreign_keys=ON")
            self.conn.execute("PRAGMA synchronous=FULL")
        except sqlite3.DatabaseError as exc:
            raise StartupRefused(
                f"cannot open the index {path}: {exc}. Run `pidesk doctor` to rebuild it "
                "from the transcripts."
            ) from exc
        self._synchronous = "FULL"

    @property
    def schema_version(self) -> int:
        with self._lock:
            return int(self.conn.execute("PRAGMA user_version").fetchone()[0])

    def migrate(self) -> int:
        """Bring the schema to the newest version, one transaction per migration."""
        current = self.schema_version
        newest = len(MIGRATIONS)
        if current > newest:
            raise StartupRefused(
                f"the index {self.path} has schema {current}, newer than this pidesk knows "
                f"({newest}); upgrade pidesk to open it"
            )
        for number, fn in enumerate(MIGRATIONS[current:], start=current + 1):
            with self._lock:
                self.conn.execute("BEGIN IMMEDIATE")
                try:
                    fn(self.conn)
                    self.faults.hit(f"migration.{fn.__name__}")
                    self.conn.execute(f"PRAGMA user_version = {number}")
                    self.conn.execute("COMMIT")
                except Exception as exc:
                    self.conn.execute("ROLLBACK")
                    self.conn.close()
                    raise StartupRefused(
                        f"migration {number} ({fn.__name__}) failed: {exc}. The index was left "
                        f"at schema {number - 1}, unchanged; pidesk will not start until the "
                        "migration succeeds."
                    ) from exc
        return newest

    @contextmanager
    def tx(self, *, durable: bool = True) -> Iterator[sqlite3.Connection]:
        """A write transaction; commits on success, rolls back on any exception.

        A failed commit raises ``StoreError`` (PERSISTENCE_FAILURE): nothing changed.
        """
        with self._lock:
            try:
                self._set_synchronous("FULL" if durable else "NORMAL")
                self.conn.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                raise StoreError(f"the store could not begin a transaction: {exc}") from exc
            try:
                yield self.conn
                self.conn.execute("COMMIT")
            except BaseException as exc:
                if self.conn.in_transaction:
                    self.conn.execute("ROLLBACK")
                if isinstance(exc, sqlite3.Error):
                    raise StoreError(f"the store could not commit: {exc}") from exc
                raise

    @contextmanager
    def read(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            yield self.conn

    def integrity(self) -> str:
        """``PRAGMA integrity_check`` ("ok", else what it found) on a read-only connection of its own:
        a check of a large index takes seconds, and holding the shared connection's lock for them
        would stall every caller of ``read`` and ``tx`` — the event loop first (WAL lets both read)."""
        conn = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, isolation_level=None)
        try:
            return "; ".join(str(row[0]) for row in conn.execute("PRAGMA integrity_check"))
        finally:
            conn.close()

    def _set_synchronous(self, level: str) -> None:
        if self._synchronous != level:
            self.conn.execute(f"PRAGMA synchronous={level}")
            self._synchronous = level

    def close(self) -> None:
        with self._lock:
            self.conn.close()


def _private(path: Path) -> None:
    """Create the index 0600 (an empty file is a new database), or tighten one an older pidesk made
    0644, with the ``-wal`` and ``-shm`` it left; a file system that refuses chmod keeps its modes."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600))
    except OSError:
        return  # not ours to create (a directory, a read-only disk): connect() says why
    for name in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
        try:
            if name.stat().st_mode & 0o077:
                os.chmod(name, 0o600)
        except (FileNotFoundError, PermissionError):
            pass
