"""The permission policy against an oracle written from the documents.

``expected()`` below is derived from DESIGN.md ("Contract modes" table, the
``grants`` bullet), PROTOCOL.md ("Semantics the tables do not show": the
Enter*Mode, Contract-mode tool list and unknown-tool bullets) and seed 003
(§0 Bash policy, §3 rule 12, §5 acceptance 10). It deliberately does not call
or mirror ``policy.py``: it is a flat lookup per tool name, not a kind
classification, so a mis-classified tool shows up as a failing cell.

One cell family the documents leave open: DESIGN.md says Agent-mode plugin
tools go "by manifest risk and permission mode" without saying how. The
oracle reads it as: low risk is read-like (allow), medium risk is edit-like
(ask; allow under accept-edits/auto or a grant), high risk is shell-like (ask;
allow under auto or a grant). That reading should be written into DESIGN.md.

Contract mode × temporary session cannot occur (PLAN_WORKSPACE_REQUIRED keeps
temporary sessions out of Plan/Goal); for those cells the oracle applies the
contract-mode list unchanged: Enter*Mode is PLAN_ALREADY_ACTIVE.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pidesk.core.errors import Code
from pidesk.core.modes import Mode, PermissionMode
from pidesk.core.policy import (
    BUILTIN_TOOLS,
    Allow,
    Ask,
    Decision,
    Deny,
    PluginRisk,
    batch_is_exclusive_violation,
    decide,
    grant_key,
    is_escalation,
    visible_tools,
)

AGENT, PLAN, GOAL = Mode.AGENT, Mode.PLAN, Mode.GOAL
ASK_PM, ACCEPT_EDITS, AUTO = PermissionMode.ASK, PermissionMode.ACCEPT_EDITS, PermissionMode.AUTO
CONTRACT_MODES = (PLAN, GOAL)

# Every tool the documents name (DESIGN.md architecture; PROTOCOL.md "Agent tools").
DOCUMENTED_TOOLS = (
    "Read", "Glob", "Grep", "BrowserPreview", "Write", "Edit", "Bash",
    "EnterPlanMode", "EnterGoalMode", "SubmitPlan", "SubmitGoal",
    "ReportCriteria", "NewContext", "Task", "TaskWait",
)  # fmt: skip

UNKNOWN_NAME = "FrobnicateRepo"


@dataclass(frozen=True)
class Tool:
    """A tool call's identity as the host knows it: a name, and a risk if a plugin serves it."""

    name: str
    risk: PluginRisk | None = None

    @property
    def label(self) -> str:
        return f"plugin:{self.risk.value}" if self.risk is not None else self.name


TOOLS = (
    *(Tool(name) for name in sorted(BUILTIN_TOOLS)),
    *(Tool(f"mcp__demo__{risk.value}", risk) for risk in PluginRisk),
    Tool(UNKNOWN_NAME),
)


