"""What a session's model requests include beyond the transcript: instruction files, skills, environment.

Gathered once per turn, off the event loop (``Instructions.for_turn``), and
composed into the system prompt by ``pidesk.runtime.prompts``; every request
of the turn carries the same prompt. ``session.context`` answers from the same
values: the running turn's, or for an idle session what its next turn will
gather.

Instruction files. From the session root up to the repository root (the
nearest directory holding ``.git``; without one, the session root alone), each
directory contributes its ``AGENTS.md``, else its ``CLAUDE.md``. The global file
``<config dir>/pidesk/AGENTS.md`` comes first, then the directories from the
repository root down to the session root. A temporary session (no project) gets
the global file and global skills only. A file is at most ``FILE_CAP`` bytes in
the prompt and all of them together ``TOTAL_CAP`` (the budget is spent from the
session root outward, so the nearest file is cut last); a cut file ends with a
note saying so, a file left out entirely is a warning.

Change detection. Each file is stat'ed once per turn; only when its
(mtime, size, inode, ctime) stamp differs from the cached one is it read and
hashed again. So an edit between turns is in the next turn's prompt, and no
request re-reads anything.

Refused: a file that is not a regular file (a FIFO would block the read), one
whose real path (symlinks followed) leaves its tree (a project file: the
repository or session root, so a cloned repository's ``AGENTS.md`` cannot
point the prompt at ``~/.aws/credentials``; the user's own global files may
point anywhere), lies in the host's data dir, or is named like a secret
(``.env``, keys: ``core.paths.is_secret``). Each refusal is a warning; a file
reached twice (the global file inside the repository) is included once.

Skills (the Agent Skills format): ``<dir>/SKILL.md`` under ``.pi/skills/``,
``.agents/skills/`` and ``.claude/skills/`` of the session root and of each folder
above it up to the repository root (as ``AGENTS.md`` is found: a session in a
subfolder sees the repository's skills), nearest first, then the global
``<config dir>/pidesk/skills/``; a name already taken is skipped with a
warning. Only the front matter is read (the first ``SKILL_HEAD`` bytes), by
``parse_front_matter`` — a deliberately small parser, not YAML:

- the file starts with a ``---`` line and the front matter ends at the next;
- each line is ``key: value``; blank lines and ``#`` comments are skipped;
- a value is plain (to the end of the line, a `` #`` comment removed), or in
  double quotes (JSON string escapes) or single quotes (``''`` is a quote);
- indented lines and ``- item`` lines belong to the key above them, which must
  have an empty value (a map or list such as ``metadata:``), and are ignored;
- ``name`` (lowercase letters, digits and single hyphens, at most 64
  characters) and ``description`` (at most 1024 characters, one line) are
  required; other keys are accepted and not used. A block scalar (``|``, ``>``)
  for either is refused.

A skill whose front matter breaks a rule is skipped with a warning; a turn
never fails over one.

Environment: the date (the host's clock, as a local date), the platform, the
shell Bash runs (bash), the root, and in a repository the branch and the count
of changed files from one ``git status`` per turn, run as a subprocess with a
short deadline (no answer in time, or no git: no Git line; no ``.git`` above the
root: no git run at all). It runs with
``core.fsmonitor`` off and ``--no-optional-locks``, so it starts no monitor and
takes no index lock under the agent's own git commands.
"""

from __future__ import annotations

import asyncio
import codecs
import hashlib
import json
import logging
import os
import platform
import re
import stat
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from pidesk.core import paths
from pidesk.core.records import Session
from pidesk.runtime.prompts import Environment, InstructionFile, ProjectContext, Skill
from pidesk.tools.base import ToolFailure
from pidesk.tools.children import spawn

FILE_CAP = 32 * 1024  # bytes of one instruction file in the prompt
TOTAL_CAP = 64 * 1024  # bytes of all of them together
MAX_HASHED = 64 * 1024 * 1024  # a bigger "instruction file" is refused rather than read and hashed
MAX_LEVELS = 64  # directories walked up from the root looking for the repository root
MAX_SKILLS = 64
SKILL_HEAD = 16 * 1024  # bytes of a SKILL.md read for its front matter
MAX_CACHED = 1024  # file and skill entries remembered between turns
GIT_TIMEOUT = 2.0  # seconds one turn's git status may take
NAMES = ("AGENTS.md", "CLAUDE.md")
SKILL_DIRS = (".pi/skills", ".agents/skills", ".claude/skills")
SHELL = "bash"  # what the Bash tool runs (pidesk.tools.bash)

