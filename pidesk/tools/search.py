"""What Glob and Grep search with: ripgrep in a child process, and a linear-time glob matcher.

Why not Python's ``re`` on the host: a backtracking regex like ``(a*)*b`` takes
time exponential in its input, and ``re`` holds the GIL while it runs, so even
in a worker thread it froze the whole host (``/healthz``, ``agent.abort``).

- **ripgrep** (the PyPI package ``ripgrep`` ships the ``rg`` binary) matches with
  finite automata, in time linear in the input, outside the interpreter. It runs
  as the leader of its own process group with stdin from /dev/null and no config
  file (``--no-config``). Its output is read in chunks and one record at a time,
  each cut at ``MAX_RECORD_BYTES``, so the host never holds more than that of a
  line. ``run_rg`` always ends it: on return, on the deadline (the caller turns
  that into ``TOOL_TIMEOUT``) and on cancellation (abort) the group gets SIGKILL
  and is waited for (bounded), so no ``rg`` outlives the call.
- **Globs** are matched by ``compile_glob`` in time O(name × pattern): ``{a,b}``
  is expanded (bounded), and each ``*`` run becomes an atomic group that takes
  the leftmost place of the fixed-length piece after it, which is never worse
  than any later one, so nothing backtracks. ``**`` segments are matched the
  same way, one level up, over path segments.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import os
import re
import shutil
import sys
import sysconfig
from collections.abc import Callable, Sequence
from contextlib import suppress
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Final

from pidesk.core.errors import Code
from pidesk.tools.base import ToolFailure
from pidesk.tools.children import spawn

DEFAULT_SEARCH_TIMEOUT_S: Final = 30.0
MAX_RECORD_BYTES: Final = 16_384  # one output record (path + line preview); the rest of a longer one is dropped
MAX_STDERR_BYTES: Final = 8_192
MAX_GLOB_CHARS: Final = 1_024
MAX_GLOB_ALTERNATIVES: Final = 256  # per path segment, after {a,b} expansion
_READ_CHUNK: Final = 65_536
_SLICE_S: Final = 0.005  # at most this long on the loop between two yields to it
_KILL_WAIT_S: Final = 2.0


# ---------------------------------------------------------------- ripgrep


@cache
def ripgrep() -> str | None:
    """The ``rg`` binary: the ``ripgrep`` package's own, else beside this Python, else on PATH."""
    candidates: list[Path] = []
    with suppress(importlib.metadata.PackageNotFoundError):
        dist = importlib.metadata.distribution("ripgrep")
        candidates += [Path(str(dist.locate_file(f))) for f in dist.files or () if f.name in ("rg", "rg.exe")]
    candidates += [Path(sysconfig.get_path("scripts")) / "rg", Path(sys.executable).parent / "rg"]
    for candidate in candidates:
        path = os.path.normpath(candidate)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return shutil.which("rg")


@dataclass(frozen=True, slots=True)
class RgRun:
    returncode: int | None  # None when it was killed at the deadline
    stderr: str  # the first MAX_STDERR_BYTES of it
    timed_out: bool


async def run_rg(
    args: Sequence[str],
    *,
    cwd: Path,
    timeout_s: float,
    separator: bytes,
    on_record: Callable[[bytes], None],
    tool: str,
) -> RgRun:
    """Run ``rg args`` in ``cwd`` and hand each output record (split at ``separator``) to ``on_record``.

    ``on_record`` runs on the event loop; it is given at most ``MAX_RECORD_BYTES``
    of a record. The loop gets a turn at least every ``_SLICE_S`` of work.
    """
    binary = ripgrep()
    if binary is None:
        raise ToolFailure(
            None, f"{tool}: ripgrep (rg) is not installed; reinstall pidesk's dependencies (bin/dev)"
        )
    try:
        proc = await spawn([binary, *args], cwd=cwd, start_new_session=True)
    except OSError as exc:
        raise ToolFailure(None, f"{tool}: cannot start ripgrep: {exc.strerror or type(exc).__name__}") from None
    assert proc.stdout is not None and proc.stderr is not None
    errors = asyncio.ensure_future(_head(proc.stderr, MAX_STDERR_BYTES))
    timed_out = False
    try:
        async with asyncio.timeout(timeout_s):
            await _records(proc.stdout, separator, on_record)
            await proc.wait()
    except TimeoutError:
        timed_out = True
    finally:
        if proc.returncode is None:  # (not yet reaped: its pid, and so its group, is still ours)
            await proc.stop()
        await asyncio.wait({errors}, timeout=_KILL_WAIT_S)
        errors.cancel()
    stderr = b""
    if errors.done() and not errors.cancelled() and errors.exception() is None:
        stderr = errors.result()
    return RgRun(
        returncode=None if timed_out else proc.returncode,
        stderr=stderr.decode("utf-8", errors="replace"),
        timed_out=timed_out,
    )


