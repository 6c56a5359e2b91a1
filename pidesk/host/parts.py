"""The parts every host service shares, and the small helpers they all need."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import os
import queue
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pidesk.config import HostConfig
from pidesk.core.errors import Code, Conflict, InvalidParams, NotFound
from pidesk.core.events import SessionUpdated
from pidesk.core.records import Attachment, Session
from pidesk.host import validate
from pidesk.host.bus import EventBus
from pidesk.host.live import Live
from pidesk.providers.base import Provider
from pidesk.runtime.gate import StepGate
from pidesk.store import Store, repo
from pidesk.tools import Tool, make_workspace_tools
from pidesk.tools.sandbox_server import Sandbox


class StoreThreads(ThreadPoolExecutor):
    """The threads the host's blocking store work runs on: each append's write, fsync and commit.

    A ``ThreadPoolExecutor`` whose idle threads wait on a ``queue.Queue``, which wakes one of them
    per job. Its own ``SimpleQueue`` (3.11) wakes a second idle thread whenever one takes a job,
    only for it to find the queue empty and sleep again: a context switch and a hand-off of the
    GIL per append, two appends a tool call, as soon as a burst has started a second thread
    (~0.3 ms a call in the peer benchmark, docs/benchmarks.md). Were a later Python to rename
    the attribute, the executor keeps its own queue: slower, never wrong."""

    def __init__(self) -> None:
        super().__init__(thread_name_prefix="pidesk-store")
        self._work_queue = queue.Queue()  # type: ignore[assignment]  # (the interface the workers use: get, put)


@dataclass
class Parts:
    config: HostConfig
    store: Store
    bus: EventBus
    live: Live
    provider: Provider
    gate: StepGate  # shared by every turn and delegate of the host
    plugin_tools: Any = None  # pidesk.plugins.mcp_tools.McpTools when the config names MCP servers
    session_plugins: Any = None  # pidesk.host.session_plugins.SessionPlugins: servers clients bring per session
    threads: ThreadPoolExecutor = field(default_factory=StoreThreads)
    # sandboxes starting at once, across every turn (tools/sandbox_server.py, Sandbox): a start is CPU work
    sandbox_starts: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(os.cpu_count() or 1))

    def session(self, session_id: str) -> Session:
        with self.store.db.read() as db:
            session = repo.get_session(db, session_id)
        if session is None:
            raise NotFound(f"no session {session_id!r}")
        return session

    def plugins(self, session_id: str) -> Any:
        """The MCP tools a turn of ``session_id`` may be offered (a ``PluginSet``: the config file's
        servers, then the session's own), or None when there are none."""
        own = self.session_plugins.of(session_id) if self.session_plugins is not None else None
        registries = [r for r in (self.plugin_tools, own) if r is not None]
        if not registries:
            return None
        from pidesk.plugins.mcp_tools import PluginSet

        return PluginSet(registries)

    def publish_session(self, session_id: str) -> Session | None:
        with self.store.db.read() as db:
            session = repo.get_session(db, session_id)
        if session is not None:
            self.bus.publish(SessionUpdated(session=session))
        return session

    def project(self, value: Any, name: str = "projectPath") -> Path:
        """A directory a session may work in: absolute, existing, resolved (``validate.project_dir``), and
        apart from the host's data directory — neither it, inside it, nor holding it
        (``WORKSPACE_PATH_DENIED``): a revert there would rewrite the store, and a sandbox whose root
        lies there would show what it hides."""
        project = validate.project_dir(value, name)
        data = self.store.data_dir.resolve()
        if project == data or project.is_relative_to(data) or data.is_relative_to(project):
            raise Conflict(f"{name} {str(value)!r} holds or lies in this host's data directory {data}: "
                           "choose a project elsewhere", Code.WORKSPACE_PATH_DENIED)
        return project

    def workspace_tools(self, root: Path, sandbox: Sandbox | None) -> dict[str, Tool]:
        """The built-in tools of a turn or a delegate over ``root``: refusing the host's own data
        directory, with every Bash group recorded so a crash cannot leave it running, and each Bash
        command confined by ``sandbox`` (pidesk.host.tooling decides it)."""
        return make_workspace_tools(root, env=self.config.tool_env, host_dir=self.store.data_dir,
                                    process_groups=self.store.process_groups, sandbox=sandbox)

    def stored_attachments(self, value: Any) -> list[Attachment]:
        """A prompt's attachments, each naming bytes the host holds (``attachments.put``) of their
        stated size — for ``agent.prompt`` and ``agent.queue.push`` alike."""
        files = validate.attachments(value)
        for item in files:
            path = self.store.blobs.path(item.ref)
            if path is None:
                raise InvalidParams(f"attachment {item.name!r}: unknown ref {item.ref!r}; upload it with attachments.put")
            if path.stat().st_size != item.size:
                raise InvalidParams(f"attachment {item.name!r}: size {item.size} does not match its bytes")
        return files

    def is_busy(self, session_id: str) -> bool:
        """An active turn, a pending approval or a queued/running execution (seed 003 §3 rule 15), or a
        compaction under way (issue 30)."""
        if session_id in self.live.turns or session_id in self.live.compacting:
            return True
        with self.store.db.read() as db:
            return repo.has_open_contract(db, session_id)

    async def in_thread(self, fn: Any, *args: Any) -> Any:
        """``fn(*args)`` on one of the store's threads, as ``asyncio.to_thread`` runs it (in this context)."""
        call = functools.partial(contextvars.copy_context().run, fn, *args)
        return await asyncio.get_running_loop().run_in_executor(self.threads, call)

