"""``Host``: the authority, and the Python API the protocol server wraps one-to-one.

Each public coroutine is one PROTOCOL.md method (``session.create`` is
``session_create``); ``call(method, params)`` is the same table keyed by wire
names with camelCase params, returning plain JSON values. The work is done by
the services beside this module — sessions, turns, queue, permissions,
approvals, executions, forks, recovery — which share the store, the event bus
and the live state; this class only wires them and checks the preconditions
that span them (a prompt needs an idle session).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import re
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any, Literal

import msgspec

from pidesk import PROTOCOL_VERSION, __version__
from pidesk.config import HostConfig
from pidesk.core.errors import Code, Conflict, InvalidParams, NotFound, PideskError
from pidesk.core.events import AnyEvent, TurnEnded, event_payload
from pidesk.core.modes import TurnOrigin
from pidesk.core.records import AttachmentBlock, Block, Draft, Session, TextBlock, Turn
from pidesk.host import checkpoints, doctor, paging, validate
from pidesk.host.approvals import Approvals
from pidesk.host.bus import EventBus, Subscription
from pidesk.host.compaction import Compactions
from pidesk.host.context import HostTurnContext, session_tool_specs
from pidesk.host.delegates import Delegates
from pidesk.host.executions import Executions
from pidesk.host.forks import Forks
from pidesk.host.instructions import Instructions, listing
from pidesk.host.live import Live, LiveTurn
from pidesk.host.notifications import Notifications
from pidesk.host.parts import Parts
from pidesk.host.permissions import Permissions
from pidesk.host.queue import Queue
from pidesk.host.recovery import Recovery, recover
from pidesk.host.render import render_html
from pidesk.host.schedules import Schedules
from pidesk.host.session_plugins import SessionPlugins
from pidesk.host.sessions import Sessions
from pidesk.host.tooling import git_sandbox, sandbox_status
from pidesk.host.turns import Turns
from pidesk.plugins.hooks import EventHooks, turn_ended_payload
from pidesk.providers.base import Provider
from pidesk.runtime.context_window import estimate_request
from pidesk.runtime.gate import StepGate
from pidesk.runtime.prompts import system_prompt
from pidesk.ids import utcnow
from pidesk.store import Store, repo
from pidesk.tools.sandbox import SandboxStatus

DEFAULT_PAGE = 200
MAX_ATTACHMENT = 10 * 1024 * 1024
MAX_PAGE = 1000
SANDBOX_RECHECK_S = 10.0  # how often an unavailable sandbox is looked at again (host.hello, host.doctor)


class Host:
    def __init__(self, config: HostConfig, provider: Provider, store: Store,
                 clock: Callable[[], datetime] = utcnow) -> None:
        self.parts = Parts(config=config, store=store, bus=EventBus(), live=Live(), provider=provider,
                           gate=StepGate(config.step_slots))
        p = self.parts
        self.sessions = Sessions(p)
        self.turns = Turns(p)
        self.queue = Queue(p, self.turns)
        self.permissions = Permissions(p)
        self.approvals = Approvals(p)
        self.executions = Executions(p, self.turns)
        self.forks = Forks(p)
        self.instructions = Instructions(config.config_dir, store.data_dir, config.tool_env,
                                         lambda: clock().astimezone().date().isoformat(), git_sandbox(p))
        self.delegates = Delegates(p, self.permissions, self.instructions)
        self.schedules = Schedules(p, self.sessions, self.turns, clock)
        self.compactions = Compactions(p)
        self.notifications = Notifications(p, clock)
        self.turns.context_factory = self._context
        self.turns.after_turn = self._after_turn
        self.recovery: Recovery | None = None
        self._sandbox: SandboxStatus | None = None
        self._sandbox_at = 0.0  # when it was last found (time.monotonic)
        self._scheduler: asyncio.Task[None] | None = None
        self._pruner: asyncio.Task[None] | None = None
        self.hooks: EventHooks | None = None
        if config.mcp_servers:
            from pidesk.plugins.mcp_tools import McpTools

            p.plugin_tools = McpTools.from_config(config.mcp_servers, source=config.mcp_source,
                                                  environ=config.mcp_environ, process_groups=store.process_groups)
        p.session_plugins = SessionPlugins(config.mcp_environ, store.process_groups,
                                           configured=[str(name) for name in config.mcp_servers])

    @classmethod
    def open(cls, config: HostConfig, provider: Provider, clock: Callable[[], datetime] = utcnow,
             hooks: EventHooks | None = None) -> Host:
        """Open the store, recover (fail closed), and return a host ready to serve.

        ``hooks`` are the event plugins (default: the ``pidesk.plugins`` entry points);
        MCP tool servers start with ``start_plugins``.
        """
        host = cls(config, provider, Store(config.data_dir, config.faults), clock)
        host.hooks = hooks if hooks is not None else EventHooks.from_entry_points()
        if host.hooks.listing():  # no plugin installed: no listener on the bus at all
            host.parts.bus.listeners.append(host._to_hooks)
        host.recovery = recover(host.parts)
        host.schedules.skip_missed(clock())
        return host

    async def start_plugins(self, how: Literal["wait", "background", "first turn"] = "wait") -> None:
        """Start MCP tool servers, and tell event plugins about the turns recovery ended.

        ``how``: "wait" returns once every server is ready or failed; "background" at once (``serve``:
        it answers meanwhile, and a turn sees the tools of the servers ready so far); "first turn"
        leaves them to the first turn, which waits a bounded time for them (embedded hosts: a command
        that runs no turn spawns no server, and a one-shot ``run`` sees the tools).
        """
        plugins = self.parts.plugin_tools
        if plugins is not None:
            if how == "wait":
                await plugins.start()
            elif how == "background":
                plugins.start_background()
            else:
                plugins.lazy = True
        if self.recovery is not None:
            for ended in self.recovery.ended_turns:
                self._to_hooks(0, ended)
            self.recovery = Recovery(self.recovery.boot, self.recovery.interrupted, self.recovery.held_queues, [])

    def _to_hooks(self, seq: int, event: AnyEvent) -> None:
        if self.hooks is None:
            return
        payload = event_payload(event, seq)
        self.hooks.deliver(payload)
        if isinstance(event, TurnEnded):
            self.hooks.deliver(turn_ended_payload(payload))

    def start_scheduler(self) -> None:
        """Fire schedules from now on, and prune old notifications now and every hour (a long-running
        host; the CLI's one-shot hosts do neither)."""
        if self._scheduler is None:
            self._scheduler = asyncio.create_task(self.schedules.run_forever(), name="scheduler")
        if self._pruner is None:
            self._pruner = asyncio.create_task(self.notifications.run_forever(), name="notification pruner")

    async def close(self) -> None:
        for task in (self._scheduler, self._pruner):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        await self.turns.shutdown()
        await checkpoints.of(self.parts).close()
        await self.schedules.close()
        if self.parts.plugin_tools is not None:
            await self.parts.plugin_tools.close()
        await self.parts.session_plugins.close()
        if self.hooks is not None:
            await self.hooks.close()
        self.parts.store.close()
        self.parts.threads.shutdown()

    @property
    def store(self) -> Store:
        return self.parts.store

    def subscribe(self) -> Subscription:
        return self.parts.bus.subscribe()

    async def _context(self, live: LiveTurn) -> HostTurnContext:
        plugins = self.parts.plugins(live.session_id)
        if plugins is not None:  # an embedded host's first turn (or a session's own servers') starts and awaits them
            await plugins.before_turn()
        context = HostTurnContext(self.parts, live, self.permissions, self.approvals, self.executions,
                                  self.delegates, self.instructions, self.compactions)
        await context.prepare()
        return context

    async def _after_turn(self, session_id: str) -> None:
        if not await self.executions.dispatch(session_id):
            await self.queue.release(session_id)

    # ---- host.* ---------------------------------------------------------------------

    async def host_hello(self, protocol_version: Any, client: Any = None) -> dict[str, Any]:
        if not isinstance(protocol_version, int) or isinstance(protocol_version, bool):  # not true, not 1.0
            raise InvalidParams(f"protocolVersion must be an integer (this host speaks {PROTOCOL_VERSION}); "
                                f"got {validate.brief(protocol_version)}")
        if protocol_version != PROTOCOL_VERSION:
            raise Conflict(f"this host speaks protocol {PROTOCOL_VERSION}; the client asked for "
                           f"{validate.brief(protocol_version)}", Code.PROTOCOL_MISMATCH)
        return {"protocolVersion": PROTOCOL_VERSION, "schemaVersion": self.store.schema_version,
                "hostVersion": __version__, "strictPlanning": self.parts.config.strict_planning,
                "sandbox": (await self.sandbox_status()).to_wire()}

    async def host_status(self) -> dict[str, int]:
        with self.store.db.read() as db:
            return {
                "sessions": repo.count_sessions(db),
                "running": len(self.parts.live.turns),
                "pendingApprovals": len(repo.approvals(db, pending=True)),
                "queued": repo.count_queued(db),
            }

    async def host_doctor(self) -> dict[str, Any]:
        """A pidesk addition: ``pidesk doctor``'s read-only checks while this host holds the data dir."""
        return {**await doctor.look(self.parts), "sandbox": (await self.sandbox_status(fresh=True)).to_wire()}

    async def sandbox_status(self, *, fresh: bool = False) -> SandboxStatus:
        """Which sandbox Bash runs in, found by starting one (off the loop) once; while it is unavailable,
        again at most every ``SANDBOX_RECHECK_S`` (bubblewrap installed meanwhile is seen), or when ``fresh``
        (doctor)."""
        known, now = self._sandbox, time.monotonic()
        if known is None or fresh or (known.enabled and not known.available and now - self._sandbox_at > SANDBOX_RECHECK_S):
            known, self._sandbox_at = await asyncio.to_thread(sandbox_status, self.parts.config), now
            self._sandbox = known
        return known

    # ---- session.* --------------------------------------------------------------------

    async def session_create(self, project_path: Any = None, title: Any = None, mode: Any = None,
                             permission_mode: Any = None) -> Session:
        return self.sessions.create(project_path, title, mode, permission_mode)

    async def session_list(self, project_path: Any = None, limit: Any = None, cursor: Any = None) -> paging.Ready:
        return await self.sessions.list(project_path, limit, cursor)

    async def session_get(self, session_id: Any, before_seq: Any = None, limit: Any = None) -> dict[str, Any]:
        session = self.parts.session(validate.ident(session_id, "sessionId"))
        if before_seq is not None:
            before_seq = validate.integer(before_seq, "beforeSeq", 0, validate.INT64_MAX)
        count = validate.positive_int(limit, "limit", DEFAULT_PAGE, MAX_PAGE)
        messages, has_more = self.store.page(session.id, before_seq, count)
        with self.store.db.read() as db:
            pending = repo.approvals(db, session_id=session.id, pending=True)
            return {
                "session": session, "messages": messages, "hasMore": has_more,
                "queue": repo.queue_entries(db, session.id),
                "pendingApproval": pending[0] if pending else None,
                "pendingPermissions": repo.pending_requests(db, session.id),
            }

    async def session_turns(self, session_id: Any, limit: Any = None) -> dict[str, list[Turn]]:
        session = self.parts.session(validate.ident(session_id, "sessionId"))
        with self.store.db.read() as db:
            return {"turns": repo.list_turns(db, session.id, validate.positive_int(limit, "limit", 50, 1000))}

    async def session_delete(self, session_id: Any) -> dict[str, Any]:
        self.sessions.delete(session_id)
        self.parts.session_plugins.session_deleted(session_id)
        return {}

    async def session_set_plugins(self, session_id: Any, servers: Any, client_id: str = "local") -> dict[str, Any]:
        """The MCP servers this session's client brings (a pidesk addition, docs/protocol-notes.md; host/
        session_plugins.py): they replace the session's earlier set, when it is idle."""
        session = self.parts.session(validate.ident(session_id, "sessionId"))
        if self.parts.is_busy(session.id):
            raise Conflict("the session is busy; set its MCP servers once it is idle", Code.AGENT_BUSY)
        registry = self.parts.session_plugins.replace(session.id, servers, owner=client_id)
        names = [entry["name"] for entry in servers]  # (validated: names only; env and headers stay unwritten)
        with self.store.db.tx() as db:
            repo.audit(db, "plugins.session", session.id, None, servers=names)
        return {"plugins": registry.listing() if registry is not None else []}

    async def session_rename(self, session_id: Any, title: Any) -> Session:
        return self.sessions.rename(session_id, title)

    async def session_changes(self, session_id: Any, turn_id: Any = None, path: Any = None, limit: Any = None,
                              cursor: Any = None, diff: Any = None) -> dict[str, Any]:
        """What each turn changed in the workspace (PROTOCOL.md "Additions"; host/changes.py)."""
        return await checkpoints.of(self.parts).changes(session_id, turn_id, path, limit, cursor, diff)

    async def session_revert(self, session_id: Any, turn_id: Any) -> dict[str, Any]:
        """The workspace back to its state before a turn (or a revert), when idle."""
        return await checkpoints.of(self.parts).revert(session_id, turn_id)

    async def projects_check(self, path: Any) -> dict[str, Any]:
        return self.sessions.check_project(path)

    async def session_set_mode(self, session_id: Any, mode: Any) -> Session:
        return self.sessions.set_mode(session_id, mode)

    async def session_set_permission_mode(self, session_id: Any, permission_mode: Any) -> Session:
        return self.sessions.set_permission_mode(session_id, permission_mode)

    async def session_fork(self, session_id: Any, through_message_id: Any = None) -> Session:
        return self.forks.fork(session_id, through_message_id)

    async def session_context(self, session_id: Any) -> dict[str, Any]:
        """PROTOCOL.md Additions: the instruction files and skills the session's next model request
        includes (plus ``warnings``, a pidesk addition: what was found and left out, and why)."""
        session = self.parts.session(validate.ident(session_id, "sessionId"))
        running = self.parts.live.turns.get(session.id) is not None
        context = await self.instructions.next_request(session, running)
        listed = listing(context)
        view = await self.parts.in_thread(self.compactions.view, session.id)
        estimate = estimate_request(system_prompt(session.mode, session.root, context),
                                    session_tool_specs(self.parts, session), view)  # (before any count)
        listed["window"] = await self.compactions.window(session.id, estimate)
        return listed

    async def session_compact(self, session_id: Any, instructions: Any = None) -> dict[str, bool]:
        """Turn-3 additions: compact an idle session's view now (``AGENT_BUSY`` otherwise). The session
        counts as busy from the check on, so no prompt or second compaction starts meanwhile."""
        session = self.parts.session(validate.ident(session_id, "sessionId"))
        if instructions is not None:
            instructions = validate.text(instructions, "instructions", allow_empty=True)
        if self.parts.is_busy(session.id):
            raise Conflict("the session is busy; compact it once it is idle", Code.AGENT_BUSY)
        self.parts.live.compacting.add(session.id)
        try:
            prepared = await self.instructions.for_turn(session)
            system = system_prompt(session.mode, session.root, prepared.context, prepared.environment)
            return await self.compactions.compact_now(session.id, instructions or "", system,
                                                      session_tool_specs(self.parts, session))
        finally:
            self.parts.live.compacting.discard(session.id)
            await self.queue.release(session.id)  # a prompt queued meanwhile starts now

    async def session_focus(self, session_id: Any, client_id: str = "local") -> dict[str, Any]:
        self.sessions.focus(client_id, session_id)
        if session_id is not None:
            await self.queue.unhold(session_id)
        return {}

    def client_opened(self, client_id: str) -> None:
        """A WebSocket client connected (it keeps a host started on demand alive: ``idle``)."""
        self.parts.live.clients.add(client_id)

    def client_closed(self, client_id: str) -> None:
        """A connection went away: it no longer makes any session visible."""
        self.parts.live.focus.pop(client_id, None)
        self.parts.live.clients.discard(client_id)
        self.parts.session_plugins.client_closed(client_id)

    def idle(self) -> bool:
        """Nothing for this host to do or keep: no client connected, no turn or compaction running, and
        no enabled schedule to fire (a host started on demand exits once it has been idle a while)."""
        live = self.parts.live
        if live.clients or live.turns or live.compacting:
            return False
        return not any(s.enabled for s in self.schedules.all())

    # ---- markdown.render (a pidesk addition: see docs/protocol-notes.md) ----------------

    async def markdown_render(self, text: Any) -> dict[str, str]:
        return {"html": await render_html(validate.text(text, "text", allow_empty=True))}

    # ---- attachments.put (a pidesk addition: see docs/protocol-notes.md) ----------------

    async def attachments_put(self, name: Any, mime: Any, data: Any, kind: Any = None) -> dict[str, Any]:
        """Store attachment bytes (base64 in ``data``) by content; returns the Attachment to send."""
        import base64
        import binascii

        label = validate.text(name, "name")
        media = validate.text(mime, "mime")
        chosen = kind or ("image" if media.startswith("image/") else "file")
        if chosen not in ("file", "image"):
            raise InvalidParams("kind must be 'file' or 'image'")
        if not isinstance(data, str):
            raise InvalidParams("data must be base64 text")
        try:
            raw = base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError):
            raise InvalidParams("data is not valid base64") from None
        if len(raw) > MAX_ATTACHMENT:
            raise InvalidParams(f"an attachment holds at most {MAX_ATTACHMENT} bytes", Code.LIMIT_EXCEEDED)
        ref = await self.parts.in_thread(self.store.blobs.put, raw)
        return {"kind": chosen, "name": label, "mime": media, "size": len(raw), "ref": ref}

    # ---- agent.* --------------------------------------------------------------------

    async def agent_prompt(self, session_id: Any, text: Any, attachments: Any = None, unattended: Any = None, *,
                           origin: TurnOrigin = TurnOrigin.INTERACTIVE) -> dict[str, str]:
        """``unattended`` (a pidesk addition to PROTOCOL.md): nobody will answer an Ask or a contract."""
        session = self.parts.session(validate.ident(session_id, "sessionId"))
        if unattended is not None and not isinstance(unattended, bool):
            raise InvalidParams("unattended must be true or false")
        body = validate.text(text, "text")
        files = self.parts.stored_attachments(attachments)
        if self.parts.is_busy(session.id):
            raise Conflict("the session is running; queue the prompt or wait", Code.AGENT_BUSY)
        if unattended and session.mode.is_contract:
            raise Conflict(f"{session.mode.value.title()} mode needs an interactive session to approve its "
                           "contract; switch the session to Agent mode to run it unattended",
                           Code.PLAN_REQUIRES_INTERACTIVE_SESSION)
        content: list[Block] = [TextBlock(text=body)]
        content += [AttachmentBlock(**{f: getattr(a, f) for f in a.__struct_fields__}) for a in files]
        turn_id, message_id = await self.turns.start(
            session.id, content, origin=origin, unattended=bool(unattended), draft=Draft(text=body, attachments=files)
        )
        self.sessions.title_from_prompt(session.id, body)
        return {"turnId": turn_id, "messageId": message_id}

    async def agent_steer(self, session_id: Any, turn_id: Any, text: Any) -> dict[str, Any]:
        session = self.parts.session(validate.ident(session_id, "sessionId"))
        turn_id = validate.ident(turn_id, "turnId")
        body = validate.text(text, "text")
        with self.store.db.read() as db:
            turn = repo.get_turn(db, turn_id)
        if turn is None or turn.session_id != session.id:
            raise NotFound(f"no turn {turn_id!r} in session {session.id}")
        live = self.parts.live.owns(session.id, turn_id)
        if live is None or live.stop_requested:
            raise Conflict(f"turn {turn_id} has ended or is finishing; send a new prompt instead", Code.TURN_ENDED)
        live.steers.append(body)
        return {}

    async def agent_stop(self, session_id: Any) -> dict[str, Any]:
        session = self.parts.session(validate.ident(session_id, "sessionId"))
        live = self.parts.live.turns.get(session.id)
        if live is not None:
            live.stop_requested = True
        return {}

    async def agent_abort(self, session_id: Any, smart: Any = None) -> dict[str, Any]:
        session = self.parts.session(validate.ident(session_id, "sessionId"))
        result = await self.turns.abort(session.id, smart=bool(smart))
        out: dict[str, Any] = {"aborted": result.aborted}
        if result.restored_draft is not None:
            out["restoredDraft"] = result.restored_draft
        return out

    async def agent_queue_push(self, session_id: Any, text: Any, attachments: Any = None) -> dict[str, Any]:
        entry = await self.queue.push(session_id, text, attachments)
        self.sessions.title_from_prompt(entry.session_id, entry.text)
        return {"entryId": entry.id, "position": entry.position}

    async def agent_queue_list(self, session_id: Any) -> dict[str, Any]:
        return {"entries": self.queue.entries(session_id)}

    async def agent_queue_remove(self, session_id: Any, entry_id: Any) -> dict[str, Any]:
        self.queue.remove(session_id, entry_id)
        return {}

    async def agent_queue_prioritize(self, session_id: Any, entry_id: Any) -> dict[str, Any]:
        return {"entries": self.queue.prioritize(session_id, entry_id)}

    async def agent_queue_send_now(self, session_id: Any, entry_id: Any) -> dict[str, Any]:
        await self.queue.send_now(session_id, entry_id)
        return {}

    # ---- permissions.* / plans.* ------------------------------------------------------------

    async def permissions_pending(self, session_id: Any = None) -> dict[str, Any]:
        return {"requests": self.permissions.pending(session_id)}

    async def permissions_resolve(self, request_id: Any, session_id: Any, turn_id: Any, decision: Any,
                                  remember: Any = None) -> dict[str, Any]:
        self.permissions.resolve(request_id, session_id, turn_id, decision, remember)
        return {}

    async def plans_pending(self, session_id: Any = None) -> dict[str, Any]:
        return {"approvals": self.approvals.pending(session_id)}

    async def plans_list(self, session_id: Any) -> dict[str, Any]:
        return {"approvals": self.approvals.history(session_id)}

    async def plans_get(self, approval_id: Any) -> dict[str, Any]:
        approval, markdown = self.approvals.get(approval_id)
        out: dict[str, Any] = msgspec.to_builtins(approval)
        out["markdown"] = markdown
        out["html"] = await render_html(markdown)  # never fails: a plan too long or slow to format is shown plain
        return out

    async def plans_resolve(self, approval_id: Any, session_id: Any, turn_id: Any, decision: Any,
                            permission_mode: Any = None, feedback: Any = None, context: Any = None) -> Any:
        return self.approvals.resolve(approval_id, session_id, turn_id, decision, permission_mode, feedback, context)

    # ---- schedules.* -----------------------------------------------------------------------------

    async def schedules_create(self, name: Any, cron: Any, project_path: Any, prompt: Any, mode: Any = None,
                               permission_mode: Any = None) -> Any:
        return self.schedules.create(name, cron, project_path, prompt, mode, permission_mode)

    async def schedules_list(self) -> dict[str, Any]:
        return {"schedules": self.schedules.all()}

    async def schedules_delete(self, schedule_id: Any) -> dict[str, Any]:
        self.schedules.delete(schedule_id)
        return {}

    async def schedules_run_now(self, schedule_id: Any) -> dict[str, Any]:
        return await self.schedules.run_now(schedule_id)

    # ---- plugins.* -------------------------------------------------------------------------------

    async def plugins_list(self) -> dict[str, Any]:
        tools = self.parts.plugin_tools.listing() if self.parts.plugin_tools is not None else []
        hooks = [{"name": h["name"], "tools": [], "enabled": h["enabled"]} for h in
                 (self.hooks.listing() if self.hooks is not None else [])]
        return {"plugins": [*tools, *hooks]}

    # ---- notifications.* / audit.* ------------------------------------------------------------

    async def notifications_list(self, unseen_only: Any = None, limit: Any = None,
                                 cursor: Any = None) -> paging.Ready:
        return await self.notifications.list(unseen_only, limit, cursor)

    async def notifications_mark_seen(self, ids: Any = None, session_id: Any = None) -> dict[str, Any]:
        self.notifications.mark_seen(ids, session_id)
        return {}

    async def audit_list(self, session_id: Any = None, limit: Any = None) -> dict[str, Any]:
        if session_id is not None:
            session_id = self.parts.session(validate.ident(session_id, "sessionId")).id
        with self.store.db.read() as db:
            return {"entries": repo.audit_entries(db, session_id, validate.positive_int(limit, "limit", 100, 10_000))}

    # ---- the wire table ---------------------------------------------------------------------

    async def call(self, method: str, params: Any = None, *, client_id: str = "local") -> Any:
        """Run one PROTOCOL.md method by its wire name with camelCase params; JSON-ready result."""
        handler = METHODS.get(method)
        if handler is None:
            raise PideskError(f"unknown method {method!r}", Code.METHOD_NOT_FOUND)
        if params is None:
            params = {}
        if not isinstance(params, dict):
            raise InvalidParams("params must be an object")
        fn = getattr(self, handler)
        accepted = _wire_params(fn)
        unknown = set(params) - set(accepted)
        if unknown:
            raise InvalidParams(f"unknown params for {method}: {', '.join(sorted(unknown))}")
        kwargs = {accepted[k]: v for k, v in params.items()}
        if "client_id" in _signature(getattr(fn, "__func__", fn)).parameters:
            kwargs["client_id"] = client_id
        if method == "session.focus":
            kwargs.setdefault("session_id", None)
        missing = [k for k, name in accepted.items() if _required(fn, name) and name not in kwargs]
        if missing:
            raise InvalidParams(f"{method} needs {', '.join(missing)}")
        result = await fn(**kwargs)
        return result if isinstance(result, paging.Ready) else msgspec.to_builtins(result)