async def _records(stream: asyncio.StreamReader, separator: bytes, on_record: Callable[[bytes], None]) -> None:
    loop = asyncio.get_running_loop()
    pending = bytearray()
    overflow = False  # the current record passed MAX_RECORD_BYTES: drop the rest of it
    yielded = loop.time()
    while chunk := await stream.read(_READ_CHUNK):
        start = 0
        while (end := chunk.find(separator, start)) != -1:
            if not overflow:
                pending += chunk[start : start + max(0, min(end - start, MAX_RECORD_BYTES - len(pending)))]
            on_record(bytes(pending))
            pending.clear()
            overflow = False
            start = end + len(separator)
            if loop.time() - yielded > _SLICE_S:
                await asyncio.sleep(0)
                yielded = loop.time()
        if not overflow:
            room = MAX_RECORD_BYTES - len(pending)
            pending += chunk[start : start + room]
            overflow = len(chunk) - start > room
        await asyncio.sleep(0)
        yielded = loop.time()
    if pending:
        on_record(bytes(pending))


async def _head(stream: asyncio.StreamReader, limit: int) -> bytes:
    """The first ``limit`` bytes of ``stream``; the rest is read and dropped (so the writer never blocks)."""
    kept = bytearray()
    while chunk := await stream.read(_READ_CHUNK):
        kept += chunk[: max(0, limit - len(kept))]
    return bytes(kept)


def rg_problem(stderr: str, root: Path) -> str:
    """ripgrep's complaint, one paragraph, without the ``rg:`` prefixes or the host's root path."""
    text = stderr.replace(f"{root}/", "").replace(str(root), ".")
    lines = [line.removeprefix("rg: ").rstrip() for line in text.splitlines()]
    return "\n".join(line for line in lines if line).strip()


def unreadable_note(stderr: str, root: Path, prefix: str) -> str:
    """A note on the paths ripgrep could not read (its ``… (os error N)`` lines), or ''."""
    failures = [  # (one outside the root, e.g. a parent's .gitignore, is not the model's business)
        line for line in rg_problem(stderr, root).splitlines() if "(os error " in line and not line.startswith("/")
    ]
    if not failures:
        return ""
    first = failures[0].removeprefix("./")
    first = f"{prefix}/{first}" if prefix and not first.startswith(f"{prefix}/") else first
    return f"\n[{len(failures)} paths could not be read, e.g. {first}]"


# ---------------------------------------------------------------- globs


class GlobMatcher:
    """``match(path)`` for a ``/``-separated path relative to where the glob applies.

    ``*`` and ``?`` stay within one segment, ``[...]`` (``[!...]``/``[^...]``
    negated) is a character class, ``{a,b}`` an alternation within a segment, and
    a ``**`` segment spans any number of directories (at the end: one or more
    segments, so ``src/**`` is everything below ``src``). Dot files are not special.
    """

    def __init__(self, pattern: str) -> None:
        if len(pattern) > MAX_GLOB_CHARS:
            raise _glob_error(pattern, f"it is longer than {MAX_GLOB_CHARS} characters")
        if "\0" in pattern:
            raise _glob_error(pattern, "it contains a NUL character")
        segments: list[re.Pattern[str] | None] = []  # None: a ``**`` segment
        for segment in pattern.split("/"):
            if segment == "**":
                if not segments or segments[-1] is not None:
                    segments.append(None)
            else:
                segments.append(_segment_matcher(pattern, segment))
        if segments[-1] is None:  # a trailing ``**`` is one segment or more
            segments[-1:] = [_ANY_SEGMENT, None]
        self.pattern = pattern
        # The fixed-length runs of segment matchers, split at the ``**``s.
        self._pieces: list[list[re.Pattern[str]]] = [[]]
        for matcher in segments:
            if matcher is None:
                self._pieces.append([])
            else:
                self._pieces[-1].append(matcher)

    def match(self, path: str) -> bool:
        names = path.split("/")
        pieces = self._pieces
        if len(pieces) == 1:
            return len(names) == len(pieces[0]) and _fits(pieces[0], names, 0)
        first, last = pieces[0], pieces[-1]
        end = len(names) - len(last)
        if end < len(first) or not _fits(first, names, 0) or not _fits(last, names, end):
            return False
        at = len(first)
        for piece in pieces[1:-1]:  # each at its leftmost place: never worse than a later one
            while at + len(piece) <= end and not _fits(piece, names, at):
                at += 1
            if at + len(piece) > end:
                return False
            at += len(piece)
        return True


