"""A real MCP stdio server for the plugin tests: run it with ``sys.executable``.

Tools: ``echo``, ``write_marker``, ``fail`` (an isError result),
``pid`` (the process id, to check ``close()``), ``sleep`` (for cancellation),
``big`` (a result of N megabytes) and ``crash`` (``os._exit(1)`` mid-call).
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("demo")


@server.tool()
def echo(text: str) -> str:
    """Return the text unchanged."""
    return text


@server.tool()
def write_marker(path: str) -> str:
    """Write a marker file at the given absolute path."""
    Path(path).write_text("marker\n")
    return f"wrote {path}"


@server.tool()
def fail(message: str) -> str:
    """Fail with the given message (an isError result)."""
    raise ToolError(message)


@server.tool()
def pid() -> int:
    """This server's process id."""
    return os.getpid()


@server.tool()
async def sleep(seconds: float) -> str:
    """Sleep, then say so."""
    await asyncio.sleep(seconds)
    return "slept"


@server.tool()
def big(megabytes: int) -> str:
    """A result of that many megabytes (one JSON line on stdout)."""
    return "x" * (megabytes * 1024 * 1024)


@server.tool()
def crash() -> str:
    """Exit the process at once, mid-call."""
    print("demo server: crashing on purpose", file=sys.stderr, flush=True)
    os._exit(1)


if __name__ == "__main__":
    server.run("stdio")
