"""Read, Glob, Grep, Write and Edit over one session root.

Invariants:

- Every path goes through ``workspace.resolve_for_read`` / ``resolve_for_write``
  first, whatever the host's gate already decided.
- Glob and Grep search with ripgrep in a child process (``tools/search.py``):
  matching is linear-time and outside the interpreter, every call has a deadline
  (``timeout_s``, then ``TOOL_TIMEOUT``), and the ``rg`` process is killed
  however the call ends, abort included. Their walk never enters a ``.git``
  directory; skips what ``.gitignore`` files exclude inside a git repository,
  as git would (and what ``.ignore`` files exclude anywhere); finds dot files;
  and never follows a symlink (a symlink is neither listed nor searched; a
  ``path`` argument that is one is resolved, and must stay in the root).
  Non-regular files are never opened. Grep never shows a line of a secret
  file (``paths.read_denied``), skips binary files (a NUL byte), and takes
  ripgrep's regex syntax (Rust ``regex``: no look-around or backreferences;
  an invalid one is ``INVALID_ARGUMENTS`` with ripgrep's reason).
- Output is bounded: Read by lines and line length, Glob and Grep by a result
  cap, and each says what it left out and how to get the rest. No line is ever
  held whole: Read reads in chunks and keeps at most ``MAX_LINE_CHARS`` (as UTF-8,
  4 bytes each) of a line, showing ``… [line truncated: N bytes]``; Grep shows at
  most ``MAX_GREP_LINE_CHARS`` of a matching line (``… [line truncated]``), and
  ripgrep maps files rather than buffering a long line.
- Errors name paths as the model gave them (or root-relative), never the host's
  absolute path; a name over the file system's limit is ``INVALID_ARGUMENTS``.
- Write and Edit replace a file atomically (temp file in the same directory,
  fsync, ``os.replace``) and keep an existing file's permission bits; a reader
  sees the old bytes or the new ones, never a torn file.

Read, Write and Edit run in a worker thread. Cancelling the awaiting coroutine
does not stop the thread, so a cancelled Write or Edit may still land (whole).
"""

from __future__ import annotations

import asyncio
import errno
import os
import secrets
import stat
from collections.abc import Awaitable, Callable, Iterator
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
from pidesk.tools.search import (
    DEFAULT_SEARCH_TIMEOUT_S,
    GlobMatcher,
    compile_glob,
    rg_problem,
    run_rg,
    unreadable_note,
)
from pidesk.tools.workspace import resolve, resolve_for_read, resolve_for_write

DEFAULT_READ_LIMIT: Final = 2000
MAX_LINE_CHARS: Final = 2000
MAX_LINE_HEAD_BYTES: Final = 4 * MAX_LINE_CHARS  # enough UTF-8 for MAX_LINE_CHARS characters
MAX_GREP_LINE_CHARS: Final = 500
DEFAULT_MAX_RESULTS: Final = 1000
BINARY_SNIFF_BYTES: Final = 8192
MAX_PATTERN_BYTES: Final = 65_536
_READ_CHUNK: Final = 65_536
# ripgrep cuts a matching line longer than this many bytes to a preview of as many
# characters; any line that long has more than MAX_GREP_LINE_CHARS characters.
_RG_MAX_COLUMNS: Final = 4 * MAX_GREP_LINE_CHARS
# Every search: no config file, dot files too, files mapped (a long line is never buffered whole).
_RG_WALK: Final = ("--no-config", "--hidden", "--mmap")
# Never into .git: given after any glob of the model's, so it wins over them.
_RG_NO_GIT: Final = ("--iglob", "!.git")  # (any case: .GIT is .git where names are read without case)
_GLOB_SPECIAL: Final = frozenset("*?[]{}!\\")


def _skip_host_dir(start: Path, host_dir: Path | None) -> list[str]:
    """ripgrep arguments that keep a walk from ``start`` out of the host's data directory below it
    (a project at $HOME holds the default one): a later ``--glob`` wins over the user's own."""
    if host_dir is None:
        return []
    data = host_dir.resolve()
    if data == start or not data.is_relative_to(start):
        return []  # the data dir is not below the start (a walk from inside it is refused before)
    rel = "".join(f"\\{c}" if c in _GLOB_SPECIAL else c for c in data.relative_to(start).as_posix())
    return ["--glob", f"!/{rel}/"]


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
        with _open(target, path, tool="Read") as file:
            if b"\0" in file.read(BINARY_SNIFF_BYTES):
                raise _binary(rel)
            file.seek(0)
            for total, (head, length, has_nul) in enumerate(_bounded_lines(file), 1):
                if offset <= total < offset + limit:
                    if has_nul:
                        raise _binary(rel)
                    shown.append(f"{total:>6}\t{_read_line(head, length)}")
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

    return _threaded("Read", read)


