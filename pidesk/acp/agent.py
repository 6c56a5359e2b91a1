"""pidesk as an ACP agent: an editor's requests become host calls, the host's events become ACP updates.

One ``PideskAgent`` serves one editor connection over one link to the host (``pidesk.cli.link``:
a running host's WebSocket, or an embedded host). It decides nothing: modes, permissions and
contracts are the host's, exactly as for the web page and ``pidesk chat``. What it keeps is what
a translation needs — which sessions this editor opened, the mode it last told the editor, the
prompt each session is answering, a goal's criteria.

Order: one task (``_pump``) reads the host's events and sends every session/update, so the editor
sees them in the host's order. A question for the user (a permission, a contract) is asked from a
task of its own, since the editor answers when the user does while the turn's events go on.

A prompt lasts until the session has nothing left to do for it: an approved contract's execution
is a new turn on the host, and it runs inside the same session/prompt, so the editor shows the
plan, the approval, the switch to Agent and the work as one exchange.
"""

from __future__ import annotations

import asyncio
import logging
import re
from dataclasses import dataclass, field
from typing import Any

from acp import RequestError
from acp.helpers import update_agent_message_text, update_agent_thought_text, update_current_mode, update_plan
from acp.schema import (
    AgentCapabilities,
    AllowedOutcome,
    Implementation,
    InitializeResponse,
    ListSessionsResponse,
    LoadSessionResponse,
    McpCapabilities,
    NewSessionResponse,
    PromptCapabilities,
    PromptResponse,
    SessionCapabilities,
    SessionInfo,
    SessionListCapabilities,
    SetSessionModeResponse,
    UsageUpdate,
)

from pidesk import __version__
from pidesk.acp import translate
from pidesk.core.errors import Code, PideskError

log = logging.getLogger("pidesk.acp")

PROTOCOL_VERSION = 1
HISTORY_PAGE = 200  # messages per session.get while session/load replays a session


@dataclass
class Prompt:
    """The session/prompt a session is answering: done when its turns are."""

    done: asyncio.Future[str]
    cancelled: bool = False
    turn_running: bool = False
    execution_pending: bool = False  # a contract approved in this prompt: its execution turn follows
    failure: str | None = None


@dataclass
class Opened:
    """A session this editor opened (session/new or session/load)."""

    id: str
    root: str
    mode: str
    servers: list[dict[str, Any]] = field(default_factory=list)  # its MCP servers, as sent to the host
    prompt: Prompt | None = None
    streamed: set[str] = field(default_factory=set)  # message ids whose text came as deltas
    criteria: list[str] = field(default_factory=list)  # an approved goal's
    reported: dict[str, str] = field(default_factory=dict)  # criterion -> met/unmet/blocked


