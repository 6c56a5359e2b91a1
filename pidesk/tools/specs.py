"""Parameter specs (JSON Schema) for every model-visible tool in PROTOCOL.md.

Names and camelCase argument names are the protocol's; providers translate
``{"name", "description", "parameters"}`` into their own tool formats. The
set of names equals ``core.policy.BUILTIN_TOOLS`` (a test keeps them equal).
"""

from __future__ import annotations

from functools import cache
from typing import Any, Final


def _string(description: str) -> dict[str, Any]:
    return {"type": "string", "description": description}


def _spec(name: str, description: str, properties: dict[str, Any], *required: str) -> dict[str, Any]:
    return {
        "name": name,
        "description": description,
        "parameters": {
            "type": "object",
            "properties": properties,
            "required": list(required),
            "additionalProperties": False,
        },
    }


_PATH: Final = "File path, relative to the workspace root (an absolute path must lie inside it)."

_REASON: Final = {"reason": _string("Why this mode fits the task, shown to the user.")}

_CONTRACT: Final = {
    "title": _string("Short title of the proposal."),
    "markdown": _string("The full proposal in Markdown."),
    "question": _string("The question the user answers by approving or rejecting."),
}

@cache  # (one value per host: a provider's request body is built from the same dict every time)
def bash_spec(*, sandboxed: bool = True, network: bool = False, read_only: bool = False,
              may_escalate: bool = True) -> dict[str, Any]:
    """Bash as the host runs it: in its sandbox or not; with the network or not; the root read-only
    (strict planning) or not; and with ``escalate`` (and what calls for it) where it may be asked for."""
    properties: dict[str, Any] = {
        "command": _string("The bash command line."),
        "timeoutMs": {
            "type": "integer",
            "minimum": 1,
            "maximum": 600_000,
            "description": "Kill the command after this many milliseconds (default 120000).",
        },
    }
    description = ("Run a bash command in the workspace root and return its combined output and exit code; "
                   "background processes it leaves are stopped when it ends.")
    if sandboxed:
        where = ("only in /tmp (private to the command): the workspace is read-only while planning" if read_only
                 else "only inside the workspace root (not .pi/, .git/hooks or .git/config) and /tmp (private to "
                      "the command)")
        description += f" Commands run in a sandbox: they can write {where}, and " + (
            "reach the network." if network else "have no network.")
    if sandboxed and may_escalate:
        needs = "a write outside the root" if network else "a package download, a write outside the root"
        description += (f" Work within it. Only when the task cannot be done otherwise ({needs}), set `escalate` "
                        "with a `justification`: the user is asked to run that one command outside the sandbox, "
                        "and may refuse.")
        properties["escalate"] = {
            "type": "boolean",
            "description": "Ask the user to run this command outside the sandbox.",
        }
        properties["justification"] = _string(
            "With `escalate`: why this command needs to leave the sandbox, one sentence the user reads before deciding.")
    return _spec("Bash", description, properties, "command")


TOOL_SPECS: Final[dict[str, dict[str, Any]]] = {
    spec["name"]: spec
    for spec in (
        _spec(
            "Read",
            "Read a text file from the workspace as numbered lines, a window at a time.",
            {
                "path": _string(_PATH),
                "offset": {"type": "integer", "minimum": 1, "description": "First line to show (1-based)."},
                "limit": {"type": "integer", "minimum": 1, "description": "Number of lines (default 2000)."},
            },
            "path",
        ),
        _spec(
            "Glob",
            "List workspace files matching a glob pattern such as `src/**/*.py`, sorted, skipping .git and "
            "files .gitignore excludes.",
            {
                "pattern": _string("Glob relative to `path`; `**` spans directories, `*` stays in one."),
                "path": _string("Directory to search in (default: the workspace root)."),
            },
            "pattern",
        ),
        _spec(
            "Grep",
            "Search file contents with a regular expression (ripgrep); prints `path:line:text` per match, "
            "skipping files .gitignore excludes.",
            {
                "pattern": _string(
                    "Regular expression searched in each line, in ripgrep's (Rust) syntax: "
                    "no look-around or backreferences."
                ),
                "path": _string("File or directory to search (default: the workspace root)."),
                "glob": _string("Only files whose name (or path, if it has a `/`) matches, e.g. `*.{ts,tsx}`."),
                "ignoreCase": {"type": "boolean", "description": "Match case-insensitively."},
            },
            "pattern",
        ),
        _spec(
            "Write",
            "Create or overwrite a workspace file with the given content, creating parent directories.",
            {"path": _string(_PATH), "content": _string("The complete new file content.")},
            "path",
            "content",
        ),
        _spec(
            "Edit",
            "Replace an exact, unique piece of text in a workspace file (every occurrence with replaceAll).",
            {
                "path": _string(_PATH),
                "oldText": _string("Exact text to replace, whitespace included; must occur exactly once."),
                "newText": _string("Replacement text."),
                "replaceAll": {"type": "boolean", "description": "Replace every occurrence of oldText."},
            },
            "path",
            "oldText",
            "newText",
        ),
        bash_spec(),
        _spec(
            "BrowserPreview",
            "Open a read-only preview of a loopback URL or a file in the workspace.",
            {"url": _string("An http://localhost or http://127.0.0.1 URL, or a file:// URL inside the workspace.")},
            "url",
        ),
        _spec(
            "EnterPlanMode",
            "Switch to Plan mode to investigate read-only and then submit a plan for approval.",
            _REASON,
        ),
        _spec(
            "EnterGoalMode",
            "Switch to Goal mode to investigate read-only and then submit a goal with checkable criteria.",
            _REASON,
        ),
        _spec(
            "SubmitPlan",
            "Submit the plan for the user's approval; waits until they approve or reject it.",
            _CONTRACT,
            "title",
            "markdown",
            "question",
        ),
        _spec(
            "SubmitGoal",
            "Submit the goal and its acceptance criteria for approval; waits until the user decides.",
            {
                **_CONTRACT,
                "criteria": {
                    "type": "array",
                    "items": {"type": "string"},
                    "minItems": 1,
                    "description": "Acceptance criteria, each checkable on its own.",
                },
            },
            "title",
            "markdown",
            "question",
            "criteria",
        ),
        _spec(
            "ReportCriteria",
            "Report, with evidence, whether each goal criterion is met, unmet or blocked.",
            {
                "results": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "criterion": _string("The criterion, as submitted."),
                            "outcome": {"type": "string", "enum": ["met", "unmet", "blocked"]},
                            "evidence": _string("What shows the outcome (commands run, files, output)."),
                        },
                        "required": ["criterion", "outcome", "evidence"],
                        "additionalProperties": False,
                    },
                    "description": "One entry per criterion.",
                }
            },
            "results",
        ),
        _spec(
            "NewContext",
            "Continue in a fresh context that starts from the given summary of the work so far.",
            {"summary": _string("Everything the fresh context needs to carry on.")},
            "summary",
        ),
        _spec(
            "Task",
            "Start a delegate agent on a self-contained task; returns its task id.",
            {
                "description": _string("A few words naming the task."),
                "prompt": _string("Complete instructions for the delegate."),
            },
            "description",
            "prompt",
        ),
        _spec(
            "TaskWait",
            "Wait for delegate tasks to finish and return their results.",
            {
                "taskIds": {
                    "type": "array",
                    "items": {"type": "string"},
                    "minItems": 1,
                    "description": "Ids returned by Task.",
                }
            },
            "taskIds",
        ),
    )
}
