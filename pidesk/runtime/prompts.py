"""The system prompt: the one place that decides what the model is told.

Pure: it composes values that the host gathered (``pidesk.host.instructions``
does the file and git I/O, once per turn) and reads nothing itself. The parts,
in this order — the stable ones first, so a prompt that changes between turns
changes at its end (a prompt cache keeps the longest unchanged prefix):

1. the contract: the root, and short tool guidance;
2. project instructions: each AGENTS.md / CLAUDE.md under its path, the global
   file first, then from the repository root down to the session root (the
   nearer a file, the later, and the more it counts); a capped file ends with a
   visible truncation note;
3. skills: name, description and path only — the model Reads a SKILL.md when
   it needs it;
4. the mode text;
5. the environment: date, platform, shell, root, and the git branch and count
   of changed files when the root is in a repository.

Paths are shown relative to the session root where they lie inside it or above
it (``AGENTS.md``, ``../AGENTS.md``), a global one by its absolute path. The
same function composes every request of a turn, so a turn's requests carry the
same prompt. ``tests/runtime/test_prompts.py`` pins the text for a fixture
project (``tests/runtime/golden/``); docs/architecture.md gives its size.
"""

from __future__ import annotations

from dataclasses import dataclass

from pidesk.core.modes import Mode

_BASE = (
    "You are a coding agent working in the directory {root}. Use the tools to read, search, "
    "edit and run things there; paths are relative to that directory."
)

_TOOLS = (
    "Search with Grep and Glob and read files with Read rather than with Bash. Edit replaces "
    "exact text that must be unique in the file: Read it first and copy the text exactly."
)

_MODES = {
    Mode.AGENT: "You are in Agent mode: carry out the user's request.",
    Mode.PLAN: (
        "You are in Plan mode. Investigate with Read, Glob, Grep and Bash (Write and Edit are "
        "disabled), then call SubmitPlan once, alone in its batch, with a title, the plan as "
        "Markdown (ordered steps) and the question the user answers by approving. Nothing is "
        "changed until the user approves."
    ),
    Mode.GOAL: (
        "You are in Goal mode. Investigate with Read, Glob, Grep and Bash (Write and Edit are "
        "disabled), then call SubmitGoal once, alone in its batch, with a title, Markdown holding "
        "the goal statement, acceptance criteria and boundaries, the question for the user, and "
        "the criteria as a list. Nothing is changed until the user approves."
    ),
}

_INSTRUCTIONS = (
    "# Project instructions\n"
    "Instructions from the user and the project follow, each under its path; a later file lies "
    "nearer the working directory and wins where they disagree."
)

_SKILLS = (
    "# Skills\n"
    "When a task matches a skill's description, Read its SKILL.md first and follow it "
    "(a skill outside the root: print it with Bash)."
)


@dataclass(frozen=True)
class InstructionFile:
    """One instruction file as it goes into the prompt."""

    path: str  # as shown: relative to the session root (``../AGENTS.md``), or absolute (the global file)
    text: str  # what the prompt includes: the file's text, cut at the cap with a note saying so
    size: int  # bytes on disk
    sha256: str  # of the bytes on disk


@dataclass(frozen=True)
class Skill:
    name: str
    description: str
    path: str  # of its SKILL.md, shown like an instruction file's path


@dataclass(frozen=True)
class ProjectContext:
    """The instruction files and skills one turn's requests include, in the order included,
    and why anything found was left out."""

    files: tuple[InstructionFile, ...] = ()
    skills: tuple[Skill, ...] = ()
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class Environment:
    date: str  # ISO date, from the host's clock
    platform: str
    shell: str
    root: str
    git_branch: str | None = None  # None: not a repository (or git could not tell)
    git_changed: int | None = None


def system_prompt(mode: Mode, root: str, context: ProjectContext | None = None,
                  environment: Environment | None = None) -> str:
    parts = [f"{_BASE.format(root=root)}\n{_TOOLS}"]
    if context is not None and context.files:
        parts.append("\n\n".join([_INSTRUCTIONS, *(f"## {f.path}\n{f.text.rstrip()}" for f in context.files)]))
    if context is not None and context.skills:
        listing = "\n".join(f"- {s.name}: {s.description} ({s.path})" for s in context.skills)
        parts.append(f"{_SKILLS}\n{listing}")
    parts.append(_MODES[mode])
    if environment is not None:
        parts.append(_environment(environment))
    return "\n\n".join(parts)


def _environment(env: Environment) -> str:
    lines = ["# Environment", f"Date: {env.date}", f"Platform: {env.platform}", f"Shell: {env.shell}",
             f"Root: {env.root}"]
    if env.git_branch is not None:
        changed = "" if env.git_changed is None else \
            f", {env.git_changed} changed file{'' if env.git_changed == 1 else 's'}"
        lines.append(f"Git: branch {env.git_branch}{changed}")
    return "\n".join(lines)
