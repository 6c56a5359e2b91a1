"""The ``[plugins.mcp.<name>]`` tables of the config file: what each MCP server is and how far to trust it.

A table names a stdio server (``command = [...]``, optional ``env``) or a
Streamable HTTP one (``url``, optional ``headers`` whose values may name
``${VARIABLE}``s of pidesk's environment, filled in only when it connects and
never logged or listed), with an optional ``risk`` (else each tool's own hints
decide), ``enabled`` and ``timeout`` (seconds one call may run, default 120).
Every mistake is an ``InvalidParams`` naming the file, the table, the key and the
fix; the registry (``mcp_tools.py``) disables only that server.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from pidesk.core.errors import InvalidParams
from pidesk.core.policy import PluginRisk

DEFAULT_CALL_TIMEOUT: Final = 120.0  # seconds one tool call may run, unless the server's ``timeout`` says otherwise
_SERVER_NAME = re.compile(r"^[A-Za-z0-9-]+(?:_[A-Za-z0-9-]+)*$")  # no "__", no leading/trailing "_"
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_CONFIG_KEYS: Final = frozenset({"command", "url", "headers", "env", "risk", "enabled", "timeout"})


@dataclass(frozen=True, slots=True)
class McpServerConfig:
    name: str
    command: list[str]  # stdio: the argv; empty for a Streamable HTTP server
    env: dict[str, str] | None
    risk: PluginRisk | None  # None: each tool's risk from its annotations
    enabled: bool = True
    timeout: float = DEFAULT_CALL_TIMEOUT  # seconds one call may run before it is TOOL_TIMEOUT
    url: str | None = None  # Streamable HTTP endpoint, instead of command
    headers: dict[str, str] | None = field(default=None, repr=False)  # values may hold ${NAME}


def load_mcp_config(file_dict: Mapping[str, Any], source: str = "config") -> list[McpServerConfig]:
    """The ``[plugins.mcp.<name>]`` tables of a parsed config file, validated (see the module docstring).

    Raises ``InvalidParams`` naming ``source`` (the file), the server and the key at fault.
    """
    plugins = file_dict.get("plugins", {})
    if not isinstance(plugins, Mapping):
        raise InvalidParams(f"{source}: [plugins] must be a table")
    servers = plugins.get("mcp", {})
    if not isinstance(servers, Mapping):
        raise InvalidParams(f"{source}: [plugins.mcp] must be a table of [plugins.mcp.<name>] tables")
    return [server_config(name, table, source) for name, table in servers.items()]


def server_config(name: str, table: Any, source: str = "config") -> McpServerConfig:
    where = f"{source} [plugins.mcp.{name}]"
    if not _SERVER_NAME.match(name):
        raise InvalidParams(
            f"{where}: the server name may hold only letters, digits, '-' and single '_' "
            "(it becomes part of tool names mcp__<server>__<tool>); rename the table"
        )
    if not isinstance(table, Mapping):
        raise InvalidParams(f"{where}: must be a table with command = [...] or url = \"http://…/mcp\"")
    unknown = sorted(set(table) - _CONFIG_KEYS)
    if unknown:
        raise InvalidParams(f"{where}: unknown key(s) {', '.join(unknown)}: remove or correct them; "
                            f"the keys are {', '.join(sorted(_CONFIG_KEYS))}")
    command, url = table.get("command"), table.get("url")
    if command is not None and url is not None:
        raise InvalidParams(f"{where}: command and url both given: keep command for a stdio server, "
                            "url for a Streamable HTTP one")
    if url is not None:
        if not isinstance(url, str) or not re.match(r"^https?://[^/\s]+", url):
            raise InvalidParams(f"{where}: url must be an http:// or https:// address, e.g. url = "
                                "\"http://127.0.0.1:8000/mcp\"")
        if table.get("env") is not None:
            raise InvalidParams(f"{where}: env is for stdio servers (command = [...]); for url, send what "
                                "the server needs in headers = { … }")
    else:
        if isinstance(command, str):
            raise InvalidParams(f"{where}: command must be a list of strings, e.g. command = "
                                f"{json.dumps(command.split())}")
        if not isinstance(command, list) or not command or not all(isinstance(a, str) and a for a in command):
            raise InvalidParams(f"{where}: command must be a non-empty list of non-empty strings, e.g. "
                                "[\"uvx\", \"my-server\"] (or give url = \"http://…/mcp\" for an HTTP server)")
    headers = table.get("headers")
    if headers is not None:
        if url is None:
            raise InvalidParams(f"{where}: headers are for HTTP servers (url = …); a stdio server takes env = {{ … }}")
        if not isinstance(headers, Mapping) or not all(isinstance(k, str) and isinstance(v, str)
                                                       for k, v in headers.items()):
            raise InvalidParams(f"{where}: headers must be a table of string values, e.g. "
                                "headers = { Authorization = \"Bearer ${MY_TOKEN}\" }")
    env = table.get("env")
    if env is not None and (
        not isinstance(env, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())
    ):
        raise InvalidParams(f"{where}: env must be a table of string values, e.g. env = {{ TOKEN = \"…\" }}")
    risk = table.get("risk")
    choices = ", ".join(f'"{r.value}"' for r in PluginRisk)
    if risk is not None and risk not in {r.value for r in PluginRisk}:
        raise InvalidParams(f"{where}: risk must be one of {choices} (or left out: each tool's own hints "
                            f"decide), got {risk!r}")
    enabled = table.get("enabled", True)
    if not isinstance(enabled, bool):
        raise InvalidParams(f"{where}: enabled must be true or false, got {enabled!r}")
    timeout = table.get("timeout", DEFAULT_CALL_TIMEOUT)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < math.inf:
        raise InvalidParams(
            f"{where}: timeout must be a positive number of seconds one tool call may run "
            f"(default {DEFAULT_CALL_TIMEOUT:g}), got {timeout!r}"
        )
    return McpServerConfig(
        name=name, command=list(command or []) if url is None else [], env=dict(env) if env is not None else None,
        risk=PluginRisk(risk) if risk is not None else None, enabled=enabled, timeout=float(timeout),
        url=url, headers=dict(headers) if headers is not None else None,
    )


def expand_headers(config: McpServerConfig, environ: Mapping[str, str]) -> dict[str, str]:
    """The headers with ``${NAME}`` replaced; a variable not set is an error naming it (never a value)."""
    expanded = {}
    for key, value in (config.headers or {}).items():
        missing = [n for n in _ENV_REF.findall(value) if n not in environ]
        if missing:
            raise LookupError(
                f"header {key} uses ${{{missing[0]}}}, which is not set in pidesk's environment: "
                f"export {missing[0]} before starting pidesk, or write the value in [plugins.mcp.{config.name}]"
            )
        expanded[key] = _ENV_REF.sub(lambda m: environ[m.group(1)], value)
    return expanded
