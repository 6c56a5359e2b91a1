"""Plugin tools: MCP servers (stdio or Streamable HTTP), their tools offered under ``mcp__<server>__<tool>``.

Each server is declared in the user config file; the risk the user accepts for
its tools becomes Allow / Ask in Agent mode (``core.policy``; Plan and Goal deny
every plugin tool whatever its risk or its hints)::

    [plugins.mcp.github]                      # <name>: letters, digits, "-" and "_" (no "__")
    command = ["npx", "-y", "@modelcontextprotocol/server-github"]   # stdio: argv, a list of strings
    risk = "medium"                           # optional: "low" | "medium" | "high" for every tool
    enabled = true                            # optional, default true
    env = { GITHUB_TOKEN = "…" }              # optional (stdio), added to the server's environment
    timeout = 120                             # optional: seconds one tool call may run (default 120)

    [plugins.mcp.docs]
    url = "https://example.com/mcp"           # Streamable HTTP instead of command
    headers = { Authorization = "Bearer ${DOCS_TOKEN}" }   # optional; ${NAME}: from pidesk's environment

Risk: the table's ``risk`` when it has one, for every tool of the server; else
each tool's own annotations: ``readOnlyHint`` → low (like Read), another hint
(``destructiveHint``, or ``readOnlyHint = false``) → medium (like Write), none
→ high (like Bash). ``plugins.list`` says where each tool's risk came from.

A stdio server's environment is the MCP SDK's safe default (HOME, LOGNAME, PATH,
SHELL, TERM, USER) plus its ``env`` table — never the host's provider keys. Its
stderr goes to a private temporary file whose tail is quoted when it fails. An
HTTP server's header values are expanded when it is connected, from the variables
``HostConfig.mcp_environ`` carries; they are never logged nor listed.

Design and invariants:

- A broken ``[plugins.mcp.<name>]`` table disables that server only
  (``McpTools.from_config``): it is listed as failed with the config file, the
  key and the fix, and logged once; every other server and command works.
- ``McpTools`` owns every server process. Each live connection is one
  ``_Connection``: an owner task that enters ``mcp.Client`` (whose anyio task
  groups must be entered and left in one task), lists the tools, then waits to
  be told to stop. Calls are made from the callers' tasks through that client.
- Starting never blocks the host unless asked: ``start()`` waits for every
  server, ``start_background()`` returns at once (``pidesk serve``: a turn sees
  the tools of the servers ready so far), and ``lazy`` registries start with the
  first turn, which waits up to ``TURN_WAIT`` s for them (embedded hosts: a
  command that runs no turn spawns nothing). ``listing()`` gives each server's
  state: stopped / starting / ready / failed (with ``error``) / disabled.
- Failures are data. A server that cannot be spawned, exits during the
  handshake or does not answer within ``start_timeout`` is recorded with its
  error, and the others still start. ``call()`` never raises either, except
  ``asyncio.CancelledError``, which propagates to the awaiting task untouched.
- Every call has a deadline: the server's ``timeout`` (default 120 s). A call
  still unanswered at its deadline is ``TOOL_TIMEOUT``; one whose turn is asked
  to stop (``agent.stop``, the ``stopped`` predicate, polled every
  ``STOP_POLL`` s) is ``TOOL_ABORTED``; an aborted turn cancels it. In all three
  the request is cancelled in the client, which sends the server MCP's
  ``notifications/cancelled`` for it (bounded), and the connection stays usable.
- A stdio server found dead before a call goes out (its process, identified by
  pid and start time once started, is gone) was idle when it died: it is
  restarted and the call then runs. Only a connection that closes while a call
  is out reports the crash (what the call did is unknown); the next call
  restarts it. Its tools stay offered meanwhile, so the model can retry.
- Tools that require MCP task support (``execution.taskSupport: "required"``)
  are left out, listed under ``skipped`` with the reason: pidesk does not run tasks.
- ``close()`` stops every process, starting or started: pending starts are
  cancelled, stdin closed, then SIGTERM / SIGKILL to the server's process group
  (the SDK's shutdown sequence), every wait bounded.
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
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager, suppress
from dataclasses import dataclass, field
from typing import Any, Final, Literal, TextIO, TypeVar

import anyio
from mcp import Client, MCPError, StdioServerParameters, stdio_client
from mcp import types as mcp_types
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client  # the SDK's client with its MCP timeouts

from pidesk import __version__
from pidesk.core.errors import Code, InvalidParams
from pidesk.core.policy import PluginRisk
from pidesk.plugins import mcp_lines
from pidesk.plugins.mcp_config import McpServerConfig, expand_headers, server_config
from pidesk.tools.base import ToolResult
from pidesk.tools.reaper import running_members
from pidesk.tools.watchdog import GroupRecord, Guarded, guard, release

log = logging.getLogger("pidesk.plugins.mcp")
mcp_lines.install()  # stdio servers' answers read in whole lines, linear and bounded (plugins/mcp_lines.py)

PREFIX: Final = "mcp__"
DEFAULT_START_TIMEOUT: Final = 30.0  # seconds to spawn, handshake and list tools
TURN_WAIT: Final = 15.0  # seconds a turn of a lazy (embedded) registry waits for servers still starting
STOP_POLL: Final = 0.1  # seconds between looks at the turn's stop flag while a call runs
CANCEL_GRACE: Final = 5.0  # seconds a cancelled call gets to send its cancellation and unwind
STOP_GRACE: Final = 10.0  # the SDK's own shutdown is bounded near 6.5 s; this is the backstop
MAX_OUTPUT: Final = 100_000  # characters of a tool result passed on to the model
STDERR_TAIL: Final = 2_000  # characters of a failed server's stderr quoted in its error
STDERR_KEEP: Final = 1 << 20  # bytes of a server's stderr kept before the log is emptied
_LIST_PAGE_CAP: Final = 100

_TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # what OpenAI and Anthropic both accept
RiskSource = Literal["config", "readOnlyHint", "hints", "unannotated"]
State = Literal["stopped", "starting", "ready", "failed", "disabled"]
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class PluginTool:
    """A tool as the host offers it: namespaced name, owning server, its risk, provider spec."""

    name: str
    server: str
    risk: PluginRisk
    spec: dict[str, Any]  # {"name", "description", "parameters"}, as tools.specs.TOOL_SPECS


def namespaced(server: str, tool: str) -> str:
    return f"{PREFIX}{server}__{tool}"


def risk_from_annotations(tool: mcp_types.Tool) -> tuple[PluginRisk, RiskSource]:
    """A tool's risk from its own hints: read-only → low; another hint (destructive or not) → medium,
    like Write; no hint → high, like Bash. A tool claiming both read-only and destructive is medium."""
    hints = tool.annotations
    if hints is None or (hints.read_only_hint is None and hints.destructive_hint is None):
        return PluginRisk.HIGH, "unannotated"
    if hints.read_only_hint and not hints.destructive_hint:
        return PluginRisk.LOW, "readOnlyHint"
    return PluginRisk.MEDIUM, "hints"


@asynccontextmanager
async def _then(transport: Any, entered: Callable[[], None]) -> AsyncIterator[Any]:
    """``transport``, with ``entered()`` called once it is entered (a stdio server spawned), before the
    client uses its streams."""
    async with transport as streams:
        entered()
        yield streams


class _Connection:
    """One spawned server process and its client session, owned by one task.

    ``ready`` resolves to the server's tool list, or to the exception that kept
    it from starting. ``ended`` turns true when the owner task has finished, for
    whatever reason; ``error`` then says why, unless it was asked to stop.
    """

    def __init__(self, config: McpServerConfig, start_timeout: float, environ: Mapping[str, str],
                 process_groups: GroupRecord | None = None) -> None:
        self.config = config
        self.client: Client | None = None
        self.ended = False
        self.error: str | None = None
        self.ready: asyncio.Future[list[mcp_types.Tool]] = asyncio.get_running_loop().create_future()
        self.ready.add_done_callback(_consume_exception)
        self.process: tuple[int, str] | None = None  # a stdio server's (pid, start time), once started
        # a stdio server leads its own process group (the SDK starts it so): guarded as a Bash call's is,
        # so the watchdog (or the next boot) kills it, and what it started, if the host dies
        self._groups = process_groups
        self._guarded: Guarded | None = None
        self._environ = environ
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
            with anyio.CancelScope(deadline=anyio.current_time() + self._start_timeout) as scope:
                self._scope = scope
                async with self._transport() as transport, Client(
                    transport,
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
            if self._guarded is not None and not running_members(self._guarded[0]):  # (the SDK stopped it)
                release(self._guarded, self._groups)
            self.client = None
            self.ended = True
            if not self.ready.done():
                self.ready.set_exception(ConnectionError("stopped before it was ready"))

    @asynccontextmanager
    async def _transport(self) -> AsyncIterator[Any]:
        """The server's transport, not yet entered: stdio (a child process) or Streamable HTTP."""
        if self.config.url is None:
            params = StdioServerParameters(
                command=self.config.command[0], args=self.config.command[1:], env=self.config.env
            )
            yield _then(stdio_client(params, errlog=self._stderr), self._spawned)
            return
        async with AsyncExitStack() as stack:
            http = await stack.enter_async_context(
                create_mcp_http_client(headers=expand_headers(self.config, self._environ)))
            yield streamable_http_client(self.config.url, http_client=http)

    def _spawned(self) -> None:
        """The stdio server runs (before it is asked anything): find its process and guard its group."""
        self.process = _child_writing_to(self._stderr)
        if self.process is not None:
            self._guarded = guard(self.process[0], self._groups)

    def alive(self) -> bool:
        """False once the stdio server's process is known to be gone (True while unknown: HTTP, starting)."""
        return self.process is None or _same_process_alive(*self.process)

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
    risks: dict[str, tuple[PluginRisk, RiskSource]] = field(default_factory=dict)  # namespaced name → risk
    skipped: list[dict[str, str]] = field(default_factory=list)  # the server's tools left out, and why
    error: str | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class McpTools:
    """The registry of configured MCP servers and the tools they offer."""

    def __init__(self, configs: Sequence[McpServerConfig], *, start_timeout: float = DEFAULT_START_TIMEOUT,
                 environ: Mapping[str, str] | None = None, broken: Mapping[str, str] | None = None,
                 lazy: bool = False, process_groups: GroupRecord | None = None) -> None:
        """``environ``: what ``${NAME}`` in headers may name; ``broken``: server name → why its table
        was refused; ``lazy``: the first turn starts the servers (``before_turn``); ``process_groups``:
        the store's record of running process groups, which boot kills (stdio servers are written to it)."""
        names = [c.name for c in configs]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise InvalidParams(f"MCP server names must be unique; repeated: {', '.join(duplicates)}")
        self._servers = {c.name: _Server(c) for c in configs}
        self._broken = dict(broken or {})
        self._environ = dict(environ or {})
        self._start_timeout = start_timeout
        self._process_groups = process_groups
        self._retiring: set[_Connection] = set()
        self._starting: set[asyncio.Task[Any]] = set()
        self.lazy = lazy
        self._started = False

    @classmethod
    def from_config(cls, tables: Any, *, source: str = "config", environ: Mapping[str, str] | None = None,
                    lazy: bool = False, process_groups: GroupRecord | None = None) -> McpTools:
        """A registry of the ``[plugins.mcp]`` tables as read from ``source`` (the config file). A table
        that is not valid disables that server only: logged now, listed as failed with the fix."""
        configs: list[McpServerConfig] = []
        broken: dict[str, str] = {}
        if not isinstance(tables, Mapping):
            broken["[plugins.mcp]"] = (f"{source}: [plugins.mcp] must be a table of [plugins.mcp.<name>] "
                                       "tables, e.g. [plugins.mcp.github] with command = [...]")
        else:
            for name, table in tables.items():
                try:
                    configs.append(server_config(str(name), table, source))
                except InvalidParams as exc:
                    broken[str(name)] = exc.message
        for name, why in broken.items():
            log.warning("MCP server %s is disabled: %s", name, why)
        return cls(configs, environ=environ, broken=broken, lazy=lazy, process_groups=process_groups)

    async def start(self) -> None:
        """Spawn every enabled server not yet running, concurrently, and wait for each to be ready or
        failed; failures are recorded, never raised."""
        self.start_background()
        while self._starting:  # bounded: each start ends by its start timeout; none is added meanwhile
            await asyncio.gather(*self._starting, return_exceptions=True)

    def start_background(self) -> None:
        """Spawn every enabled server not yet running or starting, and return at once."""
        self._started = True
        for server in self._servers.values():
            if server.config.enabled and server.conn is None:
                task = asyncio.create_task(self._ensure(server), name=f"start mcp server {server.config.name}")
                self._starting.add(task)
                task.add_done_callback(self._starting.discard)

    async def before_turn(self) -> None:
        """A lazy registry starts its servers with the first turn, and a turn waits (at most
        ``TURN_WAIT`` s) for those still starting; otherwise nothing (a turn sees what is ready)."""
        if not self.lazy:
            return
        if not self._started:
            self.start_background()
        if self._starting:
            await asyncio.wait(set(self._starting), timeout=TURN_WAIT)

    def tools(self) -> list[PluginTool]:
        return [
            PluginTool(name=name, server=server.config.name, risk=server.risks[name][0],
                       spec=copy.deepcopy(server.specs[name]))
            for server in self._servers.values() if server.config.enabled
            for name in server.tools
        ]

    def risk_of(self, name: str) -> PluginRisk | None:
        """The risk of an offered plugin tool; ``None`` when ``name`` is not one."""
        server = self._owner(name)
        return server.risks[name][0] if server is not None else None

    def listing(self) -> list[dict[str, Any]]:
        """``plugins.list`` entries: one per configured server with its ``state``, ``error`` while it is
        not healthy, its tools with their risk and its source, and the tools ``skipped``."""
        entries = []
        for server in self._servers.values():
            state, error = self._state(server)
            entry: dict[str, Any] = {
                "name": server.config.name,
                "tools": [{"name": name, "risk": risk.value, "riskFrom": source}
                          for name, (risk, source) in server.risks.items()],
                "enabled": server.config.enabled,
                "state": state,
                "transport": "http" if server.config.url is not None else "stdio",
            }
            if error is not None:
                entry["error"] = error
            if server.skipped:
                entry["skipped"] = [dict(s) for s in server.skipped]
            entries.append(entry)
        for name, why in self._broken.items():
            entries.append({"name": name, "tools": [], "enabled": False, "state": "failed", "error": why})
        return entries

    @staticmethod
    def _state(server: _Server) -> tuple[State, str | None]:
        if not server.config.enabled:
            return "disabled", None
        conn = server.conn
        if conn is not None and not conn.ready.done():
            return "starting", None
        if conn is not None and not conn.ready.exception() and not conn.ended:
            if conn.alive():
                return "ready", None
            return "failed", f"{'lost its connection' if server.config.url else 'exited'} while idle; {_again(server)}s on the next call"
        if server.error is not None:
            return "failed", server.error
        return "stopped", None

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
                return ToolResult.error(Code.TOOL_ERROR, (
                    f"MCP server '{label}' is not {'reachable' if server.config.url else 'running'} "
                    f"({server.error}); the next call will try to {_again(server)} it"))
            client = conn.client
            if client is not None:
                break
        if conn is None or client is None:
            return ToolResult.error(Code.TOOL_ERROR, f"MCP server '{label}' keeps {'closing the connection' if server.config.url else 'exiting'} before it can take a call")
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
                return ToolResult.error(Code.TOOL_ERROR, f"{name} failed: MCP error {exc.code}: {exc.message}")
            current = server.conn is conn  # not yet replaced by a concurrent call's restart
            tail = await self._retire(server, conn, stderr_since=mark)
            lost = "lost its connection" if server.config.url else "crashed"
            if current:
                self._report(server, f"{lost} during a call to {remote}; {_again(server)}s on the next call", tail)
            return ToolResult.error(Code.TOOL_ERROR, (
                f"MCP server '{label}' {lost} while running {name}, so what the call did is unknown. "
                f"It {_again(server)}s on the next call.{_quoted(tail)}"))
        except Exception as exc:  # a malformed or unexpected result: the plugin's fault, reported to the model
            return ToolResult.error(Code.TOOL_ERROR, f"{name} failed: {_describe(exc)}")
        return _to_result(result)

    async def close(self) -> None:
        """Stop every server process, starting or started (bounded). ``start()`` may be called again afterwards."""
        starting = set(self._starting)
        for task in starting:
            task.cancel()
        if starting:
            await asyncio.wait(starting, timeout=STOP_GRACE)
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
            if conn is not None and conn.ready.done() and (conn.ended or not conn.alive()):
                # died while idle: no call went out on it, so the call that brought us here runs on a new one
                tail = await self._retire(server, conn)
                gone = "closed while idle" if server.config.url else "exited while idle"
                self._report(server, f"{gone} ({conn.error or 'its process is gone'}); {_again(server)}ing", tail)
                conn = None
            if conn is None:
                conn = server.conn = _Connection(server.config, self._start_timeout, self._environ,
                                                 self._process_groups)
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
        server.risks.clear()
        server.skipped.clear()
        for tool in tools:
            name = namespaced(server.config.name, tool.name)
            if not _TOOL_NAME.match(name):
                log.warning("MCP server %r: skipping tool %r: %r is not a tool name providers accept",
                            server.config.name, tool.name, name)
                server.skipped.append({"name": tool.name, "reason": f"{name} is not a tool name providers accept"})
                continue
            if tool.execution is not None and tool.execution.task_support == "required":
                server.skipped.append({"name": tool.name, "reason": (
                    "it runs only as an MCP task (execution.taskSupport = \"required\"), which pidesk does not "
                    "support; its other tools are offered")})
                continue
            server.tools[name] = tool.name
            server.risks[name] = ((server.config.risk, "config") if server.config.risk is not None
                                  else risk_from_annotations(tool))
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
    if result.is_error:
        return ToolResult.error(Code.TOOL_ERROR, text)
    return ToolResult(ok=True, output=text)


