"""A real MCP server over Streamable HTTP on 127.0.0.1, for the plugin tests.

Run it with ``sys.executable``; it binds a free port and prints ``port <n>`` on stdout once it
accepts. Every request must carry ``Authorization: Bearer <$EXPECTED_TOKEN>`` (else 401).
Tools: ``echo`` and ``whoami`` (how many requests were refused so far).
"""

from __future__ import annotations

import os
import socket
import sys

import uvicorn
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from mcp.server.mcpserver import MCPServer

server = MCPServer("web")
refused = 0


@server.tool()
def echo(text: str) -> str:
    """Return the text unchanged."""
    return text


@server.tool()
def refusals() -> int:
    """How many requests came without the right token."""
    return refused


class RequireToken:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.expected = f"Bearer {os.environ['EXPECTED_TOKEN']}"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        global refused
        if scope["type"] == "http" and Request(scope).headers.get("authorization") != self.expected:
            refused += 1
            await PlainTextResponse("unauthorized", status_code=401)(scope, receive, send)
            return
        await self.app(scope, receive, send)


def main() -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    app = RequireToken(server.streamable_http_app())
    config = uvicorn.Config(app, log_level="warning", lifespan="on")
    uv = uvicorn.Server(config)
    print(f"port {sock.getsockname()[1]}", flush=True)  # the socket already accepts (listen backlog)
    uv.run(sockets=[sock])
    sys.exit(0)


if __name__ == "__main__":
    main()
