"""Each session's view kept between its requests (issue 33 §2, host/views.py) against a real store: at
every request it is the view the whole transcript gives (the oracle, tests/runtime/view_oracle.py)
through appends, compactions, fresh starts, smart-stop cuts, evictions, restarts and deletes; a
restart builds it from the last compaction, not from the start; it never mixes two sessions."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pidesk.core.errors import NotFound
from pidesk.core.modes import Mode, PermissionMode, PlanState, SessionStatus
from pidesk.core.records import Block, CompactionBlock, Message, Session, TextBlock, ToolCallBlock, ToolResultBlock
from pidesk.host import views as views_module
from pidesk.host.views import Views
from pidesk.runtime.context_window import ViewState
from pidesk.store import Store
from tests.runtime import view_oracle

SESSIONS = ("s_one", "s_two")


def open_session(store: Store, session_id: str) -> None:
    store.create_session(Session(
        id=session_id, title=session_id, project_path=None, root="/tmp", mode=Mode.AGENT,
        permission_mode=PermissionMode.ASK, status=SessionStatus.IDLE, plan_state=PlanState.INACTIVE,
        current_turn_id=None, forked_from=None, created_at="2026-01-01T00:00:00Z", updated_at="2026-01-01T00:00:00Z"))


def content(op: tuple[Any, ...], next_seq: int) -> tuple[str, list[Block]]:
    kind = op[0]
    if kind == "compaction":
        _, summary, back = op
        kept_from = None if back is None else max(1, next_seq - back)
        return "user", [CompactionBlock(summary="s" * summary, reason="auto", tokens_before=1, tokens_after=1,
                                        kept_from_seq=kept_from)]
    if kind == "new":
        return "tool", [ToolResultBlock(tool_call_id="c", name="NewContext", ok=op[1], output="n" * op[2])]
    role, size = op[1], op[2]
    if role == "tool":
        return "tool", [ToolResultBlock(tool_call_id="c", name="Read", ok=True, output='"x"\n' * (size // 4))]
    if role == "assistant":
        return "assistant", [TextBlock(text="a" * size), ToolCallBlock(id="c", name="Read", args={"path": "compaction"})]
    return "user", [TextBlock(text="u" * size + ' "compaction" "NewContext"')]  # (the markers, as text: no cut)


def note_of(state: ViewState) -> str:
    return "NOTE " + "".join("1" if state.in_view(s) else "0" for s in range(1, 40))


def oracle(store: Store, session_id: str, limit: int) -> list[Message]:
    messages = store.messages(session_id)
    note = "NOTE " + "".join("1" if view_oracle.in_view(messages, s) else "0" for s in range(1, 40))
    return view_oracle.model_view(messages, limit, lambda: note)


ops = st.lists(st.tuples(st.sampled_from(SESSIONS), st.one_of(
    st.tuples(st.just("msg"), st.sampled_from(["user", "assistant", "tool"]), st.integers(0, 1600)),
    st.tuples(st.just("msg"), st.sampled_from(["user", "assistant", "tool"]), st.integers(0, 1600)),
    st.tuples(st.just("compaction"), st.integers(0, 800), st.one_of(st.none(), st.integers(0, 20))),
    st.tuples(st.just("new"), st.booleans(), st.integers(0, 400)),
    st.tuples(st.just("read"), st.booleans()),
    st.tuples(st.just("read"), st.booleans()),
    st.tuples(st.just("draft"), st.one_of(st.none(), st.integers(0, 20))),
    st.tuples(st.just("cut"), st.integers(0, 30)),
    st.tuples(st.just("evict")),
    st.tuples(st.just("restart")),
)), max_size=60)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops, st.integers(300, 5000))
def test_a_kept_view_is_always_the_view_of_the_whole_transcript(steps, limit):
    with tempfile.TemporaryDirectory() as name:
        data = Path(name)
        store = Store(data)
        views = Views(store.transcripts, limit, max_views=2)
        try:
            for session_id in (*SESSIONS, "s_x1", "s_x2"):
                open_session(store, session_id)
            for session_id, op in [*steps, *((s, ("read", False)) for s in SESSIONS)]:
                kind = op[0]
                if kind == "read":
                    got = views.read(session_id, note_of, quick=op[1])
                    if got is not None or not op[1]:
                        assert got == oracle(store, session_id, limit)
                    assert views.compactions(session_id) == sum(
                        1 for m in store.messages(session_id) if isinstance(m.content[0], CompactionBlock))
                elif kind == "draft":  # a compaction about to be recorded: the view after it
                    last = len(store.messages(session_id))
                    block = CompactionBlock(summary="draft", reason="auto", tokens_before=1, tokens_after=1,
                                            kept_from_seq=None if op[1] is None else max(1, last + 1 - op[1]))
                    draft = Message(id="m_draft", session_id=session_id, turn_id=None, seq=1 << 62, role="user",
                                    content=[block], created_at="")
                    messages = [*store.messages(session_id), draft]
                    note = "NOTE " + "".join("1" if view_oracle.in_view(messages, s) else "0" for s in range(1, 40))
                    assert views.after(session_id, draft, note_of) == view_oracle.model_view(
                        messages, limit, lambda: note)
                elif kind == "cut":  # a smart stop: the transcript cut back before a message
                    messages = store.messages(session_id)
                    if messages:
                        store.cut_from(session_id, messages[op[1] % len(messages)].id, lambda _db: None)
                elif kind == "evict":  # another session's views push this one out
                    for other in ("s_x1", "s_x2"):
                        views.read(other, note_of)
                    assert session_id not in views._views
                elif kind == "restart":
                    store.close()
                    store = Store(data)
                    views = Views(store.transcripts, limit, max_views=2)
                else:
                    role, blocks = content(op, len(store.messages(session_id)) + 1)
                    store.append_message(session_id, None, role, blocks)
        finally:
            store.close()


def test_a_restart_builds_the_view_from_the_last_compaction_not_from_the_start(tmp_path: Path, monkeypatch):
    """5,000 messages, a compaction keeping the 3 before it, then 20: a fresh host's first request decodes the
    compaction, what it kept and the 20 after it, and nothing older; the next decodes only what is new."""
    store = Store(tmp_path)
    open_session(store, "s_long")
    for n in range(5000):
        store.append_message("s_long", None, "user" if n % 2 else "assistant", [TextBlock(text=f"message {n}")])
    store.append_message("s_long", None, "user", [CompactionBlock(
        summary="the summary", reason="auto", tokens_before=9, tokens_after=1, kept_from_seq=4998)])
    for n in range(20):
        store.append_message("s_long", None, "user", [TextBlock(text=f"after {n}")])
    store.close()

    decoded: list[int] = []
    decode = views_module.decode_messages

    def counting(lines: bytes) -> list[Message]:
        out = decode(lines)
        decoded.append(len(out))
        return out

    monkeypatch.setattr(views_module, "decode_messages", counting)
    store = Store(tmp_path)
    try:
        views = Views(store.transcripts, 200_000)
        view = views.read("s_long", lambda _state: "NOTE")
        assert view is not None
        assert view == view_oracle.model_view(store.messages("s_long"), 200_000, lambda: "NOTE")
        assert view[0].text().endswith("the summary") and [m.seq for m in view[1:4]] == [4998, 4999, 5000]
        assert sum(decoded) == 20  # the 20 after it (the cut and the kept three are decoded a line at a time)
        assert views.builds == 1
        decoded.clear()
        store.append_message("s_long", None, "user", [TextBlock(text="one more")])
        assert views.read("s_long", lambda _state: "NOTE", quick=True) == view_oracle.model_view(
            store.messages("s_long"), 200_000, lambda: "NOTE")
        assert decoded == [1] and views.builds == 1
    finally:
        store.close()


def test_a_deleted_session_is_not_found_and_its_view_is_gone(tmp_path: Path):
    store = Store(tmp_path)
    try:
        open_session(store, "s_gone")
        store.append_message("s_gone", None, "user", [TextBlock(text="hello")])
        views = Views(store.transcripts, 10_000)
        assert views.read("s_gone", note_of) is not None
        store.delete_session("s_gone")
        with pytest.raises(NotFound):
            views.read("s_gone", note_of)
        assert "s_gone" not in views._views
    finally:
        store.close()


def test_views_past_their_bounds_let_the_least_recently_used_go(tmp_path: Path):
    store = Store(tmp_path)
    try:
        views = Views(store.transcripts, 100_000, max_views=3, max_tokens=3_000)
        for n in range(5):
            open_session(store, f"s_{n}")
            store.append_message(f"s_{n}", None, "user", [TextBlock(text="x" * 4000)])  # ~1,000 tokens
        for n in range(5):
            views.read(f"s_{n}", note_of)
        assert list(views._views) == ["s_3", "s_4"]  # ~1,000 tokens each: a third would pass 3,000 with s_2's
        views.read("s_0", note_of)
        assert list(views._views) == ["s_4", "s_0"] and views.builds == 6
    finally:
        store.close()


def test_a_cut_and_new_messages_of_the_same_length_are_never_read_as_if_nothing_was_cut(tmp_path: Path):
    """A smart stop cuts the last two messages; three new ones of the same byte length follow, so the third
    starts exactly where the view had read up to, with the next seq: the view is built again, never
    caught up with the third alone over the two that are gone."""
    store = Store(tmp_path)
    try:
        open_session(store, "s_cut")
        old = [store.append_message("s_cut", None, "user", [TextBlock(text=f"old {n}")]) for n in range(5)]
        views = Views(store.transcripts, 10_000)
        assert [m.text() for m in views.read("s_cut", note_of) or []] == [f"old {n}" for n in range(5)]
        store.cut_from("s_cut", old[3].id, lambda _db: None)
        for n in range(3):
            store.append_message("s_cut", None, "user", [TextBlock(text=f"new {n}")])
        assert [m.text() for m in views.read("s_cut", note_of) or []] == [
            "old 0", "old 1", "old 2", "new 0", "new 1", "new 2"]
    finally:
        store.close()
