"""What the model sees of a session: its transcript, cut to fit, never the transcript itself changed.

Two things shape the view:

- **NewContext** — the model asked for a fresh start with a summary: the view is
  the summary (as a user message) plus everything after that call's result.
- **Compaction** — when the view's estimated size passes ``high_water`` of the
  model's context limit, the oldest messages leave the view until it fits in
  ``low_water``; a note says how many were left out. A kept window starts at a
  user or assistant message, never at a tool result without its call.

Sizes are estimated at four characters a token: close enough to stay clear of
the limit, free of any tokenizer.
"""

from __future__ import annotations

import msgspec

from pidesk.core.records import Message, TextBlock, ToolResultBlock

CHARS_PER_TOKEN = 4
HIGH_WATER = 0.8
LOW_WATER = 0.5
_encode = msgspec.json.Encoder().encode
SUMMARY_PREFIX = "Summary of the conversation so far (the earlier messages are out of view):\n"


def estimate_tokens(message: Message) -> int:
    size = 0
    for block in message.content:
        if isinstance(block, TextBlock):
            size += len(block.text)
        elif isinstance(block, ToolResultBlock):
            size += len(block.output) + 32
        else:  # a tool call or an attachment note: about its JSON's length
            size += len(_encode(block))
    return size // CHARS_PER_TOKEN + 4


def model_view(messages: list[Message], limit_tokens: int) -> list[Message]:
    view = _after_new_context(messages)
    sizes = [estimate_tokens(m) for m in view]
    if sum(sizes) <= limit_tokens * HIGH_WATER:
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
    note = _note(view[0].session_id, f"[{dropped} earlier messages were compacted out of the model's view; "
                                     "the transcript keeps every one of them.]")
    return [note, *view[start:]] if dropped else view


def _after_new_context(messages: list[Message]) -> list[Message]:
    for index in range(len(messages) - 1, -1, -1):
        for block in messages[index].content:
            if isinstance(block, ToolResultBlock) and block.name == "NewContext" and block.ok:
                summary = _note(messages[index].session_id, SUMMARY_PREFIX + block.output)
                return [summary, *messages[index + 1:]]
    return list(messages)


def _note(session_id: str, text: str) -> Message:
    return Message(id="m_context", session_id=session_id, turn_id=None, seq=0, role="user",
                   content=[TextBlock(text=text)], created_at="")