log = logging.getLogger("pidesk.instructions")

_SKILL_NAME = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")
_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")

Stamp = tuple[int, int, int, int]
T = TypeVar("T")


@dataclass(frozen=True)
class Prepared:
    """What one turn's requests include beyond the transcript."""

    context: ProjectContext
    environment: Environment


@dataclass(frozen=True)
class _Read:
    """One instruction file as last read: its head (at most ``FILE_CAP`` bytes), size and digest."""

    head: bytes
    size: int
    sha256: str


class FrontMatterError(ValueError):
    pass


class Instructions:
    """The host's gatherer: caches what it read by file stamp, and knows each running turn's values."""

    def __init__(self, config_dir: Path | None, host_dir: Path | None = None,
                 env: Mapping[str, str] | None = None, today: Callable[[], str] | None = None,
                 sandbox: Callable[[Path], list[str]] | None = None) -> None:
        self.config_dir = config_dir  # <platform config dir>/pidesk; None: no global file or skills
        self.host_dir = Path(os.path.realpath(host_dir)) if host_dir is not None else None
        self.env = dict(env) if env is not None else None
        # what confines the turn's `git status` in a root (a read-only sandbox; None: nothing): the repository
        # may be one a command made, whose config would otherwise run its filters and helpers here
        self.sandbox = sandbox
        self.today = today or _local_date
        self.platform = platform.system() or "unknown"
        self.active: dict[str, Prepared] = {}  # session id -> its running turn's values
        self._lock = threading.Lock()
        self._files: dict[str, tuple[Stamp, _Read]] = {}
        self._skills: dict[str, tuple[Stamp, Skill | str]] = {}  # SKILL.md -> its skill, or why it is refused

    async def for_turn(self, session: Session) -> Prepared:
        """Gather once, off the loop, for a turn about to make its first request. Never fails the
        turn: should gathering break unexpectedly, the turn runs without the files, and says why."""
        try:
            context, environment = await asyncio.gather(self.gather(session), self.environment(session))
        except Exception as exc:
            log.exception("gathering the instruction files of %s failed", session.root)
            context = ProjectContext(warnings=(f"instruction files and skills not included: {exc}",))
            environment = Environment(date=self.today(), platform=self.platform, shell=SHELL, root=session.root)
        return Prepared(context, environment)

    async def gather(self, session: Session) -> ProjectContext:
        return await asyncio.to_thread(self.gather_now, Path(session.root), session.project_path is None)

    async def environment(self, session: Session) -> Environment:
        root = Path(session.root)
        in_repository = session.project_path is not None and await asyncio.to_thread(_repository, root) is not None
        branch, changed = (await git_state(root, self.env, sandbox=self.sandbox) if in_repository
                           else (None, None))  # no git spawned
        return Environment(date=self.today(), platform=self.platform, shell=SHELL, root=session.root,
                           git_branch=branch, git_changed=changed)

    async def next_request(self, session: Session, running: bool) -> ProjectContext:
        """``session.context``: the running turn's values, else what the next turn will gather."""
        prepared = self.active.get(session.id) if running else None
        return prepared.context if prepared is not None else await self.gather(session)

    # ---- files (runs in a worker thread) ------------------------------------------------------

    def gather_now(self, root: Path, temporary: bool) -> ProjectContext:
        warnings: list[str] = []
        found: list[tuple[str, Path, Path | None]] = []  # (shown path, file, the tree it must stay in)
        if self.config_dir is not None:
            found.append((str(self.config_dir / "AGENTS.md"), self.config_dir / "AGENTS.md", None))
        if not temporary:
            top, chain = _chain(root)
            for directory in reversed(chain):
                chosen = next((directory / n for n in NAMES if os.path.lexists(directory / n)), None)
                if chosen is not None:
                    found.append((os.path.relpath(chosen, root), chosen, top))
        reads: list[tuple[str, _Read]] = []
        seen: set[str] = set()
        for shown, path, tree in found:
            real = os.path.realpath(path)
            read = None if real in seen else self._read(shown, path, tree, warnings)
            if read is not None:
                seen.add(real)
                reads.append((shown, read))
        return ProjectContext(files=_fit(reads, warnings), skills=tuple(self._gather_skills(root, temporary, warnings)),
                              warnings=tuple(warnings))

    def _read(self, shown: str, path: Path, tree: Path | None, warnings: list[str]) -> _Read | None:
        try:
            info = os.stat(path)
        except FileNotFoundError:
            if os.path.islink(path):
                warnings.append(f"{shown} not included: it is a broken symbolic link")
            return None
        except OSError as exc:
            warnings.append(f"{shown} not included: {exc.strerror or exc}")
            return None
        why = self._refusal(path, tree, info)
        if why is not None:
            warnings.append(f"{shown} not included: {why}")
            return None
        key, stamp = str(path), _stamp(info)
        with self._lock:
            cached = self._files.get(key)
        if cached is not None and cached[0] == stamp:
            return cached[1]
        try:
            read = _read_file(path)
        except OSError as exc:
            warnings.append(f"{shown} not included: {exc.strerror or exc}")
            return None
        with self._lock:
            _remember(self._files, key, (stamp, read))
        return read

    def _refusal(self, path: Path, tree: Path | None, info: os.stat_result) -> str | None:
        if not stat.S_ISREG(info.st_mode):
            return "it is not a regular file"
        if info.st_size > MAX_HASHED:
            return f"it is {info.st_size:,} bytes (at most {MAX_HASHED:,} are read)"
        real = Path(os.path.realpath(path))
        if paths.is_secret(real.name):
            return "it leads to a secret file (.env, keys)"
        if tree is not None and not real.is_relative_to(os.path.realpath(tree)):
            return f"it leads outside {tree}"
        if self.host_dir is not None and real.is_relative_to(self.host_dir):
            return "it leads into pidesk's data directory"
        return None

    # ---- skills ---------------------------------------------------------------------------------

    def _gather_skills(self, root: Path, temporary: bool, warnings: list[str]) -> list[Skill]:
        places: list[tuple[Path, Path | None, bool]] = []  # (skills dir, the tree it must stay in, shown relative?)
        if not temporary:
            top, chain = _chain(root)
            places += [(directory / d, top, True) for directory in chain for d in SKILL_DIRS]
        if self.config_dir is not None:
            places.append((self.config_dir / "skills", None, False))
        skills: list[Skill] = []
        taken: dict[str, str] = {}
        for directory, tree, relative in places:
            try:
                entries = sorted(e.name for e in os.scandir(directory) if e.is_dir())
            except OSError:
                continue  # no such directory (the usual case), or unreadable: nothing to offer
            for entry in entries:
                path = directory / entry / "SKILL.md"
                shown = os.path.relpath(path, root) if relative else str(path)
                skill = self._skill(shown, path, tree, warnings)
                if skill is None:
                    continue
                if skill.name in taken:
                    warnings.append(f"skill {shown} skipped: the name {skill.name!r} is taken by {taken[skill.name]}")
                elif len(skills) >= MAX_SKILLS:
                    warnings.append(f"skill {shown} skipped: at most {MAX_SKILLS} skills are offered")
                else:
                    taken[skill.name] = shown
                    skills.append(skill)
        return skills

    def _skill(self, shown: str, path: Path, tree: Path | None, warnings: list[str]) -> Skill | None:
        try:
            info = os.stat(path)
        except OSError:
            return None  # a directory without SKILL.md is not a skill
        why = self._refusal(path, tree, info)
        if why is not None:
            warnings.append(f"skill {shown} skipped: {why}")
            return None
        key, stamp = str(path), _stamp(info)
        with self._lock:
            cached = self._skills.get(key)
        if cached is not None and cached[0] == stamp:
            found = cached[1]
        else:
            try:
                with open(path, "rb") as f:
                    head = f.read(SKILL_HEAD)
                fields = parse_front_matter(head.decode("utf-8"))
                found = Skill(name=_skill_name(fields), description=_description(fields), path=shown)
            except UnicodeDecodeError:
                found = "SKILL.md is not UTF-8 text"
            except FrontMatterError as exc:
                found = str(exc)
            except OSError as exc:
                found = f"cannot read SKILL.md: {exc.strerror or exc}"
            with self._lock:
                _remember(self._skills, key, (stamp, found))
        if isinstance(found, str):
            warnings.append(f"skill {shown} skipped: {found}")
            return None
        return found


