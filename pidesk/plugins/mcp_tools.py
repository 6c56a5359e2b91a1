"""Plugin tools: MCP servers spawned over stdio, their tools offered under ``mcp__<server>__<tool>``.

Each server is declared in the user config file with the risk the user accepts
for its tools (the policy in ``core.policy`` turns that risk into Allow / Ask in
Agent mode; Plan and Goal deny every plugin tool whatever its risk)::

    [plugins.mcp.github]                      # <name>: letters, digits, "-" and "_" (no "__")
    command = ["npx", "-y", "@modelcontextprotocol/server-github"]   # argv, a list of strings
    risk = "medium"                           # required: "low" | "medium" | "high"
    enabled = true                            # optional, default true
    env = { GITHUB_TOKEN = "…" }              # optional, added to the server's environment
    timeout = 120                             # optional: seconds one tool call may run (default 120)

A server's environment is the MCP SDK's safe default (HOME, LOGNAME, PATH, SHELL,
TERM, USER) plus its ``env`` table — never the host's provider keys. Its stderr
goes to a private temporary file whose tail is quoted when it fails.

Design and invariants:

- ``McpTools`` owns every server process. Each live connection is one
  ``_Connection``: an owner task that enters ``mcp.Client`` (whose anyio task
  groups must be entered and left in one task), lists the tools, then waits to
  be told to stop. Calls are made from the callers' tasks through that client.
- Failures are data. ``start()`` never raises: a server that cannot be spawned,
  exits during the handshake or does not answer within ``start_timeout`` is
  recorded with its error (``listing()``), and the others still start.
  ``call()`` never raises either, except ``asyncio.CancelledError``, which
  propagates to the awaiting task untouched (an aborted tool call).
- Every call has a deadline: the server's ``timeout`` (default 120 s). A call
  still unanswered at its deadline is ``TOOL_TIMEOUT``; one whose turn is asked
  to stop (``agent.stop``, the ``stopped`` predicate, polled every
  ``STOP_POLL`` s) is ``TOOL_ABORTED``; an aborted turn cancels it. In all three
  the request is cancelled in the client, which sends the server MCP's
  ``notifications/cancelled`` for it (bounded), and the connection stays usable.
- A server that dies is found when a call fails with the connection closed:
  that call reports the crash (``ok=False``), the dead connection is torn down,
  and the next call to any of its tools restarts it (on demand, never eagerly;
  a failed restart is reported the same way and retried on the following call).
  Its tools stay offered meanwhile, so the model can retry.
- ``close()`` stops every process: stdin closed, then SIGTERM / SIGKILL to the
  server's process group (the SDK's shutdown sequence), every wait bounded.
- Names are the host's, never the server's: ``mcp__<server>__<tool>`` maps back
  through a table, so a tool name containing ``__`` is unambiguous. Tools whose
  namespaced name no provider accepts (outside ``[A-Za-z0-9_-]{1,64}``) are
  skipped with a warning.
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import math
import os
import re
import tempfile
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any, Final, Literal, TextIO, TypeVar

import anyio
from mcp import Client, MCPError, StdioServerParameters, stdio_client
from mcp import types as mcp_types

from pidesk import __version__
from pidesk.core.errors import Code, InvalidParams
from pidesk.core.policy import PluginRisk
from pidesk.tools.base import ToolResult

log = logging.getLogger("pidesk.plugins.mcp")

PREFIX: Final = "mcp__"
DEFAULT_START_TIMEOUT: Final = 30.0  # seconds to spawn, handshake and list tools
DEFAULT_CALL_TIMEOUT: Final = 120.0  # seconds one tool call may run, unless the server's ``timeout`` says otherwise
STOP_POLL: Final = 0.1  # seconds between looks at the turn's stop flag while a call runs
CANCEL_GRACE: Final = 5.0  # seconds a cancelled call gets to send its cancellation and unwind
STOP_GRACE: Final = 10.0  # the SDK's own shutdown is bounded near 6.5 s; this is the backstop
MAX_OUTPUT: Final = 100_000  # characters of a tool result passed on to the model
STDERR_TAIL: Final = 2_000  # characters of a failed server's stderr quoted in its error
STDERR_KEEP: Final = 1 << 20  # bytes of a server's stderr kept before the log is emptied
_LIST_PAGE_CAP: Final = 100

_SERVER_NAME = re.compile(r"^[A-Za-z0-9-]+(?:_[A-Za-z0-9-]+)*$")  # no "__", no leading/trailing "_"
_TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # what OpenAI and Anthropic both accept
_CONFIG_KEYS: Final = frozenset({"command", "env", "risk", "enabled", "timeout"})
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class McpServerConfig:
    name: str
    command: list[str]
    env: dict[str, str] | None
    risk: PluginRisk
    enabled: bool = True
    timeout: float = DEFAULT_CALL_TIMEOUT  # seconds one call may run before it is TOOL_TIMEOUT


@dataclass(frozen=True, slots=True)
class PluginTool:
    """A tool as the host offers it: namespaced name, owning server, declared risk, provider spec."""

    name: str
    server: str
    risk: PluginRisk
    spec: dict[str, Any]  # {"name", "description", "parameters"}, as tools.specs.TOOL_SPECS


def namespaced(server: str, tool: str) -> str:
    return f"{PREFIX}{server}__{tool}"


def load_mcp_config(file_dict: Mapping[str, Any]) -> list[McpServerConfig]:
    """The ``[plugins.mcp.<name>]`` tables of a parsed config file, validated (see the module docstring).

    Raises ``InvalidParams`` naming the server and the key at fault.
    """
    plugins = file_dict.get("plugins", {})
    if not isinstance(plugins, Mapping):
        raise InvalidParams("config: [plugins] must be a table")
    servers = plugins.get("mcp", {})
    if not isinstance(servers, Mapping):
        raise InvalidParams("config: [plugins.mcp] must be a table of [plugins.mcp.<name>] tables")
    return [_server_config(name, table) for name, table in servers.items()]


def _server_config(name: str, table: Any) -> McpServerConfig:
    where = f"config [plugins.mcp.{name}]"
    if not _SERVER_NAME.match(name):
        raise InvalidParams(
            f"{where}: the server name may hold only letters, digits, '-' and single '_' "
            "(it becomes part of tool names mcp__<server>__<tool>)"
        )
    if not isinstance(table, Mapping):
        raise InvalidParams(f"{where}: must be a table with command = [...] and risk = \"low\"|\"medium\"|\"high\"")
    unknown = sorted(set(table) - _CONFIG_KEYS)
    if unknown:
        raise InvalidParams(f"{where}: unknown key(s) {', '.join(unknown)}; expected {', '.join(sorted(_CONFIG_KEYS))}")
    command = table.get("command")
    if isinstance(command, str):
        raise InvalidParams(f"{where}: command must be a list of strings, e.g. command = {json.dumps(command.split())}")
    if not isinstance(command, list) or not command or not all(isinstance(a, str) and a for a in command):
        raise InvalidParams(f"{where}: command must be a non-empty list of non-empty strings, e.g. [\"uvx\", \"my-server\"]")
    env = table.get("env")
    if env is not None and (
        not isinstance(env, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())
    ):
        raise InvalidParams(f"{where}: env must be a table of string values, e.g. env = {{ TOKEN = \"…\" }}")
    risk = table.get("risk")
    choices = ", ".join(f'"{r.value}"' for r in PluginRisk)
    if risk is None:
        raise InvalidParams(f"{where}: risk is required — declare how far you trust its tools: risk = {choices}")
    if risk not in {r.value for r in PluginRisk}:
        raise InvalidParams(f"{where}: risk must be one of {choices}, got {risk!r}")
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
        name=name, command=list(command), env=dict(env) if env is not None else None,
        risk=PluginRisk(risk), enabled=enabled, timeout=float(timeout),
    )


class _Connection:
    """One spawned server process and its client session, owned by one task.

    ``ready`` resolves to the server's tool list, or to the exception that kept
    it from starting. ``ended`` turns true when the owner task has finished, for
    whatever reason; ``error`` then says why, unless it was asked to stop.
    """

    def __init__(self, config: McpServerConfig, start_timeout: float) -> None:
        self.config = config
        self.client: Client | None = None
        self.ended = False
        self.error: str | None = None
        self.ready: asyncio.Future[list[mcp_types.Tool]] = asyncio.get_running_loop().create_future()
        self.ready.add_done_callback(_consume_exception)
        self._start_timeout = start_timeout
        self._stop = asyncio.Event()
        self._stopping = False
        self._scope: anyio.CancelScope | None = None
        self._stderr = _private_log()
        self._task = asyncio.create_task(self._run(), name=f"mcp server {config.name}")

    async def _run(self) -> None:
        try:
            if self._stop.is_set():
                return
            params = StdioServerParameters(
                command=self.config.command[0], args=self.config.command[1:], env=self.config.env
            )
            with anyio.CancelScope(deadline=anyio.current_time() + self._start_timeout) as scope:
                self._scope = scope
                async with Client(
                    stdio_client(params, errlog=self._stderr),
                    cache=None,
                    client_info=mcp_types.Implementation(name="pidesk", version=__version__),
                ) as client:
                    tools = await _list_all_tools(client)
                    scope.deadline = math.inf  # started: from now on only stop() ends it
                    self.client = client
                    self.ready.set_result(tools)
                    await self._stop.wait()
            if scope.cancelled_caught and not self.ready.done() and not self._stopping:
                self._fail(TimeoutError(f"no answer within {self._start_timeout:g} s"))
        except Exception as exc:
            self._fail(exc)
        finally:
            self.client = None
            self.ended = True
            if not self.ready.done():
                self.ready.set_exception(ConnectionError("stopped before it was ready"))

    def _fail(self, exc: BaseException) -> None:
        self.error = _describe(exc)
        if not self.ready.done():
            self.ready.set_exception(exc)
        else:
            log.warning("MCP server %r: connection ended: %s", self.config.name, self.error)

    async def stop(self, stderr_since: int = 0) -> str:
        """End the session and the process (bounded; safe to repeat).

        Returns the tail of what the server wrote to stderr after offset ``stderr_since``.
        """
        self._stopping = True
        self._stop.set()
        if self._scope is not None and not self.ready.done():
            self._scope.cancel()  # still in the handshake: abandon it
        done, _ = await asyncio.wait({self._task}, timeout=STOP_GRACE)
        if not done and self._scope is not None:
            self._scope.cancel()
            done, _ = await asyncio.wait({self._task}, timeout=STOP_GRACE)
        if not done:
            log.error("MCP server %r did not shut down within %g s; abandoning it", self.config.name, 2 * STOP_GRACE)
            self._task.cancel()
        tail = self._stderr_tail(stderr_since)
        self._stderr.close()
        return tail

    def stderr_mark(self) -> int:
        """The current end of the stderr log, emptied first once it passes ``STDERR_KEEP``.

        The child writes in append mode, so truncating under it is safe.
        """
        with suppress(OSError, ValueError):
            size = self._stderr.seek(0, os.SEEK_END)
            if size <= STDERR_KEEP:
                return size
            self._stderr.truncate(0)
        return 0

    def _stderr_tail(self, since: int) -> str:
        with suppress(OSError, ValueError):
            size = self._stderr.seek(0, os.SEEK_END)
            self._stderr.seek(max(since, size - 4 * STDERR_TAIL))
            return self._stderr.read()[-STDERR_TAIL:].strip()
        return ""


@dataclass(eq=False)
class _Server:
    config: McpServerConfig
    conn: _Connection | None = None
    adopted: _Connection | None = None  # the connection whose tool list ``tools`` holds
    tools: dict[str, str] = field(default_factory=dict)  # namespaced name → the server's own name
    specs: dict[str, dict[str, Any]] = field(default_factory=dict)  # namespaced name → spec
    error: str | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class McpTools:
    """The registry of configured MCP servers and the tools they offer."""

    def __init__(self, configs: Sequence[McpServerConfig], *, start_timeout: float = DEFAULT_START_TIMEOUT) -> None:
        names = [c.name for c in configs]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise InvalidParams(f"MCP server names must be unique; repeated: {', '.join(duplicates)}")
        self._servers = {c.name: _Server(c) for c in configs}
        self._start_timeout = start_timeout
        self._retiring: set[_Connection] = set()

    async def start(self) -> None:
        """Spawn every enabled server not yet running, concurrently; failures are recorded, never raised."""
        await asyncio.gather(*(
            self._ensure(server) for server in self._servers.values()
            if server.config.enabled and server.conn is None
        ))

    def tools(self) -> list[PluginTool]:
        return [
            PluginTool(name=name, server=server.config.name, risk=server.config.risk,
                       spec=copy.deepcopy(server.specs[name]))
            for server in self._servers.values() if server.config.enabled
            for name in server.tools
        ]

    def risk_of(self, name: str) -> PluginRisk | None:
        """The declared risk of an offered plugin tool; ``None`` when ``name`` is not one."""
        server = self._owner(name)
        return server.config.risk if server is not None else None

    def listing(self) -> list[dict[str, Any]]:
        """``plugins.list`` entries: one per configured server, with ``error`` while it is not healthy."""
        entries = []
        for server in self._servers.values():
            entry: dict[str, Any] = {
                "name": server.config.name,
                "tools": [{"name": name, "risk": server.config.risk.value} for name in server.tools],
                "enabled": server.config.enabled,
            }
            if server.error is not None:
                entry["error"] = server.error
            entries.append(entry)
        return entries

    async def call(
        self, name: str, args: dict[str, Any], *, stopped: Callable[[], bool] | None = None,
    ) -> ToolResult:
        """Call an offered tool. Failures are results; only cancellation propagates.

        The call ends at the server's deadline (``TOOL_TIMEOUT``) or as soon as
        ``stopped()`` turns true (``TOOL_ABORTED``); either way the server is sent
        a cancellation for it.
        """
        server = self._owner(name)
        if server is None:
            return ToolResult.error(Code.TOOL_NOT_FOUND, f"{name} is not a tool of any running MCP server")
        label = server.config.name
        conn = client = None
        for _ in range(2):  # a connection found ended before the call went out is replaced once
            conn = await self._ensure(server)
            if conn is None:
                return ToolResult.failure(
                    f"MCP server '{label}' is not running ({server.error}); the next call will try to start it again"
                )
            client = conn.client
            if client is not None:
                break
        if conn is None or client is None:
            return ToolResult.failure(f"MCP server '{label}' keeps exiting before it can take a call")
        remote = server.tools.get(name)
        if remote is None:
            return ToolResult.error(Code.TOOL_NOT_FOUND, f"MCP server '{label}' no longer offers {name}")
        mark = conn.stderr_mark()
        timeout = server.config.timeout
        outcome = await _bounded(client.call_tool(remote, args), timeout, stopped)
        if outcome == "timeout":
            return ToolResult.error(Code.TOOL_TIMEOUT, (
                f"{name} did not answer within {timeout:g} s (the timeout of [plugins.mcp.{label}]), so it was "
                "cancelled; what it did meanwhile is unknown. Retry only if that is safe, or ask the user."
            ))
        if outcome == "stopped":
            return ToolResult.error(Code.TOOL_ABORTED, f"{name} was cancelled: the user stopped the turn")
        try:
            result = outcome.result()
        except MCPError as exc:
            if exc.code != mcp_types.CONNECTION_CLOSED:
                return ToolResult.failure(f"{name} failed: MCP error {exc.code}: {exc.message}")
            current = server.conn is conn  # not yet replaced by a concurrent call's restart
            tail = await self._retire(server, conn, stderr_since=mark)
            if current:
                self._report(server, f"crashed during a call to {remote}; restarts on the next call", tail)
            return ToolResult.failure(
                f"MCP server '{label}' crashed while running {name}, so what the call did is unknown. "
                f"It will be restarted on the next call.{_quoted(tail)}"
            )
        except Exception as exc:  # a malformed or unexpected result: the plugin's fault, reported to the model
            return ToolResult.failure(f"{name} failed: {_describe(exc)}")
        return _to_result(result)

    async def close(self) -> None:
        """Stop every server process (bounded). ``start()`` may be called again afterwards."""
        conns = {s.conn for s in self._servers.values() if s.conn is not None} | self._retiring
        for server in self._servers.values():
            server.conn = None
        await asyncio.gather(*(conn.stop() for conn in conns))
        self._retiring.clear()

    def _owner(self, name: str) -> _Server | None:
        if not name.startswith(PREFIX):
            return None
        return next((s for s in self._servers.values() if s.config.enabled and name in s.tools), None)

    async def _ensure(self, server: _Server) -> _Connection | None:
        """A live connection to ``server``, (re)starting it if it has none; ``None`` if it would not start."""
        async with server.lock:
            conn = server.conn
            if conn is not None and conn.ended:  # died while idle: no call went out on it
                tail = await self._retire(server, conn)
                self._report(server, f"exited ({conn.error or 'no reason given'}); restarting", tail)
                conn = None
            if conn is None:
                conn = server.conn = _Connection(server.config, self._start_timeout)
            try:
                tools = await asyncio.shield(conn.ready)
            except Exception as exc:
                tail = await self._retire(server, conn)
                self._report(server, f"failed to start: {_describe(exc)}", tail)
                return None
            if server.adopted is not conn:
                self._adopt(server, conn, tools)
            server.error = None
            return conn

    def _adopt(self, server: _Server, conn: _Connection, tools: list[mcp_types.Tool]) -> None:
        server.adopted = conn
        server.tools.clear()
        server.specs.clear()
        for tool in tools:
            name = namespaced(server.config.name, tool.name)
            if not _TOOL_NAME.match(name):
                log.warning("MCP server %r: skipping tool %r: %r is not a tool name providers accept",
                            server.config.name, tool.name, name)
                continue
            server.tools[name] = tool.name
            server.specs[name] = {
                "name": name,
                "description": tool.description or tool.title or f"{tool.name} (MCP server {server.config.name})",
                "parameters": tool.input_schema,
            }

    async def _retire(self, server: _Server, conn: _Connection, *, stderr_since: int = 0) -> str:
        """Stop a dead or failed connection; returns its stderr tail. The server keeps its tools.

        Until its stop completes the connection sits in ``_retiring``, so a
        caller cancelled meanwhile leaves it for ``close()`` rather than leaking it.
        """
        if server.conn is conn:
            server.conn = None
        self._retiring.add(conn)
        tail = await conn.stop(stderr_since)
        self._retiring.discard(conn)
        return tail

    @staticmethod
    def _report(server: _Server, what: str, stderr_tail: str) -> None:
        server.error = what + _quoted(stderr_tail)
        log.warning("MCP server %r %s", server.config.name, server.error)


async def _bounded(
    call: Awaitable[T], timeout: float, stopped: Callable[[], bool] | None,
) -> asyncio.Task[T] | Literal["timeout", "stopped"]:
    """Run ``call`` until it finishes (its task, done), ``timeout`` s pass, or ``stopped()`` turns true.

    A call left running is cancelled — the MCP client then sends the server
    ``notifications/cancelled`` — and waited for (at most ``CANCEL_GRACE`` s),
    also when the caller itself is cancelled, whose cancellation then propagates.
    """
    task = asyncio.ensure_future(call)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    poll = STOP_POLL if stopped is not None else timeout
    verdict: Literal["timeout", "stopped"] = "timeout"
    try:
        for _ in range(math.ceil(timeout / poll) + 1):  # each pass waits up to ``poll`` s: bounded by the deadline
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            await asyncio.wait({task}, timeout=min(remaining, poll))
            if task.done():
                return task
            if stopped is not None and stopped():
                verdict = "stopped"
                break
    except BaseException:
        await _give_up(task)
        raise
    if task.done():  # it answered just as the deadline passed
        return task
    await _give_up(task)
    return verdict


async def _give_up(task: asyncio.Task[Any]) -> None:
    """Cancel a call and wait (bounded) for its cancellation to reach the server."""
    task.cancel()
    await asyncio.wait({task}, timeout=CANCEL_GRACE)
    if task.done() and not task.cancelled():
        task.exception()  # retrieved: how a call given up on failed is of no interest


async def _list_all_tools(client: Client) -> list[mcp_types.Tool]:
    tools: list[mcp_types.Tool] = []
    cursor: str | None = None
    for _ in range(_LIST_PAGE_CAP):
        page = await client.list_tools(cursor=cursor)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if cursor is None:
            break
    return tools


def _to_result(result: mcp_types.CallToolResult) -> ToolResult:
    parts: list[str] = []
    for block in result.content:
        if isinstance(block, mcp_types.TextContent):
            parts.append(block.text)
        elif isinstance(block, (mcp_types.ImageContent, mcp_types.AudioContent)):
            parts.append(f"[{block.type} {block.mime_type}, {len(block.data)} base64 characters, not shown]")
        elif isinstance(block, mcp_types.EmbeddedResource):
            res = block.resource
            if isinstance(res, mcp_types.TextResourceContents):
                parts.append(res.text)
            else:
                parts.append(f"[binary resource {res.uri} ({res.mime_type or 'unknown type'}), not shown]")
        else:
            parts.append(f"[resource link {block.uri}]")
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False))
    text = "\n".join(parts)
    if len(text) > MAX_OUTPUT:
        text = text[:MAX_OUTPUT] + f"\n[{len(text) - MAX_OUTPUT} more characters cut]"
    return ToolResult(ok=not result.is_error, output=text)


def _describe(exc: BaseException) -> str:
    """One line per leaf of an exception (anyio task groups wrap failures in groups)."""
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_describe(e) for e in exc.exceptions)
    if isinstance(exc, FileNotFoundError) and exc.filename:
        return f"command not found: {exc.filename}"
    if isinstance(exc, MCPError) and exc.code == mcp_types.CONNECTION_CLOSED:
        return "the server closed the connection (it exited, or does not speak MCP over stdio)"
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _quoted(tail: str) -> str:
    return f"\nIts stderr ended with:\n{tail}" if tail else ""


def _private_log() -> TextIO:
    """An unlinked append-mode file for a server's stderr: the child writes, we read the tail."""
    fd, path = tempfile.mkstemp(prefix="pidesk-mcp-", suffix=".log")
    os.close(fd)
    try:
        return open(path, "a+", encoding="utf-8", errors="replace")
    finally:
        os.unlink(path)


def _consume_exception(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()  # retrieved here, so a start failure nobody awaited is not logged as lost
