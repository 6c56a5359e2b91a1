"""What the host knows only in memory: the running turns and who is looking.

Nothing here is authoritative about durable state — the store is. A host
restart loses all of it by design: recovery then interrupts what was in flight
(fail closed), and no waiter can be resumed.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from pidesk.core.modes import TurnOrigin
from pidesk.core.records import Draft


@dataclass
class GoalProgress:
    """A Goal execution's criteria and the last outcome reported for each."""

    criteria: list[str]
    outcomes: dict[str, str] = field(default_factory=dict)

    def unreported(self) -> list[str]:
        return [c for c in self.criteria if c not in self.outcomes]


@dataclass
class LiveTurn:
    session_id: str
    turn_id: str
    origin: TurnOrigin
    unattended: bool
    draft: Draft | None = None
    root_message_id: str | None = None
    root_seq: int | None = None  # the seq of that prompt (an execution's instructions, kept by its compaction)
    contract_context_done: bool = False  # an execution's approved context (compact, fresh) is applied
    task: asyncio.Task[None] | None = None
    approval_id: str | None = None  # set on an execution turn
    goal: GoalProgress | None = None
    decided: bool = False  # the terminal reason is recorded; nothing may restate it
    stop_requested: bool = False
    has_output: bool = False  # assistant text or a tool row began (smart stop restores no draft)
    steers: list[str] = field(default_factory=list)
    permission_waiters: dict[str, asyncio.Future[tuple[bool, bool]]] = field(default_factory=dict)
    delegates: dict[str, asyncio.Task[str]] = field(default_factory=dict)  # Task id -> its child agent
    approval_waiter: tuple[str, asyncio.Future[str]] | None = None


@dataclass
class Live:
    turns: dict[str, LiveTurn] = field(default_factory=dict)  # session id -> its active turn
    focus: dict[str, str] = field(default_factory=dict)  # client id -> focused session id
    held_queues: set[str] = field(default_factory=set)  # sessions whose restored queue waits for a client
    compacting: set[str] = field(default_factory=set)  # sessions a session.compact is summarising (busy)
    clients: set[str] = field(default_factory=set)  # the WebSocket clients connected now

    def owns(self, session_id: str, turn_id: str) -> LiveTurn | None:
        """The live turn ``turn_id`` if it still owns its session and is not finalizing."""
        live = self.turns.get(session_id)
        if live is None or live.turn_id != turn_id or live.decided:
            return None
        return live

    def visible(self, session_id: str) -> bool:
        return session_id in self.focus.values()