def expected(mode: Mode, pm: PermissionMode, tool: Tool, granted: bool, temporary: bool) -> Decision:
    """The documents' answer for one cell."""
    contract = mode is not AGENT
    name = tool.name

    if tool.risk is not None:  # a registered plugin (MCP) tool
        if contract:
            return Deny(Code.PLUGIN_DISABLED_IN_PLAN)  # "deny, always (hidden too)"
        if tool.risk is PluginRisk.LOW:
            return Allow()
        if tool.risk is PluginRisk.MEDIUM:
            return Allow() if pm in (ACCEPT_EDITS, AUTO) or granted else Ask()
        return Allow() if pm is AUTO or granted else Ask()

    if name in ("Read", "Glob", "Grep", "BrowserPreview"):
        return Allow()
    if name in ("NewContext", "Task", "TaskWait"):
        return Allow()  # on PROTOCOL.md's contract-mode list; plain agent tools otherwise
    if name == "Write":
        if contract:
            return Deny(Code.WRITE_DISABLED_IN_PLAN)
        return Allow() if pm in (ACCEPT_EDITS, AUTO) or granted else Ask()
    if name == "Edit":
        if contract:
            return Deny(Code.EDIT_DISABLED_IN_PLAN)
        return Allow() if pm in (ACCEPT_EDITS, AUTO) or granted else Ask()
    if name == "Bash":
        if contract:  # seed 003 §0 and acceptance 10: the permission mode alone
            return Allow() if pm is AUTO else Ask()
        return Allow() if pm is AUTO or granted else Ask()
    if name in ("EnterPlanMode", "EnterGoalMode"):
        if contract:
            return Deny(Code.PLAN_ALREADY_ACTIVE)
        return Deny(Code.PLAN_WORKSPACE_REQUIRED) if temporary else Allow()
    if name == "SubmitPlan":
        if not contract:
            return Deny(Code.PLAN_NOT_ACTIVE)
        return Allow() if mode is PLAN else Deny(Code.PLAN_KIND_MISMATCH)
    if name == "SubmitGoal":
        if not contract:
            return Deny(Code.PLAN_NOT_ACTIVE)
        return Allow() if mode is GOAL else Deny(Code.PLAN_KIND_MISMATCH)
    if name == "ReportCriteria":
        # Used by a Goal *execution*, which runs in Agent mode; in a contract
        # mode it is "any other known tool": TOOL_DISABLED_IN_PLAN.
        return Deny(Code.TOOL_DISABLED_IN_PLAN) if contract else Allow()
    return Deny(Code.TOOL_NOT_FOUND)  # "an unknown name is TOOL_NOT_FOUND in every mode"


def call(mode: Mode, pm: PermissionMode, tool: Tool, granted: bool, temporary: bool) -> Decision:
    return decide(mode, pm, tool.name, plugin_risk=tool.risk, granted=granted, temporary=temporary)


CELLS = [
    pytest.param(
        mode, pm, tool, granted, temporary,
        id=f"{mode.value}-{pm.value}-{tool.label}-{'granted' if granted else 'nogrant'}"
        f"-{'temporary' if temporary else 'project'}",
    )
    for mode in Mode
    for pm in PermissionMode
    for tool in TOOLS
    for granted in (True, False)
    for temporary in (True, False)
]  # fmt: skip


def test_builtin_tools_are_exactly_the_documented_tools() -> None:
    # If a tool is added to the registry, the oracle (and the docs) must learn it first.
    assert set(BUILTIN_TOOLS) == set(DOCUMENTED_TOOLS)


def test_cell_grid_covers_every_combination() -> None:
    assert len(CELLS) == len(Mode) * len(PermissionMode) * (len(DOCUMENTED_TOOLS) + len(PluginRisk) + 1) * 4


@pytest.mark.parametrize(("mode", "pm", "tool", "granted", "temporary"), CELLS)
def test_decide_matches_documented_table(
    mode: Mode, pm: PermissionMode, tool: Tool, granted: bool, temporary: bool
) -> None:
    assert call(mode, pm, tool, granted, temporary) == expected(mode, pm, tool, granted, temporary)


# --- the seed rules, each proved over all of its cells ----------------------------------------

HARD_DENIED = [
    pytest.param(Tool("Write"), Code.WRITE_DISABLED_IN_PLAN, id="Write"),
    pytest.param(Tool("Edit"), Code.EDIT_DISABLED_IN_PLAN, id="Edit"),
    *(
        pytest.param(Tool(f"mcp__demo__{risk.value}", risk), Code.PLUGIN_DISABLED_IN_PLAN, id=f"plugin:{risk.value}")
        for risk in PluginRisk
    ),
]


@pytest.mark.parametrize(("tool", "code"), HARD_DENIED)
def test_seed003_acceptance10_contract_modes_deny_write_edit_plugins_regardless_of_auto_or_grants(
    tool: Tool, code: Code
) -> None:
    for mode in CONTRACT_MODES:
        for pm in PermissionMode:
            for granted in (True, False):
                for temporary in (True, False):
                    assert call(mode, pm, tool, granted, temporary) == Deny(code), (mode, pm, granted, temporary)


