"""A hand-written MCP stdio server speaking protocol 2025-11-25, as npm servers do (server-everything),
with one tool that requires MCP task support (``execution.taskSupport = "required"``).

The Python SDK's own servers speak the 2026 protocol, which carries no task support in tool
listings, so this one is written out: ``initialize``, ``tools/list`` and ``tools/call``, one JSON
object per line; anything else is -32601. Tools: ``echo`` and ``research`` (task-only: called
plainly it fails with -32601, as server-everything's ``simulate-research-query`` does).
"""

from __future__ import annotations

import json
import sys

TOOLS = [
    {"name": "echo", "description": "Return the text unchanged.",
     "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
     "annotations": {"readOnlyHint": True}},
    {"name": "research", "description": "Research a topic (runs only as a task).",
     "inputSchema": {"type": "object", "properties": {"topic": {"type": "string"}}},
     "execution": {"taskSupport": "required"}},
]


def answer(request: dict) -> dict | None:
    method, params = request.get("method"), request.get("params") or {}
    if "id" not in request:
        return None  # a notification
    if method == "initialize":
        result: dict = {"protocolVersion": "2025-11-25", "capabilities": {"tools": {}},
                        "serverInfo": {"name": "tasks", "version": "1"}}
    elif method == "tools/list":
        result = {"tools": TOOLS}
    elif method == "tools/call" and params.get("name") == "echo":
        result = {"content": [{"type": "text", "text": params.get("arguments", {}).get("text", "")}]}
    elif method == "ping":
        result = {}
    else:
        return {"jsonrpc": "2.0", "id": request["id"], "error": {"code": -32601, "message": f"{method}: not found"}}
    return {"jsonrpc": "2.0", "id": request["id"], "result": result}


for line in sys.stdin:
    if line.strip():
        reply = answer(json.loads(line))
        if reply is not None:
            print(json.dumps(reply), flush=True)
