"""Lost and torn writes (issue 7): a power cut after a SIGKILL, through the lossy disk.

A child runs a real Host on a real data directory and project with every
transcript, blob and artifact mutation journaled (``lossy_disk.py``), and dies
— at its end, or at a chosen or random mutation. The parent then "loses" what a
power cut could lose: bytes written after a file's last fsync (dropped, torn,
or zeros / garbage in their place) and directory entries created, renamed or
removed after their directory's last fsync. SQLite's own files are left whole.
It reopens the Host and checks: every acknowledged record is intact; a torn
transcript tail is quarantined, reported and audited, with every earlier byte
kept; nothing is pending or running; the index is sound; no artifact row names
a missing or changed file; new appends continue the seqs and read back.

``PIDESK_LOST_WRITES_RUNS`` sets how many random kills the seeded loop makes (CI: 3,
each cut three ways); ``PIDESK_LOST_WRITES_SEED`` its seed. The full run:
``PIDESK_LOST_WRITES_RUNS=200 bin/dev test tests/crash/test_crash_lost_writes.py``.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from crash_harness import assert_fail_closed, crash_log, rows
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lossy_disk import install
from power_cut import Disk, ModelError, Policy
from scenario import ended, prompt

from pidesk.config import HostConfig
from pidesk.host import Host
from pidesk.providers.scripted import ScriptedProvider
from pidesk.store.store import Store
from pidesk.store.transcripts import Transcripts

RUNS = int(os.environ.get("PIDESK_LOST_WRITES_RUNS", "3"))
SEED = int(os.environ.get("PIDESK_LOST_WRITES_SEED", "11"))
CUTS_PER_KILL = 3


# ---- the layer itself --------------------------------------------------------------------------------


@pytest.fixture
def layered(tmp_path: Path) -> Iterator[tuple[Disk, Any, Path]]:
    """A transcripts directory snapshotted as durable, then the layer installed over it in this process."""
    root = tmp_path / "data"
    (root / "transcripts").mkdir(parents=True)
    (root / "transcripts" / "old.jsonl").write_bytes(b"durable before the layer\n")
    journal = tmp_path / "journal.jsonl"
    disk = Disk([root], journal, strict=[root / "transcripts"])
    installed = install(journal, [root])
    try:
        yield disk, installed.layer, root / "transcripts"
    finally:
        installed.uninstall()


def _history(layer: Any, tdir: Path) -> Transcripts:
    """Synced and unsynced operations of every kind the layer models, through pidesk's own code where it can."""
    t = Transcripts(tdir)
    t.create("s1", [b"header\n"])  # temp file, fsync, rename, directory fsync
    t.append("s1", b"line one\n")  # synced (fdatasync, or O_DSYNC)
    t.forget("s1")
    fd = layer.os.open(t.path("s1"), os.O_WRONLY | os.O_APPEND)
    layer.os.write(fd, b"line two, never synced\n")
    layer.os.close(fd)
    t.create("s3", [b"three\n"])  # its directory fsync is the last
    fd = layer.os.open(tdir / "s2.jsonl", os.O_WRONLY | os.O_CREAT | os.O_DSYNC)
    layer.os.write(fd, b"synced by O_DSYNC, in a directory never synced\n")
    layer.os.close(fd)
    layer.os.replace(tdir / "s3.jsonl", tdir / "s4.jsonl")  # no directory fsync after it
    (tdir / "old.jsonl").unlink()  # nor after this
    return t


def _files(tdir: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(tdir.iterdir())}


def test_lossy_disk_keeps_what_was_synced_and_drops_what_was_not(layered: tuple[Disk, Any, Path]) -> None:
    disk, layer, tdir = layered
    _history(layer, tdir)
    page_cache = _files(tdir)
    assert disk.replay() > 0
    disk.verify()
    assert page_cache == {"s1.jsonl": b"header\nline one\nline two, never synced\n",
                          "s2.jsonl": b"synced by O_DSYNC, in a directory never synced\n",
                          "s4.jsonl": b"three\n"}

    assert disk.cut(Policy("keep", "all")).tree == disk.now()  # what a SIGKILL alone leaves

    dropped = disk.cut(Policy("drop", "none"))
    disk.apply(dropped)
    assert _files(tdir) == {"old.jsonl": b"durable before the layer\n",  # the unsynced unlink did not happen
                            "s1.jsonl": b"header\nline one\n",  # the unsynced line is gone, the synced kept
                            "s3.jsonl": b"three\n"}  # the rename did not happen; s2's entry never reached the disk
    assert any("s1.jsonl: drop" in note for note in dropped.lost)


