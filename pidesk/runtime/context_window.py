"""What the model sees of a session: its transcript from the last cut on, never the transcript changed.

A *cut* is where the view starts again:

- **a compaction** (``CompactionBlock``, runtime/compaction.py): the view is an opening
  message — the host's state note, then the summary — followed by the messages the
  compaction kept (from ``kept_from_seq``, up to the compaction's own message) and every
  message after it;
- **NewContext** — the model asked for a fresh start with a summary: the opening message
  carries that summary, and everything after that call's result follows.

The state note is the host's (``note``, called only when there is a cut): the mode, the
permission mode and the contract as the host's records have them. The summary is the
model's own words and is labelled so.

A last guard keeps every request inside the window whatever happened before (a compaction
that failed, one huge message): past ``SAFETY`` of the limit the oldest messages of the view
leave it until it fits in ``LOW_WATER``, and a note says how many were left out. A kept
window starts at a user or assistant message, never at a tool result without its call.

Sizes are estimated at four characters a token: close enough to stay clear of the limit,
free of any tokenizer. The host corrects the estimate with the provider's own counts
(host/compaction.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from pidesk.core.records import CompactionBlock, Message, TextBlock, ToolResultBlock

CHARS_PER_TOKEN = 4
SAFETY = 0.95
LOW_WATER = 0.5
_encode = msgspec.json.Encoder().encode
SUMMARY_PREFIX = "Summary of the conversation so far (the earlier messages are out of view):\n"
SUMMARY_HEADING = ("[Summary of the conversation before this point, written by the model when it was compacted. "
                   "It is the model's own account: what the host's record above says wins over it.]\n")


def estimate_tokens(message: Message) -> int:
    size = 0
    for block in message.content:
        if isinstance(block, TextBlock):
            size += len(block.text)
        elif isinstance(block, ToolResultBlock):
            size += len(block.output) + 32
        elif isinstance(block, CompactionBlock):
            size += len(block.summary)
        else:  # a tool call, thinking or an attachment note: about its JSON's length
            size += len(_encode(block))
    return size // CHARS_PER_TOKEN + 4


def estimate_request(system: str, tools: list[dict[str, Any]], messages: list[Message]) -> int:
    """The estimated input tokens of a request: its system prompt, tool specs and messages."""
    fixed = (len(system) + len(_encode(tools))) // CHARS_PER_TOKEN
    return fixed + sum(estimate_tokens(m) for m in messages)


def compaction_of(message: Message) -> CompactionBlock | None:
    for block in message.content:
        if isinstance(block, CompactionBlock):
            return block
    return None


def model_view(messages: list[Message], limit_tokens: int, note: Callable[[], str] = str) -> list[Message]:
    view = _from_last_cut(messages, note)
    sizes = [estimate_tokens(m) for m in view]
    if sum(sizes) <= limit_tokens * SAFETY:
        return view
    budget = int(limit_tokens * LOW_WATER)
    start, used = len(view), 0
    while start > 0 and used + sizes[start - 1] <= budget:
        start -= 1
        used += sizes[start]
    while start < len(view) - 1 and view[start].role == "tool":
        start += 1  # never open the window on a tool result whose call is out of view
    if start == len(view):
        start = len(view) - 1  # the newest message alone is bigger than the budget: keep it anyway
    dropped = start
    left_out = _note(view[0].session_id, f"[{dropped} earlier messages were left out of the model's view to fit "
                                         "its window; the transcript keeps every one of them.]")
    return [left_out, *view[start:]] if dropped else view


def _from_last_cut(messages: list[Message], note: Callable[[], str]) -> list[Message]:
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        compaction = compaction_of(message)
        if compaction is not None:
            kept = index
            if compaction.kept_from_seq is not None:
                while kept > 0 and messages[kept - 1].seq >= compaction.kept_from_seq:
                    kept -= 1
            text = note()
            if compaction.summary:
                text = f"{text}\n\n{SUMMARY_HEADING}{compaction.summary}" if text else compaction.summary
            return [_note(message.session_id, text), *messages[kept:index], *messages[index + 1:]]
        for block in message.content:
            if isinstance(block, ToolResultBlock) and block.name == "NewContext" and block.ok:
                state = note()
                text = f"{state}\n\n{SUMMARY_PREFIX}{block.output}" if state else SUMMARY_PREFIX + block.output
                return [_note(message.session_id, text), *messages[index + 1:]]
    return list(messages)


def _note(session_id: str, text: str) -> Message:
    return Message(id="m_context", session_id=session_id, turn_id=None, seq=0, role="user",
                   content=[TextBlock(text=text)], created_at="")
