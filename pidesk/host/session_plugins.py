"""MCP servers a client brings for one session (``session.setPlugins``; ACP's ``mcpServers``).

An editor speaking ACP names the MCP servers its user set up when it opens a session; the host
runs them for that session only, under the same rules as the servers of the config file: their
tools are offered in Agent mode only (Plan and Goal deny every plugin tool, ``core.policy``),
each call has the server's deadline, and their risk comes from each tool's hints (none: asked
like Bash). They start with the session's next turn (a session that never runs a turn spawns
nothing) and stop when the session's set is replaced, when the session is deleted, when the
client that set them disconnects, or when the host closes. They are not kept on disk: a client
that loads the session again sends them again.

Environment values and headers may hold the user's secrets: they go to the server only, never
to the audit (which records the servers' names) nor to any listing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pidesk.core.errors import InvalidParams

if TYPE_CHECKING:
    from pidesk.plugins.mcp_tools import McpTools

log = logging.getLogger("pidesk.plugins.mcp")

MAX_SERVERS = 32  # a session's own servers: more is a client's mistake, not a setup


class SessionPlugins:
    def __init__(self, environ: Mapping[str, str], process_groups: Any, configured: Sequence[str]) -> None:
        """``environ``: what ``${NAME}`` in headers may name; ``configured``: the config file's server
        names, which a session's servers may not take."""
        self._environ = dict(environ)
        self._process_groups = process_groups
        self._configured = frozenset(configured)
        self._registries: dict[str, McpTools] = {}
        self._owners: dict[str, str] = {}  # session id -> the client that set its servers
        self._closing: set[asyncio.Task[None]] = set()

    def of(self, session_id: str) -> McpTools | None:
        return self._registries.get(session_id)

    def replace(self, session_id: str, servers: Any, owner: str) -> McpTools | None:
        """The session's servers become ``servers`` (a list of ``{name, command, env?}`` or ``{name, url,
        headers?}``; empty: none). Validated whole first: a bad entry changes nothing."""
        from pidesk.plugins.mcp_config import server_config
        from pidesk.plugins.mcp_tools import McpTools

        if not isinstance(servers, list) or len(servers) > MAX_SERVERS:
            raise InvalidParams(f"servers must be a list of at most {MAX_SERVERS} MCP servers")
        configs = []
        for index, entry in enumerate(servers):
            if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
                raise InvalidParams(f"servers[{index}] must be an object with a name")
            name = entry["name"]
            if name in self._configured:
                raise InvalidParams(f"servers[{index}]: {name!r} is the name of a server of the config file; "
                                    "give this one another name")
            table = {k: v for k, v in entry.items() if k != "name"}
            configs.append(server_config(name, table, source=f"session {session_id} servers[{index}]"))
        self._retire(session_id)
        if not configs:
            return None
        registry = McpTools(configs, environ=self._environ, lazy=True, process_groups=self._process_groups)
        self._registries[session_id] = registry
        self._owners[session_id] = owner
        return registry

    def client_closed(self, client_id: str) -> None:
        for session_id in [s for s, owner in self._owners.items() if owner == client_id]:
            self._retire(session_id)

    def session_deleted(self, session_id: str) -> None:
        self._retire(session_id)

    async def close(self) -> None:
        for session_id in list(self._registries):
            self._retire(session_id)
        while self._closing:  # bounded: each registry's close is (McpTools.close)
            await asyncio.gather(*self._closing, return_exceptions=True)

    def _retire(self, session_id: str) -> None:
        registry = self._registries.pop(session_id, None)
        self._owners.pop(session_id, None)
        if registry is None:
            return
        task = asyncio.get_running_loop().create_task(registry.close(), name=f"stop session {session_id} MCP servers")
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)