def test_goal_shares_the_plan_codes() -> None:
    # PROTOCOL.md: "contract-mode hard denies; Goal shares the Plan codes".
    for name, code in (("Write", Code.WRITE_DISABLED_IN_PLAN), ("Edit", Code.EDIT_DISABLED_IN_PLAN)):
        assert decide(GOAL, AUTO, name, granted=True) == Deny(code)
    assert decide(GOAL, AUTO, "mcp__x", plugin_risk=PluginRisk.LOW, granted=True) == Deny(
        Code.PLUGIN_DISABLED_IN_PLAN
    )
    assert decide(GOAL, AUTO, "ReportCriteria") == Deny(Code.TOOL_DISABLED_IN_PLAN)


@pytest.mark.parametrize("mode", CONTRACT_MODES, ids=lambda m: m.value)
def test_contract_mode_bash_follows_permission_mode_only(mode: Mode) -> None:
    by_pm = {ASK_PM: Ask(), ACCEPT_EDITS: Ask(), AUTO: Allow()}
    for pm, decision in by_pm.items():
        for granted in (True, False):
            assert decide(mode, pm, "Bash", granted=granted) == decision, (pm, granted)


@pytest.mark.parametrize("mode", CONTRACT_MODES, ids=lambda m: m.value)
def test_contract_mode_grants_never_change_any_decision(mode: Mode) -> None:
    for pm in PermissionMode:
        for tool in TOOLS:
            for temporary in (True, False):
                assert call(mode, pm, tool, True, temporary) == call(mode, pm, tool, False, temporary), (
                    pm,
                    tool.label,
                )


def test_agent_mode_grant_lifts_ask_for_write_edit_bash() -> None:
    # The contrast with the contract modes: in Agent mode a session grant does lift an Ask.
    for name in ("Write", "Edit", "Bash"):
        assert decide(AGENT, ASK_PM, name) == Ask()
        assert decide(AGENT, ASK_PM, name, granted=True) == Allow()
    assert decide(AGENT, ACCEPT_EDITS, "Bash") == Ask()
    assert decide(AGENT, ACCEPT_EDITS, "Bash", granted=True) == Allow()


def test_goal_matches_plan_exactly() -> None:
    """Every cell of Goal equals the same cell of Plan, except that the Submit tools swap."""
    swap = {"SubmitPlan": "SubmitGoal", "SubmitGoal": "SubmitPlan"}
    compared = 0
    for pm in PermissionMode:
        for tool in TOOLS:
            for granted in (True, False):
                for temporary in (True, False):
                    plan = call(PLAN, pm, tool, granted, temporary)
                    mirrored = Tool(swap.get(tool.name, tool.name), tool.risk)
                    goal = call(GOAL, pm, mirrored, granted, temporary)
                    assert goal == plan, (pm, tool.label, granted, temporary)
                    compared += 1
    assert compared == len(PermissionMode) * len(TOOLS) * 4


def test_submit_own_kind_allowed_other_kind_mismatch() -> None:
    assert decide(PLAN, ASK_PM, "SubmitPlan") == Allow()
    assert decide(PLAN, ASK_PM, "SubmitGoal") == Deny(Code.PLAN_KIND_MISMATCH)
    assert decide(GOAL, ASK_PM, "SubmitGoal") == Allow()
    assert decide(GOAL, ASK_PM, "SubmitPlan") == Deny(Code.PLAN_KIND_MISMATCH)
    for name in ("SubmitPlan", "SubmitGoal"):
        for pm in PermissionMode:
            assert decide(AGENT, pm, name, granted=True) == Deny(Code.PLAN_NOT_ACTIVE)


@pytest.mark.parametrize("mode", CONTRACT_MODES, ids=lambda m: m.value)
def test_contract_mode_tool_list_is_exactly_protocol_list(mode: Mode) -> None:
    """PROTOCOL.md: Read, Glob, Grep, BrowserPreview, Bash, Submit<own kind>, NewContext, Task, TaskWait."""
    own_submit = "SubmitPlan" if mode is PLAN else "SubmitGoal"
    listed = {"Read", "Glob", "Grep", "BrowserPreview", "Bash", own_submit, "NewContext", "Task", "TaskWait"}
    usable = {
        tool.label
        for tool in TOOLS
        for pm in PermissionMode
        for granted in (True, False)
        if not isinstance(call(mode, pm, tool, granted, False), Deny)
    }
    assert usable == listed


