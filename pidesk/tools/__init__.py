"""The workspace tools the agent runtime calls, built as factories over a session root.

``make_workspace_tools(root)`` gives the file and shell tools by their protocol
names; ``TOOL_SPECS`` describes every model-visible tool, including those the
runtime and host implement themselves (mode, plan, goal and task tools).
``check_paths`` is the path verdict the host applies before any permission Ask.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from pidesk.tools.base import Tool, ToolFailure, ToolResult, run_tool
from pidesk.tools.bash import Bash, make_bash_tool
from pidesk.tools.browser import make_browser_preview_tool
from pidesk.tools.files import (
    make_edit_tool,
    make_glob_tool,
    make_grep_tool,
    make_read_tool,
    make_write_tool,
)
from pidesk.tools.sandbox_server import Sandbox
from pidesk.tools.specs import TOOL_SPECS
from pidesk.tools.watchdog import GroupRecord
from pidesk.tools.workspace import PATH_TOOLS, check_paths, guard, resolve

__all__ = [
    "TOOL_SPECS",
    "Tool",
    "ToolFailure",
    "ToolResult",
    "check_paths",
    "Bash",
    "close_tools",
    "make_bash_tool",
    "make_edit_tool",
    "make_glob_tool",
    "make_grep_tool",
    "make_read_tool",
    "make_workspace_tools",
    "make_write_tool",
    "resolve",
    "run_tool",
]


async def close_tools(tools: Mapping[str, Tool] | None) -> None:
    """A turn's loop is over: kill what its tools keep ready (Bash's spare shell), and wait until it is gone."""
    for tool in (tools or {}).values():
        if isinstance(tool, Bash):
            await tool.aclose()


def make_workspace_tools(root: Path, *, env: Mapping[str, str] | None = None,
                         host_dir: Path | None = None, process_groups: GroupRecord | None = None,
                         sandbox: Sandbox | None = None) -> dict[str, Tool]:
    """``env`` is the Bash environment (``None``: inherit the host's); ``host_dir`` the host's data
    directory, which the path tools then refuse as they run (``workspace.guard``); ``process_groups``
    the store's record of running Bash groups, which boot kills (``tools/watchdog.py``); ``sandbox``
    what confines each Bash command (``tools/sandbox.py``; ``None``: nothing)."""
    tools: dict[str, Tool] = {
        "Read": make_read_tool(root),
        "Glob": make_glob_tool(root, host_dir=host_dir),
        "Grep": make_grep_tool(root, host_dir=host_dir),
        "Write": make_write_tool(root),
        "Edit": make_edit_tool(root),
        "Bash": make_bash_tool(root, env=env, sandbox=sandbox, process_groups=process_groups),
        "BrowserPreview": make_browser_preview_tool(root, host_dir=host_dir, process_groups=process_groups),
    }
    if host_dir is not None:
        tools.update({name: guard(name, tools[name], root, host_dir) for name in PATH_TOOLS})
    return tools
