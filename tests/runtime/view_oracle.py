"""The model's view as pidesk built it before views were kept between requests (issue 33 §2), verbatim:
the oracle the kept views must equal, request for request (tests/runtime/test_view_state.py,
tests/host/test_views.py)."""

from __future__ import annotations

from collections.abc import Callable

from pidesk.core.records import CompactionBlock, Message, TextBlock, ToolResultBlock
from pidesk.runtime.context_window import LOW_WATER, SAFETY, SUMMARY_HEADING, SUMMARY_PREFIX, compaction_of, estimate_tokens


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
        start += 1
    if start == len(view):
        start = len(view) - 1
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


def in_view(messages: list[Message], seq: int) -> bool:
    """host/compaction.py's ``_in_view`` as it was: kept by, or after, the transcript's last compaction."""
    for message in reversed(messages):
        block = next((b for b in message.content if isinstance(b, CompactionBlock)), None)
        if block is not None:
            return message.seq < seq or (block.kept_from_seq is not None and seq >= block.kept_from_seq)
    return True


def _note(session_id: str, text: str) -> Message:
    return Message(id="m_context", session_id=session_id, turn_id=None, seq=0, role="user",
                   content=[TextBlock(text=text)], created_at="")
