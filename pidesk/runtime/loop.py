"""The agent loop of one turn.

    steer? stop? -> model call (stream) -> assistant message
      -> no tool calls: ask the host whether the turn may end (a Goal execution
         must have reported its criteria) -> end
      -> tool batch: each call is authorized by the host (which reads durable
         mode and permission state itself), run, and its result persisted
      -> loop

The whole loop runs inside a slot of the host's ``StepGate`` (runtime/gate.py):
every await on something outside the turn (the model stream, a tool, a user's
answer, a durable append) goes through ``slot.wait_for``, which gives the slot
up when the wait is long, so RPCs stay quick however many turns are busy.

The loop owns no state that outlives the turn and makes no policy decision: it
asks its ``TurnContext`` (implemented by the host) for everything. A provider
failure is a value (``Done("error")``), never an exception. Cancellation is the
abort signal: the loop records ``TOOL_ABORTED`` results for every unfinished
call of the batch, then lets the cancellation through.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, Protocol

from pidesk.core.errors import Code
from pidesk.core.policy import Allow, Deny, batch_is_exclusive_violation
from pidesk.core.records import Block, Message, TextBlock, ThinkingBlock, ToolCallBlock, ToolResultBlock, Usage
from pidesk.core.sizes import json_size
from pidesk.core.text import scrub
from pidesk.providers.base import (
    Done,
    ModelRequest,
    Provider,
    Retrying,
    TextDelta,
    ThinkingDelta,
    Thought,
    ToolCall,
    UsageReport,
)
from pidesk.runtime.compaction import Plan, Refused, summarise, to_summarise
from pidesk.runtime.gate import Slot, StepGate
from pidesk.tools.base import ToolResult


@dataclass(frozen=True)
class Completed:
    pass


@dataclass(frozen=True)
class Failed:
    code: str
    message: str = ""  # for a person: the provider's words, the retries spent (Turn.errorMessage)


TurnEnd = Completed | Failed


@dataclass(frozen=True)
class ToolOutcome:
    result: ToolResult
    end: TurnEnd | None = None  # the turn ends after this call, with no further model call


@dataclass(frozen=True)
class Nudge:
    text: str


class TurnContext(Protocol):
    session_id: str
    turn_id: str
    agent: str  # "main", or a delegate's task id

    @property
    def stop_requested(self) -> bool: ...
    def system_prompt(self) -> str: ...
    def tool_specs(self) -> list[dict[str, Any]]: ...
    async def history(self) -> list[Message]: ...  # the view for the next request (the host decides where it is read)
    def new_message_id(self) -> str: ...
    def take_steers(self) -> list[str]: ...
    def output_started(self) -> None: ...
    def delta(self, message_id: str, text: str) -> None: ...
    # prompt_tokens: the request's whole input as the provider counted it (None: a summary request's)
    def add_usage(self, usage: Usage, prompt_tokens: int | None = None) -> None: ...
    # Before a request: what to compact first, if anything (runtime/compaction.py); after a refusal
    # of the input as too long (overflow=True): what to compact before the one retry
    def compaction_due(self, request: ModelRequest, overflow: bool = False) -> Plan | None: ...
    async def compacted(self, plan: Plan, summary: str) -> None: ...
    def compaction_failed(self, plan: Plan, detail: str) -> None: ...
    def retrying(self, retry: Retrying) -> None: ...  # the request is sent again after a wait
    async def append(self, role: str, content: list[Block], message_id: str | None = None) -> Message: ...
    def tool_started(self, call: ToolCallBlock) -> None: ...
    def tool_finished(self, call: ToolCallBlock, result: ToolResult, duration_ms: int) -> None: ...
    async def authorize(self, call: ToolCallBlock) -> Allow | Deny: ...
    async def run_tool(self, call: ToolCallBlock) -> ToolOutcome: ...
    def may_end(self, nudged: bool) -> TurnEnd | Nudge: ...
    async def close(self) -> None: ...  # the loop is over: release what its tools hold (a spare shell)


# A denial that means this turn cannot go on (an unattended run met an Ask).
_TURN_ENDING_DENIALS = frozenset({Code.PERMISSION_REQUIRED})
# What the model is told beyond the code, where the code alone does not say what to do instead.
_DENIAL_HINTS = {
    Code.PLAN_REQUIRES_INTERACTIVE_SESSION: (
        "this run is unattended and nobody can approve a plan or goal; the session stays in Agent "
        "mode: carry out the request directly, or say what you would need"
    ),
}
_SUBMIT_TOOLS = frozenset({"SubmitPlan", "SubmitGoal"})
MAX_MODEL_CALLS = 200  # a bound on every turn's loop
# A tool call's arguments past this (their JSON, about) are not kept, shown or run: every copy of
# them — the transcript line, each event, the next request's history — holds the event loop for
# one uninterruptible encoding or decoding, ~25 ms for 10 MB. Models write large files in parts.
MAX_TOOL_ARGUMENTS = 1 << 20
# Characters of text and thinking one answer may hold (~500k tokens, beyond any model's output): a
# model server that streams on and on (120 MiB) held the loop 0.4-1.4 s and 1.2 GB when its message
# was kept and sent (issue 29). Past it the answer is cut there, kept, and the turn ends PROVIDER_ERROR.
MAX_ANSWER_CHARS = 2_000_000


async def run_turn(ctx: TurnContext, provider: Provider, gate: StepGate | None = None) -> TurnEnd:
    try:
        async with (gate or StepGate()).slot() as slot:
            return await _Turn(ctx, slot).run(provider)
    finally:
        await ctx.close()


class _Turn:
    """One turn's loop, holding its slot of the step gate."""

    def __init__(self, ctx: TurnContext, slot: Slot) -> None:
        self.ctx = ctx
        self.slot = slot
        self.oversized: dict[str, int] = {}  # tool call id -> the size of the arguments it came with
        self.request: ModelRequest | None = None  # the model request just made (until its answer is in)

    async def append(self, role: str, content: list[Block], message_id: str | None = None) -> Message:
        return await self.slot.wait_for(self.ctx.append(role, content, message_id))

    async def history(self) -> list[Message]:
        """The view for the next request (the host reads it on the loop when that is quick, else in a
        worker thread: host/views.py)."""
        history: list[Message] = await self.slot.wait_for(self.ctx.history())
        return history

    async def run(self, provider: Provider) -> TurnEnd:
        ctx = self.ctx
        nudged = False
        overflowed = False  # the last request was refused as too long (and compacted for one retry)
        for _ in range(MAX_MODEL_CALLS):
            for text in ctx.take_steers():
                await self.append("user", [TextBlock(text=text)])
            if ctx.stop_requested:  # a graceful stop ends the turn as if the model had: the host may refuse
                verdict = ctx.may_end(True)
                return Completed() if isinstance(verdict, Nudge) else verdict
            message_id = ctx.new_message_id()
            blocks, done = await self.stream(provider, message_id)
            request, self.request = self.request, None  # (a waiting turn must not hold its view's messages)
            if done.overflow and not blocks and not overflowed and request is not None:
                overflowed = True  # refused as longer than the window: compact, and try once more
                plan = ctx.compaction_due(request, overflow=True)
                if plan is not None and await self.compact(provider, request, plan):
                    continue
            overflowed = False
            request = None
            if done.stop_reason in ("error", "aborted"):
                if blocks:
                    await self.append("assistant", blocks, message_id)
                return Failed(done.error_code or Code.PROVIDER_ERROR, done.detail)
            await self.append("assistant", blocks or [TextBlock(text="")], message_id)
            calls = [b for b in blocks if isinstance(b, ToolCallBlock)]
            if not calls:
                verdict = ctx.may_end(nudged)
                if isinstance(verdict, Nudge):
                    nudged = True
                    await self.append("user", [TextBlock(text=verdict.text)])
                    continue
                return verdict
            end = await self.run_batch(calls)
            if end is not None:
                return end
        return Failed(Code.INTERNAL, f"the turn made {MAX_MODEL_CALLS} model calls without finishing")

    async def compact(self, provider: Provider, request: ModelRequest, plan: Plan) -> bool:
        """Fold the older part of ``request``'s view into a summary the host records (or, for a fresh
        start, record the cut alone). False when the model gave no summary: the request goes on with
        the view as it was (``model_view`` still keeps it inside the window)."""
        summary = ""
        if plan.summarise:
            outcome = await summarise(provider, request, to_summarise(request.messages, plan.keep_from),
                                      plan.instructions, wait=self.slot.wait_for)
            if isinstance(outcome, Refused):
                self.ctx.compaction_failed(plan, outcome.done.detail or str(outcome.done.error_code))
                return False
            if outcome.usage is not None:
                self.ctx.add_usage(outcome.usage.as_usage())
            summary = outcome.text
        await self.slot.wait_for(self.ctx.compacted(plan, summary))
        return True

    async def stream(self, provider: Provider, message_id: str) -> tuple[list[Block], Done]:
        ctx = self.ctx
        history = await self.history()
        request = ModelRequest(
            session_id=ctx.session_id, turn_id=ctx.turn_id, system=ctx.system_prompt(),
            messages=history, tools=ctx.tool_specs(), agent=ctx.agent,
        )
        plan = ctx.compaction_due(request)
        if plan is not None and await self.compact(provider, request, plan):
            request = dataclasses.replace(request, messages=await self.history())
        self.request = request
        # The answer's blocks in the order they came: thinking and text as they streamed (a
        # thinking block ends the text before it), then the tool calls.
        blocks: list[Block] = []
        text: list[str] = []
        calls: list[ToolCallBlock] = []
        started = False
        done = Done("error", Code.STREAM_FAILED, "the stream ended without a stop reason")
        said = 0  # characters of text and thinking so far (MAX_ANSWER_CHARS)

        def begin() -> None:  # thinking is output too (seed 003 §3 rule 4): a smart stop restores no draft
            nonlocal started
            if not started:
                started = True
                ctx.output_started()

        def end_text() -> None:
            if text:
                blocks.append(TextBlock(text="".join(text)))
                text.clear()

        async with aclosing(provider.stream(request)) as stream:
            while True:
                try:
                    event = await self.slot.wait_for(anext(stream))
                except StopAsyncIteration:
                    break
                if isinstance(event, TextDelta):
                    begin()
                    delta = scrub(event.text)  # (what a model sends is kept as it came, less what UTF-8 cannot hold)
                    if said + len(delta) > MAX_ANSWER_CHARS:  # kept up to the bound; the rest is not read
                        text.append(delta[:MAX_ANSWER_CHARS - said])
                        done = Done("error", Code.PROVIDER_ERROR, f"the model's answer went past "
                                    f"{MAX_ANSWER_CHARS:,} characters; it was cut there")
                        break
                    said += len(delta)
                    text.append(delta)
                    ctx.delta(message_id, delta)
                elif isinstance(event, ThinkingDelta):
                    begin()
                elif isinstance(event, Thought):
                    begin()
                    said += len(event.text)
                    if said > MAX_ANSWER_CHARS:
                        done = Done("error", Code.PROVIDER_ERROR, f"the model's reasoning went past "
                                    f"{MAX_ANSWER_CHARS:,} characters; it was not kept")
                        break
                    end_text()
                    blocks.append(ThinkingBlock(text=scrub(event.text), redacted=event.redacted,
                                                opaque=scrub(event.opaque)))
                elif isinstance(event, ToolCall):
                    begin()
                    calls.append(self.call_block(event))
                elif isinstance(event, UsageReport):
                    ctx.add_usage(event.as_usage(), event.prompt_tokens)
                elif isinstance(event, Retrying):
                    ctx.retrying(event)
                else:
                    done = event
                    break
        end_text()
        return [*blocks, *calls], done

    def call_block(self, event: ToolCall) -> ToolCallBlock:
        """The call as kept: arguments over ``MAX_TOOL_ARGUMENTS`` are replaced by a note of their size."""
        size = event.oversized or json_size(event.args)  # (a provider that did not keep the text says its size)
        call_id, name = scrub(event.id), scrub(event.name)
        if size <= MAX_TOOL_ARGUMENTS:
            return ToolCallBlock(id=call_id, name=name, args=scrub(event.args))
        self.oversized[call_id] = size
        note = f"{size:,} bytes of arguments, over the {MAX_TOOL_ARGUMENTS:,}-byte limit: not kept"
        return ToolCallBlock(id=call_id, name=name, args={"omitted": note})

    async def run_batch(self, calls: list[ToolCallBlock]) -> TurnEnd | None:
        ctx = self.ctx
        if batch_is_exclusive_violation([c.name for c in calls]):
            for call in calls:
                ctx.tool_started(call)
                await self.record(call, ToolResult.error(
                    Code.TOOL_BATCH_EXCLUSIVE,
                    "EnterPlanMode, EnterGoalMode, SubmitPlan and SubmitGoal must be the only tool call "
                    "in their batch; nothing in this batch ran",
                ), 0)
            return None
        unfinished = list(calls)
        started: float | None = None  # when the call now running began
        try:
            for call in calls:
                ctx.tool_started(call)
                started = time.monotonic()
                if call.id in self.oversized:
                    await self.record(call, ToolResult.error(Code.INVALID_ARGUMENTS, (
                        f"{call.name} was not run: its arguments were {self.oversized[call.id]:,} bytes, over the "
                        f"{MAX_TOOL_ARGUMENTS:,}-byte limit of a tool call; write large content in parts "
                        "(Write the first part, then Edit to add the rest)")), 0)
                    unfinished.remove(call)
                    continue
                decision = await self.slot.wait_for(ctx.authorize(call))
                if isinstance(decision, Deny):
                    why = f"{decision.code}: {_DENIAL_HINTS[decision.code]}" if decision.code in _DENIAL_HINTS \
                        else decision.code
                    outcome = ToolOutcome(ToolResult.error(decision.code, f"{call.name} was not run: {why}"))
                    if decision.code in _TURN_ENDING_DENIALS:
                        outcome = ToolOutcome(outcome.result, Failed(decision.code))
                else:
                    outcome = await self.slot.wait_for(ctx.run_tool(call))
                await self.record(call, outcome.result, _ms_since(started))
                unfinished.remove(call)
                if outcome.end is not None:
                    return outcome.end
        except asyncio.CancelledError:
            for call in unfinished:
                code = Code.PLAN_APPROVAL_INTERRUPTED if call.name in _SUBMIT_TOOLS else Code.TOOL_ABORTED
                # the call that was running took real time; the ones after it never ran
                ran = _ms_since(started) if started is not None and call is unfinished[0] else 0
                await self.record(call, ToolResult.error(code, "the turn was aborted"), ran)
            raise
        return None

    async def record(self, call: ToolCallBlock, result: ToolResult, duration_ms: int) -> None:
        block = ToolResultBlock(
            tool_call_id=call.id, name=call.name, ok=result.ok, output=result.output, error_code=result.error_code,
            duration_ms=duration_ms,
        )
        await self.append("tool", [block])
        self.ctx.tool_finished(call, result, duration_ms)


def _ms_since(started: float) -> int:
    return int((time.monotonic() - started) * 1000)
