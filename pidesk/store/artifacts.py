"""Plan and Goal artifacts: immutable ``<project>/.pi/<kind>/*.md`` files.

Written once with exclusive create, the file and its directory fsynced before
the approval row that names them is committed. Names are unique even for
identical bytes (a timestamp, a slug of the title, a random suffix); the exact
Markdown bytes are kept, with their sha256 and size recorded by the caller.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from pidesk.store.transcripts import fsync_dir


@dataclass(frozen=True)
class Artifact:
    rel_path: str  # POSIX, relative to the project root
    sha256: str
    size: int


def slugify(title: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")
    return slug[:48].rstrip("-") or "untitled"


def write_artifact(project: Path, kind: str, title: str, data: bytes, moment: datetime) -> Artifact:
    directory = project / ".pi" / kind
    _make_dirs(project, directory)
    name = f"{moment.strftime('%Y%m%dT%H%M%SZ')}-{slugify(title)}-{secrets.token_hex(4)}.md"
    path = directory / name
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    fsync_dir(directory)
    return Artifact(f".pi/{kind}/{name}", hashlib.sha256(data).hexdigest(), len(data))


def read_artifact(project: Path, rel_path: str) -> bytes:
    return (project / rel_path).read_bytes()


def sha256_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _make_dirs(project: Path, directory: Path) -> None:
    """Create ``.pi/<kind>`` and make both entries durable, whoever created them: a process killed
    between its mkdir and its fsync leaves an entry that only a later fsync makes durable."""
    for part in (project / ".pi", directory):
        part.mkdir(exist_ok=True)
        fsync_dir(part.parent)
