"""Read, Glob, Grep, Write and Edit over one session root.

Invariants:

- Every path goes through ``workspace.resolve_for_read`` / ``resolve_for_write``
  first, whatever the host's gate already decided.
- Searches walk the tree without following directory symlinks, never enter a
  ``.git`` directory, and never open a secret, a non-regular file (a FIFO would
  block) or a symlink leading out of the root. Grep skips binary files (a NUL
  byte in the first 8 KiB).
- Output is bounded: Read by lines and line length, Glob and Grep by a result
  cap, and each says what it left out and how to get the rest.
- Write and Edit replace a file atomically (temp file in the same directory,
  fsync, ``os.replace``) and keep an existing file's permission bits; a reader
  sees the old bytes or the new ones, never a torn file.

The blocking work runs in a worker thread. Cancelling the awaiting coroutine
does not stop the thread, so a cancelled Write or Edit may still land (whole).
"""

from __future__ import annotations

import asyncio
import os
import re
import secrets
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Final

from pidesk.core import paths
from pidesk.core.errors import Code
from pidesk.tools.base import (
    Tool,
    ToolFailure,
    ToolResult,
    optional_bool,
    optional_int,
    optional_str,
    require_str,
)
from pidesk.tools.workspace import resolve, resolve_for_read, resolve_for_write

DEFAULT_READ_LIMIT: Final = 2000
MAX_LINE_CHARS: Final = 2000
MAX_GREP_LINE_CHARS: Final = 500
DEFAULT_MAX_RESULTS: Final = 1000
BINARY_SNIFF_BYTES: Final = 8192


# ---------------------------------------------------------------- Read


def make_read_tool(root: Path) -> Tool:
    root = root.resolve()

    def read(args: dict[str, Any]) -> ToolResult:
        path = require_str(args, "Read", "path")
        offset = optional_int(args, "Read", "offset", minimum=1) or 1
        limit = optional_int(args, "Read", "limit", minimum=1) or DEFAULT_READ_LIMIT
        target, rel = resolve_for_read(root, path)
        _require_regular_file(target, path, tool="Read")
        shown: list[str] = []
        total = 0
        with _open(target, path) as file:
            if b"\0" in file.read(BINARY_SNIFF_BYTES):
                raise _binary(rel)
            file.seek(0)
            for total, raw in enumerate(file, 1):
                if offset <= total < offset + limit:
                    if b"\0" in raw:
                        raise _binary(rel)
                    shown.append(f"{total:>6}\t{_clip(_decode_line(raw), MAX_LINE_CHARS)}")
        if total == 0:
            return ToolResult(ok=True, output=f"({rel} is empty)")
        if offset > total:
            raise ToolFailure(
                None, f"offset {offset} is past the end of {rel} ({total} lines); use a smaller offset"
            )
        last = offset + len(shown) - 1
        if offset > 1 or last < total:
            more = f"; continue with offset={last + 1}" if last < total else ""
            shown.append(f"\n[lines {offset}-{last} of {total} in {rel}{more}]")
        return ToolResult(ok=True, output="\n".join(shown))

    return _threaded(read)


# ---------------------------------------------------------------- Glob


def make_glob_tool(root: Path, *, max_results: int = DEFAULT_MAX_RESULTS) -> Tool:
    root = root.resolve()

    def glob(args: dict[str, Any]) -> ToolResult:
        pattern = require_str(args, "Glob", "pattern")
        if pattern.startswith("/"):
            raise ToolFailure(
                Code.INVALID_ARGUMENTS,
                "Glob: `pattern` is relative to `path` (default: the workspace root); "
                "put a directory in `path` instead of an absolute pattern",
            )
        start = _search_start(root, args, "Glob", for_read=False)
        if not start.is_dir():
            raise ToolFailure(None, f"Glob: {args.get('path')} is not a directory")
        matcher = glob_regex(pattern.removeprefix("./"))
        walk = _Walk(root, start, hide_secrets=False)
        matches = sorted(rel for _, rel, below in walk.files() if matcher.match(below))
        if not matches:
            return ToolResult(ok=True, output=f"No files match {pattern}" + walk.note())
        lines = matches[:max_results]
        if len(matches) > max_results:
            lines.append(
                f"[{len(matches) - max_results} more of {len(matches)} matches not shown; "
                "narrow the pattern or path]"
            )
        return ToolResult(ok=True, output="\n".join(lines) + walk.note())

    return _threaded(glob)


# ---------------------------------------------------------------- Grep


