"""Where a tool's path argument really points, and whether the tool may touch it.

``resolve`` is the I/O half of ``core.paths``: it follows symlinks (for a file
that does not exist yet, through its existing parents) and refuses anything
that lands outside the resolved session root with ``PATH_OUTSIDE_WORKSPACE``.
The deny rules then judge both the resolved path and the path as written, so a
symlink can neither lead out of the root nor disguise a secret or a host-owned
file in either direction.

The host's own data directory (``host_dir``: the index, every session's
transcript, attachments, ``host.json`` with the bearer token) is off limits to
every path tool when it lies inside a root — a project at ``$HOME`` with the
default data dir under it: Write and Edit there would corrupt what the host
serves, Read, Grep, Glob and a ``file:`` BrowserPreview would show other
sessions' transcripts (secrets users pasted) and the token. Both spellings are
judged against both spellings of the data dir (as configured, and resolved).
A temporary session's root is a scratch directory inside the data dir; that
root, and nothing else of the data dir, is the session's own. The rule covers
path arguments only: Grep and Glob walking a root that contains the data dir
enter it (pruning the walk is ``tools.files``'s to do), and Bash cannot be
path-checked at all (the seeds reject classifying command text): under ``auto``
a command can still write there.

``check_paths`` gives the host the same verdict before it asks the user
anything; every tool re-checks on its own (defence in depth; for the data dir,
``guard`` wraps a tool with the re-check), so a tool called without the gate is
no weaker. The check and the later open are not atomic: a process racing the
agent inside the root could swap a component for a symlink in between. The
root belongs to the user, whose own processes are trusted.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from pidesk.core import paths
from pidesk.core.errors import Code
from pidesk.tools.base import Tool, ToolFailure, ToolResult

PATH_TOOLS = ("Read", "Glob", "Grep", "Write", "Edit", "BrowserPreview")


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


def resolve_for_search(root: Path, path: str, host_dir: Path | None = None) -> tuple[Path, str]:
    """Glob's start: inside the root, and not the host's data directory (secrets it may list by name)."""
    target, rel = resolve(root, path)
    _refuse_host_dir(root, path, target, host_dir, "list")
    return target, rel


def resolve_for_read(root: Path, path: str, host_dir: Path | None = None) -> tuple[Path, str]:
    target, rel = resolve(root, path)
    if any(paths.read_denied(candidate) for candidate in _spellings(root, path, rel)):
        raise ToolFailure(
            Code.WORKSPACE_PATH_DENIED,
            f"{path} is a secret file (.env, keys); tools may not read it",
        )
    _refuse_host_dir(root, path, target, host_dir, "read")
    return target, rel


def resolve_for_write(root: Path, path: str, host_dir: Path | None = None) -> tuple[Path, str]:
    target, rel = resolve(root, path)
    if any(paths.write_denied(candidate) for candidate in _spellings(root, path, rel)):
        raise ToolFailure(
            Code.WORKSPACE_PATH_DENIED,
            f"{path} is a secret or host-owned (.pi/, .git/) path; tools may not write it",
        )
    _refuse_host_dir(root, path, target, host_dir, "write")
    return target, rel


def _spellings(root: Path, path: str, resolved_rel: str) -> set[str]:
    """The resolved relative path, plus the path as written when that stays in the root."""
    base = root.resolve()
    lexical = Path(os.path.normpath(base / path))
    if lexical.is_relative_to(base):
        return {resolved_rel, lexical.relative_to(base).as_posix()}
    return {resolved_rel}


def _refuse_host_dir(root: Path, path: str, target: Path, host_dir: Path | None, verb: str) -> None:
    if host_dir is None:
        return
    base = root.resolve()
    host_dirs = {Path(os.path.abspath(host_dir)), Path(os.path.realpath(host_dir))}
    if any(base.is_relative_to(d / "scratch") for d in host_dirs):
        return  # a temporary session: its root is its own, and resolve() kept the target inside it
    lexical = Path(os.path.normpath(base / path))
    if any(p.is_relative_to(d) for p in (target, lexical) for d in host_dirs):
        raise ToolFailure(
            Code.WORKSPACE_PATH_DENIED,
            f"{path} is inside pidesk's own data directory (the session transcripts, the index and the "
            f"host's token); tools may not {verb} it. Work on files outside it.",
        )


def path_failure(tool: str, args: dict[str, Any], root: Path, host_dir: Path | None = None) -> ToolFailure | None:
    """Why the path rules refuse this call (outside the root, or denied), or ``None``; malformed
    arguments are left to the tool, which explains them."""
    raw = args.get("url") if tool == "BrowserPreview" else args.get("path")
    if not isinstance(raw, str) or not raw:
        return None
    try:
        match tool:
            case "Read" | "Grep":
                resolve_for_read(root, raw, host_dir)
            case "Write" | "Edit":
                resolve_for_write(root, raw, host_dir)
            case "Glob":
                resolve_for_search(root, raw, host_dir)
            case "BrowserPreview":  # as the tool reads it: a file URL or a plain path is a workspace file
                url = urlsplit(raw)
                if url.scheme not in ("file", ""):
                    return None
                resolve_for_read(root, unquote(url.path) if url.scheme == "file" else raw, host_dir)
            case _:
                return None
    except ToolFailure as failure:
        if failure.code in (Code.PATH_OUTSIDE_WORKSPACE, Code.WORKSPACE_PATH_DENIED):
            return failure
    return None


def check_paths(tool: str, args: dict[str, Any], root: Path, host_dir: Path | None = None) -> Code | None:
    """The verdict the host applies before any Ask, in every mode, grants or not."""
    failure = path_failure(tool, args, root, host_dir)
    return None if failure is None or failure.code is None else failure.code


def guard(name: str, tool: Tool, root: Path, host_dir: Path) -> Tool:
    """``tool`` re-checking its path against the host's data directory as it runs, not only at the gate
    (a link may have been swapped in while the user decided)."""

    async def guarded(args: dict[str, Any]) -> ToolResult:
        failure = path_failure(name, args, root, host_dir) if isinstance(args, dict) else None
        if failure is not None:
            raise failure
        return await tool(args)

    return guarded
