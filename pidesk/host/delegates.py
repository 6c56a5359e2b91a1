"""Delegates: Task starts a child agent inside the parent's turn; TaskWait collects results.

A delegate has its own context (its messages live in memory, not in the
session's transcript) and works under its parent's durable mode: every call it
makes is authorized by the host from the session's mode and permission state,
with ``delegate=True`` so it can never change the mode, submit or report a
contract, or start tasks of its own. Its Asks reach the user as the parent
turn's permission requests. Seed 003 §3 rule 17: a parent that ends its loop
while delegates run keeps its turn open until they finish; a parent that ends in
error, or is aborted, cancels them (their Bash process groups are killed by the
tool on cancellation).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from pidesk.core import policy
from pidesk.core.errors import Code
from pidesk.core.events import ToolFinished, ToolStarted
from pidesk.core.records import Block, Message, TextBlock, ToolCallBlock, Usage
from pidesk.host.instructions import Instructions
from pidesk.host import checkpoints
from pidesk.host.bus import retrying_event
from pidesk.host.live import LiveTurn
from pidesk.host.parts import Parts
from pidesk.host.permissions import Permissions
from pidesk.ids import new_id, now_iso
from pidesk.providers.base import ModelRequest, Retrying
from pidesk.runtime.compaction import Plan
from pidesk.runtime.context_window import model_view
from pidesk.runtime.loop import Completed, Failed, Nudge, ToolOutcome, TurnEnd, run_turn
from pidesk.runtime.prompts import system_prompt
from pidesk.store import repo
from pidesk.host.tooling import TurnTools, tool_specs
from pidesk.tools import run_tool
from pidesk.tools.base import ToolResult

MAX_DELEGATES = 8


class Delegates:
    def __init__(self, parts: Parts, permissions: Permissions, instructions: Instructions | None = None) -> None:
        self.p = parts
        self.permissions = permissions
        self.instructions = instructions

    def start(self, live: LiveTurn, call: ToolCallBlock) -> ToolOutcome:
        description, prompt = call.args.get("description"), call.args.get("prompt")
        if not isinstance(description, str) or not isinstance(prompt, str) or not prompt.strip():
            return ToolOutcome(ToolResult.error(Code.INVALID_ARGUMENTS, "Task needs a description and a prompt"))
        if len(live.delegates) >= MAX_DELEGATES:
            return ToolOutcome(ToolResult.failure(f"at most {MAX_DELEGATES} tasks per turn"))
        task_id = f"task_{len(live.delegates) + 1}"
        context = DelegateContext(self.p, live, self.permissions, task_id, description, prompt, self.instructions)
        live.delegates[task_id] = asyncio.create_task(context.run(), name=f"{live.turn_id} {task_id}")
        return ToolOutcome(ToolResult(ok=True, output=f"Started {task_id}: {description}. Collect it with TaskWait."))

    async def wait(self, live: LiveTurn, call: ToolCallBlock) -> ToolOutcome:
        ids = call.args.get("taskIds")
        if not isinstance(ids, list) or not ids or not all(isinstance(i, str) for i in ids):
            return ToolOutcome(ToolResult.error(Code.INVALID_ARGUMENTS, "taskIds must be a list of task ids"))
        unknown = [i for i in ids if i not in live.delegates]
        if unknown:
            return ToolOutcome(ToolResult.failure(f"unknown tasks: {', '.join(unknown)}"))
        results = await asyncio.gather(*(live.delegates[i] for i in ids))
        return ToolOutcome(ToolResult(ok=True, output="\n\n".join(f"## {i}\n{r}" for i, r in zip(ids, results))))

    @staticmethod
    async def settle(live: LiveTurn, end: TurnEnd) -> None:
        """Rule 17: a completed parent waits for its delegates; a failed one cancels them."""
        running = [t for t in live.delegates.values() if not t.done()]
        if not running:
            return
        if isinstance(end, Completed):
            await asyncio.gather(*running, return_exceptions=True)
            return
        await cancel(live)


async def cancel(live: LiveTurn) -> None:
    running = [t for t in live.delegates.values() if not t.done()]
    for task in running:
        task.cancel()
    await asyncio.gather(*running, return_exceptions=True)


class DelegateContext:
    """The runtime's TurnContext for a child agent: its own memory, its parent's authority."""

    def __init__(self, parts: Parts, live: LiveTurn, permissions: Permissions, task_id: str,
                 description: str, prompt: str, instructions: Instructions | None = None) -> None:
        self.p = parts
        self.live = live
        self.permissions = permissions
        self.session_id = live.session_id
        self.turn_id = live.turn_id
        self.agent = task_id
        self.description = description
        self.messages: list[Message] = []
        self._prompt = prompt
        self._tools: TurnTools | None = None
        self.instructions = instructions

    async def run(self) -> str:
        await self.append("user", [TextBlock(text=self._prompt)])
        end = await run_turn(self, self.p.provider, self.p.gate)  # type: ignore[arg-type]
        if isinstance(end, Failed):
            return f"{self.agent} failed: {end.code}"
        last = next((m for m in reversed(self.messages) if m.role == "assistant" and m.text()), None)
        return last.text() if last else "(no answer)"

    @property
    def stop_requested(self) -> bool:
        return self.live.stop_requested

    def system_prompt(self) -> str:
        """The parent turn's prompt (its instruction files, skills and environment), then the task."""
        session = self.p.session(self.session_id)
        prepared = self.instructions.active.get(self.session_id) if self.instructions is not None else None
        base = system_prompt(session.mode, session.root, prepared.context if prepared else None,
                             prepared.environment if prepared else None)
        return (f"{base}\n\nYou are a delegate working on one task: "
                f"{self.description}. Answer with what you found; you cannot submit plans or change modes.")

    def tool_specs(self) -> list[dict[str, Any]]:
        session = self.p.session(self.session_id)
        names = policy.visible_tools(session.mode, temporary=session.project_path is None, delegate=True)
        return tool_specs(self.p.config, names, session.mode)

    async def history(self) -> list[Message]:
        return model_view(self.messages, self.p.config.context_limit)  # (a delegate's task is short: no summary)

    def compaction_due(self, request: ModelRequest, overflow: bool = False) -> Plan | None:
        return None

    async def compacted(self, plan: Plan, summary: str) -> None:
        pass

    def compaction_failed(self, plan: Plan, detail: str) -> None:
        pass

    def retrying(self, retry: Retrying) -> None:  # (the delegate's requests are its parent turn's)
        self.p.bus.publish(retrying_event(self.session_id, self.turn_id, retry))

    def new_message_id(self) -> str:
        return new_id("m")

    def take_steers(self) -> list[str]:
        return []

    def output_started(self) -> None:
        self.live.has_output = True

    def delta(self, message_id: str, text: str) -> None:
        pass

    def add_usage(self, usage: Usage, prompt_tokens: int | None = None) -> None:
        with self.p.store.db.tx(durable=False) as db:
            repo.add_usage(db, self.turn_id, usage)

    async def append(self, role: str, content: list[Block], message_id: str | None = None) -> Message:
        message = Message(id=message_id or new_id("m"), session_id=self.session_id, turn_id=self.turn_id,
                          seq=len(self.messages) + 1, role=role, content=content, created_at=now_iso())
        self.messages.append(message)
        return message

    def tool_started(self, call: ToolCallBlock) -> None:
        self.p.bus.publish(ToolStarted(session_id=self.session_id, turn_id=self.turn_id, tool_call_id=call.id,
                                       name=call.name, args=call.args))

    def tool_finished(self, call: ToolCallBlock, result: ToolResult, duration_ms: int) -> None:
        self.p.bus.publish(ToolFinished(session_id=self.session_id, turn_id=self.turn_id, tool_call_id=call.id,
                                        name=call.name, ok=result.ok, error_code=result.error_code,
                                        duration_ms=duration_ms))

    async def authorize(self, call: ToolCallBlock) -> policy.Allow | policy.Deny:
        if self.p.live.owns(self.session_id, self.turn_id) is None:
            return policy.Deny(Code.TOOL_ABORTED)
        return await self.permissions.authorize(self.live, call, delegate=True)

    async def run_tool(self, call: ToolCallBlock) -> ToolOutcome:
        session = self.p.session(self.session_id)
        if self._tools is None:
            self._tools = TurnTools(self.p, Path(session.root))
        tool = self._tools.tool(call.name, call.args, session.mode)
        if tool is None:
            return ToolOutcome(ToolResult.error(Code.TOOL_NOT_FOUND, f"{call.name} is not available to a delegate"))
        outcome = ToolOutcome(await run_tool(tool, call.args))
        checkpoints.of(self.p).after_call(self.live, call)  # the workspace as the call left it (issue 17)
        return outcome

    def may_end(self, nudged: bool) -> TurnEnd | Nudge:
        return Completed()

    async def close(self) -> None:
        if self._tools is not None:
            await self._tools.aclose()
