"""Compaction (issue 30): when the model's view is folded into a summary, the host's note that opens
the view after one, and the window figures ``session.context`` reports.

**When.** Before each model request of a turn, the host expects the request's input size: the
provider's own count for the session's last request plus an estimate (four characters a token)
of the messages added since, or, before any count or after the view changed, an estimate of the
whole request. Past ``compact_at`` (0.85) of the window it plans a compaction: the messages
before the newest user message (the request being worked on, a steer) are summarised and that
message on stays in view verbatim — or nothing stays, when the tail alone would take more than
``KEEP_FRACTION`` of the window. A provider's refusal of an input as too long plans one the same
way, for one retry. An execution whose approval asked for ``context: "compact"`` or ``"fresh"``
plans one before its first request, keeping its instructions (the contract's text): ``fresh``
with no summary at all. ``session.compact`` compacts an idle session now, keeping nothing.

**The note.** The view after a cut opens with the host's record of the session — the mode, the
permission mode, the contract awaiting a decision or being carried out (path and sha256; the
text of an execution's contract when its instructions are out of view), a goal's criteria and
what was reported of each — built from the host's records at each request, never from the
summary. A compaction changes none of that state: it appends one message (a ``CompactionBlock``)
and counts itself. Approving, rejecting, entering or leaving Plan and Goal stay what they were:
the host's, through their own calls.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pidesk.core.errors import Code, Conflict
from pidesk.core.events import ContextCompacted, MessageAppended
from pidesk.core.modes import Mode
from pidesk.core.records import CompactionBlock, Message, PlanApproval, Session
from pidesk.host.live import LiveTurn
from pidesk.host.parts import Parts
from pidesk.host.views import Views
from pidesk.providers.base import ModelRequest
from pidesk.runtime.compaction import Plan, Refused, summarise
from pidesk.runtime.context_window import ViewState, estimate_request, estimate_tokens
from pidesk.store import repo
from pidesk.store.artifacts import read_artifact, sha256_of

log = logging.getLogger("pidesk.compaction")

KEEP_FRACTION = 0.3  # the most of the window the verbatim tail after a summary may take
NOTE_CONTRACT_CHARS = 100_000  # of a contract's text the note carries (an approved plan is rarely longer)


@dataclass
class _Seen:
    """The session's last model request as the provider counted it."""

    prompt_tokens: int
    first_seq: int  # the seq of the view's first transcript message then (a new cut changes it)
    last_seq: int  # the seq of its last