def make_grep_tool(root: Path, *, max_matches: int = DEFAULT_MAX_RESULTS) -> Tool:
    root = root.resolve()

    def grep(args: dict[str, Any]) -> ToolResult:
        pattern = require_str(args, "Grep", "pattern")
        file_glob = optional_str(args, "Grep", "glob")
        flags = re.IGNORECASE if optional_bool(args, "Grep", "ignoreCase") else 0
        try:
            regex = re.compile(pattern, flags)
        except re.error as exc:
            raise ToolFailure(
                Code.INVALID_ARGUMENTS, f"Grep: invalid regular expression {pattern!r}: {exc}"
            ) from None
        name_filter = glob_regex(file_glob) if file_glob else None
        filter_on_path = file_glob is not None and "/" in file_glob
        start = _search_start(root, args, "Grep", for_read=True)
        walk = _Walk(root, start, hide_secrets=True)
        candidates: Iterator[tuple[Path, str, str]]
        if start.is_dir():
            candidates = walk.files()
        else:
            _require_regular_file(start, str(args["path"]), tool="Grep")
            candidates = iter([(start, start.relative_to(root).as_posix(), start.name)])
        found: list[str] = []
        total = 0
        for path, rel, below in candidates:
            subject = below if filter_on_path else below.rsplit("/", 1)[-1]
            if name_filter is not None and not name_filter.match(subject):
                continue
            for lineno, line in _text_lines(path):
                if regex.search(line):
                    total += 1
                    if total <= max_matches:
                        found.append(f"{rel}:{lineno}:{_clip(line, MAX_GREP_LINE_CHARS)}")
        if not found:
            return ToolResult(ok=True, output=f"No matches for {pattern}" + walk.note())
        if total > max_matches:
            found.append(
                f"[{total - max_matches} more of {total} matching lines not shown; "
                "narrow the pattern, path or glob]"
            )
        return ToolResult(ok=True, output="\n".join(found) + walk.note())

    return _threaded(grep)


def _text_lines(path: Path) -> Iterator[tuple[int, str]]:
    try:
        with path.open("rb") as file:
            if b"\0" in file.read(BINARY_SNIFF_BYTES):
                return
            file.seek(0)
            for lineno, raw in enumerate(file, 1):
                yield lineno, _decode_line(raw)
    except OSError:
        return


# ---------------------------------------------------------------- Write / Edit


def make_write_tool(root: Path) -> Tool:
    root = root.resolve()

    def write(args: dict[str, Any]) -> ToolResult:
        path = require_str(args, "Write", "path")
        content = require_str(args, "Write", "content", allow_empty=True)
        target, rel = resolve_for_write(root, path)
        if target.is_dir():
            raise ToolFailure(None, f"Write: {path} is a directory; give a file path")
        data = content.encode("utf-8")
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(target, data)
        except OSError as exc:
            raise ToolFailure(None, f"Write: cannot write {rel}: {exc.strerror or exc}") from None
        return ToolResult(ok=True, output=f"Wrote {len(data)} bytes to {rel}")

    return _threaded(write)


def make_edit_tool(root: Path) -> Tool:
    root = root.resolve()

    def edit(args: dict[str, Any]) -> ToolResult:
        path = require_str(args, "Edit", "path")
        old = require_str(args, "Edit", "oldText")
        new = require_str(args, "Edit", "newText", allow_empty=True)
        replace_all = optional_bool(args, "Edit", "replaceAll")
        target, rel = resolve_for_write(root, path)
        _require_regular_file(target, path, tool="Edit")
        with _open(target, path) as file:
            data = file.read()
        if b"\0" in data:
            raise _binary(rel)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise ToolFailure(
                Code.TOOL_BINARY_CONTENT, f"{rel} is not UTF-8 text; Edit cannot change it"
            ) from None
        if old == new:
            raise ToolFailure(None, "Edit: oldText and newText are identical; nothing to change")
        count = text.count(old)
        if count == 0 and "\r\n" in text and "\n" in old and "\r\n" not in old:
            old, new = old.replace("\n", "\r\n"), new.replace("\n", "\r\n")
            count = text.count(old)
        if count == 0:
            raise ToolFailure(
                None,
                f"Edit: oldText was not found in {rel}; Read the file and copy the exact text, "
                "including whitespace",
            )
        if count > 1 and not replace_all:
            raise ToolFailure(
                None,
                f"Edit: oldText occurs {count} times in {rel}; include more surrounding text "
                "to make it unique, or set replaceAll to change every occurrence",
            )
        try:
            atomic_write(target, text.replace(old, new).encode("utf-8"))
        except OSError as exc:
            raise ToolFailure(None, f"Edit: cannot write {rel}: {exc.strerror or exc}") from None
        noun = "occurrence" if count == 1 else "occurrences"
        return ToolResult(ok=True, output=f"Replaced {count} {noun} in {rel}")

    return _threaded(edit)


def atomic_write(target: Path, data: bytes) -> None:
    """Replace ``target`` with ``data`` in one step, keeping an existing file's mode.

    A new file gets ``0o666`` less the umask, as ``open()`` would give it.
    """
    try:
        mode: int | None = stat.S_IMODE(target.stat().st_mode)
    except FileNotFoundError:
        mode = None
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    while True:
        temp = target.parent / f".{secrets.token_hex(6)}.pidesk-tmp"
        try:
            fd = os.open(temp, flags, 0o600 if mode is not None else 0o666)
            break
        except FileExistsError:
            continue
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        if mode is not None:
            os.chmod(temp, mode)
        os.replace(temp, target)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    _fsync_dir(target.parent)


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# ---------------------------------------------------------------- walking