@pytest.mark.parametrize("mode", ["torn", "zeros", "garbage"])
def test_lossy_disk_tears_or_fills_only_the_unsynced_bytes(mode: str, layered: tuple[Disk, Any, Path]) -> None:
    disk, layer, tdir = layered
    _history(layer, tdir)
    disk.replay()
    kept = b"header\nline one\n"
    unsynced = b"line two, never synced\n"
    for seed in range(20):
        s1 = disk.cut(Policy(mode, "all", seed)).tree[str(tdir / "s1.jsonl")]
        assert s1 is not None and s1.startswith(kept)
        if mode == "torn":
            assert 0 < len(s1) - len(kept) < len(unsynced) and unsynced.startswith(s1[len(kept):])
        else:
            assert len(s1) == len(kept + unsynced) and s1 != kept + unsynced
            assert mode != "zeros" or s1[len(kept):] == bytes(len(unsynced))


def test_lossy_disk_fails_loudly_on_a_write_it_did_not_see(layered: tuple[Disk, Any, Path]) -> None:
    disk, layer, tdir = layered
    _history(layer, tdir)
    with open(tdir / "s1.jsonl", "ab") as behind_its_back:
        behind_its_back.write(b"unrecorded\n")
    disk.replay()
    with pytest.raises(ModelError, match="behind the layer"):
        disk.verify()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(st.tuples(st.booleans(), st.binary(min_size=1, max_size=40)), min_size=1, max_size=12),
       seed=st.integers(0, 2**32), mode=st.sampled_from(["drop", "keep", "torn", "zeros", "garbage"]))