def compile_glob(pattern: str) -> GlobMatcher:
    return GlobMatcher(pattern)


def _fits(piece: list[re.Pattern[str]], names: list[str], at: int) -> bool:
    return all(matcher.match(names[at + i]) for i, matcher in enumerate(piece))


_ANY_SEGMENT: Final = re.compile(r"(?s:.+)\Z")

# A segment's tokens: a literal character, ``?``, a class, ``*``, and the brace tokens.
_STAR: Final = ("*", "")
_ONE: Final = ("?", "")
_OPEN: Final = ("{", "")
_SEP: Final = (",", "")
_CLOSE: Final = ("}", "")
_Token = tuple[str, str]


def _segment_matcher(pattern: str, segment: str) -> re.Pattern[str]:
    alternatives = _expand(pattern, _tokens(segment))
    try:
        return re.compile("|".join(f"(?:{_alternative_regex(tokens)})" for tokens in alternatives), re.DOTALL)
    except re.error as exc:  # a class such as [z-a]
        raise _glob_error(pattern, str(exc)) from None


def _tokens(segment: str) -> list[_Token]:
    tokens: list[_Token] = []
    depth = 0
    i = 0
    while i < len(segment):
        char = segment[i]
        if char == "*":
            tokens.append(_STAR)
        elif char == "?":
            tokens.append(_ONE)
        elif char == "[" and (klass := _class(segment, i)) is not None:
            regex, i = klass
            tokens.append(("[", regex))
        elif char == "{" and "}" in segment[i + 1 :]:
            tokens.append(_OPEN)
            depth += 1
        elif char == "," and depth:
            tokens.append(_SEP)
        elif char == "}" and depth:
            tokens.append(_CLOSE)
            depth -= 1
        else:
            tokens.append(("c", re.escape(char)))
        i += 1
    return tokens


def _class(segment: str, i: int) -> tuple[str, int] | None:
    """The regex of the class opening at ``segment[i]`` and the index of its ``]``; None if unclosed."""
    start = i + 1
    negate = segment[start : start + 1] in ("!", "^")
    start += negate
    end = segment.find("]", start + 1)  # a ``]`` right after the opening is a member
    if end == -1 or start >= len(segment):
        return None
    body = segment[start:end]
    out = []
    for index, char in enumerate(body):
        ranged = char == "-" and 0 < index < len(body) - 1
        out.append("-" if ranged else re.escape(char))
    return ("[^" if negate else "[") + "".join(out) + "]", end


def _expand(pattern: str, tokens: list[_Token]) -> list[list[_Token]]:
    """Every brace-free token list the segment stands for (at most MAX_GLOB_ALTERNATIVES)."""

    def sequence(i: int, inside: bool) -> tuple[list[list[_Token]], int]:
        options: list[list[_Token]] = []
        current: list[list[_Token]] = [[]]
        while i < len(tokens):
            token = tokens[i]
            if token is _OPEN:
                group, i = sequence(i + 1, True)
                current = [left + right for left in current for right in group]
            elif inside and token is _SEP:
                options += current
                current = [[]]
                i += 1
            elif inside and token is _CLOSE:
                return options + current, i + 1
            else:
                current = [left + [token] for left in current]
                i += 1
            if len(options) + len(current) > MAX_GLOB_ALTERNATIVES:
                raise _glob_error(
                    pattern, f"its {{a,b}} groups stand for more than {MAX_GLOB_ALTERNATIVES} names"
                )
        return options + current, i

    return sequence(0, False)[0]


def _alternative_regex(tokens: list[_Token]) -> str:
    """``P0*P1*…*Pk`` as ``P0(?>.*?P1)…(?>.*?Pk-1).*Pk\\Z``: each Pi has a fixed length, so its
    leftmost place after the previous one is the best, and committing to it (atomic) is exact."""
    pieces: list[str] = [""]
    for kind, regex in tokens:
        if kind == "*":
            if pieces[-1] or len(pieces) == 1:
                pieces.append("")
        else:
            pieces[-1] += "." if kind == "?" else regex
    if len(pieces) == 1:
        return pieces[0] + r"\Z"
    middle = "".join(f"(?>.*?{piece})" for piece in pieces[1:-1] if piece)
    return f"{pieces[0]}{middle}.*{pieces[-1]}\\Z"


def _glob_error(pattern: str, why: str) -> ToolFailure:
    shown = pattern if len(pattern) <= 80 else pattern[:80] + "…"
    return ToolFailure(Code.INVALID_ARGUMENTS, f"glob {shown!r} cannot be used: {why}; simplify it")
