from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from pidesk.core.errors import Code
from pidesk.core.policy import BUILTIN_TOOLS
from pidesk.tools import TOOL_SPECS, ToolFailure, ToolResult, make_workspace_tools, run_tool

# PROTOCOL.md "Agent tools": name -> (every argument, the required ones).
PROTOCOL_ARGS: dict[str, tuple[set[str], set[str]]] = {
    "Read": ({"path", "offset", "limit"}, {"path"}),
    "Glob": ({"pattern", "path"}, {"pattern"}),
    "Grep": ({"pattern", "path", "glob", "ignoreCase"}, {"pattern"}),
    "Write": ({"path", "content"}, {"path", "content"}),
    "Edit": ({"path", "oldText", "newText", "replaceAll"}, {"path", "oldText", "newText"}),
    "Bash": ({"command", "timeoutMs", "escalate", "justification"}, {"command"}),
    "BrowserPreview": ({"url"}, {"url"}),
    "EnterPlanMode": ({"reason"}, set()),
    "EnterGoalMode": ({"reason"}, set()),
    "SubmitPlan": ({"title", "markdown", "question"}, {"title", "markdown", "question"}),
    "SubmitGoal": ({"title", "markdown", "question", "criteria"}, {"title", "markdown", "question", "criteria"}),
    "ReportCriteria": ({"results"}, {"results"}),
    "NewContext": ({"summary"}, {"summary"}),
    "Task": ({"description", "prompt"}, {"description", "prompt"}),
    "TaskWait": ({"taskIds"}, {"taskIds"}),
}


def test_specs_cover_every_builtin_tool_with_protocol_argument_names() -> None:
    assert set(TOOL_SPECS) == set(BUILTIN_TOOLS) == set(PROTOCOL_ARGS)
    for name, spec in TOOL_SPECS.items():
        assert spec["name"] == name
        # (Bash's also says what its sandbox allows and when to ask to leave it: the model must not fight it)
        assert spec["description"].endswith(".") and len(spec["description"]) < (600 if name == "Bash" else 160)
        params = spec["parameters"]
        assert params["type"] == "object" and params["additionalProperties"] is False
        assert (set(params["properties"]), set(params["required"])) == PROTOCOL_ARGS[name], name
        for prop in params["properties"].values():
            assert prop.get("type") in {"string", "integer", "boolean", "array"}
    json.dumps(TOOL_SPECS)


def test_report_criteria_outcomes() -> None:
    item = TOOL_SPECS["ReportCriteria"]["parameters"]["properties"]["results"]["items"]
    assert item["properties"]["outcome"]["enum"] == ["met", "unmet", "blocked"]
    assert set(item["required"]) == {"criterion", "outcome", "evidence"}


def test_workspace_tools_by_protocol_name(root: Path) -> None:
    assert list(make_workspace_tools(root)) == ["Read", "Glob", "Grep", "Write", "Edit", "Bash", "BrowserPreview"]


def test_tool_result_error_carries_the_code_string() -> None:
    assert ToolResult.error(Code.FILE_NOT_FOUND, "gone") == ToolResult(False, "gone", "FILE_NOT_FOUND")
    assert ToolResult.failure("exit 1") == ToolResult(False, "exit 1", None)


@pytest.mark.asyncio
async def test_run_tool_turns_failures_and_bugs_into_results() -> None:
    async def fails(args: dict[str, Any]) -> ToolResult:
        raise ToolFailure(Code.TOOL_BINARY_CONTENT, "binary")

    async def fails_plainly(args: dict[str, Any]) -> ToolResult:
        raise ToolFailure(None, "not found in file")

    async def crashes(args: dict[str, Any]) -> ToolResult:
        raise KeyError("missing")

    assert await run_tool(fails, {}) == ToolResult(False, "binary", "TOOL_BINARY_CONTENT")
    assert await run_tool(fails_plainly, {}) == ToolResult(False, "not found in file", None)
    assert await run_tool(crashes, {}) == ToolResult(False, "KeyError: 'missing'", "INTERNAL")
    not_a_dict: Any = ["path"]
    assert (await run_tool(fails, not_a_dict)).error_code == "INVALID_ARGUMENTS"


@pytest.mark.asyncio
async def test_run_tool_lets_cancellation_through() -> None:
    started = asyncio.Event()

    async def waits(args: dict[str, Any]) -> ToolResult:
        started.set()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    task = asyncio.create_task(run_tool(waits, {}))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
