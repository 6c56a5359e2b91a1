"""The append path's shortcuts: O_DSYNC descriptors, tracked end offsets, spliced lines, ordered ids."""

from __future__ import annotations

import errno
import fcntl
import os
import threading
import types
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pidesk import ids as ids_module
from pidesk.core.errors import StoreError
from pidesk.core.records import Message, TextBlock, ToolCallBlock, ToolResultBlock
from pidesk.ids import iso, now_iso, ordered_ids, utcnow
from pidesk.store import store as store_module
from pidesk.store import transcripts as transcripts_module
from pidesk.store.transcripts import Transcripts, as_line, encode_line, encode_message
from tests.store.test_write_faults import new_store


def test_the_kept_descriptor_is_o_dsync_so_each_write_is_its_own_sync(tmp_path: Path):
    transcripts = Transcripts(tmp_path)
    transcripts.create("s", [b"header\n"])
    transcripts.append("s", b"one\n")
    fd = transcripts._open["s"].fd
    assert fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DSYNC == os.O_DSYNC


def test_the_tracked_end_follows_appends_cuts_quarantines_evictions_and_reopens(tmp_path: Path):
    transcripts = Transcripts(tmp_path, max_open=1)
    transcripts.create("s", [b"header\n"])
    transcripts.create("other", [b"h\n"])
    assert transcripts.append("s", b"aa\n") == 7
    assert transcripts.append("s", b"bbb\n") == 10
    transcripts.truncate("s", 10)  # a smart stop's cut
    assert transcripts.append("s", b"c\n") == 10
    assert transcripts.append("other", b"x\n") == 2  # evicts the handle of "s" (max_open=1)
    assert transcripts.append("s", b"d\n") == 12  # reopened: the end is read again
    with open(transcripts.path("s"), "ab") as f:  # a torn tail, as a crash in an earlier run leaves
        f.write(b'{"t":"mess')
    transcripts.forget("s")
    transcripts.quarantine_tail("s", 14)  # as boot would, past the last good line
    assert transcripts.append("s", b"e\n") == 14
    transcripts.close()
    assert transcripts.path("s").read_bytes() == b"header\naa\nc\nd\ne\n"


