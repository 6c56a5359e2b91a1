"""The host side of one running turn: what the runtime's ``TurnContext`` asks for.

Every method names its turn; a turn that no longer owns its session can still
append history (late rows are recorded), but cannot change the session: its
tool calls are refused with ``TOOL_ABORTED`` before any policy or tool runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pidesk.core import policy
from pidesk.core.errors import Code
from pidesk.core.events import MessageAppended, MessageDelta, SessionUpdated, ToolFinished, ToolStarted
from pidesk.core.modes import Mode, PlanKind
from pidesk.core.records import Block, Message, Session, ToolCallBlock, Usage
from pidesk.core.transitions import ModeCause, change_mode
from pidesk.host import checkpoints
from pidesk.host.approvals import Approvals
from pidesk.host.bus import retrying_event
from pidesk.host.compaction import Compactions, span
from pidesk.host.delegates import Delegates
from pidesk.host.executions import Executions
from pidesk.host.instructions import Instructions, Prepared
from pidesk.host.live import LiveTurn
from pidesk.host.parts import Parts
from pidesk.host.permissions import Permissions
from pidesk.providers.base import ModelRequest, Retrying
from pidesk.runtime.compaction import Plan
from pidesk.runtime.loop import Nudge, ToolOutcome, TurnEnd
from pidesk.runtime.prompts import system_prompt
from pidesk.store import repo
from pidesk.host.tooling import TurnTools, tool_specs
from pidesk.tools import run_tool
from pidesk.tools.base import ToolResult


class HostTurnContext:
    def __init__(
        self, parts: Parts, live: LiveTurn, permissions: Permissions, approvals: Approvals, executions: Executions,
        delegates: Delegates, instructions: Instructions | None = None, compactions: Compactions | None = None,
    ) -> None:
        self.p = parts
        self.live = live
        self.session_id = live.session_id
        self.turn_id = live.turn_id
        self.agent = "main"
        self.permissions = permissions
        self.approvals = approvals
        self.executions = executions
        self.delegates = delegates
        self._tools: TurnTools | None = None
        self._session: Session | None = None
        self.instructions = instructions
        self._prepared: Prepared | None = None  # this turn's instruction files, skills and environment
        self._prompts: dict[Mode, str] = {}
        self.compactions = compactions or Compactions(parts)
        # the seqs of the first and last transcript messages of the last request's view (what the provider's
        # count of its input covers); never the messages themselves, which a waiting turn would hold
        self._span: tuple[int, int] | None = None

    def _current(self) -> Session:
        """The session row as this turn last read it. Nothing else changes its mode, root or project
        while the turn runs (configuration needs an idle session); ``_enter`` re-reads it."""
        if self._session is None:
            self._session = self.p.session(self.session_id)
        return self._session

    @property
    def stop_requested(self) -> bool:
        return self.live.stop_requested

    async def prepare(self) -> None:
        """Gather, once and off the loop, what every request of this turn tells the model beyond its
        transcript (pidesk.host.instructions); ``session.context`` reports it while the turn runs."""
        if self.instructions is not None:
            self._prepared = await self.instructions.for_turn(self._current())
            self.instructions.active[self.session_id] = self._prepared

    def system_prompt(self) -> str:
        session = self._current()
        prompt = self._prompts.get(session.mode)
        if prompt is None:
            prepared = self._prepared
            prompt = self._prompts[session.mode] = system_prompt(
                session.mode, session.root, prepared.context if prepared else None,
                prepared.environment if prepared else None)
        return prompt

    def tool_specs(self) -> list[dict[str, Any]]:
        return session_tool_specs(self.p, self._current(), goal_execution=self.live.goal is not None,
                                  unattended=self.live.unattended)

    async def history(self) -> list[Message]:
        # The session's view as kept between requests (host/views.py): what was appended since the
        # last request is decoded, nothing else. Never kept on this context: a turn lives through tool
        # runs, queueing for a step-gate slot and a person's answer, and the views' memory is bounded
        # (docs/reliability.md, "Load").
        view = await self.compactions.view_async(self.session_id, self.live)
        self._span = span(view)
        return view

    def compaction_due(self, request: ModelRequest, overflow: bool = False) -> Plan | None:
        return self.compactions.due(request, self.live, overflow)

    async def compacted(self, plan: Plan, summary: str) -> None:
        await self.compactions.record(self.session_id, self.turn_id, plan, summary, self.system_prompt(),
                                      self.tool_specs(), self.live)

    def compaction_failed(self, plan: Plan, detail: str) -> None:
        self.compactions.failed(self.session_id, self.turn_id, plan, detail)

    def retrying(self, retry: Retrying) -> None:
        self.p.bus.publish(retrying_event(self.session_id, self.turn_id, retry))

    def new_message_id(self) -> str:
        return self.p.store.new_message_id()

    def take_steers(self) -> list[str]:
        steers, self.live.steers = self.live.steers, []
        return steers

    def output_started(self) -> None:
        self.live.has_output = True

    def delta(self, message_id: str, text: str) -> None:
        self.p.bus.publish(MessageDelta(session_id=self.session_id, turn_id=self.turn_id, message_id=message_id, text=text))

    def add_usage(self, usage: Usage, prompt_tokens: int | None = None) -> None:
        with self.p.store.db.tx(durable=False) as db:
            repo.add_usage(db, self.turn_id, usage)
            if prompt_tokens and self._span is not None:
                self.compactions.observed(db, self.session_id, prompt_tokens, self._span)

    async def append(self, role: str, content: list[Block], message_id: str | None = None) -> Message:
        message: Message = await self.p.in_thread(
            self.p.store.append_message, self.session_id, self.turn_id, role, content, message_id
        )
        self.p.bus.publish(MessageAppended(session_id=self.session_id, turn_id=self.turn_id, message=message))
        return message

    def tool_started(self, call: ToolCallBlock) -> None:
        self.live.has_output = True
        self.p.bus.publish(ToolStarted(
            session_id=self.session_id, turn_id=self.turn_id, tool_call_id=call.id, name=call.name, args=call.args
        ))

    def tool_finished(self, call: ToolCallBlock, result: ToolResult, duration_ms: int) -> None:
        self.p.bus.publish(ToolFinished(
            session_id=self.session_id, turn_id=self.turn_id, tool_call_id=call.id, name=call.name,
            ok=result.ok, error_code=result.error_code, duration_ms=duration_ms,
        ))

    async def authorize(self, call: ToolCallBlock) -> policy.Allow | policy.Deny:
        if self.p.live.owns(self.session_id, self.turn_id) is None:
            return policy.Deny(Code.TOOL_ABORTED)
        return await self.permissions.authorize(self.live, call)

    async def run_tool(self, call: ToolCallBlock) -> ToolOutcome:
        changes = checkpoints.of(self.p)  # issue 17
        await changes.before_call(self.live)  # the workspace as the turn found it is recorded first
        outcome = await self._dispatch(call)
        changes.after_call(self.live, call)  # then as the call left it
        return outcome

    async def _dispatch(self, call: ToolCallBlock) -> ToolOutcome:
        match call.name:
            case "EnterPlanMode":
                return self._enter(Mode.PLAN)
            case "EnterGoalMode":
                return self._enter(Mode.GOAL)
            case "SubmitPlan":
                return await self.approvals.submit(self.live, call, PlanKind.PLAN)
            case "SubmitGoal":
                return await self.approvals.submit(self.live, call, PlanKind.GOAL)
            case "ReportCriteria":
                return self.executions.report(self.live, call)
            case "Task":
                return self.delegates.start(self.live, call)
            case "TaskWait":
                return await self.delegates.wait(self.live, call)
            case "NewContext":
                summary = call.args.get("summary")
                if not isinstance(summary, str) or not summary.strip():
                    return ToolOutcome(ToolResult.error(Code.INVALID_ARGUMENTS, "summary must be a non-empty string"))
                return ToolOutcome(ToolResult(ok=True, output=summary))
        plugins = self.p.plugins(self.session_id)
        if plugins is not None and plugins.risk_of(call.name) is not None:
            return ToolOutcome(await plugins.call(call.name, call.args, stopped=lambda: self.live.stop_requested))
        tool = self._turn_tools().tool(call.name, call.args, self._current().mode)
        if tool is None:
            return ToolOutcome(ToolResult.error(Code.TOOL_NOT_FOUND, f"{call.name} is not available in this host"))
        return ToolOutcome(await run_tool(tool, call.args))

    def may_end(self, nudged: bool) -> TurnEnd | Nudge:
        return self.executions.may_end(self.live, nudged)

    def _enter(self, target: Mode) -> ToolOutcome:
        if self.live.approval_id is not None:  # seed 003 §3 rule 15: no new contract while one executes
            return ToolOutcome(ToolResult.error(
                Code.PLAN_ALREADY_ACTIVE, "an approved contract is executing; finish it before proposing another"))
        session = self.p.session(self.session_id)
        mode = change_mode(session.mode, target, ModeCause.AGENT)
        with self.p.store.db.tx() as db:
            repo.update_session(db, self.session_id, mode=mode.value)
            repo.audit(db, "mode.changed", self.session_id, self.turn_id, frm=session.mode.value, to=mode.value,
                       cause="agent")
        updated = self._session = self.p.session(self.session_id)
        self.p.bus.publish(SessionUpdated(session=updated))
        submit = "SubmitPlan" if target is Mode.PLAN else "SubmitGoal"
        return ToolOutcome(ToolResult(ok=True, output=(
            f"{target.value.title()} mode entered. Investigate (Write and Edit are disabled), then call {submit}."
        )))

    async def close(self) -> None:
        if self.instructions is not None and self._prepared is not None \
                and self.instructions.active.get(self.session_id) is self._prepared:
            del self.instructions.active[self.session_id]
        if self._tools is not None:
            await self._tools.aclose()

    def _turn_tools(self) -> TurnTools:
        if self._tools is None:
            self._tools = TurnTools(self.p, Path(self._current().root))
        return self._tools


def session_tool_specs(parts: Parts, session: Session, *, goal_execution: bool = False,
                       unattended: bool = False) -> list[dict[str, Any]]:
    """The tool specs a request of ``session`` offers the model, as its mode and turn allow."""
    names = policy.visible_tools(session.mode, temporary=session.project_path is None,
                                 goal_execution=goal_execution, unattended=unattended)
    specs = tool_specs(parts.config, names, session.mode)
    plugins = parts.plugins(session.id)
    if plugins is not None and not session.mode.is_contract:  # plugin tools are Agent-only
        specs += [tool.spec for tool in plugins.tools()]
    return specs
