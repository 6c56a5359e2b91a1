"""A view grown a message at a time (``ViewState``, issue 33 §2) is, at every request, the view the whole
transcript gives (the oracle: the view as it was built before, tests/runtime/view_oracle.py) — through
compactions keeping any messages, NewContext starts, the window's guard, and what it lets go of."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from pidesk.core.records import CompactionBlock, Message, TextBlock, ToolCallBlock, ToolResultBlock
from pidesk.runtime.context_window import ViewState, estimate_request, model_view
from tests.runtime import view_oracle


def make(seq: int, op: tuple[Any, ...]) -> Message:
    kind = op[0]
    if kind == "compaction":
        _, summary, back = op
        kept_from = None if back is None else max(1, seq - back)
        content: list[Any] = [CompactionBlock(summary="s" * summary, reason="auto", tokens_before=1, tokens_after=1,
                                              kept_from_seq=kept_from)]
        role = "user"
    elif kind == "new":
        _, ok, size = op
        content, role = [ToolResultBlock(tool_call_id=f"c{seq}", name="NewContext", ok=ok, output="n" * size)], "tool"
    elif op[1] == "tool":
        content, role = [ToolResultBlock(tool_call_id=f"c{seq}", name="Read", ok=True, output="x" * op[2])], "tool"
    elif op[1] == "assistant":
        content = [TextBlock(text="a" * op[2]), ToolCallBlock(id=f"c{seq}", name="Read", args={"path": "p"})]
        role = "assistant"
    else:
        content, role = [TextBlock(text="u" * op[2])], "user"
    return Message(id=f"m{seq}", session_id="s", turn_id="t", seq=seq, role=role, content=content, created_at="")


ops = st.lists(st.one_of(
    st.tuples(st.just("msg"), st.sampled_from(["user", "assistant", "tool"]), st.integers(0, 1600)),
    st.tuples(st.just("msg"), st.sampled_from(["user", "assistant", "tool"]), st.integers(0, 1600)),
    st.tuples(st.just("compaction"), st.integers(0, 800), st.one_of(st.none(), st.integers(0, 30))),
    st.tuples(st.just("new"), st.booleans(), st.integers(0, 400)),
    st.tuples(st.just("render")),
    st.tuples(st.just("render")),
    st.tuples(st.just("rebuild")),
), max_size=120)


def notes(messages_or_state: Any) -> str:
    """A note that also says what the host's note asks of the view: whether a few seqs are in it."""
    if isinstance(messages_or_state, ViewState):
        return "NOTE " + "".join("1" if messages_or_state.in_view(s) else "0" for s in range(1, 40))
    return "NOTE " + "".join("1" if view_oracle.in_view(messages_or_state, s) else "0" for s in range(1, 40))


@settings(max_examples=400, deadline=None)
@given(ops, st.integers(200, 6000))
def test_a_view_grown_message_by_message_is_the_view_of_the_whole_transcript(steps, limit):
    transcript: list[Message] = []
    state = ViewState(limit)
    for op in [*steps, ("render",)]:
        if op[0] == "render":
            expected = view_oracle.model_view(transcript, limit, lambda: notes(transcript))
            got = state.render(lambda: notes(state))
            assert got == expected
            assert estimate_request("", [], got) == estimate_request("", [], list(expected))  # (its kept sizes)
            assert model_view(transcript, limit, lambda: notes(transcript)) == expected
        elif op[0] == "rebuild":  # (a view built again from the transcript: evicted, a restart)
            state = ViewState.of(transcript, limit)
        else:
            message = make(len(transcript) + 1, op)
            transcript.append(message)
            if not state.add(message):  # it keeps messages let go of: built again from the transcript
                state = ViewState.of(transcript, limit)


@settings(max_examples=200, deadline=None)
@given(ops, st.integers(200, 3000))
def test_a_view_past_its_window_holds_about_its_window_not_its_history(steps, limit):
    """What a kept view holds stays within about twice the guard's budget plus its newest message, however
    long the transcript — the messages before its window leave memory."""
    state = ViewState(limit)
    transcript: list[Message] = []
    for op in steps:
        if op[0] in ("render", "rebuild"):
            state.render()
            continue
        message = make(len(transcript) + 1, op)
        transcript.append(message)
        if not state.add(message):
            state = ViewState.of(transcript, limit)
        state.render()
        if state.skipped:
            newest = state.cum[-1] - state.cum[-2]
            assert state.cum[-1] <= 2 * (limit // 2 + newest) + newest
