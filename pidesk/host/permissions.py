"""The policy gate: every tool call is decided here from durable state.

``authorize`` reads the session's mode and permission mode from the store on
every call (never from the runtime or a client), applies ``core.policy``, then
the path rules (decided before any Ask, whatever the mode or grants; they
include the host's own data directory), then — for an Ask — creates a durable
permission request and waits for its answer. Grants are session-scoped "always
allow" records, consulted in Agent mode only, so they never lift a contract-mode
deny. Every denial is audited with its code.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from pidesk.core import policy
from pidesk.core.errors import Code, Conflict, InvalidParams, NotFound
from pidesk.core.events import PermissionRequested, PermissionResolved
from pidesk.core.modes import Mode, PermissionStatus, SessionStatus
from pidesk.core.records import PermissionRequest, ToolCallBlock
from pidesk.host import checkpoints, validate
from pidesk.host.live import LiveTurn
from pidesk.host.parts import Parts
from pidesk.ids import new_id, now_iso
from pidesk.store import repo
from pidesk.tools.workspace import check_paths


class Permissions:
    def __init__(self, parts: Parts) -> None:
        self.p = parts

    async def authorize(self, live: LiveTurn, call: ToolCallBlock, *, delegate: bool = False
                        ) -> policy.Allow | policy.Deny:
        session = self.p.session(live.session_id)
        escalated = policy.is_escalation(call.name, call.args)
        with self.p.store.db.read() as db:
            granted = session.mode is Mode.AGENT and repo.has_grant(db, session.id, policy.grant_key(call.name, escalated))
        plugins = self.p.plugins(session.id)
        decision = policy.decide(
            session.mode, session.permission_mode, call.name,
            plugin_risk=plugins.risk_of(call.name) if plugins is not None else None,
            granted=granted, temporary=session.project_path is None, delegate=delegate,
            unattended=live.unattended, escalated=escalated,
        )
        if not isinstance(decision, policy.Deny):
            path_verdict = check_paths(call.name, call.args, Path(session.root), self.p.store.data_dir)
            if path_verdict is not None:
                decision = policy.Deny(path_verdict)
        if isinstance(decision, policy.Ask) and live.unattended:
            decision = policy.Deny(Code.PERMISSION_REQUIRED)
        if isinstance(decision, policy.Deny):
            self._audit_denial(live, call, decision.code, session.mode)
            return decision
        if isinstance(decision, policy.Allow):
            return decision
        return await self._ask(live, call, Path(session.root))

    async def _ask(self, live: LiveTurn, call: ToolCallBlock, root: Path) -> policy.Allow | policy.Deny:
        # (a diff of a big file is seconds of pure Python: off the loop, bounded, and kept with the request)
        shown = await asyncio.to_thread(checkpoints.preview, call.name, call.args, root)
        request = PermissionRequest(
            id=new_id("p"), session_id=live.session_id, turn_id=live.turn_id, tool_call_id=call.id,
            tool=call.name, args=call.args, status=PermissionStatus.PENDING, created_at=now_iso(), resolved_at=None,
            preview=shown,
            escalated=policy.is_escalation(call.name, call.args),
        )
        future: asyncio.Future[tuple[bool, bool]] = asyncio.get_running_loop().create_future()
        live.permission_waiters[request.id] = future
        try:
            with self.p.store.db.tx() as db:
                repo.insert_request(db, request)
                repo.set_status(db, live.session_id, SessionStatus.RUNNING, SessionStatus.WAITING_PERMISSION,
                                live.turn_id)
            self.p.bus.publish(PermissionRequested(request=request))
            self.p.publish_session(live.session_id)
            allowed, _remember = await future
        finally:
            live.permission_waiters.pop(request.id, None)
        if allowed:
            return policy.ALLOW
        self._audit_denial(live, call, Code.TOOL_DENIED, None)
        return policy.Deny(Code.TOOL_DENIED)

    def resolve(self, request_id: Any, session_id: Any, turn_id: Any, decision: Any, remember: Any = None) -> None:
        request_id = validate.ident(request_id, "requestId")
        session_id = validate.ident(session_id, "sessionId")
        turn_id = validate.ident(turn_id, "turnId")
        if decision not in ("allow", "deny"):
            raise InvalidParams(f"decision must be 'allow' or 'deny'; got {decision!r}")
        if remember not in (None, "session"):
            raise InvalidParams(f"remember must be 'session' or absent; got {remember!r}")
        with self.p.store.db.read() as db:
            request = repo.get_request(db, request_id)
            turn = repo.get_turn(db, turn_id)
        if request is None:
            raise NotFound(f"no permission request {request_id!r}")
        if turn is None:
            raise NotFound(f"no turn {turn_id!r}")
        live = self.p.live.owns(turn.session_id, turn.id)
        if live is None:
            raise Conflict(f"turn {turn_id} has ended; its permission requests are settled", Code.TURN_ENDED)
        future = live.permission_waiters.get(request.id)
        if request.status is not PermissionStatus.PENDING or future is None or future.done():
            raise Conflict(f"permission request {request_id} is already settled", Code.STALE_REQUEST)
        if request.session_id != session_id or request.turn_id != turn_id:
            raise Conflict("the request belongs to another session or turn", Code.STALE_REQUEST)
        allowed = decision == "allow"
        status = PermissionStatus.ALLOWED if allowed else PermissionStatus.DENIED
        with self.p.store.db.tx() as db:
            repo.settle_request(db, request.id, status)
            repo.set_status(db, session_id, SessionStatus.WAITING_PERMISSION, SessionStatus.RUNNING, turn_id)
            repo.audit(db, "permission.resolved", session_id, turn_id, tool=request.tool, decision=decision,
                       escalated=request.escalated)
            if allowed and remember == "session":
                grant = policy.grant_key(request.tool, request.escalated)
                repo.insert_grant(db, session_id, grant)
                repo.audit(db, "grant.created", session_id, turn_id, tool=grant, scope="session")
        future.set_result((allowed, remember == "session"))
        with self.p.store.db.read() as db:
            settled = repo.get_request(db, request.id)
        assert settled is not None
        self.p.bus.publish(PermissionResolved(request=settled))
        self.p.publish_session(session_id)

    def pending(self, session_id: Any = None) -> list[PermissionRequest]:
        if session_id is not None:
            session_id = self.p.session(validate.ident(session_id, "sessionId")).id
        with self.p.store.db.read() as db:
            return repo.pending_requests(db, session_id)

    def _audit_denial(self, live: LiveTurn, call: ToolCallBlock, code: str, mode: Mode | None) -> None:
        with self.p.store.db.tx() as db:
            repo.audit(
                db, "tool.denied", live.session_id, live.turn_id, tool=call.name, code=str(code),
                mode=mode.value if mode else None,
            )
