"""Attachment bytes, content-addressed: ``<data_dir>/blobs/<sha256>``, written once.

Messages reference an attachment by ``ref`` (``sha256:<hex>``) with its kind,
name, MIME type and size; transcripts never hold the bytes or any base64 of them.
Blobs are 0600 in a 0700 directory, like every file of the data dir.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from pidesk.store.transcripts import fsync_dir, private_dir, write_private

PREFIX = "sha256:"


class Blobs:
    def __init__(self, directory: Path) -> None:
        self.dir = directory
        private_dir(directory)  # made durable by the Store, with the data dir

    def put(self, data: bytes) -> str:
        digest = hashlib.sha256(data).hexdigest()
        path = self.dir / digest
        if not path.exists():
            temp = self.dir / f".{digest}.tmp"
            write_private(temp, data)
            os.replace(temp, path)
        # Even when the blob was there: a process killed before this fsync may have left its name unsynced,
        # and the ref is acknowledged now.
        fsync_dir(self.dir)
        return PREFIX + digest

    def path(self, ref: str) -> Path | None:
        digest = ref[len(PREFIX):] if ref.startswith(PREFIX) else ""
        if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            return None
        path = self.dir / digest
        return path if path.exists() else None

    def get(self, ref: str) -> bytes | None:
        path = self.path(ref)
        return path.read_bytes() if path else None