# ---- pure helpers -------------------------------------------------------------------------------

def parse_front_matter(text: str) -> dict[str, str]:
    """The ``key: value`` lines between the leading ``---`` lines (see the module docstring)."""
    lines = text.splitlines()
    if not lines or lines[0].rstrip() != "---":
        raise FrontMatterError("SKILL.md must start with a '---' line (YAML front matter with name and description)")
    fields: dict[str, str] = {}
    nested_under: str | None = None  # the key whose indented block (a map or list) is being skipped
    for number, line in enumerate(lines[1:], start=2):
        if line.rstrip() == "---":
            return fields
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if line[0] in " \t" or stripped.startswith("- "):
            if nested_under is None:
                raise FrontMatterError(f"front matter line {number}: an indented line must follow a 'key:' "
                                       "with no value")
            continue
        key, colon, raw = line.partition(":")
        if not colon or not _KEY.fullmatch(key):
            raise FrontMatterError(f"front matter line {number}: expected 'key: value'")
        if key in fields:
            raise FrontMatterError(f"front matter line {number}: {key!r} appears twice")
        raw = raw.strip()
        nested_under = key if not raw else None
        fields[key] = _scalar(raw, number) if key in ("name", "description") else raw
    raise FrontMatterError("the front matter has no closing '---' line (within the first "
                           f"{SKILL_HEAD // 1024} KiB)")


