"""JSONL transcripts: the durable truth of every session's messages.

``transcripts/<session>.jsonl`` holds one JSON object per line: first a
``{"t":"session"}`` header (enough to restore an orphaned session row), then one
``{"t":"message"}`` line per message, appended and synced *before* the index
transaction that makes the message visible. Lines are only ever appended, except
two atomic cuts: a smart stop truncates back to just before its root user row,
and a torn or garbage tail is moved whole to a quarantine file (never dropped).

**Appends are O_DSYNC writes.** Each session keeps one descriptor open between
appends (a bounded LRU), opened ``O_WRONLY | O_APPEND | O_DSYNC``: one
``os.write`` puts the line in the file and returns only once it is as durable as
``write`` + ``fdatasync`` would have made it, so an append is a single syscall
and a single hand-over of the GIL (with 50 appending threads on two CPUs each
extra one costs more than the Python around it; docs/benchmarks.md). Hence:

- a failed write is a failed sync: either way ``_undo`` cuts the file back to
  where the append began, durably, or poisons the session until a restart;
- the fault points ``transcript.write`` and ``transcript.fsync`` are both hit
  just before each ``os.write`` (that write is the sync);
- there is no separate ``fdatasync`` (the module's former ``_sync`` alias is
  gone): a test layer that models the disk must count an ``os.write`` on an
  O_DSYNC descriptor as synced.

The offset an append starts at is tracked per kept descriptor (``_Tail.end``),
not asked of the kernel: the store is the only writer of its transcripts and
appends to one session are serialised by its lock. The end is read once with
``fstat`` when a descriptor is (re)opened, and every cut, replacement or removal
(``truncate``, ``quarantine_tail``, ``create``, ``delete``, a failed append)
closes the descriptor first, so the next append re-reads it. All file I/O here
goes through module-level ``os.<function>`` names (and ``open``), which the
crash tests' lossy disk replaces.

**Reading what is new.** A model request reads only the lines appended since
the last one (host/views.py): ``read_from`` an offset, ``slices`` to decode a
long stretch a bounded piece at a time, ``chunks_back`` and ``lines_marked`` to
find the last cut by a byte search from the end. Such an offset stays good while
the session's ``generation`` does: ``forget`` — which every cut, replacement or
removal calls first — counts a new one.
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import msgspec

from pidesk.core.records import ForkedFrom, Message
from pidesk.faults import NO_FAULTS, Faults
from pidesk.ids import now_iso


class HeaderLine(msgspec.Struct, rename="camel", kw_only=True, tag="session", tag_field="t"):
    id: str
    title: str
    project_path: str | None
    root: str
    mode: str
    created_at: str
    forked_from: ForkedFrom | None = None


class MessageLine(Message, tag="message", tag_field="t"):
    """A message as written to its transcript: the Message fields plus ``"t":"message"``."""


Line = HeaderLine | MessageLine

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(Line)
# Lines known to be message lines (what follows the header, what the index points at) decode
# straight into Messages: the "t" tag is an unknown field to Message and is skipped, which
# takes half the time of decoding MessageLines and copying each into a Message.
_message_decoder = msgspec.json.Decoder(Message)
_message_lines = msgspec.json.Decoder(list[Message])
SLICE_BYTES = 1 << 20  # what one decoding call of a transcript's lines takes at most (a longer line aside): ~3 ms


def encode_line(line: Line) -> bytes:
    return _encoder.encode(line) + b"\n"


def decode_line(raw: bytes) -> Line:
    return _decoder.decode(raw)


_MESSAGE_TAG = b'{"t":"message",'


def encode_message(message: Message) -> bytes:
    """``encode_line(as_line(message))`` without copying the message: its JSON with the tag spliced in first."""
    return _MESSAGE_TAG + _encoder.encode(message)[1:] + b"\n"


def as_line(message: Message) -> MessageLine:
    return MessageLine(**{f: getattr(message, f) for f in message.__struct_fields__})


def as_message(line: MessageLine) -> Message:
    return Message(**msgspec.structs.asdict(line))


def decode_message(raw: bytes) -> Message:
    """A line known to be a message line (the index points only at those), as a Message."""
    return _message_decoder.decode(raw)


def decode_messages(lines: bytes) -> list[Message]:
    """Whole message lines, in one pass: a line never holds a raw newline (JSON escapes it), so the
    lines joined by commas are a JSON array."""
    if not lines:
        return []
    return _message_lines.decode(b"[%s]" % lines[:-1].replace(b"\n", b","))


class _Tail:
    """A session's kept descriptor and the offset its next append starts at."""

    __slots__ = ("fd", "end")

    def __init__(self, fd: int, end: int) -> None:
        self.fd = fd
        self.end = end