def _bounded_lines(file: BinaryIO) -> Iterator[tuple[bytes, int, bool]]:
    """Each line as (its first MAX_LINE_HEAD_BYTES bytes, its length, whether it holds a NUL byte).

    The file is read in chunks; of a longer line only the head is kept, so a
    gigabyte without a newline costs a chunk and a head, never the line.
    """
    head = bytearray()
    length = 0
    has_nul = False
    while chunk := file.read(_READ_CHUNK):
        start = 0
        while start < len(chunk):
            end = chunk.find(b"\n", start)
            stop = len(chunk) if end == -1 else end
            room = MAX_LINE_HEAD_BYTES - len(head)
            if room > 0:
                head += chunk[start : min(stop, start + room)]
            length += stop - start
            has_nul = has_nul or chunk.find(b"\0", start, stop) != -1
            if end == -1:
                break
            yield bytes(head), length, has_nul
            head.clear()
            length, has_nul = 0, False
            start = end + 1
    if length:
        yield bytes(head), length, has_nul


def _read_line(head: bytes, length: int) -> str:
    text = _decode_line(head)
    if length <= len(head) and len(text) <= MAX_LINE_CHARS:
        return text
    return f"{text[:MAX_LINE_CHARS]}… [line truncated: {length} bytes]"


# ---------------------------------------------------------------- Glob


def make_glob_tool(
    root: Path, *, max_results: int = DEFAULT_MAX_RESULTS, timeout_s: float = DEFAULT_SEARCH_TIMEOUT_S,
    host_dir: Path | None = None,
) -> Tool:
    """``timeout_s`` bounds each call's walk (then ``TOOL_TIMEOUT``); ``host_dir``, the host's data
    directory, is left out of every walk that would pass through it."""
    root = root.resolve()

    async def glob(args: dict[str, Any]) -> ToolResult:
        pattern = require_str(args, "Glob", "pattern")
        if pattern.startswith("/"):
            raise ToolFailure(
                Code.INVALID_ARGUMENTS,
                "Glob: `pattern` is relative to `path` (default: the workspace root); "
                "put a directory in `path` instead of an absolute pattern",
            )
        matcher = _glob(pattern.removeprefix("./"), "Glob")
        start, start_rel = await asyncio.to_thread(_search_start, root, args, "Glob", for_read=False)
        if not await asyncio.to_thread(start.is_dir):
            raise ToolFailure(None, f"Glob: {_shown(args.get('path'))} is not a directory")
        found = _Collected(max_results)

        def on_record(record: bytes) -> None:
            below = _decode_path(record)
            if below and matcher.match(below):
                found.add(_join(start_rel, below))

        run = await run_rg(
            [*_RG_WALK, "--files", "--null", *_RG_NO_GIT, *_skip_host_dir(start, host_dir), "--", "."],
            cwd=start, timeout_s=timeout_s, separator=b"\0", on_record=on_record, tool="Glob",
        )
        note = unreadable_note(run.stderr, root, start_rel)
        lines = found.first()
        if run.timed_out:
            return ToolResult.error(Code.TOOL_TIMEOUT, "\n".join(
                [*lines, f"[Glob stopped after {timeout_s:g} s with {found.total} matches so far; "
                          "narrow the path or pattern]"]) + note)
        if run.returncode == 2 and not found.total and not note:
            raise ToolFailure(None, f"Glob: ripgrep failed: {rg_problem(run.stderr, root)}")
        if not lines:
            return ToolResult(ok=True, output=f"No files match {pattern}" + note)
        if found.total > max_results:
            lines.append(
                f"[{found.total - max_results} more of {found.total} matches not shown; "
                "narrow the pattern or path]"
            )
        return ToolResult(ok=True, output="\n".join(lines) + note)

    return _guarded("Glob", glob)


@dataclass
class _Collected:
    """The ``cap`` smallest paths seen, and how many were seen; holds at most 2 × cap."""

    cap: int
    total: int = 0
    kept: list[str] = field(default_factory=list)

    def add(self, path: str) -> None:
        self.total += 1
        self.kept.append(path)
        if len(self.kept) > 2 * self.cap:
            self.kept.sort()
            del self.kept[self.cap :]

    def first(self) -> list[str]:
        return sorted(self.kept)[: self.cap]


# ---------------------------------------------------------------- Grep