def _scalar(raw: str, number: int) -> str:
    if raw.startswith('"'):
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            raise FrontMatterError(f"front matter line {number}: a double-quoted value must close on its "
                                   "line (JSON escapes)") from None
        if not isinstance(value, str):
            raise FrontMatterError(f"front matter line {number}: expected one quoted string")
        return value
    if raw.startswith("'"):
        if len(raw) < 2 or not raw.endswith("'") or "'" in raw[1:-1].replace("''", ""):
            raise FrontMatterError(f"front matter line {number}: a single-quoted value must close on its line")
        return raw[1:-1].replace("''", "'")
    if raw[:1] in ("|", ">"):
        raise FrontMatterError(f"front matter line {number}: block values (| or >) are not supported here; "
                               "write the value on one line")
    if raw[:1] in ("[", "{", "&", "*", "!", "%", "@", "`") or ": " in raw:
        raise FrontMatterError(f"front matter line {number}: quote this value")
    return raw.split(" #", 1)[0].rstrip()


def _skill_name(fields: dict[str, str]) -> str:
    name = fields.get("name", "")
    if not name:
        raise FrontMatterError("the front matter has no name")
    if len(name) > 64 or not _SKILL_NAME.fullmatch(name):
        raise FrontMatterError(f"name {name[:80]!r} must be lowercase letters, digits and single hyphens "
                               "(at most 64 characters)")
    return name


def _description(fields: dict[str, str]) -> str:
    description = " ".join(fields.get("description", "").split())
    if not description:
        raise FrontMatterError("the front matter has no description")
    if len(description) > 1024:
        raise FrontMatterError(f"the description has {len(description)} characters (at most 1024)")
    return description


def _repository(root: Path) -> Path | None:
    top, _ = _chain(root)
    return top if os.path.lexists(top / ".git") else None


def _chain(root: Path) -> tuple[Path, list[Path]]:
    """The repository root (else the session root) and the directories from the root up to it."""
    chain, directory = [root], root
    for _ in range(MAX_LEVELS):
        if os.path.lexists(directory / ".git"):
            return directory, chain
        if directory.parent == directory:
            break
        directory = directory.parent
        chain.append(directory)
    return root, [root]