@dataclass(frozen=True)
class ScannedLine:
    offset: int
    length: int
    line: Line


@dataclass(frozen=True)
class Scan:
    lines: list[ScannedLine]
    good_end: int  # bytes covered by complete, decodable lines
    size: int  # the file's size; > good_end means a torn or garbage tail


class Transcripts:
    def __init__(self, directory: Path, max_open: int = 256, faults: Faults = NO_FAULTS) -> None:
        self.dir = directory
        self.faults = faults
        self._poisoned: set[str] = set()
        private_dir(directory)
        self._open: dict[str, _Tail] = {}  # session id -> its kept O_DSYNC descriptor and end offset
        self._open_lock = threading.Lock()
        self._max_open = max_open
        self._locks: dict[str, threading.Lock] = {}
        self._generations: dict[str, int] = {}  # session id -> how many times its file was cut, replaced or removed

    def lock(self, session_id: str) -> threading.Lock:
        """The lock that serialises one session's appends and cuts (and guards its kept handle)."""
        lock = self._locks.get(session_id)
        if lock is None:
            with self._open_lock:
                lock = self._locks.setdefault(session_id, threading.Lock())
        return lock

    def path(self, session_id: str) -> Path:
        return self.dir / f"{session_id}.jsonl"

    def session_ids(self) -> Iterator[str]:
        for entry in os.scandir(self.dir):
            if entry.name.endswith(".jsonl"):
                yield entry.name[: -len(".jsonl")]

    def size(self, session_id: str) -> int:
        try:
            return os.stat(self.path(session_id)).st_size
        except FileNotFoundError:
            return -1

    def create(self, session_id: str, lines: list[bytes]) -> None:
        """Write a new transcript whole (temp file, fsync, rename, fsync dir)."""
        self.forget(session_id)
        target = self.path(session_id)
        temp = target.with_suffix(".jsonl.tmp")
        write_private(temp, b"".join(lines))
        os.replace(temp, target)
        fsync_dir(self.dir)

    def append(self, session_id: str, data: bytes) -> int:
        """Append bytes durably; return the offset they start at.

        The caller serialises appends to one session (the store's per-session lock).
        The descriptor is O_DSYNC, so each ``os.write`` returns only once its bytes
        are synced: a failed write is a failed fsync, and both are undone alike.
        """
        tail = self._open.get(session_id) or self._reopen(session_id)
        offset = tail.end
        try:
            written = 0
            while written < len(data):  # one write, unless the kernel takes part of the line
                self.faults.hit("transcript.write")
                self.faults.hit("transcript.fsync")
                written += os.write(tail.fd, data[written:] if written else data)
        except OSError:
            self._undo(session_id, offset)
            raise
        tail.end = offset + len(data)
        return offset

    def _undo(self, session_id: str, offset: int) -> None:
        """A write failed: cut the file back to before it, durably, or stop using it.

        A failed sync is never retried as if it had succeeded (the kernel may have
        dropped the dirty pages): the unacknowledged bytes are removed, and if even
        that fails the session takes no more appends until a restart reconciles it.
        """
        self.forget(session_id)
        try:
            with open(self.path(session_id), "r+b") as f:
                f.truncate(offset)
                f.flush()
                os.fsync(f.fileno())
        except OSError:
            self._poisoned.add(session_id)

    def _reopen(self, session_id: str) -> _Tail:
        """Open the session's descriptor (a poisoned session has none: ``_undo`` closed it)."""
        if session_id in self._poisoned:
            raise OSError(errno.EIO, f"the transcript of {session_id} failed to sync earlier; restart to recover it")
        with self._open_lock:
            if len(self._open) >= self._max_open:
                self._evict_one()
            fd = os.open(self.path(session_id), os.O_WRONLY | os.O_APPEND | os.O_DSYNC)
            tail = self._open[session_id] = _Tail(fd, os.fstat(fd).st_size)
            return tail

    def _evict_one(self) -> None:
        """Close the oldest kept handle whose session is not appending right now (it reopens on demand)."""
        for victim in list(self._open):
            lock = self._locks.get(victim)
            if lock is not None and lock.acquire(blocking=False):
                try:
                    os.close(self._open.pop(victim).fd)
                finally:
                    lock.release()
                return

    def forget(self, session_id: str) -> None:
        """Close the session's kept handle (before its file is cut, replaced or removed), and count a
        new ``generation`` of it."""
        with self._open_lock:
            self._generations[session_id] = self._generations.get(session_id, 0) + 1
            tail = self._open.pop(session_id, None)
        if tail is not None:
            os.close(tail.fd)

    def close(self) -> None:
        with self._open_lock:
            for tail in self._open.values():
                os.close(tail.fd)
            self._open.clear()

    def generation(self, session_id: str) -> int:
        """How many times this process has cut, replaced or removed the session's transcript (``forget``
        counts them). Bytes read from it stay true while this number stays the same: the file only
        grows at its end in between."""
        return self._generations.get(session_id, 0)

    def read_range(self, session_id: str, start: int, end: int) -> bytes:
        with open(self.path(session_id), "rb") as f:
            f.seek(start)
            return f.read(end - start)

    def messages(self, session_id: str) -> list[Message]:
        """Every message line of a whole transcript, in order (what ``scan`` finds, faster).

        Decoded in one pass (``decode_messages``). A torn or garbage tail makes that
        fail; then the lines are read one by one, up to the first bad one. (A model
        request reads only what is new: host/views.py and the methods below.)
        """
        with open(self.path(session_id), "rb") as f:
            data = f.read()
        body = data[data.find(b"\n") + 1:]  # after the header line
        if not body:
            return []
        if body.endswith(b"\n"):
            try:
                return decode_messages(body)
            except msgspec.DecodeError:
                pass
        return [as_message(s.line) for s in self.scan(session_id).lines if isinstance(s.line, MessageLine)]

    # ---- reading parts of a transcript (the model's view, host/views.py) --------------------------

    def body_start(self, session_id: str) -> int:
        """The offset of the first message line: just past the header."""
        with open(self.path(session_id), "rb") as f:
            return len(f.readline())

    def complete_end(self, session_id: str) -> int:
        """The end of the transcript's last whole line (a line being appended, or a torn tail, not counted)."""
        with open(self.path(session_id), "rb") as f:
            end = os.fstat(f.fileno()).st_size
            step = 64 * 1024
            while end > 0:
                start = max(0, end - step)
                f.seek(start)
                data = f.read(end - start)
                if data.endswith(b"\n"):
                    return end
                newline = data.rfind(b"\n")
                if newline >= 0:
                    return start + newline + 1
                end = start
            return 0

    def read_from(self, session_id: str, start: int, most: int | None = None) -> tuple[bytes, bool] | None:
        """The whole lines from ``start`` on, and whether there were more than ``most`` bytes to read (then
        none are returned). None if the file now ends before ``start`` (it was cut)."""
        with open(self.path(session_id), "rb") as f:
            if os.fstat(f.fileno()).st_size < start:
                return None
            f.seek(start)
            data = f.read() if most is None else f.read(most + 1)
        if most is not None and len(data) > most:
            return b"", True
        return data[:data.rfind(b"\n") + 1], False

    def slices(self, session_id: str, start: int, end: int, size: int = SLICE_BYTES) -> Iterator[bytes]:
        """The whole lines in [``start``, ``end``) in slices of about ``size`` bytes (a longer line whole),
        oldest first: each is decoded in one call that holds the GIL, so none may be large."""
        with open(self.path(session_id), "rb") as f:
            f.seek(start)
            carry = b""
            pos = start
            while pos < end:
                data = carry + f.read(min(size, end - pos))
                pos += len(data) - len(carry)
                if len(data) == len(carry):
                    break  # (the file ends before ``end``: it was cut meanwhile)
                whole = data.rfind(b"\n") + 1
                carry = data[whole:]
                if whole:
                    yield data[:whole]

    def chunks_back(self, session_id: str, start: int, end: int, size: int = SLICE_BYTES) -> Iterator[tuple[int, bytes]]:
        """The whole lines in [``start``, ``end``) in chunks of about ``size`` bytes, newest first, as
        (offset, bytes). ``start`` and ``end`` must be line boundaries (``body_start``, ``complete_end``)."""
        with open(self.path(session_id), "rb") as f:
            pos = end
            while pos > start:
                low = max(start, pos - size)
                f.seek(low)
                data = f.read(pos - low)
                if low > start:  # the first line may have begun before ``low``: it comes with the next chunk
                    first = data.find(b"\n") + 1
                    if first == len(data):  # one line longer than the chunk: read more at once
                        size *= 2
                        continue
                    low, data = low + first, data[first:]
                yield low, data
                pos = low

    def lines_marked(self, session_id: str, markers: tuple[bytes, ...], start: int, end: int
                     ) -> Iterator[tuple[int, bytes]]:
        """The lines in [``start``, ``end``) holding any of ``markers``, newest first, as (offset, line):
        found by a byte search, so a transcript is read whole without decoding a line that has none."""
        for low, data in self.chunks_back(session_id, start, end):
            starts: set[int] = set()
            for marker in markers:
                at = data.rfind(marker)
                while at >= 0:
                    line = data.rfind(b"\n", 0, at) + 1
                    starts.add(line)
                    at = data.rfind(marker, 0, line)
            for line in sorted(starts, reverse=True):
                yield low + line, data[line:data.index(b"\n", line) + 1]

    def scan(self, session_id: str, start: int = 0) -> Scan:
        """Decode complete lines from ``start``; stop at the first torn or garbage line."""
        with open(self.path(session_id), "rb") as f:
            f.seek(start)
            data = f.read()
        lines: list[ScannedLine] = []
        pos = 0
        while pos < len(data):
            newline = data.find(b"\n", pos)
            if newline < 0:
                break
            try:
                line = decode_line(data[pos : newline + 1])
            except msgspec.DecodeError:
                break
            lines.append(ScannedLine(start + pos, newline + 1 - pos, line))
            pos = newline + 1
        return Scan(lines, start + pos, start + len(data))

    def quarantine_tail(self, session_id: str, good_end: int) -> Path:
        """Move every byte past ``good_end`` to a quarantine file, then cut it off."""
        source = self.path(session_id)
        with open(source, "rb") as f:
            f.seek(good_end)
            tail = f.read()
        stamp = now_iso().replace(":", "").replace("-", "")
        target = self.dir / f"{session_id}.jsonl.quarantine-{stamp}-{good_end}"
        write_private(target, tail, exclusive=True)
        fsync_dir(self.dir)
        self.truncate(session_id, good_end)
        return target

    def truncate(self, session_id: str, size: int) -> None:
        self.forget(session_id)
        fd = os.open(self.path(session_id), os.O_WRONLY)
        try:
            os.ftruncate(fd, size)
            os.fsync(fd)
        finally:
            os.close(fd)

    def delete(self, session_id: str) -> None:
        self.forget(session_id)
        try:
            os.unlink(self.path(session_id))
        except FileNotFoundError:
            pass
        fsync_dir(self.dir)

    def quarantined(self) -> list[Path]:
        return sorted(self.dir.glob("*.jsonl.quarantine-*"))


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def private_dir(directory: Path) -> None:
    """Make ``directory`` (and missing parents) and leave it 0700, tightening one an older pidesk made
    0755 — the data dir holds every transcript and the host's token. A file system that refuses
    chmod (not the owner, no Unix modes) keeps what it has."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        if directory.stat().st_mode & 0o077:
            os.chmod(directory, 0o700)
    except PermissionError:
        pass


def write_private(path: Path, data: bytes, *, exclusive: bool = False) -> None:
    """Write a new file (0600, as every file of the data dir) whole and fsync it."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | (os.O_EXCL if exclusive else os.O_TRUNC)
    write_and_close(os.open(path, flags, 0o600), data)


def write_and_close(fd: int, data: bytes) -> None:
    """Write all of ``data`` to the new file ``fd``, fsync it, close it (whatever happens)."""
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