def _again(server: _Server) -> str:
    """What bringing a server back is: a stdio server's process restarts, an HTTP one's connection reconnects."""
    return "reconnect" if server.config.url else "restart"


def _describe(exc: BaseException) -> str:
    """One line per leaf of an exception (anyio task groups wrap failures in groups)."""
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_describe(e) for e in exc.exceptions)
    if isinstance(exc, FileNotFoundError) and exc.filename:
        return f"command not found: {exc.filename}"
    if isinstance(exc, MCPError) and exc.code == mcp_types.CONNECTION_CLOSED:
        return "the server closed the connection (it exited, or does not speak MCP)"
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


def _child_writing_to(log_file: TextIO) -> tuple[int, str] | None:
    """The (pid, start time) of this process's child whose stderr is ``log_file`` — the stdio server
    the SDK spawned — or ``None`` when /proc cannot say (then its death is found by a failed call)."""
    with suppress(OSError, ValueError):
        mine = os.fstat(log_file.fileno())
        me = os.getpid()
        children: list[str] = []
        with suppress(OSError):
            for thread in os.listdir(f"/proc/{me}/task"):
                with open(f"/proc/{me}/task/{thread}/children") as f:
                    children += f.read().split()
        for pid in children:
            with suppress(OSError):
                fd2 = os.stat(f"/proc/{pid}/fd/2")
                if (fd2.st_ino, fd2.st_dev) == (mine.st_ino, mine.st_dev):
                    started = _stat_fields(int(pid))
                    if started is not None:
                        return int(pid), started[19]
    return None


