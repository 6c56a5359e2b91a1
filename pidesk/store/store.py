"""The store: every byte pidesk keeps on disk, behind one object.

Layout of a data directory::

    index.db                     SQLite index (WAL): sessions, turns, approvals, queue, …
    transcripts/<session>.jsonl  the messages, one fsynced line each — the durable truth
    scratch/<session>/           the working root of a temporary (project-less) session
    process-groups               the tool process groups running now, which boot kills (process_groups.py)

The data dir and every directory the store makes in it are 0700, every file it
writes 0600 (SQLite gives ``index.db-wal`` and ``-shm`` the mode of
``index.db``); opening a data dir tightens the modes of its directories and of
the index an older pidesk left group- or world-readable. Transcripts and blobs
written before that keep their modes, behind the now-private directories.

Message persistence is two-step (seed 003 §4): the transcript line is appended
and synced, then its index row is committed. Index rows are written behind:
they queue in memory and commit in batches of ``INDEX_BATCH``, and always
before anything reads the message index (``flush``), so every read sees every
acknowledged message. A crash between the two steps leaves lines past the
session's indexed watermark — the outbox — which ``reconcile`` indexes at boot.

The append path is kept short because many threads run it at once and each
holds the GIL while it does (docs/benchmarks.md, "Durable append"): the line
is encoded straight from the ``Message``, message ids count up (``ordered_ids``,
so the index inserts them at its right edge), the appender that fills a batch
commits it in a few statements while the others keep appending, and nobody
waits for that commit unless ``INDEX_BACKLOG`` rows pile up behind it.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from pidesk.core.errors import NotFound, StoreError
from pidesk.core.modes import Mode, PermissionMode, PlanState, SessionStatus
from pidesk.core.records import Block, Message, Session, TextBlock
from pidesk.faults import NO_FAULTS, Faults
from pidesk.ids import now_iso, ordered_ids
from pidesk.store import repo
from pidesk.store.blobs import Blobs
from pidesk.store.db import Database
from pidesk.store.process_groups import FILE_NAME as PROCESS_GROUPS, ProcessGroups
from pidesk.store.transcripts import (
    HeaderLine,
    MessageLine,
    Transcripts,
    as_line,
    as_message,
    decode_message,
    encode_line,
    encode_message,
    fsync_dir,
    private_dir,
)

IndexRow = tuple[str, str, str | None, int, str, int, int, str]
INDEX_BATCH = 1024  # queued rows that start a commit
PAGE_BYTES = 8 * 1024 * 1024  # transcript bytes one page of messages holds at most (its newest message aside)
INDEX_BACKLOG = 8 * INDEX_BATCH  # queued rows that make appenders wait for the commit in flight


@dataclass
class BootReport:
    """What ``reconcile`` found and repaired; printed by the host and ``pidesk doctor``."""

    restored_sessions: list[str] = field(default_factory=list)
    indexed_from_outbox: int = 0
    dropped_index_rows: int = 0
    quarantined: list[str] = field(default_factory=list)
    finished_deletes: list[str] = field(default_factory=list)
    killed_process_groups: list[int] = field(default_factory=list)  # tool groups a crashed host left running


class Store:
    def __init__(self, data_dir: Path, faults: Faults = NO_FAULTS) -> None:
        self.data_dir = data_dir
        self.faults = faults
        private_dir(data_dir)  # 0700, tightened if an older pidesk left it 0755
        for name in ("scratch", "transcripts", "blobs"):
            private_dir(data_dir / name)
        fsync_dir(data_dir)  # on a fresh data dir these entries, and the dir's own, must survive a power cut
        fsync_dir(data_dir.parent)
        self.db = Database(data_dir / "index.db", faults)
        self.schema_version = self.db.migrate()
        self.transcripts = Transcripts(data_dir / "transcripts", faults=faults)
        self.blobs = Blobs(data_dir / "blobs")
        self.process_groups = ProcessGroups(data_dir / PROCESS_GROUPS)
        self._last_seq: dict[str, int] = {}
        self.new_message_id = ordered_ids("m")  # ids that sort as made: the index inserts them at its edge
        # message index rows written behind their fsynced transcript lines
        self._flush_lock = threading.Lock()
        self._pending: deque[tuple[IndexRow, int]] = deque()

    def close(self) -> None:
        try:
            self.flush()
        finally:
            self.process_groups.close()
            self.transcripts.close()
            self.db.close()

    def scratch_root(self, session_id: str) -> Path:
        """The working root of a temporary session, made (0700) if missing."""
        root = self.data_dir / "scratch" / session_id
        private_dir(root)
        return root

    # ---- sessions ---------------------------------------------------------------

    def create_session(self, session: Session, messages: list[Message] | None = None) -> None:
        """Transcript first (header and any copied messages), then one index transaction."""
        header = HeaderLine(
            id=session.id, title=session.title, project_path=session.project_path, root=session.root,
            mode=session.mode.value, created_at=session.created_at, forked_from=session.forked_from,
        )
        lines = [encode_line(header)]
        rows: list[IndexRow] = []
        offset = len(lines[0])
        for message in messages or []:
            data = encode_line(as_line(message))
            rows.append(_row(message, offset, len(data)))
            lines.append(data)
            offset += len(data)
        self.transcripts.create(session.id, lines)
        self.faults.hit("session.after_transcript")
        last_seq = messages[-1].seq if messages else 0
        try:
            with self.db.tx() as db:
                repo.insert_session(db, session, last_seq=last_seq, indexed_bytes=offset)
                repo.insert_message_rows(db, rows)
        except BaseException:
            self.transcripts.delete(session.id)  # not acknowledged: boot must not restore it
            raise
        self._last_seq[session.id] = last_seq

    def delete_session(self, session_id: str) -> None:
        """Rename the transcript aside, drop the rows, then unlink: a crash anywhere
        leaves either the whole session or a delete that boot finishes."""
        with self.transcripts.lock(session_id):
            self.flush()  # under the lock: no append can queue a row for the session after this
            self.transcripts.forget(session_id)
            path = self.transcripts.path(session_id)
            tomb = path.with_suffix(".jsonl.deleted")
            if path.exists():
                os.replace(path, tomb)
                fsync_dir(path.parent)
            self.faults.hit("session.delete.after_rename")
            with self.db.tx() as db:
                repo.delete_session(db, session_id)
            tomb.unlink(missing_ok=True)
            self._last_seq.pop(session_id, None)

    # ---- messages -----------------------------------------------------------------

    def append_message(
        self, session_id: str, turn_id: str | None, role: str, content: list[Block], message_id: str | None = None
    ) -> Message:
        """Persist one message: its transcript line fsynced, its index row queued behind it.

        Thread-safe; calls for different sessions proceed in parallel and share commits.
        """
        with self.transcripts.lock(session_id):
            seq = self._next_seq(session_id)
            message = Message(
                id=message_id or self.new_message_id(), session_id=session_id, turn_id=turn_id, seq=seq, role=role,
                content=content, created_at=now_iso(),
            )
            data = encode_message(message)
            try:
                offset = self.transcripts.append(session_id, data)
            except OSError as exc:
                raise StoreError(f"could not append to the transcript of {session_id}: {exc}") from exc
            self._last_seq[session_id] = seq
        self.faults.hit("message.after_transcript")
        self._index(_row(message, offset, len(data)), offset + len(data))
        return message

    def page(self, session_id: str, before_seq: int | None, limit: int) -> tuple[list[Message], bool]:
        """The newest ``limit`` messages with seq < ``before_seq`` (ascending) and whether older exist —
        fewer when they pass ``PAGE_BYTES`` of transcript (the newest always comes, whatever its size):
        200 messages of a megabyte made a 259 MB answer (issue 29); the older ones come with the next page."""
        self.flush()
        with self.db.read() as db:
            rows = repo.message_page(db, session_id, before_seq, limit + 1)
        has_more = len(rows) > limit
        rows = rows[-limit:] if limit else []
        first, size = len(rows), 0  # walking back from the newest, while they fit (the newest always)
        while first > 0 and (first == len(rows) or size + rows[first - 1][3] <= PAGE_BYTES):
            first -= 1
            size += rows[first][3]
        if first:
            rows, has_more = rows[first:], True
        if not rows:
            return [], has_more
        start, end = rows[0][2], rows[-1][2] + rows[-1][3]
        blob = self.transcripts.read_range(session_id, start, end)
        messages = [decode_message(blob[offset - start : offset - start + length]) for _, _, offset, length in rows]
        return messages, has_more

    def messages(self, session_id: str, through_seq: int | None = None) -> list[Message]:
        """Every message of a session from its transcript, optionally up to a seq (inclusive). A session
        deleted meanwhile (its transcript gone) is ``NOT_FOUND``."""
        try:
            out = self.transcripts.messages(session_id)
        except FileNotFoundError:
            raise NotFound(f"no session {session_id!r}") from None
        if through_seq is not None:
            out = [m for m in out if m.seq <= through_seq]
        return out

    def turn_prompts(self, session_id: str, turn_ids: list[str]) -> dict[str, str]:
        """The text of each turn's prompt (its first user message's text blocks); a turn without one is
        left out. Blocking: call it in a worker thread."""
        self.flush()
        with self.db.read() as db:
            found = repo.first_user_messages(db, session_id, turn_ids)
        prompts: dict[str, str] = {}
        for turn_id, (offset, length) in found.items():
            try:
                message = decode_message(self.transcripts.read_range(session_id, offset, offset + length))
            except (OSError, ValueError, msgspec.DecodeError):
                continue
            prompts[turn_id] = "\n".join(b.text for b in message.content if isinstance(b, TextBlock))
        return prompts

    def message_seq(self, session_id: str, message_id: str) -> int | None:
        self.flush()
        with self.db.read() as db:
            location = repo.message_location(db, session_id, message_id)
        return location[0] if location else None

    def cut_from(self, session_id: str, message_id: str, before_commit: Callable[[Any], None]) -> int:
        """Smart stop: cut the transcript back to just before ``message_id``.

        The transcript is truncated (and fsynced) first, then the index rows go in
        the same transaction as ``before_commit``'s changes (the turn's terminal
        update); boot drops index rows past a transcript's end.
        """
        with self.transcripts.lock(session_id):
            self.flush()  # under the lock, as in delete_session
            with self.db.read() as db:
                location = repo.message_location(db, session_id, message_id)
            if location is None:
                raise StoreError(f"message {message_id} is not indexed")
            seq, offset, _length = location
            self.transcripts.truncate(session_id, offset)  # closes the open handle first
            self.faults.hit("smartstop.after_truncate")
            with self.db.tx() as db:
                repo.delete_messages_from(db, session_id, seq, offset)
                before_commit(db)
            self._last_seq[session_id] = seq - 1
        return int(seq)

    # ---- write-behind index ---------------------------------------------------------------

    def _index(self, row: IndexRow, end: int) -> None:
        """Queue a message's index row; commit a full batch at once, the rest before the next read.

        The row's transcript line is already fsynced: a crash that loses queued rows loses
        nothing, because boot indexes every line past a session's watermark. One appender
        commits a full batch while the others go on queueing (the next commit takes every
        row queued meanwhile); they wait for it only once ``INDEX_BACKLOG`` rows are queued.
        The queue is a deque, whose append and popleft are atomic: appenders take no lock.
        """
        self._pending.append((row, end))
        queued = len(self._pending)
        if queued < INDEX_BATCH:
            return
        if queued >= INDEX_BACKLOG:
            self.flush()
        elif self._flush_lock.acquire(blocking=False):
            try:
                self._commit_pending()
            finally:
                self._flush_lock.release()

    def flush(self) -> None:
        """Commit every queued index row (called before anything reads the message index)."""
        with self._flush_lock:
            self._commit_pending()

    def _commit_pending(self) -> None:
        """Commit the rows queued now (the caller holds ``_flush_lock``, so it is the only taker)."""
        pending = self._pending
        batch = [pending.popleft() for _ in range(len(pending))]
        if not batch:
            return
        try:
            self._commit_rows(batch)
        except BaseException as exc:
            pending.extendleft(reversed(batch))  # keep them for the next flush; boot has them anyway
            raise StoreError(f"the message index could not commit: {exc}") from exc

    def _commit_rows(self, batch: list[tuple[IndexRow, int]]) -> None:
        marks: dict[str, tuple[int, int]] = {}
        for row, end in batch:
            seq, prior = row[3], marks.get(row[1], (0, 0))
            marks[row[1]] = (max(prior[0], seq), max(prior[1], end))
        with self.db.tx(durable=False) as db:
            repo.insert_message_rows(db, [row for row, _ in batch])
            repo.advance_watermarks(db, marks)

    def _next_seq(self, session_id: str) -> int:
        last = self._last_seq.get(session_id)
        if last is None:
            with self.db.read() as db:
                marks = db.execute("SELECT last_seq FROM sessions WHERE id = ?", (session_id,)).fetchone()
            if marks is None:
                raise StoreError(f"session {session_id} has no index row")
            last = int(marks[0])
        return last + 1

    # ---- boot reconciliation ------------------------------------------------------------

    def reconcile(self) -> BootReport:
        """Make the index agree with the transcripts (run at boot, before anything is served).

        - a ``.deleted`` transcript: finish that delete;
        - a transcript with no session row: restore the row from its header (orphan);
        - transcript bytes past the indexed watermark: index them (the outbox);
        - index rows past the transcript's end: drop them (a cut that crashed midway);
        - a torn or undecodable tail: move it to a quarantine file and report it.
        """
        self.flush()
        report = BootReport()
        for stale in self.transcripts.dir.glob("*.jsonl.tmp"):  # a create that never reached its rename
            stale.unlink()
        for tomb in self.transcripts.dir.glob("*.jsonl.deleted"):
            session_id = tomb.name[: -len(".jsonl.deleted")]
            with self.db.tx() as db:
                repo.delete_session(db, session_id)
            tomb.unlink()
            report.finished_deletes.append(session_id)
        with self.db.read() as db:
            marks = repo.session_watermarks(db)
        for session_id in self.transcripts.session_ids():
            size = self.transcripts.size(session_id)
            mark = marks.get(session_id)
            if mark is None:
                self._restore_orphan(session_id, report)
            elif size != mark[1]:
                self._reindex_tail(session_id, mark[1], report)
        return report

    def lost_messages(self) -> dict[str, int]:
        """Sessions whose transcript no longer holds messages the index says it does (acknowledged, so
        never to be lost): session id -> how many. Each indexed message must still be at its offset,
        under its id. Reads every transcript: for ``doctor``, off the event loop."""
        self.flush()
        with self.db.read() as db:
            sessions = list(repo.session_watermarks(db))
        lost: dict[str, int] = {}
        for session_id in sessions:
            try:
                data = self.transcripts.path(session_id).read_bytes()
            except FileNotFoundError:
                continue  # (a missing transcript is reported as such)
            with self.db.read() as db:
                spans = repo.message_spans(db, session_id)
            missing = sum(1 for message_id, offset, length in spans
                          if not _holds(data[offset:offset + length], message_id))
            if missing:
                lost[session_id] = missing
        return lost

    def rebuild_index(self) -> DoctorReport:
        """Check the index's integrity and rebuild every message row from the transcripts."""
        self.flush()
        with self.db.read() as db:
            integrity = "; ".join(r[0] for r in db.execute("PRAGMA integrity_check"))
            known = set(repo.session_watermarks(db))
        report = DoctorReport(integrity=integrity, boot=self.reconcile())
        on_disk = set(self.transcripts.session_ids())
        report.missing_transcripts = sorted(known - on_disk)
        for session_id in sorted(on_disk):
            scan = self.transcripts.scan(session_id)
            if scan.good_end < scan.size:
                report.boot.quarantined.append(str(self.transcripts.quarantine_tail(session_id, scan.good_end)))
            rows = [_row(as_message(s.line), s.offset, s.length) for s in scan.lines if isinstance(s.line, MessageLine)]
            with self.db.tx() as db:
                db.execute("DELETE FROM messages WHERE session_id = ?", (session_id,))
                repo.insert_message_rows(db, rows)
                db.execute("UPDATE sessions SET last_seq = ?, indexed_bytes = ? WHERE id = ?",
                           (max((r[3] for r in rows), default=0), scan.good_end, session_id))
            self._last_seq.pop(session_id, None)
            report.sessions += 1
            report.messages += len(rows)
        return report

    def _restore_orphan(self, session_id: str, report: BootReport) -> None:
        scan = self.transcripts.scan(session_id)
        if not scan.lines or not isinstance(scan.lines[0].line, HeaderLine):
            report.quarantined.append(str(self.transcripts.quarantine_tail(session_id, 0)))
            self.transcripts.delete(session_id)
            return
        header = scan.lines[0].line
        quarantined = None
        if scan.good_end < scan.size:
            quarantined = str(self.transcripts.quarantine_tail(session_id, scan.good_end))
            report.quarantined.append(quarantined)
        messages = [as_message(s.line) for s in scan.lines if isinstance(s.line, MessageLine)]
        offsets = [(s.offset, s.length) for s in scan.lines if isinstance(s.line, MessageLine)]
        session = Session(
            id=header.id, title=header.title, project_path=header.project_path, root=header.root,
            mode=Mode(header.mode), permission_mode=PermissionMode.ASK, status=SessionStatus.IDLE,
            plan_state=PlanState.INACTIVE, current_turn_id=None, forked_from=header.forked_from,
            created_at=header.created_at, updated_at=now_iso(),
        )
        with self.db.tx() as db:
            repo.insert_session(
                db, session, last_seq=messages[-1].seq if messages else 0, indexed_bytes=scan.good_end
            )
            repo.insert_message_rows(db, [_row(m, o, n) for m, (o, n) in zip(messages, offsets, strict=True)])
            repo.audit(db, "session.restored", session_id, reason="orphan transcript")
            if quarantined is not None:
                repo.audit(db, "transcript.quarantined", session_id, file=quarantined)
        report.restored_sessions.append(session_id)

    def _reindex_tail(self, session_id: str, indexed: int, report: BootReport) -> None:
        size = self.transcripts.size(session_id)
        if size < indexed:  # the transcript was cut after these rows were indexed
            with self.db.tx() as db:
                cur = db.execute("DELETE FROM messages WHERE session_id = ? AND offset >= ?", (session_id, size))
                report.dropped_index_rows += cur.rowcount
                last = db.execute(
                    "SELECT coalesce(max(seq), 0) FROM messages WHERE session_id = ?", (session_id,)
                ).fetchone()[0]
                db.execute("UPDATE sessions SET last_seq = ?, indexed_bytes = ? WHERE id = ?", (last, size, session_id))
            return
        scan = self.transcripts.scan(session_id, indexed)
        rows = [_row(as_message(s.line), s.offset, s.length) for s in scan.lines if isinstance(s.line, MessageLine)]
        if scan.good_end < scan.size:
            report.quarantined.append(str(self.transcripts.quarantine_tail(session_id, scan.good_end)))
        with self.db.tx() as db:
            repo.insert_message_rows(db, rows)
            last = max((r[3] for r in rows), default=0)
            repo.advance_watermark(db, session_id, last, scan.good_end)
            if report.quarantined and report.quarantined[-1].startswith(str(self.transcripts.path(session_id))):
                repo.audit(db, "transcript.quarantined", session_id, file=report.quarantined[-1])
        report.indexed_from_outbox += len(rows)


@dataclass
class DoctorReport:
    integrity: str
    sessions: int = 0
    messages: int = 0
    missing_transcripts: list[str] = field(default_factory=list)
    boot: BootReport = field(default_factory=BootReport)


def _row(message: Message, offset: int, length: int) -> IndexRow:
    return (message.id, message.session_id, message.turn_id, message.seq, message.role, offset, length, message.created_at)


__all__ = ["BootReport", "DoctorReport", "Store"]


def _holds(line: bytes, message_id: str) -> bool:
    """Whether ``line`` is the transcript line of message ``message_id``."""
    try:
        return decode_message(line).id == message_id
    except (msgspec.DecodeError, ValueError):
        return False