def make_grep_tool(
    root: Path, *, max_matches: int = DEFAULT_MAX_RESULTS, timeout_s: float = DEFAULT_SEARCH_TIMEOUT_S,
    host_dir: Path | None = None,
) -> Tool:
    """``timeout_s`` bounds each call's search (then ``TOOL_TIMEOUT``, with the matches found so far);
    ``host_dir``, the host's data directory, is left out of every search that would pass through it."""
    root = root.resolve()

    async def grep(args: dict[str, Any]) -> ToolResult:
        pattern = require_str(args, "Grep", "pattern")
        file_glob = optional_str(args, "Grep", "glob")
        ignore_case = optional_bool(args, "Grep", "ignoreCase")
        if "\0" in pattern:
            raise ToolFailure(Code.INVALID_ARGUMENTS, "Grep: `pattern` cannot contain a NUL character")
        if len(pattern.encode("utf-8", errors="replace")) > MAX_PATTERN_BYTES:
            raise ToolFailure(
                Code.INVALID_ARGUMENTS, f"Grep: `pattern` is longer than {MAX_PATTERN_BYTES} bytes; shorten it"
            )
        if file_glob is not None and "\0" in file_glob:
            raise ToolFailure(Code.INVALID_ARGUMENTS, "Grep: `glob` cannot contain a NUL character")
        start, start_rel = await asyncio.to_thread(_search_start, root, args, "Grep", for_read=True)
        search = ["--null", "--line-number", "--with-filename", "--no-heading", "--color", "never",
                  "--sort", "path", "--max-columns", str(_RG_MAX_COLUMNS), "--max-columns-preview"]
        search += ["--ignore-case"] if ignore_case else []
        if await asyncio.to_thread(start.is_dir):
            cwd, prefix, target = start, start_rel, "."
            search += ["--glob", file_glob] if file_glob is not None else []
        else:
            await asyncio.to_thread(_require_regular_file, start, str(args["path"]), tool="Grep")
            if file_glob is not None and not _glob(file_glob, "Grep").match(start.name):
                return ToolResult(ok=True, output=f"No matches for {pattern}")
            cwd, prefix, target = root, "", start_rel
        found: list[str] = []
        total = 0

        def on_record(record: bytes) -> None:
            nonlocal total
            name, nul, rest = record.partition(b"\0")
            number, colon, line = rest.partition(b":")
            if not nul or not colon or not number.isdigit():
                return  # ripgrep's own note, e.g. "binary file matches"
            rel = _join(prefix, _decode_path(name))
            if paths.read_denied(rel):
                return
            total += 1
            if total <= max_matches:
                found.append(f"{rel}:{int(number)}:{_clip(_decode_line(line), MAX_GREP_LINE_CHARS)}")

        run = await run_rg(
            [*_RG_WALK, *search, *_RG_NO_GIT, *_skip_host_dir(cwd, host_dir), "--regexp", pattern, "--", target],
            cwd=cwd, timeout_s=timeout_s, separator=b"\n", on_record=on_record, tool="Grep",
        )
        note = unreadable_note(run.stderr, root, prefix)
        if run.timed_out:
            return ToolResult.error(Code.TOOL_TIMEOUT, "\n".join(
                [*found, f"[Grep stopped after {timeout_s:g} s with {total} matching lines so far; "
                         "narrow the path or glob, or simplify the pattern]"]) + note)
        if run.returncode == 2 and not total and not note:
            problem = rg_problem(run.stderr, root)
            if file_glob is not None and "error parsing glob" in problem:
                raise ToolFailure(Code.INVALID_ARGUMENTS, f"Grep: invalid glob {file_glob!r}: {problem}")
            raise ToolFailure(
                Code.INVALID_ARGUMENTS, f"Grep: invalid regular expression {_shown(pattern)!r}: {problem}"
            )
        if not found:
            return ToolResult(ok=True, output=f"No matches for {pattern}" + note)
        if total > max_matches:
            found.append(
                f"[{total - max_matches} more of {total} matching lines not shown; "
                "narrow the pattern, path or glob]"
            )
        return ToolResult(ok=True, output="\n".join(found) + note)

    return _guarded("Grep", grep)


def _glob(pattern: str, tool: str) -> GlobMatcher:
    try:
        return compile_glob(pattern)
    except ToolFailure as failure:
        raise ToolFailure(failure.code, f"{tool}: {failure.message}") from None


def _decode_path(raw: bytes) -> str:
    return raw.decode("utf-8", errors="replace").removeprefix("./")


def _join(prefix: str, below: str) -> str:
    return f"{prefix}/{below}" if prefix else below


# ---------------------------------------------------------------- Write / Edit