def test_a_failed_o_dsync_write_is_a_failed_sync_and_its_bytes_are_cut_back(tmp_path: Path, monkeypatch):
    transcripts = Transcripts(tmp_path)
    transcripts.create("s", [b"header\n"])
    assert transcripts.append("s", b"kept\n") == 7

    def write_half_then_fail(fd: int, data: bytes) -> int:
        if len(data) > 4:
            return os.write(fd, bytes(data[: len(data) // 2]))  # a short write...
        raise OSError(errno.EIO, "the disk failed to sync")  # ...whose rest fails

    monkeypatch.setattr(transcripts_module, "os", types.SimpleNamespace(**{**vars(os), "write": write_half_then_fail}))
    with pytest.raises(OSError):
        transcripts.append("s", b"lost line\n")
    monkeypatch.undo()
    assert transcripts.path("s").read_bytes() == b"header\nkept\n"  # nothing unacknowledged stays
    assert transcripts.append("s", b"next\n") == 12
    assert transcripts.path("s").read_bytes() == b"header\nkept\nnext\n"


def test_a_session_whose_failed_write_cannot_be_cut_back_takes_no_appends_until_a_restart(tmp_path: Path, monkeypatch):
    transcripts = Transcripts(tmp_path)
    transcripts.create("s", [b"header\n"])
    transcripts.append("s", b"kept\n")

    def fail(*args: object, **kwargs: object) -> int:
        raise OSError(errno.EIO, "the disk failed")

    monkeypatch.setattr(transcripts_module, "os", types.SimpleNamespace(**{**vars(os), "write": fail}))
    monkeypatch.setattr(transcripts_module, "open", fail, raising=False)  # _undo cannot cut the file back
    with pytest.raises(OSError):
        transcripts.append("s", b"unsynced\n")
    monkeypatch.undo()  # the disk works again, but the file may hold bytes nobody acknowledged
    with pytest.raises(OSError, match="restart to recover it"):
        transcripts.append("s", b"next\n")
    transcripts.close()
    restarted = Transcripts(tmp_path)  # boot reconciles the tail; then appends go on
    assert restarted.append("s", b"next\n") > 0
    restarted.close()


def test_a_smart_stop_cut_commits_queued_rows_under_the_session_lock(tmp_path: Path, monkeypatch):
    store, sid = new_store(tmp_path, store_module.NO_FAULTS)
    store.append_message(sid, None, "user", [TextBlock(text="kept")])
    cut = store.append_message(sid, None, "user", [TextBlock(text="cut")])
    flush, seen = store.flush, []

    def flush_and_look():
        seen.append(store.transcripts.lock(sid).locked())
        flush()

    monkeypatch.setattr(store, "flush", flush_and_look)
    assert store.cut_from(sid, cut.id, lambda db: None) == 2
    assert seen == [True]
    monkeypatch.undo()
    assert [m.text() for m in store.page(sid, None, 10)[0]] == ["kept"]
    store.close()


def test_an_encoded_message_is_the_same_line_as_through_message_line():
    message = Message(
        id="m_1", session_id="s_1", turn_id=None, seq=3, role="assistant", created_at=now_iso(),
        content=[TextBlock(text='quote " and \\n'), ToolCallBlock(id="c", name="Bash", args={"cmd": "ls"}),
                 ToolResultBlock(tool_call_id="c", name="Bash", ok=True, output="x", duration_ms=4)],
    )
    assert encode_message(message) == encode_line(as_line(message))


def test_ordered_ids_have_the_usual_shape_and_sort_in_the_order_made():
    make = ordered_ids("m")
    ids = [make() for _ in range(1000)]
    assert all(len(i) == 18 and i.startswith("m_") and int(i[2:], 16) >= 0 for i in ids)
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert ordered_ids("m")() > ids[-1]  # a later generator (a restart) starts above


def test_now_iso_is_iso_of_utcnow():
    before, now, after = iso(utcnow()), now_iso(), iso(utcnow())
    assert before <= now <= after and len(now) == len(before)


@settings(max_examples=200, deadline=None)
@given(steps=st.lists(st.integers(min_value=0, max_value=3_000_000_000), min_size=1, max_size=40))
def test_now_iso_reuses_a_stamp_only_within_its_millisecond(steps: list[int]):
    """The kept text of a millisecond (and of a second) is right for every clock reading:
    readings inside one millisecond, across millisecond and second boundaries, and after a
    clock stepped back."""
    clock = 1_764_720_000_123_456_789  # 2025-12-03, nanoseconds
    readings = []
    for n, step in enumerate(steps):
        clock += step if n % 7 else -step  # now and then the clock steps back
        readings.append(clock)
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    with pytest.MonkeyPatch.context() as patch:
        ticks = iter(readings)
        patch.setattr(ids_module.time, "time_ns", lambda: next(ticks))
        stamps = [now_iso() for _ in readings]
    assert stamps == [iso(epoch + timedelta(milliseconds=ns // 1_000_000)) for ns in readings]


def test_concurrent_appenders_past_many_batches_leave_every_row_indexed(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(store_module, "INDEX_BATCH", 8)
    monkeypatch.setattr(store_module, "INDEX_BACKLOG", 32)
    store, first = new_store(tmp_path, store_module.NO_FAULTS)
    sessions = [first, *(f"s_{n}" for n in range(2, 7))]
    for sid in sessions[1:]:
        new_store_session(store, sid, tmp_path)

    def writer(sid: str) -> None:
        for n in range(60):
            store.append_message(sid, None, "user", [TextBlock(text=f"{sid} {n}")])

    threads = [threading.Thread(target=writer, args=(sid,)) for sid in sessions]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    for sid in sessions:
        messages, _ = store.page(sid, None, 100)
        assert [(m.seq, m.text()) for m in messages] == [(n + 1, f"{sid} {n}") for n in range(60)]
    store.close()
    again = store_module.Store(tmp_path / "data")
    report = again.reconcile()
    assert report.indexed_from_outbox == 0 and report.quarantined == []  # every watermark matches its file
    again.close()


def test_a_failed_index_commit_keeps_its_rows_for_the_next_flush(tmp_path: Path, monkeypatch):
    store, sid = new_store(tmp_path, store_module.NO_FAULTS)
    for n in range(3):
        store.append_message(sid, None, "user", [TextBlock(text=f"before {n}")])
    commit = store._commit_rows

    def fail_once(batch):
        monkeypatch.setattr(store, "_commit_rows", commit)
        store.append_message(sid, None, "user", [TextBlock(text="during")])  # queued while the batch is out
        raise OSError("disk I/O error")

    monkeypatch.setattr(store, "_commit_rows", fail_once)
    with pytest.raises(StoreError) as failed:
        store.flush()
    assert failed.value.code == "PERSISTENCE_FAILURE"
    store.append_message(sid, None, "user", [TextBlock(text="after")])  # queued behind the kept rows
    messages, _ = store.page(sid, None, 10)
    assert [m.text() for m in messages] == ["before 0", "before 1", "before 2", "during", "after"]
    store.close()


def test_deleting_a_session_commits_its_queued_rows_under_its_lock(tmp_path: Path, monkeypatch):
    """A row queued for a session after the delete's flush would reference a deleted session
    and fail every later index commit; the flush runs while the session's appends are locked out."""
    store, sid = new_store(tmp_path, store_module.NO_FAULTS)
    store.append_message(sid, None, "user", [TextBlock(text="queued")])
    new_store_session(store, "s_2", tmp_path)
    flush, seen = store.flush, []

    def flush_and_look():
        seen.append(store.transcripts.lock(sid).locked())
        flush()

    monkeypatch.setattr(store, "flush", flush_and_look)
    store.delete_session(sid)
    assert seen == [True]
    store.append_message("s_2", None, "user", [TextBlock(text="still indexed")])
    assert [m.text() for m in store.page("s_2", None, 10)[0]] == ["still indexed"]
    store.close()


def new_store_session(store: store_module.Store, sid: str, root: Path) -> None:
    from pidesk.core.modes import Mode, PermissionMode, PlanState, SessionStatus
    from pidesk.core.records import Session

    now = now_iso()
    store.create_session(Session(
        id=sid, title="t", project_path=None, root=str(root), mode=Mode.AGENT,
        permission_mode=PermissionMode.ASK, status=SessionStatus.IDLE, plan_state=PlanState.INACTIVE,
        current_turn_id=None, forked_from=None, created_at=now, updated_at=now))
