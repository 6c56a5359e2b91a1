"""Which workspace paths tools may touch, decided on a root-relative POSIX path.

Resolving a path against the root (symlinks followed) is I/O and belongs to the
tools; this module only judges the result. Secrets are off limits to Read, Write
and Edit; host-owned trees (``.pi/``, any ``.git/``) to Write and Edit. Names are
compared without case: on a case-insensitive file system (macOS, Windows)
``.GIT/config`` is ``.git/config`` and ``.Env`` is ``.env``.
"""

from __future__ import annotations

from fnmatch import fnmatchcase
from typing import Final

_SECRET_NAMES: Final = (".env", ".env.*", "*.pem", "*.key", "id_rsa*", "id_ed25519*")


def is_secret(rel_path: str) -> bool:
    name = rel_path.rsplit("/", 1)[-1].lower()
    return any(fnmatchcase(name, pattern) for pattern in _SECRET_NAMES)


def is_host_owned(rel_path: str) -> bool:
    parts = rel_path.lower().split("/")
    return parts[0] == ".pi" or ".git" in parts


def read_denied(rel_path: str) -> bool:
    return is_secret(rel_path)


def write_denied(rel_path: str) -> bool:
    return is_secret(rel_path) or is_host_owned(rel_path)