def _fit(reads: list[tuple[str, _Read]], warnings: list[str]) -> tuple[InstructionFile, ...]:
    """Each file within ``FILE_CAP``, all within ``TOTAL_CAP``, spent from the nearest file outward."""
    budget = TOTAL_CAP
    kept: list[InstructionFile] = []
    for shown, read in reversed(reads):
        allowed = min(FILE_CAP, budget)
        if allowed <= 0:
            warnings.append(f"{shown} not included: the instruction files already hold {TOTAL_CAP // 1024} KiB")
            continue
        head = read.head[:allowed]
        # an incremental decoder leaves out a character the cut split in two
        text = codecs.getincrementaldecoder("utf-8")(errors="replace").decode(head, final=read.size <= len(head))
        if read.size > len(head):
            text = text.rstrip() + (f"\n\n[pidesk: {shown} is {read.size:,} bytes; only its first "
                                    f"{len(head):,} are included here]")
        budget -= len(head)
        kept.append(InstructionFile(path=shown, text=text, size=read.size, sha256=read.sha256))
    return tuple(reversed(kept))


def _read_file(path: Path) -> _Read:
    digest = hashlib.sha256()
    head = b""
    size = 0
    with open(path, "rb") as f:
        while size <= MAX_HASHED:
            chunk = f.read(1 << 16)
            if not chunk:
                break
            if len(head) < FILE_CAP:
                head += chunk[:FILE_CAP - len(head)]
            digest.update(chunk)
            size += len(chunk)
    return _Read(head=head, size=size, sha256=digest.hexdigest())


def _stamp(info: os.stat_result) -> Stamp:
    return info.st_mtime_ns, info.st_size, info.st_ino, info.st_ctime_ns


def _remember(cache: dict[str, T], key: str, value: T) -> None:
    cache.pop(key, None)
    if len(cache) >= MAX_CACHED:
        del cache[next(iter(cache))]  # the oldest entry
    cache[key] = value


def _local_date() -> str:
    from datetime import datetime

    return datetime.now().astimezone().date().isoformat()


def listing(context: ProjectContext) -> dict[str, object]:
    """``session.context``'s answer."""
    return {
        "files": [{"path": f.path, "size": f.size, "sha256": f.sha256} for f in context.files],
        "skills": [{"name": s.name, "description": s.description, "path": s.path} for s in context.skills],
        "warnings": list(context.warnings),
    }


# ---- git --------------------------------------------------------------------------------------------

async def git_state(root: Path, env: Mapping[str, str] | None, timeout: float = GIT_TIMEOUT,
                    sandbox: Callable[[Path], list[str]] | None = None) -> tuple[str | None, int | None]:
    """(branch, changed files) of the repository holding ``root``; (None, None) when it is none, git is
    missing or cannot be confined by ``sandbox`` (the argv prefix for ``root``), or does not answer within
    ``timeout``."""
    try:
        prefix = sandbox(root) if sandbox is not None else []
        proc = await spawn(
            [*prefix, "git", "-C", str(root), "-c", "core.fsmonitor=false", "--no-optional-locks",
             "status", "--porcelain=v2", "--branch", "-z"],
            env=None if env is None else {**env, "GIT_TERMINAL_PROMPT": "0"}, stderr=False,
        )
    except (OSError, ToolFailure):
        return None, None
    assert proc.stdout is not None
    try:
        async with asyncio.timeout(timeout):
            out = await proc.stdout.read()
            await proc.wait()
    except TimeoutError:
        await proc.stop()
        return None, None
    except asyncio.CancelledError:  # the turn was aborted: git must not outlive it
        await proc.stop()
        raise
    if proc.returncode != 0:
        return None, None
    return parse_status(out.decode("utf-8", errors="replace"))


def parse_status(out: str) -> tuple[str | None, int | None]:
    """``git status --porcelain=v2 --branch -z``: the branch and the number of changed paths."""
    branch: str | None = None
    changed = 0
    tokens = iter(out.split("\0"))
    for token in tokens:
        if token.startswith("# branch.head "):
            head = token.removeprefix("# branch.head ")
            branch = "(detached HEAD)" if head == "(detached)" else head
        elif token.startswith("2 "):  # a rename or copy: its original path is the next token
            next(tokens, None)
            changed += 1
        elif token and not token.startswith("#"):
            changed += 1
    return branch, changed if branch is not None else None
