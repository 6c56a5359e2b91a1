"""The system prompt: what the model is told about its mode and its contract."""

from __future__ import annotations

from pidesk.core.modes import Mode

_BASE = (
    "You are a coding agent working in the directory {root}. Use the tools to read, search, "
    "edit and run things there; paths are relative to that directory."
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


def system_prompt(mode: Mode, root: str) -> str:
    return f"{_BASE.format(root=root)}\n{_MODES[mode]}"
