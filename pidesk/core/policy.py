"""The permission policy: one pure function over durable state.

``decide(mode, permission_mode, tool, …)`` returns ``Allow | Ask | Deny(code)``
for every cell of DESIGN.md's table. Contract modes (Plan, Goal) are checked
first and their hard denies cannot be lifted by a permission mode or a grant;
session grants are consulted in Agent mode only. Path checks (secrets, host-owned
paths) live in ``core.paths`` and run before any Ask, in every mode.

    tool                          agent                          plan / goal
    Read Glob Grep BrowserPreview allow                          allow
    NewContext Task TaskWait      allow                          allow
    Write Edit                    ask; allow: accept-edits/auto  WRITE_/EDIT_DISABLED_IN_PLAN
                                  or a session grant
    Bash                          ask; allow: auto or a grant    ask; allow: auto (no grants)
    Bash, escalated               ask, even under auto;          BASH_ESCALATION_DENIED_IN_PLAN
                                  allow: its own session grant
    plugin (risk low)             allow                          PLUGIN_DISABLED_IN_PLAN
    plugin (risk medium)          as Write                       PLUGIN_DISABLED_IN_PLAN
    plugin (risk high)            as Bash                        PLUGIN_DISABLED_IN_PLAN
    EnterPlanMode EnterGoalMode   allow (temporary session:      PLAN_ALREADY_ACTIVE
                                  PLAN_WORKSPACE_REQUIRED)
    SubmitPlan SubmitGoal         PLAN_NOT_ACTIVE                own kind allow; other PLAN_KIND_MISMATCH
    ReportCriteria                allow                          TOOL_DISABLED_IN_PLAN
    unknown name                  TOOL_NOT_FOUND                 TOOL_NOT_FOUND

An unattended turn (``pidesk run``, a schedule) has nobody to approve a contract:
there EnterPlanMode, EnterGoalMode, SubmitPlan and SubmitGoal are
``PLAN_REQUIRES_INTERACTIVE_SESSION`` (after the unknown-name and delegate checks),
so the mode never changes and nothing waits for a person.

Every Bash command runs in the host's kernel sandbox (``tools/sandbox.py``). One the
model marks ``escalate: true`` asks to run outside it — a different power from Bash's,
so it is its own cell: a person says yes to each (or grants it for the session, a grant
apart from Bash's own), whatever the permission mode, and never in a contract mode.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from pidesk.core.errors import Code
from pidesk.core.modes import Mode, PermissionMode


class ToolKind(StrEnum):
    READ = "read"
    WRITE = "write"
    EDIT = "edit"
    BASH = "bash"
    PLUGIN = "plugin"
    CONTEXT = "context"
    ENTER_PLAN = "enter_plan"
    ENTER_GOAL = "enter_goal"
    SUBMIT_PLAN = "submit_plan"
    SUBMIT_GOAL = "submit_goal"
    REPORT_CRITERIA = "report_criteria"
    UNKNOWN = "unknown"


class PluginRisk(StrEnum):
    LOW = "low"
    MEDIUM = "medium"
    HIGH = "high"


BUILTIN_TOOLS: Final[dict[str, ToolKind]] = {
    "Read": ToolKind.READ,
    "Glob": ToolKind.READ,
    "Grep": ToolKind.READ,
    "BrowserPreview": ToolKind.READ,
    "Write": ToolKind.WRITE,
    "Edit": ToolKind.EDIT,
    "Bash": ToolKind.BASH,
    "NewContext": ToolKind.CONTEXT,
    "Task": ToolKind.CONTEXT,
    "TaskWait": ToolKind.CONTEXT,
    "EnterPlanMode": ToolKind.ENTER_PLAN,
    "EnterGoalMode": ToolKind.ENTER_GOAL,
    "SubmitPlan": ToolKind.SUBMIT_PLAN,
    "SubmitGoal": ToolKind.SUBMIT_GOAL,
    "ReportCriteria": ToolKind.REPORT_CRITERIA,
}

# What a delegate may never call: it cannot change the mode, submit, report, or nest tasks.
DELEGATE_FORBIDDEN: Final[frozenset[str]] = frozenset(
    {"EnterPlanMode", "EnterGoalMode", "SubmitPlan", "SubmitGoal", "ReportCriteria", "Task", "TaskWait"}
)

# Tools that must be the only call in their assistant batch (seed 003 §3 rule 12); they are
# also the contract tools an unattended turn may not use (nobody would approve the contract).
EXCLUSIVE_TOOLS: Final[frozenset[str]] = frozenset(
    {"EnterPlanMode", "EnterGoalMode", "SubmitPlan", "SubmitGoal"}
)


@dataclass(frozen=True, slots=True)
class Allow:
    pass


@dataclass(frozen=True, slots=True)
class Ask:
    pass


@dataclass(frozen=True, slots=True)
class Deny:
    code: Code


Decision = Allow | Ask | Deny

ALLOW: Final = Allow()
ASK: Final = Ask()
_DENY: Final[dict[Code, Deny]] = {code: Deny(code) for code in Code}  # decisions are shared values


def is_escalation(tool: str, args: object) -> bool:
    """A Bash call that asks to run outside the sandbox (``escalate: true``, nothing else counts)."""
    return tool == "Bash" and isinstance(args, dict) and args.get("escalate") is True


def grant_key(tool: str, escalated: bool = False) -> str:
    """What a session's "always allow" is recorded under: the tool, or its escalation (a grant of
    plain Bash never lets a command out of the sandbox)."""
    return f"{tool} (escalated)" if escalated else tool


def classify(tool: str, plugin_risk: PluginRisk | None = None) -> ToolKind:
    """A registered plugin tool is PLUGIN; a built-in name its kind; anything else UNKNOWN."""
    if plugin_risk is not None:
        return ToolKind.PLUGIN
    return BUILTIN_TOOLS.get(tool, ToolKind.UNKNOWN)


def decide(
    mode: Mode,
    permission_mode: PermissionMode,
    tool: str,
    *,
    plugin_risk: PluginRisk | None = None,
    granted: bool = False,
    temporary: bool = False,
    delegate: bool = False,
    unattended: bool = False,
    escalated: bool = False,
) -> Decision:
    """Decide one tool call from the session's durable mode and permission state.

    ``granted`` is whether the session holds an "always allow" grant for this
    tool (for an escalation: for the escalation); ``escalated`` whether a Bash call
    asks to run outside the sandbox (``is_escalation``); ``temporary`` whether the session has no project (scratch root);
    ``delegate`` whether a Task's child agent makes the call — it works under its
    parent's mode and may never change the mode, submit a contract or start tasks;
    ``unattended`` whether nobody can answer the turn (no contract can be approved).
    """
    kind = classify(tool, plugin_risk)
    if kind is ToolKind.UNKNOWN:
        return _DENY[Code.TOOL_NOT_FOUND]
    if delegate and tool in DELEGATE_FORBIDDEN:
        return _DENY[Code.TOOL_DISABLED_IN_PLAN if mode.is_contract else Code.TOOL_NOT_FOUND]
    if unattended and tool in EXCLUSIVE_TOOLS:
        return _DENY[Code.PLAN_REQUIRES_INTERACTIVE_SESSION]
    if escalated and kind is ToolKind.BASH:
        if mode.is_contract:
            return _DENY[Code.BASH_ESCALATION_DENIED_IN_PLAN]
        return ALLOW if granted else ASK  # (every permission mode: auto never lets a command out)
    if mode.is_contract:
        return _decide_contract(mode, permission_mode, kind)
    return _decide_agent(permission_mode, kind, plugin_risk, granted, temporary)


def _decide_contract(mode: Mode, permission_mode: PermissionMode, kind: ToolKind) -> Decision:
    match kind:
        case ToolKind.READ | ToolKind.CONTEXT:
            return ALLOW
        case ToolKind.BASH:
            return ALLOW if permission_mode is PermissionMode.AUTO else ASK
        case ToolKind.WRITE:
            return _DENY[Code.WRITE_DISABLED_IN_PLAN]
        case ToolKind.EDIT:
            return _DENY[Code.EDIT_DISABLED_IN_PLAN]
        case ToolKind.PLUGIN:
            return _DENY[Code.PLUGIN_DISABLED_IN_PLAN]
        case ToolKind.ENTER_PLAN | ToolKind.ENTER_GOAL:
            return _DENY[Code.PLAN_ALREADY_ACTIVE]
        case ToolKind.SUBMIT_PLAN:
            return ALLOW if mode is Mode.PLAN else _DENY[Code.PLAN_KIND_MISMATCH]
        case ToolKind.SUBMIT_GOAL:
            return ALLOW if mode is Mode.GOAL else _DENY[Code.PLAN_KIND_MISMATCH]
        case _:
            return _DENY[Code.TOOL_DISABLED_IN_PLAN]


def _decide_agent(
    permission_mode: PermissionMode,
    kind: ToolKind,
    plugin_risk: PluginRisk | None,
    granted: bool,
    temporary: bool,
) -> Decision:
    if kind is ToolKind.PLUGIN:
        kind = {
            PluginRisk.LOW: ToolKind.READ,
            PluginRisk.MEDIUM: ToolKind.WRITE,
            PluginRisk.HIGH: ToolKind.BASH,
        }[plugin_risk or PluginRisk.HIGH]
    match kind:
        case ToolKind.READ | ToolKind.CONTEXT | ToolKind.REPORT_CRITERIA:
            return ALLOW
        case ToolKind.WRITE | ToolKind.EDIT:
            edits_allowed = permission_mode is not PermissionMode.ASK
            return ALLOW if edits_allowed or granted else ASK
        case ToolKind.BASH:
            return ALLOW if permission_mode is PermissionMode.AUTO or granted else ASK
        case ToolKind.ENTER_PLAN | ToolKind.ENTER_GOAL:
            return _DENY[Code.PLAN_WORKSPACE_REQUIRED] if temporary else ALLOW
        case _:  # SubmitPlan / SubmitGoal outside a contract mode
            return _DENY[Code.PLAN_NOT_ACTIVE]


def batch_is_exclusive_violation(tool_names: list[str]) -> bool:
    """True when a batch holds an Enter*/Submit* call beside any other call."""
    return len(tool_names) > 1 and any(name in EXCLUSIVE_TOOLS for name in tool_names)


# Tools this version implements; the rest of BUILTIN_TOOLS arrive with the runtime issue.
IMPLEMENTED_TOOLS: Final[tuple[str, ...]] = (
    "Read", "Glob", "Grep", "Write", "Edit", "Bash", "BrowserPreview",
    "EnterPlanMode", "EnterGoalMode", "SubmitPlan", "SubmitGoal", "ReportCriteria", "NewContext",
    "Task", "TaskWait",
)


def visible_tools(
    mode: Mode, *, temporary: bool = False, goal_execution: bool = False, delegate: bool = False,
    unattended: bool = False,
) -> list[str]:
    """The tools shown to the model: those the policy does not hard-deny in this mode.

    Hiding is a courtesy to the model; ``decide`` still judges every call.
    """
    shown = []
    for name in IMPLEMENTED_TOOLS:
        if name == "ReportCriteria" and not goal_execution:
            continue
        verdict = decide(mode, PermissionMode.AUTO, name, temporary=temporary, delegate=delegate,
                         unattended=unattended)
        if not isinstance(verdict, Deny):
            shown.append(name)
    return shown