def test_unknown_tool_is_tool_not_found_in_every_mode() -> None:
    for mode in Mode:
        for pm in PermissionMode:
            for granted in (True, False):
                for name in (UNKNOWN_NAME, "", "read", "write", "bash", "submitplan", " Read"):
                    assert decide(mode, pm, name, granted=granted) == Deny(Code.TOOL_NOT_FOUND), (mode, name)


def test_temporary_session_cannot_enter_a_contract_mode() -> None:
    for pm in PermissionMode:
        for name in ("EnterPlanMode", "EnterGoalMode"):
            assert decide(AGENT, pm, name, temporary=True) == Deny(Code.PLAN_WORKSPACE_REQUIRED)
            assert decide(AGENT, pm, name, temporary=False) == Allow()


# --- seed 003 §3 rule 12: exclusive batches ---------------------------------------------------

EXCLUSIVE = ("EnterPlanMode", "EnterGoalMode", "SubmitPlan", "SubmitGoal")
ORDINARY = tuple(name for name in DOCUMENTED_TOOLS if name not in EXCLUSIVE) + (UNKNOWN_NAME, "mcp__demo__low")


@pytest.mark.parametrize(
    ("batch", "violation"),
    [
        pytest.param([], False, id="empty"),
        *(pytest.param([name], False, id=f"alone-{name}") for name in EXCLUSIVE + ORDINARY),
        pytest.param(["Read", "Grep", "Bash", "Write"], False, id="ordinary-batch"),
        *(pytest.param([name, "Read"], True, id=f"{name}-then-Read") for name in EXCLUSIVE),
        *(pytest.param(["Read", name], True, id=f"Read-then-{name}") for name in EXCLUSIVE),
        *(pytest.param([name, name], True, id=f"twice-{name}") for name in EXCLUSIVE),
        pytest.param(["SubmitPlan", "EnterGoalMode"], True, id="two-exclusive"),
        pytest.param(["Glob", "Bash", "SubmitGoal", "Task"], True, id="buried"),
    ],
)
def test_seed003_rule12_exclusive_batch(batch: list[str], violation: bool) -> None:
    assert batch_is_exclusive_violation(batch) is violation


@given(st.lists(st.sampled_from(EXCLUSIVE + ORDINARY), max_size=6))
def test_seed003_rule12_exclusive_batch_property(batch: list[str]) -> None:
    # An Enter*/Submit* call must be the only call in its batch.
    has_exclusive = any(name in EXCLUSIVE for name in batch)
    assert batch_is_exclusive_violation(batch) is (has_exclusive and len(batch) > 1)


# --- properties -------------------------------------------------------------------------------

_hard_denied_tools = st.one_of(
    st.sampled_from([Tool("Write"), Tool("Edit")]),
    # A plugin tool of any risk, under any name — even one shadowing a built-in.
    st.builds(Tool, st.one_of(st.text(max_size=20), st.sampled_from(DOCUMENTED_TOOLS)), st.sampled_from(PluginRisk)),
)


@given(
    mode=st.sampled_from(CONTRACT_MODES),
    pm=st.sampled_from(PermissionMode),
    tool=_hard_denied_tools,
    granted=st.booleans(),
    temporary=st.booleans(),
)
def test_property_contract_modes_never_allow_write_edit_or_plugins(
    mode: Mode, pm: PermissionMode, tool: Tool, granted: bool, temporary: bool
) -> None:
    decision = call(mode, pm, tool, granted, temporary)
    assert isinstance(decision, Deny)
    assert not isinstance(decision, (Allow, Ask))
    assert decision.code in {Code.WRITE_DISABLED_IN_PLAN, Code.EDIT_DISABLED_IN_PLAN, Code.PLUGIN_DISABLED_IN_PLAN}