METHODS: dict[str, str] = {
    name: re.sub(r"([A-Z])", r"_\1", name.replace(".", "_")).lower()
    for name in (
        "host.hello", "host.status", "host.doctor",
        "session.create", "session.list", "session.get", "session.turns", "session.delete", "session.rename",
        "session.setMode", "session.setPermissionMode", "session.fork", "session.focus", "session.context",
        "session.changes", "session.revert", "session.compact", "session.setPlugins",
        "agent.prompt", "agent.steer", "agent.stop", "agent.abort",
        "agent.queue.push", "agent.queue.list", "agent.queue.remove", "agent.queue.prioritize",
        "agent.queue.sendNow",
        "permissions.pending", "permissions.resolve",
        "plans.pending", "plans.list", "plans.get", "plans.resolve",
        "notifications.list", "notifications.markSeen", "audit.list", "attachments.put",
        "schedules.create", "schedules.list", "schedules.delete", "schedules.runNow", "markdown.render",
        "plugins.list", "projects.check",
    )
}


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


@functools.cache
def _signature(fn: Callable[..., Any]) -> inspect.Signature:
    return inspect.signature(fn)


def _wire_params(fn: Callable[..., Any]) -> dict[str, str]:
    """camelCase wire name -> Python parameter, for the positional-or-keyword params of a method."""
    sig = _signature(getattr(fn, "__func__", fn))
    return {
        _camel(name): name for name, param in sig.parameters.items()
        if param.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD and name not in ("self", "client_id")
    }


def _required(fn: Callable[..., Any], name: str) -> bool:
    return _signature(getattr(fn, "__func__", fn)).parameters[name].default is inspect.Parameter.empty
