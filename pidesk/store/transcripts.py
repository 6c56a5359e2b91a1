"""JSONL transcripts: the durable truth of every session's messages.

``transcripts/<session>.jsonl`` holds one JSON object per line: first a
``{"t":"session"}`` header (enough to restore an orphaned session row), then one
``{"t":"message"}`` line per message, appended and fsynced *before* the index
transaction that makes the message visible. Lines are only ever appended, except
two atomic cuts: a smart stop truncates back to just before its root user row,
and a torn or garbage tail is moved whole to a quarantine file (never dropped).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import msgspec

from pidesk.core.records import ForkedFrom, Message
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
_sync = getattr(os, "fdatasync", os.fsync)  # an append's size change is data: fdatasync is enough


def encode_line(line: Line) -> bytes:
    return _encoder.encode(line) + b"\n"


def decode_line(raw: bytes) -> Line:
    return _decoder.decode(raw)


def as_line(message: Message) -> MessageLine:
    return MessageLine(**{f: getattr(message, f) for f in message.__struct_fields__})


def as_message(line: MessageLine) -> Message:
    return Message(**{f: getattr(line, f) for f in Message.__struct_fields__})


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
    def __init__(self, directory: Path) -> None:
        self.dir = directory
        directory.mkdir(parents=True, exist_ok=True)

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
        target = self.path(session_id)
        temp = target.with_suffix(".jsonl.tmp")
        with open(temp, "wb") as f:
            f.write(b"".join(lines))
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, target)
        fsync_dir(self.dir)

    def append(self, session_id: str, data: bytes) -> int:
        """Append bytes and fsync them; return the offset they start at."""
        fd = os.open(self.path(session_id), os.O_WRONLY | os.O_APPEND)
        try:
            offset = os.lseek(fd, 0, os.SEEK_END)
            written = os.write(fd, data)
            while written < len(data):
                written += os.write(fd, data[written:])
            _sync(fd)
            return offset
        finally:
            os.close(fd)

    def read_range(self, session_id: str, start: int, end: int) -> bytes:
        with open(self.path(session_id), "rb") as f:
            f.seek(start)
            return f.read(end - start)

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
        with open(target, "xb") as out:
            out.write(tail)
            out.flush()
            os.fsync(out.fileno())
        fsync_dir(self.dir)
        self.truncate(session_id, good_end)
        return target

    def truncate(self, session_id: str, size: int) -> None:
        fd = os.open(self.path(session_id), os.O_WRONLY)
        try:
            os.ftruncate(fd, size)
            os.fsync(fd)
        finally:
            os.close(fd)

    def delete(self, session_id: str) -> None:
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