@given(
    mode=st.sampled_from(list(Mode)),
    pm=st.sampled_from(PermissionMode),
    name=st.text(max_size=20).filter(lambda s: s not in BUILTIN_TOOLS),
    granted=st.booleans(),
    temporary=st.booleans(),
)
def test_property_unregistered_names_are_never_usable(
    mode: Mode, pm: PermissionMode, name: str, granted: bool, temporary: bool
) -> None:
    assert decide(mode, pm, name, granted=granted, temporary=temporary) == Deny(Code.TOOL_NOT_FOUND)


@given(
    mode=st.sampled_from(list(Mode)),
    pm=st.sampled_from(PermissionMode),
    tool=st.sampled_from(sorted(BUILTIN_TOOLS)),
    granted=st.booleans(),
    temporary=st.booleans(),
)
def test_property_unattended_turns_never_get_a_contract_tool_and_change_nothing_else(
    mode: Mode, pm: PermissionMode, tool: str, granted: bool, temporary: bool
) -> None:
    """Authority hole 2: in an unattended turn, EnterPlanMode, EnterGoalMode, SubmitPlan and SubmitGoal
    are PLAN_REQUIRES_INTERACTIVE_SESSION in every mode; every other decision is the attended one,
    and no tool is offered that the policy would refuse."""
    unattended = decide(mode, pm, tool, granted=granted, temporary=temporary, unattended=True)
    if tool in EXCLUSIVE:
        assert unattended == Deny(Code.PLAN_REQUIRES_INTERACTIVE_SESSION)
    else:
        assert unattended == decide(mode, pm, tool, granted=granted, temporary=temporary)
    assert set(visible_tools(mode, temporary=temporary, unattended=True)).isdisjoint(EXCLUSIVE)


@given(
    mode=st.sampled_from(list(Mode)),
    pm=st.sampled_from(PermissionMode),
    granted=st.booleans(),
    temporary=st.booleans(),
    delegate=st.booleans(),
)
def test_property_an_escalation_always_asks_or_is_refused_never_allowed_unasked(
    mode: Mode, pm: PermissionMode, granted: bool, temporary: bool, delegate: bool
) -> None:
    """Issue 28: a Bash command asking to leave the sandbox asks in every permission mode, ``auto``
    included; only its own session grant lifts that, in Agent mode; Plan and Goal refuse it always."""
    decision = decide(mode, pm, "Bash", granted=granted, temporary=temporary, delegate=delegate, escalated=True)
    if mode.is_contract:
        assert decision == Deny(Code.BASH_ESCALATION_DENIED_IN_PLAN)
    else:
        assert decision == (Allow() if granted else Ask())


@given(mode=st.sampled_from(list(Mode)), pm=st.sampled_from(PermissionMode), tool=st.sampled_from(sorted(BUILTIN_TOOLS)),
       granted=st.booleans())
def test_property_escalated_means_nothing_to_any_tool_but_bash(
    mode: Mode, pm: PermissionMode, tool: str, granted: bool
) -> None:
    if tool != "Bash":
        assert decide(mode, pm, tool, granted=granted, escalated=True) == decide(mode, pm, tool, granted=granted)


@pytest.mark.parametrize(("tool", "args", "escalated"), [
    ("Bash", {"command": "x", "escalate": True}, True),
    ("Bash", {"command": "x", "escalate": "true"}, False),  # only the boolean: the tool refuses the string
    ("Bash", {"command": "x", "escalate": 1}, False),
    ("Bash", {"command": "x"}, False),
    ("Write", {"path": "a", "content": "", "escalate": True}, False),
    ("Bash", ["not", "an", "object"], False),
])
def test_only_a_bash_call_with_escalate_true_is_an_escalation(tool: str, args: object, escalated: bool) -> None:
    assert is_escalation(tool, args) is escalated


def test_a_grant_of_a_tool_is_not_a_grant_of_its_escalation() -> None:
    assert grant_key("Bash") == "Bash" and grant_key("Bash", escalated=True) != grant_key("Bash")
