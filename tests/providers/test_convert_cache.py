"""``convert.ExchangeCache``: a request converts only what is new in its view, and gets exactly what
converting the whole view gives — as the view grows, is cut at its front (a compaction), is rewritten
from some point on (a smart stop), or another session's view comes between."""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from pidesk.core.records import Block, Message, TextBlock, ToolCallBlock, ToolResultBlock
from pidesk.providers.convert import ExchangeCache, exchanges

CALLS = ["c1", "c2", "c3", "c4"]  # few ids, so results meet their calls, strays and duplicates alike


@st.composite
def a_message(draw: st.DrawFn) -> tuple[str, list[Block]]:
    role = draw(st.sampled_from(["user", "assistant", "tool", "tool"]))
    if role == "user":
        return role, [TextBlock(text=draw(st.sampled_from(["go", "", "more"])))]
    if role == "assistant":
        calls = draw(st.lists(st.sampled_from(CALLS), max_size=2, unique=True))
        return role, [TextBlock(text=draw(st.sampled_from(["", "ok"]))),
                      *(ToolCallBlock(id=c, name="Read", args={"path": c}) for c in calls)]
    results = draw(st.lists(st.sampled_from(CALLS), min_size=1, max_size=2))
    return role, [ToolResultBlock(tool_call_id=c, name="Read", ok=draw(st.booleans()), output=f"of {c}") for c in results]


def made(session: str, drawn: list[tuple[str, list[Block]]], first: int) -> list[Message]:
    return [Message(id=f"{session}-m{first + n}", session_id=session, turn_id=None, seq=first + n, role=role,
                    content=content, created_at="2026-12-07T00:00:00Z") for n, (role, content) in enumerate(drawn)]


# what happens to a view between two requests
steps = st.one_of(
    st.tuples(st.just("grow"), st.lists(a_message(), max_size=4)),
    st.tuples(st.just("slide"), st.integers(min_value=1, max_value=6)),  # the window's front moves on, a note first
    st.tuples(st.just("cut front"), st.integers(min_value=1, max_value=6)),
    st.tuples(st.just("rewrite from"), st.integers(min_value=0, max_value=8), st.lists(a_message(), max_size=3)),
    st.tuples(st.just("other session"), st.lists(a_message(), max_size=4)),
)


A_TURN = [("user", [TextBlock(text="go")]), ("assistant", [ToolCallBlock(id="c1", name="Read", args={})]),
          ("tool", [ToolResultBlock(tool_call_id="c1", name="Read", ok=True, output="x")]),
          ("assistant", [TextBlock(text="done")])]


@settings(max_examples=400, deadline=None)
@given(start=st.lists(a_message(), max_size=8), changes=st.lists(steps, max_size=10))
# rewritten right after what was kept, with a tool's message: its result is the pending call's, not a stray
@example(start=A_TURN, changes=[("rewrite from", 3, [A_TURN[2]])])
def test_the_cache_converts_every_view_as_converting_it_whole_does(start, changes) -> None:
    cache = ExchangeCache()
    held = made("s", start, 0)  # the view's messages after its note, if it has one
    note: list[Message] = []
    fresh = len(held)  # (a message's id names it: each is made afresh with one of its own)
    assert cache(held) == exchanges(held)
    for change in changes:
        fresh += 10
        if change[0] == "grow":
            held = held + made("s", change[1], fresh)
        elif change[0] == "slide":
            held = held[change[1]:]
            note = made("s", [("user", [TextBlock(text=f"[{change[1]} earlier messages left out]")])], fresh + 9)
        elif change[0] == "cut front":
            held, note = held[change[1]:], []
        elif change[0] == "rewrite from":
            held = held[:change[1]] + made("s", change[2], fresh)
        else:
            other = made("o", change[1], fresh)
            assert cache(other) == exchanges(other)
            continue
        view = note + held
        assert cache(view) == exchanges(view)


def test_a_grown_or_slid_view_converts_only_its_new_messages(monkeypatch) -> None:
    """What the cache is for: the next request of a session converts what came after the last one's last
    settled point (and the window's note), not the whole view."""
    from pidesk.providers import convert

    converted: list[int] = []
    marked = convert._marked  # (every conversion goes through it)
    monkeypatch.setattr(convert, "_marked", lambda messages: converted.append(len(messages)) or marked(messages))
    turn = A_TURN
    cache = ExchangeCache()
    view = made("s", turn * 1000, 0)
    cache(view)
    converted.clear()
    grown = view + made("s", turn, len(view))
    got = cache(grown)
    assert sum(converted) <= len(turn) + 1  # the new turn, and the answer before it that was the old tail
    assert got == marked(grown)[0]  # (the whole view converted, uncounted)
    converted.clear()
    note = made("s", [("user", [TextBlock(text="[4 earlier messages were left out]")])], 10 ** 6)
    slid = note + grown[len(turn):] + made("s", turn, len(grown))
    got = cache(slid)
    assert sum(converted) <= len(turn) + 2  # the note, the new turn and the old tail
    assert got == marked(slid)[0]
