"""Forks (seed 003 §3 rules 10–11): a new idle session from an idle source's transcript.

The child gets a new transcript and one index transaction; the source is never
touched. With ``throughMessageId`` the snapshot ends inclusively at that message.
The child shares no turn, permission wait, runtime or provider state: copied
messages keep their seq but get new ids and no turn attribution.
"""

from __future__ import annotations

from typing import Any

from pidesk.core.errors import Code, Conflict, NotFound
from pidesk.core.modes import PlanState, SessionStatus
from pidesk.core.records import ForkedFrom, Message, Session
from pidesk.host import validate
from pidesk.host.parts import Parts
from pidesk.ids import new_id, now_iso


class Forks:
    def __init__(self, parts: Parts) -> None:
        self.p = parts

    def fork(self, session_id: Any, through_message_id: Any = None) -> Session:
        source = self.p.session(validate.ident(session_id, "sessionId"))
        through_seq = None
        if through_message_id is not None:
            through_message_id = validate.ident(through_message_id, "throughMessageId")
            through_seq = self.p.store.message_seq(source.id, through_message_id)
            if through_seq is None:
                raise NotFound(f"no message {through_message_id!r} in session {source.id}")
        if self.p.is_busy(source.id):
            raise Conflict("only an idle session can be forked", Code.AGENT_BUSY)
        child_id = new_id("s")
        if source.project_path is None:
            root = self.p.store.scratch_root(child_id)
            root.mkdir(parents=True, exist_ok=True)
        now = now_iso()
        child = Session(
            id=child_id, title=f"{source.title} (fork)", project_path=source.project_path,
            root=source.root if source.project_path else str(root), mode=source.mode,
            permission_mode=source.permission_mode, status=SessionStatus.IDLE,
            plan_state=PlanState.PLANNING if source.mode.is_contract else PlanState.INACTIVE,
            current_turn_id=None,
            forked_from=ForkedFrom(session_id=source.id, through_message_id=through_message_id),
            created_at=now, updated_at=now,
        )
        copied = [
            Message(id=new_id("m"), session_id=child_id, turn_id=None, seq=m.seq, role=m.role,
                    content=m.content, created_at=m.created_at)
            for m in self.p.store.messages(source.id, through_seq)
        ]
        self.p.store.create_session(child, copied)
        published = self.p.publish_session(child_id)
        assert published is not None
        return published