def make_write_tool(root: Path) -> Tool:
    root = root.resolve()

    def write(args: dict[str, Any]) -> ToolResult:
        path = require_str(args, "Write", "path")
        content = require_str(args, "Write", "content", allow_empty=True)
        target, rel = resolve_for_write(root, path)
        data = content.encode("utf-8")
        try:
            if target.is_dir():
                raise ToolFailure(None, f"Write: {_shown(path)} is a directory; give a file path")
            target.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(target, data)
        except OSError as exc:
            raise _os_failure("Write", path, exc, action="write") from None
        return ToolResult(ok=True, output=f"Wrote {len(data)} bytes to {rel}")

    return _threaded("Write", write)


def make_edit_tool(root: Path) -> Tool:
    root = root.resolve()

    def edit(args: dict[str, Any]) -> ToolResult:
        path = require_str(args, "Edit", "path")
        old = require_str(args, "Edit", "oldText")
        new = require_str(args, "Edit", "newText", allow_empty=True)
        replace_all = optional_bool(args, "Edit", "replaceAll")
        target, rel = resolve_for_write(root, path)
        _require_regular_file(target, path, tool="Edit")
        with _open(target, path, tool="Edit") as file:
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
            raise _os_failure("Edit", path, exc, action="write") from None
        noun = "occurrence" if count == 1 else "occurrences"
        return ToolResult(ok=True, output=f"Replaced {count} {noun} in {rel}")

    return _threaded("Edit", edit)


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


# ---------------------------------------------------------------- paths


def _search_start(root: Path, args: dict[str, Any], tool: str, *, for_read: bool) -> tuple[Path, str]:
    """Where a search starts, and that place relative to the root ('' for the root itself)."""
    path = optional_str(args, tool, "path")
    if path is None:
        return root, ""
    start, rel = resolve_for_read(root, path) if for_read else resolve(root, path)
    try:
        os.stat(start)
    except FileNotFoundError:
        raise ToolFailure(Code.FILE_NOT_FOUND, f"{tool}: {_shown(path)} does not exist") from None
    except OSError as exc:
        raise _os_failure(tool, path, exc) from None
    return start, "" if rel == "." else rel


# ---------------------------------------------------------------- helpers


def _threaded(name: str, body: Callable[[dict[str, Any]], ToolResult]) -> Tool:
    async def tool(args: dict[str, Any]) -> ToolResult:
        result: ToolResult = await asyncio.to_thread(body, args)
        return result

    return _guarded(name, tool)


def _guarded(name: str, body: Callable[[dict[str, Any]], Awaitable[ToolResult]]) -> Tool:
    """An OS error no branch foresaw still becomes a clean failure naming the path as given
    (``run_tool`` would make it ``INTERNAL``, with the host's absolute path in its text)."""

    async def tool(args: dict[str, Any]) -> ToolResult:
        try:
            return await body(args)
        except OSError as exc:
            path = args.get("path")
            raise _os_failure(name, path if isinstance(path, str) and path else ".", exc) from None

    return tool


def _os_failure(tool: str, path: str, exc: OSError, *, action: str = "open") -> ToolFailure:
    """``exc`` told in words without its file names (they are the host's absolute paths)."""
    if exc.errno == errno.ENAMETOOLONG:
        return ToolFailure(
            Code.INVALID_ARGUMENTS,
            f"{tool}: {_shown(path)} is too long for the file system (at most 255 bytes per name "
            "and 4096 in all); use a shorter path",
        )
    return ToolFailure(None, f"{tool}: cannot {action} {_shown(path)}: {exc.strerror or type(exc).__name__}")


def _shown(path: object) -> str:
    """A path argument as the model gave it, cut short if it is very long."""
    text = str(path)
    return text if len(text) <= 120 else text[:120] + "…"


def _require_regular_file(target: Path, path: str, *, tool: str) -> None:
    try:
        mode = target.stat().st_mode
    except FileNotFoundError:
        raise ToolFailure(Code.FILE_NOT_FOUND, f"{tool}: {_shown(path)} does not exist") from None
    except OSError as exc:
        raise _os_failure(tool, path, exc) from None
    if stat.S_ISDIR(mode):
        raise ToolFailure(None, f"{tool}: {_shown(path)} is a directory; use Glob to list its files")
    if not stat.S_ISREG(mode):
        raise ToolFailure(None, f"{tool}: {_shown(path)} is not a regular file")


def _open(target: Path, path: str, *, tool: str) -> BinaryIO:
    try:
        return target.open("rb")
    except OSError as exc:
        raise _os_failure(tool, path, exc) from None


def _binary(rel: str) -> ToolFailure:
    return ToolFailure(Code.TOOL_BINARY_CONTENT, f"{rel} is a binary file; it cannot be shown as text")


def _decode_line(raw: bytes) -> str:
    return raw.decode("utf-8", errors="replace").rstrip("\r\n")


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + "… [line truncated]"