def test_lossy_disk_never_loses_a_synced_byte_nor_invents_one(
    steps: list[tuple[bool, bytes]], seed: int, mode: str
) -> None:
    """Any mix of synced appends and unsynced writes: a cut keeps every byte up to the last sync, and
    beyond it at most what the page cache held (torn: a prefix of it)."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "data"
        (root / "transcripts").mkdir(parents=True)
        disk = Disk([root], Path(tmp) / "journal.jsonl")
        installed = install(Path(tmp) / "journal.jsonl", [root])
        try:
            t = Transcripts(root / "transcripts")
            t.create("s", [b"h\n"])
            synced = b"h\n"
            written = b"h\n"
            for sync, data in steps:
                if sync:
                    t.append("s", data)
                    synced = written = written + data
                else:
                    t.forget("s")
                    fd = installed.layer.os.open(t.path("s"), os.O_WRONLY | os.O_APPEND)
                    installed.layer.os.write(fd, data)
                    installed.layer.os.close(fd)
                    written += data
            t.close()
        finally:
            installed.uninstall()
        disk.replay()
        disk.verify()
        after = disk.cut(Policy(mode, "random", seed)).tree[str(root / "transcripts" / "s.jsonl")]
        assert after is not None and after.startswith(synced) and len(after) <= len(written)
        if mode in ("keep", "torn"):
            assert written.startswith(after)
        if mode == "keep":
            assert after == written
        if mode == "drop":
            assert after == synced


# ---- the host after a power cut -------------------------------------------------------------------------


@dataclass
class Acked:
    """What a child acknowledged, from its ack lines (see crash_driver.py, "lost and torn writes")."""

    messages: dict[str, tuple[str, int, str]] = field(default_factory=dict)
    sessions: set[str] = field(default_factory=set)
    blobs: set[str] = field(default_factory=set)
    approvals: dict[str, tuple[str, str]] = field(default_factory=dict)
    approved: set[str] = field(default_factory=set)
    deleting: set[str] = field(default_factory=set)
    deleted: set[str] = field(default_factory=set)

    def add(self, lines: list[dict[str, Any]]) -> Acked:
        for a in lines:
            if "message" in a:
                self.messages[a["message"]] = (a["session"], a["seq"], a["role"])
            elif "session" in a:
                self.sessions.add(a["session"])
            elif "blob" in a:
                self.blobs.add(a["blob"])
            elif "approval" in a:
                self.approvals[a["approval"]] = (a["artifact"], a["sha"])
            elif "approved" in a:
                self.approved.add(a["approved"])
            elif "deleting" in a:
                self.deleting.add(a["deleting"])
            elif "deleted" in a:
                self.deleted.add(a["deleted"])
        return self


@dataclass
class Place:
    """A data directory and a project under one directory, with the journal beside them."""

    base: Path

    @property
    def data_dir(self) -> Path:
        return self.base / "data"

    @property
    def project(self) -> Path:
        return self.base / "project"

    @property
    def journal(self) -> Path:
        return self.base / "journal.jsonl"

    def make(self, *, data_dir_too: bool = True) -> Place:
        self.project.mkdir(parents=True)
        (self.project / "README.md").write_text("# demo project\n")
        if data_dir_too:  # created and closed before the layer: its directories are on the disk
            Store(self.data_dir).close()
        return self

    def disk(self) -> Disk:
        return Disk([self.data_dir, self.project], self.journal,
                    strict=[self.data_dir / "transcripts", self.data_dir / "blobs", self.project / ".pi"])

    def run(self, scenario: str, kill: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        lossy = {"journal": str(self.journal), "watch": [str(self.data_dir), str(self.project)], "kill": kill}
        return crash_log(scenario, self.data_dir, self.project, "", lossy=lossy)

    def save(self) -> Path:
        """Keep the state the kill left (the page cache), to cut it more than one way."""
        saved = self.base.with_name(self.base.name + "-killed")
        for name in ("data", "project"):
            shutil.copytree(self.base / name, saved / name, symlinks=True)
        return saved

    def restore(self, saved: Path) -> None:
        for name in ("data", "project"):
            shutil.rmtree(self.base / name)
            shutil.copytree(saved / name, self.base / name, symlinks=True)


@dataclass
class Recovered:
    quarantined: list[str]
    indexed_from_outbox: int
    sessions: int


async def reopen_and_check(place: Place, acked: Acked, why: str) -> Recovered:
    """Open a Host after the cut and check every promise; then append to every session and reopen once more."""
    tdir = place.data_dir / "transcripts"
    before = {p.name[: -len(".jsonl")]: p.read_bytes() for p in tdir.glob("*.jsonl")} if tdir.is_dir() else {}
    quarantine_files = set(tdir.glob("*.jsonl.quarantine-*")) if tdir.is_dir() else set()
    provider = ScriptedProvider()
    host = Host.open(HostConfig(data_dir=place.data_dir), provider)
    try:
        boot = host.recovery.boot
        with host.store.db.read() as db:
            assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok", why
        assert_fail_closed(host, provider)

        # a torn or garbage tail is quarantined and reported; every byte before it is kept
        new_quarantines = set(tdir.glob("*.jsonl.quarantine-*")) - quarantine_files
        assert {str(p) for p in new_quarantines} == set(boot.quarantined), why
        if boot.quarantined:
            (recovered,) = rows(host, "SELECT detail FROM audit WHERE action = 'host.recovered' ORDER BY id DESC LIMIT 1")
            assert set(json.loads(recovered[0])["quarantined"]) == set(boot.quarantined), f"not audited; {why}"
        for sid, old in before.items():
            tails = sorted((p for p in new_quarantines if p.name.startswith(f"{sid}.jsonl.quarantine-")),
                           key=lambda p: int(p.name.rsplit("-", 1)[1]))
            path = tdir / f"{sid}.jsonl"
            kept = path.read_bytes() if path.exists() else b""
            assert kept + b"".join(p.read_bytes() for p in tails) == old, f"{sid}: bytes dropped silently; {why}"
            if path.exists():
                scan = host.store.transcripts.scan(sid)
                assert scan.good_end == scan.size, f"{sid}: a bad tail was left in place; {why}"

        # every acknowledged record is intact
        indexed = {r[0]: (r[1], r[2], r[3]) for r in rows(host, "SELECT id, session_id, seq, role FROM messages")}
        assert len(indexed) == len(rows(host, "SELECT id FROM messages")), f"a message id twice; {why}"
        assert len(set(indexed.values())) == len(indexed), f"two messages share a session and seq; {why}"
        sessions = {r[0]: r[1] for r in rows(host, "SELECT id, project_path FROM sessions")}
        gone = acked.deleted | {s for s in acked.deleting if s not in sessions}  # a delete under way may finish
        lost = {m: v for m, v in acked.messages.items() if v[0] not in gone and indexed.get(m) != v}
        assert lost == {}, f"acknowledged messages lost: {lost}; {why}"
        missing = acked.sessions - gone - set(sessions)
        assert missing == set(), f"acknowledged sessions lost: {missing}; {why}"
        for sid in sessions:
            assert (tdir / f"{sid}.jsonl").exists(), f"session {sid} has a row and no transcript; {why}"
            on_disk = [m.id for m in host.store.messages(sid)]
            assert sorted(on_disk) == sorted(m for m, v in indexed.items() if v[0] == sid), why
        for sid in acked.deleted:
            assert sid not in sessions and not (tdir / f"{sid}.jsonl").exists(), f"deleted {sid} came back; {why}"
        for ref in acked.blobs:
            data = host.store.blobs.get(ref)
            assert data is not None and "sha256:" + hashlib.sha256(data).hexdigest() == ref, f"blob {ref}; {why}"
        approvals = {r[0]: r[1:] for r in rows(
            host, "SELECT a.id, a.status, a.artifact_path, a.artifact_sha256, s.project_path"
                  " FROM plan_approvals a JOIN sessions s ON s.id = a.session_id")}
        assert set(acked.approvals) <= set(approvals), f"acknowledged approvals lost; {why}"
        for approval in acked.approved:
            assert approvals[approval][0] == "approved", f"an acknowledged approval was undone; {why}"
        for approval, (_status, rel, sha, project) in approvals.items():
            artifact = Path(project) / rel
            assert artifact.is_file(), f"approval {approval} names {rel}, which is gone; {why}"
            assert hashlib.sha256(artifact.read_bytes()).hexdigest() == sha, f"{rel} changed; {why}"

        # new appends continue every session's seqs and read back
        sub = host.subscribe()
        for sid in sessions:
            if rows(host, "SELECT mode FROM sessions WHERE id = ?", sid) != [("agent",)]:
                await host.call("session.setMode", {"sessionId": sid, "mode": "agent"})
            last = max((v[1] for v in indexed.values() if v[0] == sid), default=0)
            started = await prompt(host, sid, "after the power cut")
            await ended(sub, started["turnId"])
            seqs = [m.seq for m in host.store.messages(sid)]
            assert seqs == list(range(1, len(seqs) + 1)) and len(seqs) >= last + 2, f"{sid}: {seqs}; {why}"
            page, _more = host.store.page(sid, None, 10_000)
            assert [m.seq for m in page] == seqs, why
        result = Recovered(list(boot.quarantined), boot.indexed_from_outbox, len(sessions))
    finally:
        await host.close()

    again = Host.open(HostConfig(data_dir=place.data_dir), ScriptedProvider())
    try:
        boot = again.recovery.boot
        assert (boot.quarantined, boot.indexed_from_outbox, boot.dropped_index_rows) == ([], 0, 0), why
    finally:
        await again.close()
    return result


# ---- a whole workload, then a power cut ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def workload(tmp_path_factory: pytest.TempPathFactory) -> tuple[Place, Path, Disk, Acked]:
    """One child runs the whole workload and dies at its end; its page cache is kept to cut many ways."""
    place = Place(tmp_path_factory.mktemp("workload") / "w").make()
    disk = place.disk()
    acked = Acked().add(place.run("lossy_workload"))
    assert disk.replay() > 20 and len(acked.messages) >= 10 and acked.approved and acked.deleted
    disk.verify()
    return place, place.save(), disk, acked


@pytest.mark.asyncio
async def test_a_finished_workload_leaves_nothing_unsynced_and_a_power_cut_then_loses_nothing(
    workload: tuple[Place, Path, Disk, Acked]
) -> None:
    """Once every call has returned, every byte and directory entry the store wrote is synced."""
    place, saved, disk, acked = workload
    assert disk.unsynced() == {}
    place.restore(saved)
    cut = disk.cut(Policy("drop", "none"))
    assert cut.lost == []
    disk.apply(cut)
    recovered = await reopen_and_check(place, acked, "a finished workload")
    assert recovered.quarantined == [] and recovered.sessions == len(acked.sessions - acked.deleted)


# ---- a transcript append in flight ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def torn_append(tmp_path_factory: pytest.TempPathFactory) -> tuple[Place, Path, Disk, Acked]:
    """Killed inside the write of the fourth transcript append (A's final assistant line): it never returned."""
    place = Place(tmp_path_factory.mktemp("torn") / "t").make()
    disk = place.disk()
    kill = {"op": "write", "suffix": ".jsonl", "nth": 4, "when": "after"}
    acked = Acked().add(place.run("lossy_workload", kill))
    disk.replay()
    disk.verify()
    return place, place.save(), disk, acked


@pytest.mark.asyncio
@pytest.mark.parametrize("mode", ["torn", "zeros", "garbage", "drop", "keep"])
async def test_append_in_flight_at_a_power_cut_is_quarantined_if_torn_earlier_lines_kept_appends_continue(
    mode: str, torn_append: tuple[Place, Path, Disk, Acked]
) -> None:
    place, saved, disk, acked = torn_append
    place.restore(saved)
    (session,) = acked.sessions
    path = place.data_dir / "transcripts" / f"{session}.jsonl"
    in_flight = disk.unsynced()
    assert list(in_flight) == [str(path)], in_flight  # only the line being written is at risk
    synced = path.read_bytes()[: synced_length(disk, path)]
    roles = [v[2] for v in acked.messages.values()]  # the last ack may not have been printed before the kill
    assert roles and roles == ["user", "assistant", "tool"][: len(roles)]

    cut = disk.cut(Policy(mode, "none", seed=5))
    disk.apply(cut)
    after_cut = path.read_bytes()
    recovered = await reopen_and_check(place, acked, f"{mode}: {cut.lost}")

    if mode in ("torn", "zeros", "garbage"):
        (quarantined,) = recovered.quarantined
        assert Path(quarantined).read_bytes() == after_cut[len(synced):]
        assert Path(quarantined).name.startswith(f"{session}.jsonl.quarantine-")
    else:
        assert recovered.quarantined == []
    assert path.read_bytes().startswith(synced)  # every earlier line kept, then the new appends


def synced_length(disk: Disk, path: Path) -> int:
    tree = disk.cut(Policy("drop", "none")).tree
    data = tree[str(path)]
    assert data is not None
    return len(data)


# ---- random kills, random cuts -------------------------------------------------------------------------------


@pytest.mark.asyncio
@pytest.mark.timeout(60 + RUNS * 10)
async def test_random_kill_and_power_cut_lose_nothing_acknowledged(
    tmp_path: Path, workload: tuple[Place, Path, Disk, Acked]
) -> None:
    """Kill at a random mutation of the workload (before it, or after it without its return), then cut
    each unsynced file and directory a random way, several times per kill."""
    _place, _saved, calibrated, _acked = workload
    total = calibrated.replayed
    rng = random.Random(SEED)
    figures = {"kills": 0, "cuts": 0, "cuts that took something": 0, "tails quarantined": 0,
               "acknowledged records checked": 0, "lost": 0}
    for run in range(RUNS):
        place = Place(tmp_path / f"run{run}").make()
        disk = place.disk()
        kill = {"nth": rng.randint(1, total), "when": rng.choice(["before", "after"])}
        acked = Acked().add(place.run("lossy_workload", kill))
        disk.replay()
        disk.verify()
        saved = place.save()
        figures["kills"] += 1
        checked = len(acked.messages) + len(acked.sessions) + len(acked.blobs) + len(acked.approvals)
        for cut_number in range(CUTS_PER_KILL):
            if cut_number:
                place.restore(saved)
            policy = Policy("random", "random", rng.randrange(1 << 30))
            cut = disk.cut(policy)
            disk.apply(cut)
            recovered = await reopen_and_check(place, acked, f"run {run}, kill {kill}, {policy.describe()}, "
                                                             f"lost {cut.lost}")
            figures["cuts"] += 1  # reopen_and_check failed the test on any loss: "lost" stays 0
            figures["cuts that took something"] += bool(cut.lost)
            figures["tails quarantined"] += len(recovered.quarantined)
            figures["acknowledged records checked"] += checked
        shutil.rmtree(saved)
    print(f"lost writes: {figures}")  # shown with -s; the full run's figures are in docs/reliability.md


# ---- losses the lossy disk found, fixed: every new directory entry is fsynced by its parent --------------------------


@pytest.mark.asyncio
async def test_fresh_data_dir_power_cut_keeps_the_transcripts_directory(tmp_path: Path) -> None:
    place = Place(tmp_path / "fresh").make(data_dir_too=False)
    disk = place.disk()
    acked = Acked().add(place.run("lossy_attach"))
    cut = disk.power_cut(Policy("keep", "none"))
    await reopen_and_check(place, acked, f"lost {cut.lost}")


@pytest.mark.asyncio
async def test_blob_left_unsynced_by_a_killed_process_is_made_durable_by_the_next_put(tmp_path: Path) -> None:
    place = Place(tmp_path / "blob").make()
    disk = place.disk()
    acked = Acked().add(place.run("lossy_attach", {"op": "dirsync", "suffix": "/blobs"}))
    assert acked.blobs == set()  # killed before the put returned
    acked.add(place.run("lossy_attach"))
    cut = disk.power_cut(Policy("keep", "none"))
    await reopen_and_check(place, acked, f"lost {cut.lost}")


@pytest.mark.asyncio
async def test_artifact_directory_left_unsynced_by_a_killed_process_is_made_durable_by_the_next_submit(
    tmp_path: Path
) -> None:
    place = Place(tmp_path / "plan").make()
    disk = place.disk()
    acked = Acked().add(place.run("lossy_plan", {"op": "dirsync", "suffix": "/project"}))
    assert acked.approvals == {}  # killed before the artifact was written
    acked.add(place.run("lossy_plan"))
    cut = disk.power_cut(Policy("keep", "none"))
    await reopen_and_check(place, acked, f"lost {cut.lost}")
