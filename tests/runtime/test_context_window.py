"""The model's view of a transcript: compactions, NewContext boundaries and the window guard, as properties."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from pidesk.core.records import CompactionBlock, Message, TextBlock, ToolCallBlock, ToolResultBlock
from pidesk.runtime.context_window import SAFETY, SUMMARY_HEADING, SUMMARY_PREFIX, estimate_tokens, model_view


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
    if total <= limit * SAFETY:
        assert view == messages
    else:
        kept = [m for m in view if m.id != "m_context"]
        assert kept == messages[len(messages) - len(kept):]  # a suffix, in order
        assert len(kept) == 1 or sum(estimate_tokens(m) for m in kept) <= limit
        assert kept[0].role != "tool" or len(kept) == 1
        assert ("left out of the model's view" in view[0].text()) == (len(kept) < len(messages))


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


def compaction(seq: int, summary: str, kept_from: int | None) -> Message:
    block = CompactionBlock(summary=summary, reason="auto", tokens_before=9, tokens_after=1, kept_from_seq=kept_from)
    return Message(id=f"m{seq}", session_id="s", turn_id="t", seq=seq, role="user", content=[block], created_at="")


@given(transcripts, st.data())
def test_after_a_compaction_the_view_is_the_note_the_summary_what_it_kept_and_what_came_after(messages, data):
    """Issue 30: the view opens with the host's note and the summary, then the messages the compaction
    kept verbatim (from kept_from_seq up to it), then every message after it; nothing before is in it."""
    at = data.draw(st.integers(0, len(messages)))
    kept_from = data.draw(st.one_of(st.none(), st.integers(1, at + 1)))
    before, after = messages[:at], [Message(**{**{f: getattr(m, f) for f in m.__struct_fields__}, "seq": m.seq + 1,
                                               "id": f"m{m.seq + 1}"}) for m in messages[at:]]
    cut = compaction(at + 1, "the summary", kept_from)
    notes: list[str] = []

    def note() -> str:
        notes.append("asked")
        return "HOST NOTE"

    view = model_view([*before, cut, *after], 10**9, note)
    assert view[0].text() == f"HOST NOTE\n\n{SUMMARY_HEADING}the summary" and notes == ["asked"]
    kept = [m for m in before if kept_from is not None and m.seq >= kept_from]
    assert [m.id for m in view[1:]] == [m.id for m in kept + after]


def test_without_a_cut_the_note_is_never_built_and_a_fresh_start_is_the_note_alone():
    messages = [message(1, "user", 10), message(2, "assistant", 10)]

    def note() -> str:
        raise AssertionError("no cut: no note")

    assert model_view(messages, 10**9, note) == messages
    fresh = [*messages, message(3, "user", 10), compaction(4, "", 3)]
    view = model_view(fresh, 10**9, lambda: "HOST NOTE")
    assert view[0].text() == "HOST NOTE" and [m.id for m in view[1:]] == ["m3"]
