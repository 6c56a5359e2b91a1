"""Transcript handles: kept open between appends, evicted safely under concurrency."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from pidesk.store.transcripts import MessageLine, Transcripts, as_message


def test_many_sessions_appending_at_once_through_few_handles_lose_nothing(tmp_path: Path):
    transcripts = Transcripts(tmp_path, max_open=4)
    sessions = [f"s{i}" for i in range(16)]
    for sid in sessions:
        transcripts.create(sid, [b"header\n"])

    def writer(sid: str) -> None:
        for n in range(50):
            with transcripts.lock(sid):
                transcripts.append(sid, f"{sid} line {n}\n".encode())

    threads = [threading.Thread(target=writer, args=(sid,)) for sid in sessions]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    transcripts.close()
    for sid in sessions:
        lines = transcripts.path(sid).read_text().splitlines()
        assert lines == ["header", *(f"{sid} line {n}" for n in range(50))]


def test_append_returns_the_offset_the_bytes_start_at(tmp_path: Path):
    transcripts = Transcripts(tmp_path)
    transcripts.create("s", [b"abc\n"])
    assert transcripts.append("s", b"de\n") == 4
    transcripts.truncate("s", 4)  # a cut closes the kept handle; the next append reopens
    assert transcripts.append("s", b"xy\n") == 4
    assert transcripts.path("s").read_bytes() == b"abc\nxy\n"


def _transcript_with_messages(tmp_path: Path, n: int) -> tuple[Transcripts, list[bytes]]:
    from pidesk.core.records import Message, TextBlock
    from pidesk.store.transcripts import HeaderLine, as_line, encode_line

    transcripts = Transcripts(tmp_path)
    header = encode_line(HeaderLine(id="s", title="t", project_path=None, root="/r", mode="agent", created_at="now"))
    lines = [encode_line(as_line(Message(id=f"m{i}", session_id="s", turn_id="t", seq=i + 1, role="user",
                                         content=[TextBlock(text=f"line {i}\nwith a newline")], created_at="now")))
             for i in range(n)]
    transcripts.create("s", [header, *lines])
    return transcripts, lines


@pytest.mark.parametrize("tail", [b"", b'{"t":"message","id":"torn', b"\x00\x00garbage\n", b'{"t":"session"}\n'])
def test_messages_in_one_pass_are_what_a_line_by_line_scan_finds_whatever_the_tail(tmp_path: Path, tail: bytes):
    transcripts, _lines = _transcript_with_messages(tmp_path, 5)
    with transcripts.path("s").open("ab") as f:
        f.write(tail)
    by_scan = [as_message(s.line) for s in transcripts.scan("s").lines if isinstance(s.line, MessageLine)]
    assert [m.seq for m in transcripts.messages("s")] == [1, 2, 3, 4, 5]
    assert transcripts.messages("s") == by_scan
    assert transcripts.messages("s")[0].text() == "line 0\nwith a newline"


def test_a_transcript_with_only_its_header_has_no_messages(tmp_path: Path):
    transcripts, _ = _transcript_with_messages(tmp_path, 0)
    assert transcripts.messages("s") == []


# ---- reading parts of a transcript (the model's view, host/views.py) ----------------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

lines_of = st.lists(st.tuples(st.integers(0, 5000), st.booleans()), min_size=0, max_size=40).map(
    lambda rows: [("x" * size + (' "mark"' if marked else "") + "\n").encode() for size, marked in rows])


@settings(max_examples=60, deadline=None)
@given(lines_of, st.sampled_from([b"", b'{"t":"message","id":"to']), st.integers(16, 3000))
def test_reading_backwards_forwards_and_by_marker_covers_every_whole_line_once(tmp_path_factory, lines, tail, size):
    """Chunks read backwards and slices read forwards are the whole lines after the header, each once, in
    order, however the lines fall across the chunk size (one longer than it too); a torn tail is not a
    line; the marked lines are found newest first; ``read_from`` gives whole lines only."""
    transcripts = Transcripts(tmp_path_factory.mktemp("t"))
    transcripts.create("s", [b'{"t":"session"}\n', *lines])
    with transcripts.path("s").open("ab") as f:
        f.write(tail)
    start, end = transcripts.body_start("s"), transcripts.complete_end("s")
    body = b"".join(lines)
    assert (start, end) == (16, 16 + len(body))
    back = list(transcripts.chunks_back("s", start, end, size))
    assert b"".join(data for _at, data in reversed(back)) == body
    assert all(data.endswith(b"\n") and transcripts.read_range("s", at, at + len(data)) == data for at, data in back)
    assert b"".join(transcripts.slices("s", start, end, size)) == body
    marked = [line for line in lines if b'"mark"' in line]
    found = list(transcripts.lines_marked("s", (b'"mark"', b'"nothing"'), start, end))
    assert [line for _at, line in found] == marked[::-1]
    assert all(transcripts.read_range("s", at, at + len(line)) == line for at, line in found)
    assert transcripts.read_from("s", start) == (body, False)
    assert transcripts.read_from("s", start, most=len(body) + len(tail)) == (body, False)
    if body:
        assert transcripts.read_from("s", start, most=len(body) + len(tail) - 1) == (b"", True)
    assert transcripts.read_from("s", end + len(tail) + 1) is None  # (past the end: it was cut)


def test_every_cut_replacement_or_removal_counts_a_new_generation(tmp_path: Path):
    transcripts = Transcripts(tmp_path)
    transcripts.create("s", [b"h\n"])
    seen = [transcripts.generation("s")]
    transcripts.append("s", b"a\n")
    assert transcripts.generation("s") == seen[-1]  # an append is not a change of what was read
    for change in (lambda: transcripts.truncate("s", 2), lambda: transcripts.quarantine_tail("s", 2),
                   lambda: transcripts.create("s", [b"h\n"]), lambda: transcripts.delete("s")):
        change()
        assert transcripts.generation("s") > seen[-1]
        seen.append(transcripts.generation("s"))