class PideskAgent:
    def __init__(self, link: Any) -> None:
        self.link = link
        self.conn: Any = None  # the editor's side (acp's AgentSideConnection), set by on_connect
        self.sessions: dict[str, Opened] = {}
        self.initialized = False
        self._tasks: set[asyncio.Task[Any]] = set()
        self._pump_task: asyncio.Task[None] | None = None

    def on_connect(self, conn: Any) -> None:
        self.conn = conn

    # ---- lifecycle --------------------------------------------------------------------------------

    async def initialize(self, protocol_version: int, client_capabilities: Any = None, client_info: Any = None,
                         **_: Any) -> InitializeResponse:
        self.initialized = True
        if self._pump_task is None:
            self._pump_task = asyncio.create_task(self._pump(), name="acp event pump")
        return InitializeResponse(
            protocol_version=PROTOCOL_VERSION,
            agent_capabilities=AgentCapabilities(
                load_session=True,
                prompt_capabilities=PromptCapabilities(image=True, embedded_context=True),
                mcp_capabilities=McpCapabilities(http=True),
                session_capabilities=SessionCapabilities(list=SessionListCapabilities()),
            ),
            agent_info=Implementation(name="pidesk", title="pidesk", version=__version__),
            auth_methods=[],
        )

    async def authenticate(self, method_id: str, **_: Any) -> None:
        raise RequestError.invalid_params({"reason": "pidesk needs no authentication: the host is local"})

    async def close(self) -> None:
        for task in list(self._tasks) + ([self._pump_task] if self._pump_task else []):
            task.cancel()

    # ---- sessions ---------------------------------------------------------------------------------

    async def new_session(self, cwd: str, mcp_servers: list[Any] | None = None, **_: Any) -> NewSessionResponse:
        self._require_initialized()
        session = await self._call("session.create", {"projectPath": cwd})
        opened = self._open(session)
        await self._set_servers(opened, mcp_servers or [])
        return NewSessionResponse(session_id=opened.id, modes=translate.mode_state(opened.mode))

    async def load_session(self, cwd: str, session_id: str, mcp_servers: list[Any] | None = None,
                           **_: Any) -> LoadSessionResponse:
        self._require_initialized()
        got = await self._call("session.get", {"sessionId": session_id, "limit": HISTORY_PAGE})
        pages = [got["messages"]]
        while got.get("hasMore") and pages[-1]:  # bounded: each page is older than the one before
            got = await self._call("session.get", {"sessionId": session_id, "limit": HISTORY_PAGE,
                                                   "beforeSeq": pages[-1][0]["seq"]})
            pages.append(got["messages"])
        opened = self._open(got["session"])
        messages = [m for page in reversed(pages) for m in page]
        for update in translate.history(messages, opened.root):
            await self.conn.session_update(session_id=opened.id, update=update)
        await self._set_servers(opened, mcp_servers or [])
        return LoadSessionResponse(modes=translate.mode_state(opened.mode))

    async def list_sessions(self, cwd: str | None = None, cursor: str | None = None, **_: Any) -> ListSessionsResponse:
        self._require_initialized()
        params: dict[str, Any] = {"limit": 50}
        if cwd:
            params["projectPath"] = cwd
        if cursor:
            params["cursor"] = cursor
        listed = await self._call("session.list", params)
        return ListSessionsResponse(
            sessions=[SessionInfo(session_id=s["id"], cwd=s["root"], title=s.get("title"), updated_at=s.get("updatedAt"))
                      for s in listed["sessions"]],
            next_cursor=listed.get("nextCursor"))

    async def set_session_mode(self, session_id: str, mode_id: str, **_: Any) -> SetSessionModeResponse:
        self._opened(session_id)
        if mode_id not in translate.MODE_IDS:
            raise RequestError.invalid_params({"modeId": mode_id, "reason": "the modes are agent, plan and goal"})
        await self._call("session.setMode", {"sessionId": session_id, "mode": mode_id})
        return SetSessionModeResponse()

    # ---- prompts ----------------------------------------------------------------------------------

    async def prompt(self, session_id: str, prompt: list[Any], **_: Any) -> PromptResponse:
        opened = self._opened(session_id)
        if opened.prompt is not None and not opened.prompt.done.done():
            raise RequestError(-32000, "this session is already answering a prompt: wait for it or cancel it")
        text, attachments = await self._prompt_parts(prompt)
        if not text.strip() and not attachments:
            raise RequestError.invalid_params({"reason": "the prompt is empty"})
        waiting = opened.prompt = Prompt(done=asyncio.get_running_loop().create_future(), turn_running=True)
        await self._call("session.focus", {"sessionId": session_id})
        params: dict[str, Any] = {"sessionId": session_id, "text": text or "(see the attached files)"}
        if attachments:
            params["attachments"] = attachments
        try:
            await self._call("agent.prompt", params)
        except RequestError:
            opened.prompt = None
            raise
        reason = await waiting.done
        opened.prompt = None
        return PromptResponse(stop_reason=translate.stop_reason(reason, waiting.cancelled))

    async def cancel(self, session_id: str, **_: Any) -> None:
        opened = self.sessions.get(session_id)
        if opened is None or opened.prompt is None:
            return
        opened.prompt.cancelled = True
        try:
            await self.link.call("agent.abort", {"sessionId": session_id})
        except PideskError as exc:
            log.warning("cancel of %s: %s", session_id, exc.message)
        if not opened.prompt.turn_running and not opened.prompt.done.done():
            opened.prompt.done.set_result("aborted")

    async def _prompt_parts(self, blocks: list[Any]) -> tuple[str, list[dict[str, Any]]]:
        """A prompt's text, with embedded files and links inline (as an editor's @-mention means them), and its
        images stored on the host as attachments."""
        texts: list[str] = []
        attachments: list[dict[str, Any]] = []
        for block in blocks:
            kind = getattr(block, "type", None)
            if kind == "text":
                texts.append(block.text)
            elif kind == "image":
                name = (block.uri or "image").rsplit("/", 1)[-1] or "image"
                attachments.append(await self._call("attachments.put", {"name": name, "mime": block.mime_type,
                                                                        "data": block.data, "kind": "image"}))
            elif kind == "resource":
                resource = block.resource
                body = getattr(resource, "text", None)
                if body is None:  # a binary resource: stored like an attachment
                    name = resource.uri.rsplit("/", 1)[-1] or "file"
                    attachments.append(await self._call("attachments.put", {
                        "name": name, "mime": resource.mime_type or "application/octet-stream",
                        "data": resource.blob, "kind": "file"}))
                else:
                    texts.append(f"\n<file uri=\"{resource.uri}\">\n{body}\n</file>\n")
            elif kind == "resource_link":
                texts.append(f"{block.uri}")
            elif kind == "audio":
                raise RequestError.invalid_params({"reason": "pidesk takes no audio"})
        return " ".join(t for t in texts if t), attachments

    # ---- the host's events, in order ----------------------------------------------------------------

    async def _pump(self) -> None:
        async for event in self.link.events():
            try:
                await self._on_event(event)
            except asyncio.CancelledError:
                raise
            except Exception:  # one event the editor could not be told of must not end the connection
                log.exception("could not pass event %s on to the editor", event.get("type"))

    async def _on_event(self, event: dict[str, Any]) -> None:
        kind = event["type"]
        if kind.startswith("link."):
            await self._on_link(event)
            return
        session_id = event.get("sessionId") or (event.get("session") or {}).get("id") \
            or (event.get("approval") or {}).get("sessionId") or (event.get("request") or {}).get("sessionId")
        opened = self.sessions.get(session_id) if isinstance(session_id, str) else None
        if opened is None:
            return
        send = self._sender(opened.id)
        waiting = opened.prompt
        if kind == "session.updated":
            mode = event["session"]["mode"]
            if mode != opened.mode:
                opened.mode = mode
                await send(update_current_mode(mode))
        elif kind == "turn.started":
            if waiting is not None:
                waiting.turn_running = True
                if event.get("origin") == "execution":
                    waiting.execution_pending = False
        elif kind == "message.delta":
            opened.streamed.add(event["messageId"])
            await send(update_agent_message_text(event["text"]))
        elif kind == "message.appended" and event["message"]["role"] == "assistant":
            message = event["message"]
            for block in message["content"]:
                if block.get("type") == "thinking" and block.get("text") and not block.get("redacted"):
                    await send(update_agent_thought_text(block["text"]))
                elif block.get("type") == "text" and block.get("text") and message["id"] not in opened.streamed:
                    await send(update_agent_message_text(block["text"]))
            opened.streamed.discard(message["id"])
        elif kind == "message.appended":
            for block in event["message"]["content"]:
                if block.get("type") == "toolResult":
                    await send(translate.tool_result(block))
        elif kind == "tool.started":
            await send(translate.tool_started(event["toolCallId"], event["name"], event["args"], opened.root))
            if event["name"] == "ReportCriteria" and opened.criteria:
                for result in event["args"].get("results") or []:
                    if isinstance(result, dict) and isinstance(result.get("criterion"), str):
                        opened.reported[result["criterion"]] = str(result.get("outcome"))
                await send(update_plan(translate.criteria_entries(opened.criteria, opened.reported)))
        elif kind == "permission.requested":
            self._spawn(self._ask_permission(opened, event["request"]))
        elif kind == "plan.requested":
            self._spawn(self._ask_contract(opened, event["approval"]))
        elif kind == "plan.resolved":
            approval = event["approval"]
            if approval["status"] == "approved":
                if waiting is not None:
                    waiting.execution_pending = True
                if approval.get("kind") == "goal" and approval.get("criteria"):
                    opened.criteria, opened.reported = list(approval["criteria"]), {}
                    await send(update_plan(translate.criteria_entries(opened.criteria, opened.reported)))
        elif kind == "execution.changed":
            if waiting is not None and event["executionState"] in ("failed", "aborted", "interrupted", "completed"):
                waiting.execution_pending = False
                if not waiting.turn_running and not waiting.done.done():
                    waiting.done.set_result("aborted" if event["executionState"] != "completed" else "completed")
        elif kind == "turn.ended":
            await self._turn_ended(opened, event)

    async def _turn_ended(self, opened: Opened, event: dict[str, Any]) -> None:
        waiting = opened.prompt
        opened.streamed.clear()
        try:
            window = (await self.link.call("session.context", {"sessionId": opened.id})).get("window") or {}
            if window.get("limitTokens"):
                await self._sender(opened.id)(UsageUpdate(session_update="usage_update", used=window["usedTokens"],
                                                          size=window["limitTokens"]))
        except PideskError:
            pass  # the session went away meanwhile: nothing to measure
        if waiting is None or waiting.done.done():
            return
        waiting.turn_running = False
        if event["reason"] == "error":
            await self._sender(opened.id)(update_agent_message_text(translate.failure_text(event)))
        if waiting.execution_pending and event["reason"] == "completed" and not waiting.cancelled:
            return  # the approved contract's execution turn is next, within this prompt
        waiting.done.set_result(event["reason"])

    async def _on_link(self, event: dict[str, Any]) -> None:
        """The host went away: its turns ended with it (a restarted host records them interrupted)."""
        if event["type"] == "link.restored":
            for opened in self.sessions.values():
                if opened.servers:  # a session's MCP servers belonged to the lost connection
                    await self._set_servers(opened, None)
        if event["type"] in ("link.restored", "link.failed"):
            for opened in self.sessions.values():
                if opened.prompt is not None and not opened.prompt.done.done():
                    await self._sender(opened.id)(update_agent_message_text(
                        "\n\n[the pidesk host stopped during this turn]"))
                    opened.prompt.done.set_result("error")

    # ---- questions for the user ---------------------------------------------------------------------

    async def _ask_permission(self, opened: Opened, request: dict[str, Any]) -> None:
        answer = await self.conn.request_permission(session_id=opened.id,
                                                    tool_call=translate.permission_call(request, opened.root),
                                                    options=translate.permission_options(request))
        outcome = answer.outcome
        if not isinstance(outcome, AllowedOutcome):
            return  # cancelled: the prompt's cancel aborts the turn, and with it the request
        decision, remember = translate.PERMISSION_CHOICES.get(outcome.option_id, ("deny", None))
        params = {"requestId": request["id"], "sessionId": request["sessionId"], "turnId": request["turnId"],
                  "decision": decision}
        if remember:
            params["remember"] = remember
        await self._settle("permissions.resolve", params)

    async def _ask_contract(self, opened: Opened, approval: dict[str, Any]) -> None:
        full = await self.link.call("plans.get", {"approvalId": approval["id"]})
        answer = await self.conn.request_permission(session_id=opened.id,
                                                    tool_call=translate.contract_call(approval, full["markdown"]),
                                                    options=translate.CONTRACT_OPTIONS)
        outcome = answer.outcome
        if not isinstance(outcome, AllowedOutcome) or outcome.option_id not in translate.CONTRACT_CHOICES:
            return
        permission_mode = translate.CONTRACT_CHOICES[outcome.option_id]
        params: dict[str, Any] = {"approvalId": approval["id"], "sessionId": approval["sessionId"],
                                  "turnId": approval["turnId"],
                                  "decision": "approve" if permission_mode else "reject"}
        if permission_mode:
            params["permissionMode"] = permission_mode
        feedback = (getattr(answer, "field_meta", None) or {}).get("feedback") or \
            (getattr(outcome, "field_meta", None) or {}).get("feedback")
        if not permission_mode and isinstance(feedback, str) and feedback.strip():
            params["feedback"] = feedback
        await self._settle("plans.resolve", params)

    async def _settle(self, method: str, params: dict[str, Any]) -> None:
        try:
            await self.link.call(method, params)
        except PideskError as exc:  # answered elsewhere first (the web page), or the turn ended meanwhile
            log.info("%s: %s", method, exc.message)

    # ---- helpers ----------------------------------------------------------------------------------

    def _open(self, session: dict[str, Any]) -> Opened:
        opened = self.sessions.get(session["id"])
        if opened is None:
            opened = self.sessions[session["id"]] = Opened(id=session["id"], root=session["root"], mode=session["mode"])
        opened.mode = session["mode"]
        return opened

    def _opened(self, session_id: str) -> Opened:
        self._require_initialized()
        opened = self.sessions.get(session_id)
        if opened is None:
            raise RequestError(-32002, f"session {session_id!r} is not open here: session/new or session/load it "
                                       "first", {"sessionId": session_id})
        return opened

    def _require_initialized(self) -> None:
        if not self.initialized:
            raise RequestError(-32600, "initialize first: the connection has not been initialized")

    async def _set_servers(self, opened: Opened, servers: list[Any] | None) -> None:
        """The session's MCP servers on the host: ``servers`` as ACP gives them, or (None) those set before."""
        if servers is not None:
            if not servers and not opened.servers:
                return  # none before, none now: nothing to tell the host
            opened.servers = [mcp_server(s) for s in servers]
        await self._call("session.setPlugins", {"sessionId": opened.id, "servers": opened.servers})

    def _sender(self, session_id: str) -> Any:
        async def send(update: Any) -> None:
            await self.conn.session_update(session_id=session_id, update=update)
        return send

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("an editor question failed: %s", task.exception())

    async def _call(self, method: str, params: dict[str, Any]) -> Any:
        """A host call; its refusal becomes the JSON-RPC error the editor shows (message and pidesk code)."""
        try:
            return await self.link.call(method, params)
        except PideskError as exc:
            raise acp_error(exc) from None


def acp_error(exc: PideskError) -> RequestError:
    code = {Code.INVALID_PARAMS: -32602, Code.NOT_FOUND: -32002}.get(exc.code, -32000)
    return RequestError(code, exc.message, {"code": str(exc.code)})


def mcp_server(server: Any) -> dict[str, Any]:
    """An ACP McpServer as a ``session.setPlugins`` entry (stdio: argv and env; HTTP: url and headers). Names
    become what a server name may hold (they are part of the tools' names)."""
    name = re.sub(r"_+", "_", re.sub(r"[^A-Za-z0-9_-]", "-", str(server.name))).strip("_") or "server"
    url = getattr(server, "url", None)
    if url is not None:
        if getattr(server, "type", "http") == "sse":
            raise RequestError.invalid_params({"reason": f"MCP server {server.name!r}: SSE servers are not supported; "
                                                         "use its Streamable HTTP endpoint"})
        return {"name": name, "url": url, "headers": {h.name: h.value for h in server.headers or []}}
    entry: dict[str, Any] = {"name": name, "command": [server.command, *(server.args or [])]}
    if server.env:
        entry["env"] = {e.name: e.value for e in server.env}
    return entry
