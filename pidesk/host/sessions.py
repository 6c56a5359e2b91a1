"""Sessions: create, list, read, delete, rename, and configure while idle.

Configuration (mode, permission mode, delete) is accepted only while the
session is idle — no active turn, pending approval or queued/running execution
(seed 003 §3 rule 15) — and every mode change is audited. Plan and Goal need a
persisted project: a temporary session works in ``<data_dir>/scratch/<id>``.

A title is a label only: ``rename`` works in any state (1–200 characters, audited).
A session created without a title is named after its folder until its first
prompt is accepted, which then names it (``title_from_prompt``), so sessions of one
project (``pidesk run`` makes one per run) can be told apart. A refused prompt
changes nothing, its title included.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

from pidesk.core.errors import Code, Conflict, InvalidParams, StoreError
from pidesk.core.events import SessionDeleted
from pidesk.core.modes import Mode, PermissionMode, PlanState, SessionStatus
from pidesk.core.records import Session
from pidesk.core.transitions import ModeCause, change_mode
from pidesk.host import paging, validate
from pidesk.host.parts import Parts
from pidesk.ids import new_id, now_iso
from pidesk.store import repo


log = logging.getLogger("pidesk.sessions")
PROMPT_TITLE = 60  # characters of the first prompt that name an untitled session
_SPACE = re.compile(r"\s+")


class Sessions:
    def __init__(self, parts: Parts) -> None:
        self.p = parts

    def create(
        self,
        project_path: Any = None,
        title: Any = None,
        mode: Any = None,
        permission_mode: Any = None,
    ) -> Session:
        chosen_mode = validate.enum(mode or "agent", Mode, "mode")
        chosen_permission = validate.enum(permission_mode or "ask", PermissionMode, "permissionMode")
        session_id = new_id("s")
        if project_path is not None:
            project: Path | None = self.p.project(project_path)
            root = project
        else:
            if chosen_mode.is_contract:
                raise Conflict("Plan and Goal need a project; a temporary session has none",
                               Code.PLAN_WORKSPACE_REQUIRED)
            project = None
            root = self.p.store.scratch_root(session_id)
            root.mkdir(parents=True, exist_ok=True)
        now = now_iso()
        session = Session(
            id=session_id,
            title=validate.label(title, "title") if title is not None else _default_title(str(project) if project else None),
            project_path=str(project) if project else None,
            root=str(root),
            mode=chosen_mode,
            permission_mode=chosen_permission,
            status=SessionStatus.IDLE,
            plan_state=PlanState.PLANNING if chosen_mode.is_contract else PlanState.INACTIVE,
            current_turn_id=None,
            forked_from=None,
            created_at=now,
            updated_at=now,
        )
        self.p.store.create_session(session)
        self.p.publish_session(session_id)
        return session

    async def list(self, project_path: Any = None, limit: Any = None, cursor: Any = None) -> paging.Ready:
        """``session.list``, paged as ``paging`` says (at 10,000 sessions one unpaged read held the
        loop ~80 ms, and a batch of them seconds)."""
        if project_path is not None:
            project_path = str(validate.project_dir(project_path, must_exist=False))

        def read(after: paging.Key | None, count: int, newest_first: bool) -> list[Session]:
            with self.p.store.db.read() as db:
                return repo.list_sessions(db, project_path, limit=count, after=after, newest_first=newest_first)

        sessions, next_cursor = await paging.listing(read, _key, limit, cursor, "session.list")
        return paging.Ready(sessions=sessions, nextCursor=next_cursor)

    def delete(self, session_id: Any) -> None:
        session = self.p.session(validate.ident(session_id, "sessionId"))
        self._require_idle(session.id)
        self.p.store.delete_session(session.id)
        self.p.live.held_queues.discard(session.id)
        self.p.bus.publish(SessionDeleted(session_id=session.id))

    def rename(self, session_id: Any, title: Any) -> Session:
        """A new title, whatever the session is doing (a label changes nothing it may do)."""
        session = self.p.session(validate.ident(session_id, "sessionId"))
        name = validate.label(title, "title")
        if name != session.title:
            with self.p.store.db.tx() as db:
                repo.update_session(db, session.id, title=name)
                repo.audit(db, "session.renamed", session.id, frm=session.title, to=name)
        return self._published(session.id)

    def title_from_prompt(self, session_id: str, text: str) -> None:
        """Name a session still titled after its folder by its first prompt (called once the prompt is accepted).

        Best effort: the prompt has already been accepted, so a store that refuses the title
        leaves the folder's name (logged) rather than failing the prompt. Nor does it wait for the
        disk: 64 first prompts at once each waiting for an fsync of its title held the loop 50 ms.
        """
        session = self.p.session(session_id)
        if session.title != _default_title(session.project_path):
            return
        line = _SPACE.sub(" ", text).strip()
        with self.p.store.db.read() as db:
            if not line or len(repo.list_turns(db, session.id, 2)) > 1:
                return  # not its first prompt: a title equal to the folder's name was chosen
        name = line if len(line) <= PROMPT_TITLE else f"{line[:PROMPT_TITLE - 1].rstrip()}…"
        try:  # (not waiting for the disk: a title lost to a power cut is the folder's name again)
            with self.p.store.db.tx(durable=False) as db:
                repo.update_session(db, session.id, title=name)
        except StoreError as exc:
            log.warning("session %s keeps its folder's name: the store refused the title (%s)", session.id, exc)
            return
        self.p.publish_session(session.id)

    def check_project(self, path: Any) -> dict[str, Any]:
        """Whether ``path`` can be a session's project, and why not (``projects.check``, a pidesk addition)."""
        validate.text(path, "path")  # not text at all: INVALID_PARAMS, as for any method
        try:
            resolved = self.p.project(path, "path")
        except (InvalidParams, Conflict) as exc:
            return {"ok": False, "reason": str(exc)}
        return {"ok": True, "path": str(resolved)}

    def set_mode(self, session_id: Any, mode: Any) -> Session:
        session = self.p.session(validate.ident(session_id, "sessionId"))
        target = validate.enum(mode, Mode, "mode")
        self._require_idle(session.id)
        if target.is_contract and session.project_path is None:
            raise Conflict("Plan and Goal need a project; this session is temporary", Code.PLAN_WORKSPACE_REQUIRED)
        if target is not session.mode:
            change_mode(session.mode, target, ModeCause.USER)
            with self.p.store.db.tx() as db:
                repo.update_session(db, session.id, mode=target.value)
                repo.audit(db, "mode.changed", session.id, frm=session.mode.value, to=target.value, cause="user")
        return self._published(session.id)

    def set_permission_mode(self, session_id: Any, permission_mode: Any) -> Session:
        session = self.p.session(validate.ident(session_id, "sessionId"))
        target = validate.enum(permission_mode, PermissionMode, "permissionMode")
        self._require_idle(session.id)
        if target is not session.permission_mode:
            with self.p.store.db.tx() as db:
                repo.update_session(db, session.id, permission_mode=target.value)
                repo.audit(
                    db, "permission_mode.changed", session.id,
                    frm=session.permission_mode.value, to=target.value, cause="user",
                )
        return self._published(session.id)

    def focus(self, client_id: str, session_id: Any) -> None:
        """This client now shows ``session_id`` (or nothing); its unseen notifications are seen."""
        if session_id is None:
            self.p.live.focus.pop(client_id, None)
            return
        session = self.p.session(validate.ident(session_id, "sessionId"))
        self.p.live.focus[client_id] = session.id

    def _require_idle(self, session_id: str) -> None:
        if self.p.is_busy(session_id):
            raise Conflict(
                "the session is busy (a turn, a pending approval or a queued execution); "
                "wait for it to finish or abort it first",
                Code.AGENT_BUSY,
            )

    def _published(self, session_id: str) -> Session:
        session = self.p.publish_session(session_id)
        assert session is not None
        return session


def _default_title(project_path: str | None) -> str:
    return Path(project_path).name if project_path else "Scratch"


def _key(session: Session) -> tuple[str, str]:
    return session.created_at, session.id
