"""Plan and Goal artifacts: immutable ``<project>/.pi/<kind>/*.md`` files.

Written once with exclusive create, the file and its directory fsynced before
the approval row that names them is committed. Names are unique even for
identical bytes (a timestamp, a slug of the title, a random suffix); the exact
Markdown bytes are kept, with their sha256 and size recorded by the caller.

An artifact is where its ``artifactPath`` says, inside the project, or nowhere:
every component below the project directory (``.pi``, ``.pi/<kind>``, the file)
is opened relative to its parent's descriptor with ``O_NOFOLLOW``, so a symlink
there — shipped in a cloned repository, or swapped in while the host works — is
never followed, wherever it points (outside the root or inside it). Writing
refuses with ``ArtifactPathDenied`` (``WORKSPACE_PATH_DENIED``) before creating
anything; reading raises the ``OSError`` a missing artifact raises, so an
execution whose artifact now sits behind a link fails like one whose bytes
changed. The project directory itself is the user's choice and is opened as
given (sessions store it resolved).
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import secrets
import stat
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path, PurePosixPath

from pidesk.core.errors import Code, PideskError
from pidesk.store.transcripts import write_and_close

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


class ArtifactPathDenied(PideskError):
    """``.pi`` or ``.pi/<kind>`` is not a real directory inside the project; nothing was written."""

    default_code = Code.WORKSPACE_PATH_DENIED


@dataclass(frozen=True)
class Artifact:
    rel_path: str  # POSIX, relative to the project root
    sha256: str
    size: int


def slugify(title: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")
    return slug[:48].rstrip("-") or "untitled"


def write_artifact(project: Path, kind: str, title: str, data: bytes, moment: datetime) -> Artifact:
    name = f"{moment.strftime('%Y%m%dT%H%M%SZ')}-{slugify(title)}-{secrets.token_hex(4)}.md"
    with ExitStack() as opened:
        root = _closing(opened, os.open(project, _DIR))
        pi = _closing(opened, _enter(root, ".pi", project))
        directory = _closing(opened, _enter(pi, kind, project, f".pi/{kind}"))
        write_and_close(os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644,
                                dir_fd=directory), data)
        os.fsync(directory)
    return Artifact(f".pi/{kind}/{name}", hashlib.sha256(data).hexdigest(), len(data))


def read_artifact(project: Path, rel_path: str) -> bytes:
    """The artifact's bytes, reached through real directories only: a symlink anywhere below the
    project, a ``..``, or a non-regular file raises ``OSError`` (callers treat it as a missing artifact)."""
    *dirs, name = PurePosixPath(rel_path).parts or ("",)
    if PurePosixPath(rel_path).is_absolute() or any(part in ("", ".", "..") for part in (*dirs, name)):
        raise FileNotFoundError(errno.ENOENT, "not a path inside the project", rel_path)
    with ExitStack() as opened:
        parent = _closing(opened, os.open(project, _DIR))
        for part in dirs:
            parent = _closing(opened, os.open(part, _DIR | os.O_NOFOLLOW, dir_fd=parent))
        # O_NONBLOCK: a FIFO put in the artifact's place must not hang the host
        fd = _closing(opened, os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                                      dir_fd=parent))
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise IsADirectoryError(errno.EISDIR, "not a regular file", rel_path)
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)


def sha256_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _enter(parent: int, name: str, project: Path, rel: str | None = None) -> int:
    """Open the real directory ``name`` under ``parent``, creating it if missing, and make its entry
    durable whoever created it: a process killed between its mkdir and its fsync leaves an entry that
    only a later fsync makes durable. A symlink or anything but a directory there is refused."""
    try:
        os.mkdir(name, 0o755, dir_fd=parent)
    except FileExistsError:  # also a symlink, dangling or not: mkdir never follows the last component
        pass
    try:
        fd = os.open(name, _DIR | os.O_NOFOLLOW, dir_fd=parent)
    except OSError as exc:
        if exc.errno not in (errno.ENOTDIR, errno.ELOOP):
            raise
        raise ArtifactPathDenied(_refusal(parent, name, project / (rel or name))) from None
    try:
        os.fsync(parent)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _refusal(parent: int, name: str, where: Path) -> str:
    try:
        target = os.readlink(name, dir_fd=parent)
    except OSError:
        return (f"{where} is not a directory. pidesk keeps plan and goal artifacts in a real directory there: "
                "move that file aside, then submit again. Nothing was written.")
    return (f"{where} is a symbolic link (to {target}). pidesk writes plan and goal artifacts only into a real "
            "directory inside the project, never through a link: remove the link (or replace it with a "
            "directory), then submit again. Nothing was written.")


def _closing(opened: ExitStack, fd: int) -> int:
    opened.callback(os.close, fd)
    return fd
