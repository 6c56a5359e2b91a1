"""The model's view of a transcript: NewContext boundaries and compaction, as properties."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from pidesk.core.records import Message, TextBlock, ToolCallBlock, ToolResultBlock
from pidesk.runtime.context_window import HIGH_WATER, SUMMARY_PREFIX, estimate_tokens, model_view


def message(seq: int, role: str, size: int) -> Message:
    if role == "tool":
        content = [ToolResultBlock(tool_call_id=f"c{seq}", name="Read", ok=True, output="x" * size)]
    elif role == "assistant":
        content = [TextBlock(text="a" * size), ToolCallBlock(id=f"c{seq}", name="Read", args={})]
    else:
        content = [TextBlock(text="u" * size)]
    return Message(id=f"m{seq}", session_id="s", turn_id="t", seq=seq, role=role, content=content, created_at="")


transcripts = st.lists(st.tuples(st.sampled_from(["user", "assistant", "tool"]), st.integers(0, 4000)),
                       min_size=1, max_size=60).map(lambda rows: [message(i + 1, r, n) for i, (r, n) in enumerate(rows)])


@given(transcripts, st.integers(500, 20_000))
def test_the_view_keeps_the_newest_message_and_fits_or_is_untouched(messages, limit):
    view = model_view(messages, limit)
    assert view[-1] == messages[-1]
    total = sum(estimate_tokens(m) for m in messages)
    if total <= limit * HIGH_WATER:
        assert view == messages
    else:
        kept = [m for m in view if m.id != "m_context"]
        assert kept == messages[len(messages) - len(kept):]  # a suffix, in order
        assert len(kept) == 1 or sum(estimate_tokens(m) for m in kept) <= limit
        assert kept[0].role != "tool" or len(kept) == 1
        assert ("compacted" in view[0].text()) == (len(kept) < len(messages))


@given(transcripts)
def test_the_transcript_itself_is_never_changed(messages):
    before = [m.id for m in messages]
    model_view(messages, 100)
    assert [m.id for m in messages] == before


def test_new_context_replaces_everything_before_it_with_the_summary():
    messages = [message(1, "user", 10), message(2, "assistant", 10),
                Message(id="m3", session_id="s", turn_id="t", seq=3, role="tool", created_at="",
                        content=[ToolResultBlock(tool_call_id="c2", name="NewContext", ok=True,
                                                 output="we fixed the parser")]),
                message(4, "assistant", 10)]
    view = model_view(messages, 100_000)
    assert view[0].text() == SUMMARY_PREFIX + "we fixed the parser"
    assert [m.id for m in view[1:]] == ["m4"]
