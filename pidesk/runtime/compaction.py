"""A compaction's model request: the conversation so far, summarised by the model itself.

The host decides when (host/compaction.py) and records the result; this module only asks.
The summary request is the turn's own request — the same system prompt and tool specs,
so the provider's cached prefix still serves it — with the part to summarise as its
messages, one more user message asking for the summary, and ``tool_choice: "none"``: the
model can call nothing. Its answer is collected, not streamed to anyone: it becomes the
``summary`` of the compaction's record.

A summary request that is itself refused as too long (its input is the fullest the view
ever gets) is tried once more with the older half of what it summarises left out.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from pidesk.core.records import Message, TextBlock
from pidesk.core.text import scrub
from pidesk.providers.base import Done, ModelRequest, Provider, TextDelta, UsageReport

MAX_SUMMARY_CHARS = 60_000  # ~15k tokens: a summary longer than this is cut (it would defeat its purpose)

SUMMARY_PROMPT = """\
The conversation above is about to leave your context window. Write a summary that lets you \
carry on the work from it alone. Use these headings:

## Goal
What the user asked for, in their words where they matter.
## Decisions
What was decided and why, including approaches rejected.
## Files
Each file read, created or changed, with what matters about it.
## Open questions
Anything unresolved or waiting on the user.
## Next
What you were doing and what comes next.

Be specific (paths, names, commands, error messages). Do not state the session's mode, \
permission mode or whether anything was approved: the host tells you those from its own \
records. Do not call any tool."""


@dataclass(frozen=True)
class Plan:
    """What the host wants compacted before a request.

    ``keep_from``: the seq from which the messages stay in view verbatim (None: none); the
    messages before it are summarised. ``summarise``: False for a fresh start (no summary).
    """

    reason: str  # "auto" | "manual" | "fresh"
    tokens_before: int
    keep_from: int | None = None
    summarise: bool = True
    instructions: str = ""


@dataclass(frozen=True)
class Summary:
    text: str
    usage: UsageReport | None


@dataclass(frozen=True)
class Refused:
    done: Done


def to_summarise(view: list[Message], keep_from: int | None) -> list[Message]:
    """The messages of ``view`` a compaction folds into its summary: those before ``keep_from``."""
    if keep_from is None:
        return list(view)
    return [m for m in view if m.seq < keep_from or m.seq == 0]  # (seq 0: the view's opening note)


async def summarise(provider: Provider, base: ModelRequest, messages: list[Message], instructions: str = "",
                    wait: Callable[[Awaitable[Any]], Awaitable[Any]] | None = None) -> Summary | Refused:
    """Ask the model for a summary of ``messages`` (in ``base``'s request, with no tool call allowed)."""
    outcome = await _ask(provider, base, messages, instructions, wait)
    if isinstance(outcome, Refused) and outcome.done.overflow and len(messages) > 2:
        outcome = await _ask(provider, base, _newer_half(messages), instructions, wait)
    return outcome


async def _ask(provider: Provider, base: ModelRequest, messages: list[Message], instructions: str,
               wait: Callable[[Awaitable[Any]], Awaitable[Any]] | None) -> Summary | Refused:
    ask = SUMMARY_PROMPT + (f"\n\nThe user asks the summary to: {instructions}" if instructions else "")
    session_id = base.session_id
    request = dataclasses.replace(base, messages=[*messages, _user(session_id, ask)], tool_choice="none")
    text: list[str] = []
    size = 0
    usage: UsageReport | None = None
    done = Done("error", "STREAM_FAILED", "the summary's stream ended without a stop reason")
    async with aclosing(provider.stream(request)) as stream:
        while True:
            try:
                event = await (wait(anext(stream)) if wait is not None else anext(stream))
            except StopAsyncIteration:
                break
            if isinstance(event, TextDelta):
                if size < MAX_SUMMARY_CHARS:
                    text.append(event.text[:MAX_SUMMARY_CHARS - size])
                    size += len(event.text)
            elif isinstance(event, UsageReport):
                usage = event
            elif isinstance(event, Done):
                done = event
                break
    if done.stop_reason == "error" or done.stop_reason == "aborted":
        return Refused(done)
    summary = scrub("".join(text)).strip()
    if not summary:
        return Refused(Done("error", "PROVIDER_ERROR", "the model answered the summary request with no text"))
    return Summary(summary, usage)


def _newer_half(messages: list[Message]) -> list[Message]:
    """The newer half of ``messages``, opening on a user message (never on a tool result without its call)."""
    start = len(messages) // 2
    while start < len(messages) - 1 and messages[start].role != "user":
        start += 1
    return messages[start:]


def _user(session_id: str, text: str) -> Message:
    return Message(id="m_summary_request", session_id=session_id, turn_id=None, seq=0, role="user",
                   content=[TextBlock(text=text)], created_at="")
