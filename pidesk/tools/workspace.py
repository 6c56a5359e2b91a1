"""Where a tool's path argument really points, and whether the tool may touch it.

``resolve`` is the I/O half of ``core.paths``: it follows symlinks (for a file
that does not exist yet, through its existing parents) and refuses anything
that lands outside the resolved session root with ``PATH_OUTSIDE_WORKSPACE``.
The deny rules then judge both the resolved path and the path as written, so a
symlink can neither lead out of the root nor disguise a secret or a host-owned
file in either direction.

``check_paths`` gives the host the same verdict before it asks the user
anything; every tool re-checks on its own (defence in depth), so a tool called
without the gate is no weaker. The check and the later open are not atomic: a
process racing the agent inside the root could swap a component for a symlink
in between. The root belongs to the user, whose own processes are trusted.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from pidesk.core import paths
from pidesk.core.errors import Code
from pidesk.tools.base import ToolFailure


def resolve(root: Path, path: str) -> tuple[Path, str]:
    base = root.resolve()
    try:
        target = Path(os.path.realpath(base / path))
    except (ValueError, OSError) as exc:
        raise ToolFailure(Code.INVALID_ARGUMENTS, f"unusable path {path!r}: {exc}") from None
    if not target.is_relative_to(base):
        raise ToolFailure(
            Code.PATH_OUTSIDE_WORKSPACE,
            f"{path} resolves to {target}, outside the workspace {base}; use a path inside it",
        )
    return target, target.relative_to(base).as_posix()


def resolve_for_read(root: Path, path: str) -> tuple[Path, str]:
    target, rel = resolve(root, path)
    if any(paths.read_denied(candidate) for candidate in _spellings(root, path, rel)):
        raise ToolFailure(
            Code.WORKSPACE_PATH_DENIED,
            f"{path} is a secret file (.env, keys); tools may not read it",
        )
    return target, rel


def resolve_for_write(root: Path, path: str) -> tuple[Path, str]:
    target, rel = resolve(root, path)
    if any(paths.write_denied(candidate) for candidate in _spellings(root, path, rel)):
        raise ToolFailure(
            Code.WORKSPACE_PATH_DENIED,
            f"{path} is a secret or host-owned (.pi/, .git/) path; tools may not write it",
        )
    return target, rel


def _spellings(root: Path, path: str, resolved_rel: str) -> set[str]:
    """The resolved relative path, plus the path as written when that stays in the root."""
    base = root.resolve()
    lexical = Path(os.path.normpath(base / path))
    if lexical.is_relative_to(base):
        return {resolved_rel, lexical.relative_to(base).as_posix()}
    return {resolved_rel}


def check_paths(tool: str, args: dict[str, Any], root: Path) -> Code | None:
    raw = args.get("url") if tool == "BrowserPreview" else args.get("path")
    if not isinstance(raw, str) or not raw:
        return None
    try:
        match tool:
            case "Read" | "Grep":
                resolve_for_read(root, raw)
            case "Write" | "Edit":
                resolve_for_write(root, raw)
            case "Glob":
                resolve(root, raw)
            case "BrowserPreview":
                url = urlsplit(raw)
                if url.scheme != "file":
                    return None
                resolve_for_read(root, unquote(url.path))
            case _:
                return None
    except ToolFailure as failure:
        if failure.code in (Code.PATH_OUTSIDE_WORKSPACE, Code.WORKSPACE_PATH_DENIED):
            return failure.code
    return None
