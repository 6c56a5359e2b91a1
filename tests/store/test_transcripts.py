"""Transcript handles: kept open between appends, evicted safely under concurrency."""

from __future__ import annotations

import threading
from pathlib import Path

from pidesk.store.transcripts import Transcripts


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