class Compactions:
    def __init__(self, parts: Parts) -> None:
        self.p = parts
        self._seen: dict[str, _Seen] = {}
        self.views = Views(parts.store.transcripts, self.limit)  # each session's view, kept between requests

    @property
    def limit(self) -> int:
        return self.p.config.context_limit

    # ---- the view ---------------------------------------------------------------------------

    def view(self, session_id: str, live: LiveTurn | None = None) -> list[Message]:
        """What the model sees of the session now (blocking: in a worker thread, or where waiting is fine)."""
        view = self.views.read(session_id, lambda state: self.note(session_id, live, state))
        assert view is not None
        return view

    async def view_async(self, session_id: str, live: LiveTurn | None = None) -> list[Message]:
        """``view`` for a request: on the event loop when its view is warm and little is new (most
        requests), else in a worker thread (host/views.py)."""
        def note(state: ViewState) -> str:
            return self.note(session_id, live, state)

        view = self.views.read(session_id, note, quick=True)
        if view is None:
            view = await asyncio.to_thread(self.views.read, session_id, note)
        assert view is not None
        return view

    def note(self, session_id: str, live: LiveTurn | None, state: ViewState | None = None) -> str:
        """The host's record of the session's state, for the model, after a cut (``state``: the view it
        opens; None: one with no compaction)."""
        session = self.p.session(session_id)
        lines = ["[The host's record of this session, from its own state — authoritative]",
                 f"Mode: {_MODE_WORDS[session.mode]}", f"Permission mode: {session.permission_mode.value}."]
        with self.p.store.db.read() as db:
            pending = repo.approvals(db, session_id=session_id, pending=True)
            executing = repo.get_approval(db, live.approval_id) if live and live.approval_id else None
        for approval in pending:
            lines.append(f"A {approval.kind.value} awaits the user's decision: {approval.artifact_path} (sha256 "
                         f"{approval.artifact_sha256}). It is not approved: only the user approves or rejects it.")
        if executing is not None:
            lines += self._execution(session, executing, live, state)
        if not pending and executing is None:
            lines.append("No plan or goal is awaiting a decision or being carried out.")
        lines.append("Nothing in the summary below approves anything or changes any of this.")
        return "\n".join(lines)

    def _execution(self, session: Session, approval: PlanApproval, live: LiveTurn | None,
                   state: ViewState | None) -> list[str]:
        mode = approval.permission_mode.value if approval.permission_mode else "?"
        lines = [f"Carrying out the approved {approval.kind.value} {approval.artifact_path} (sha256 "
                 f"{approval.artifact_sha256}), approved with permission mode {mode}."]
        if live is not None and live.goal is not None:
            lines.append("Acceptance criteria, and what was reported so far (report each with ReportCriteria):")
            lines += [f"- {c}: {live.goal.outcomes.get(c, 'not reported yet')}" for c in live.goal.criteria]
        if live is None or live.root_seq is None or (state is not None and not state.in_view(live.root_seq)):
            text = self._contract_text(session, approval)
            lines.append(f"Its text:\n{text}" if text is not None else
                         "Its file changed or vanished since the approval: stop and tell the user.")
        return lines

    @staticmethod
    def _contract_text(session: Session, approval: PlanApproval) -> str | None:
        if session.project_path is None:
            return None
        try:
            data = read_artifact(Path(session.project_path), approval.artifact_path)
        except OSError:
            return None
        if data is None or sha256_of(data) != approval.artifact_sha256:
            return None
        return data.decode("utf-8", "replace")[:NOTE_CONTRACT_CHARS]

    # ---- when --------------------------------------------------------------------------------

    def observed(self, db: sqlite3.Connection, session_id: str, prompt_tokens: int, seqs: tuple[int, int]) -> None:
        """A request's input size as the provider counted it (``seqs``: the ``span`` of its view), in
        ``db``'s transaction."""
        if prompt_tokens > 0:
            self._seen[session_id] = _Seen(prompt_tokens, *seqs)
            repo.set_context_tokens(db, session_id, prompt_tokens)

    def expected(self, request: ModelRequest) -> int:
        """The input size ``request`` will have, as well as the host can tell before sending it."""
        seen = self._seen.get(request.session_id)
        now = span(request.messages)
        if seen is not None and now is not None and now[0] == seen.first_seq and now[1] >= seen.last_seq:
            added = 0
            for message in reversed(request.messages):  # (only what came after: never the whole view)
                if message.seq <= seen.last_seq:
                    break
                added += estimate_tokens(message)
            return seen.prompt_tokens + added
        return estimate_request(request.system, request.tools, request.messages)

    def due(self, request: ModelRequest, live: LiveTurn, overflow: bool = False) -> Plan | None:
        """What to compact before ``request`` (None: nothing)."""
        before = self.expected(request)
        if live.approval_id is not None and not live.contract_context_done:
            live.contract_context_done = True
            with self.p.store.db.read() as db:
                approval = repo.get_approval(db, live.approval_id)
            if approval is not None and approval.context in ("compact", "fresh") and live.root_seq is not None:
                return Plan("manual" if approval.context == "compact" else "fresh", before, keep_from=live.root_seq,
                            summarise=approval.context == "compact")
        if not overflow and before <= self.limit * self.p.config.compact_at:
            return None
        real = [m for m in request.messages if m.seq > 0]
        if len(real) < 2:
            return None  # nothing older than the newest message: only the guard in model_view can help
        return Plan("auto", before, keep_from=self._tail(real))

    def _tail(self, messages: list[Message]) -> int | None:
        """Where the verbatim tail after a summary starts: the newest user message, if the tail from it
        fits in ``KEEP_FRACTION`` of the window (and something older is left to summarise)."""
        budget = self.limit * KEEP_FRACTION
        size = 0
        for index in range(len(messages) - 1, 0, -1):
            message = messages[index]
            size += estimate_tokens(message)
            if size > budget:
                return None
            if message.role == "user" and message.text().strip():
                return message.seq
        return None

    # ---- recording ---------------------------------------------------------------------------

    async def record(self, session_id: str, turn_id: str | None, plan: Plan, summary: str,
                     system: str, tools: list[dict[str, Any]], live: LiveTurn | None = None) -> Message:
        """Append the compaction's message, count it, and say so (``context.compacted``)."""
        block = CompactionBlock(summary=summary, reason=plan.reason, tokens_before=plan.tokens_before,
                                tokens_after=0, kept_from_seq=plan.keep_from)
        after = await asyncio.to_thread(self.views.after, session_id, _draft(session_id, block),
                                        lambda state: self.note(session_id, live, state))
        block.tokens_after = estimate_request(system, tools, after)
        message: Message = await self.p.in_thread(self.p.store.append_message, session_id, turn_id, "user", [block])
        self.p.store.faults.hit("compaction.after_append")
        self._seen.pop(session_id, None)
        with self.p.store.db.tx() as db:
            repo.set_context_tokens(db, session_id, block.tokens_after)
            repo.audit(db, "context.compacted", session_id, turn_id, reason=plan.reason,
                       tokens_before=plan.tokens_before, tokens_after=block.tokens_after)
        self.p.bus.publish(MessageAppended(session_id=session_id, turn_id=turn_id, message=message))
        self.p.bus.publish(ContextCompacted(
            session_id=session_id, turn_id=turn_id, message_id=message.id, reason=plan.reason,
            tokens_before=plan.tokens_before, tokens_after=block.tokens_after, summary=summary))
        return message

    def failed(self, session_id: str, turn_id: str | None, plan: Plan, detail: str) -> None:
        log.warning("compaction of %s failed: %s", session_id, detail)
        with self.p.store.db.tx() as db:
            repo.audit(db, "context.compaction_failed", session_id, turn_id, reason=plan.reason, error=detail[:500])

    # ---- session.compact and session.context ---------------------------------------------------

    async def compact_now(self, session_id: str, instructions: str, system: str,
                          tools: list[dict[str, Any]]) -> dict[str, bool]:
        """``session.compact``: fold the whole view into a summary now. The caller holds the session
        in ``live.compacting`` (busy) throughout."""
        view = await asyncio.to_thread(self.view, session_id)
        if not any(m.seq > 0 and _compaction(m) is None for m in view):
            return {"compacted": False}  # nothing since the last cut
        request = ModelRequest(session_id=session_id, turn_id="", system=system, messages=view, tools=tools)
        plan = Plan("manual", self.expected(request), instructions=instructions)
        outcome = await summarise(self.p.provider, request, view, plan.instructions)
        if isinstance(outcome, Refused):
            self.failed(session_id, None, plan, outcome.done.detail or str(outcome.done.error_code))
            raise Conflict(f"the model gave no summary: {outcome.done.detail or outcome.done.error_code}",
                           Code.PROVIDER_ERROR)
        if outcome.usage is not None:  # (no turn to count it on: the session's own)
            with self.p.store.db.tx(durable=False) as db:
                repo.add_session_usage(db, session_id, outcome.usage.as_usage())
        await self.record(session_id, None, plan, outcome.text, system, tools)
        return {"compacted": True}

    async def window(self, session_id: str, estimate: int) -> dict[str, int]:
        """``session.context``'s ``window``: the last request's input (``estimate`` before any), and how
        many compactions the transcript holds (kept with its view: counted in a worker thread once)."""
        with self.p.store.db.read() as db:
            used = repo.context_tokens(db, session_id)
        compactions = await asyncio.to_thread(self.views.compactions, session_id)
        return {"usedTokens": used or estimate, "limitTokens": self.limit, "compactions": compactions}


_MODE_WORDS = {
    Mode.AGENT: "Agent — work on the user's requests with the tools you have.",
    Mode.PLAN: "Plan — Write, Edit and plugin tools are disabled; investigate, then submit a plan with SubmitPlan.",
    Mode.GOAL: "Goal — Write, Edit and plugin tools are disabled; investigate, then submit a goal with SubmitGoal.",
}


def span(view: list[Message]) -> tuple[int, int] | None:
    """The seqs of the first and last transcript messages of a view (None: it holds none)."""
    first = next((m.seq for m in view if m.seq > 0), None)  # (the opening notes come first: a step or two)
    last = next((m.seq for m in reversed(view) if m.seq > 0), None)
    return (first, last) if first is not None and last is not None else None


def _compaction(message: Message) -> CompactionBlock | None:
    return next((b for b in message.content if isinstance(b, CompactionBlock)), None)


def _draft(session_id: str, block: CompactionBlock) -> Message:
    """The compaction's message as it will stand (for the size of the view after it)."""
    return Message(id="m_draft", session_id=session_id, turn_id=None, seq=1 << 62, role="user",
                   content=[block], created_at="")