def _same_process_alive(pid: int, started: str) -> bool:
    """The process ``pid`` that started at ``started`` (clock ticks after boot) is still running."""
    fields = _stat_fields(pid)
    return fields is not None and fields[0] not in ("Z", "X") and fields[19] == started


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/<pid>/stat after the command name: state is [0], start time [19]."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


class PluginSet:
    """The MCP registries one session's turn sees, as one: the configured servers, then the servers
    the session's client brought (``session.setPlugins``). A tool name belongs to the first registry
    offering it; the session's servers may not take a configured server's name, so none is shadowed."""

    def __init__(self, registries: Sequence[McpTools]) -> None:
        self._registries = list(registries)

    def risk_of(self, name: str) -> PluginRisk | None:
        return next((risk for r in self._registries if (risk := r.risk_of(name)) is not None), None)

    def tools(self) -> list[PluginTool]:
        return [tool for r in self._registries for tool in r.tools()]

    async def before_turn(self) -> None:
        for registry in self._registries:
            await registry.before_turn()

    async def call(self, name: str, args: dict[str, Any], *, stopped: Callable[[], bool] | None = None
                   ) -> ToolResult:
        owner = next((r for r in self._registries if r.risk_of(name) is not None), None)
        if owner is None:
            return ToolResult.error(Code.TOOL_NOT_FOUND, f"{name} is not a tool of any running MCP server")
        return await owner.call(name, args, stopped=stopped)