def glob_regex(pattern: str) -> re.Pattern[str]:
    """Compile a glob over ``/``-separated paths.

    ``*`` and ``?`` stay within one segment, a ``**`` segment spans any number of
    directories (zero included), ``[...]`` is a character class and ``{a,b}``
    an alternation. Dot files are not special.
    """
    segments = pattern.split("/")
    out: list[str] = []
    for index, segment in enumerate(segments):
        last = index == len(segments) - 1
        if segment == "**":
            out.append(".*" if last else "(?:[^/]+/)*")
        else:
            out.append(_segment_regex(segment) + ("" if last else "/"))
    return re.compile("".join(out) + r"\Z", re.DOTALL)


def _segment_regex(segment: str) -> str:
    out: list[str] = []
    depth = 0
    i = 0
    while i < len(segment):
        char = segment[i]
        if char == "*":
            out.append("[^/]*")
        elif char == "?":
            out.append("[^/]")
        elif char == "[" and (end := segment.find("]", i + 2)) != -1:
            body = segment[i + 1 : end]
            negate = body[:1] in ("!", "^")
            body = body[1:] if negate else body
            out.append(("[^" if negate else "[") + body.replace("\\", "\\\\") + "]")
            i = end
        elif char == "{" and "}" in segment[i:]:
            out.append("(?:")
            depth += 1
        elif char == "," and depth:
            out.append("|")
        elif char == "}" and depth:
            out.append(")")
            depth -= 1
        else:
            out.append(re.escape(char))
        i += 1
    return "".join(out) + ")" * depth


@dataclass
class _Walk:
    """A deterministic walk of the regular files under ``start``, symlinks kept in the root.

    ``hide_secrets`` drops secret files (Grep reads contents; Glob only lists names).
    """

    root: Path
    start: Path
    hide_secrets: bool
    unreadable: list[str] = field(default_factory=list)

    def files(self) -> Iterator[tuple[Path, str, str]]:
        """Yield (absolute path, path relative to root, path relative to start)."""
        for dirpath, dirnames, filenames in os.walk(self.start, onerror=self._unreadable):
            dirnames[:] = sorted(name for name in dirnames if name != ".git")
            here = Path(dirpath)
            for name in sorted(filenames):
                path = here / name
                rel = path.relative_to(self.root).as_posix()
                if self.hide_secrets and paths.read_denied(rel):
                    continue
                if path.is_symlink():
                    try:
                        path, resolved_rel = resolve(self.root, rel)
                    except ToolFailure:
                        continue
                    if self.hide_secrets and paths.read_denied(resolved_rel):
                        continue
                try:
                    if not stat.S_ISREG(path.stat().st_mode):
                        continue
                except OSError:
                    continue
                yield path, rel, (here / name).relative_to(self.start).as_posix()

    def _unreadable(self, error: OSError) -> None:
        self.unreadable.append(str(error.filename))

    def note(self) -> str:
        if not self.unreadable:
            return ""
        return f"\n[{len(self.unreadable)} directories could not be read, e.g. {self.unreadable[0]}]"


def _search_start(root: Path, args: dict[str, Any], tool: str, *, for_read: bool) -> Path:
    path = optional_str(args, tool, "path")
    if path is None:
        return root
    start, _ = resolve_for_read(root, path) if for_read else resolve(root, path)
    if not start.exists():
        raise ToolFailure(Code.FILE_NOT_FOUND, f"{tool}: {path} does not exist")
    return start


# ---------------------------------------------------------------- helpers


def _threaded(body: Callable[[dict[str, Any]], ToolResult]) -> Tool:
    async def tool(args: dict[str, Any]) -> ToolResult:
        result: ToolResult = await asyncio.to_thread(body, args)
        return result

    return tool


def _require_regular_file(target: Path, path: str, *, tool: str) -> None:
    try:
        mode = target.stat().st_mode
    except FileNotFoundError:
        raise ToolFailure(Code.FILE_NOT_FOUND, f"{tool}: {path} does not exist") from None
    except OSError as exc:
        raise ToolFailure(None, f"{tool}: cannot open {path}: {exc.strerror or exc}") from None
    if stat.S_ISDIR(mode):
        raise ToolFailure(None, f"{tool}: {path} is a directory; use Glob to list its files")
    if not stat.S_ISREG(mode):
        raise ToolFailure(None, f"{tool}: {path} is not a regular file")


def _open(target: Path, path: str) -> BinaryIO:
    try:
        return target.open("rb")
    except OSError as exc:
        raise ToolFailure(None, f"cannot open {path}: {exc.strerror or exc}") from None


def _binary(rel: str) -> ToolFailure:
    return ToolFailure(Code.TOOL_BINARY_CONTENT, f"{rel} is a binary file; it cannot be shown as text")


def _decode_line(raw: bytes) -> str:
    return raw.decode("utf-8", errors="replace").rstrip("\r\n")


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + "… [line truncated]"
