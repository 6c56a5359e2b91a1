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
