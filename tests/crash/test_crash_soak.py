"""Random-kill soak: SIGKILL a busy host at random moments, many times, and check every restart.

After each kill: ``PRAGMA integrity_check`` is ok; every message the host had
announced durable is there, exactly once (no duplicate ids or seqs); nothing is
pending, queued or running; the restarted host makes no model request by
itself (nothing replayed). ``PIDESK_SOAK_KILLS`` sets the count (CI runs a
reduced 12; the full soak is ``PIDESK_SOAK_KILLS=200 bin/dev test tests/crash/test_crash_soak.py``).
"""

from __future__ import annotations

import json
import os
import random
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pidesk.config import HostConfig
from pidesk.host import Host
from pidesk.providers.scripted import ScriptedProvider

CHILD = Path(__file__).parent / "soak_child.py"
KILLS = int(os.environ.get("PIDESK_SOAK_KILLS", "12"))


def run_and_kill(data_dir: Path, project: Path, seed: int, acks_before_kill: int) -> list[dict]:
    child = subprocess.Popen([sys.executable, str(CHILD), str(data_dir), str(project), str(seed)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    acks: list[dict] = []
    buffer = b""
    deadline = time.monotonic() + 30
    assert child.stdout is not None
    while len(acks) < acks_before_kill and time.monotonic() < deadline:
        ready, _, _ = select.select([child.stdout], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            break
        chunk = os.read(child.stdout.fileno(), 65536)
        if not chunk:
            break
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        acks += [json.loads(line) for line in lines if line]
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL, child.stderr.read().decode() if child.stderr else ""
    return acks


@pytest.mark.timeout(30 + KILLS * 3)
@pytest.mark.asyncio
async def test_random_kills_lose_nothing_acknowledged_duplicate_nothing_and_replay_nothing(tmp_path, project):
    rng = random.Random(int(os.environ.get("PIDESK_SOAK_SEED", "7")))
    data_dir = tmp_path / "data"
    acknowledged: dict[str, tuple[str, int]] = {}
    approved: set[str] = set()
    for round_ in range(KILLS):
        acks = run_and_kill(data_dir, project, rng.randrange(1 << 30), rng.randint(1, 40))
        acknowledged.update({a["message"]: (a["session"], a["seq"]) for a in acks if "message" in a})
        approved.update(a["approved"] for a in acks if "approved" in a)
        provider = ScriptedProvider()
        host = Host.open(HostConfig(data_dir=data_dir), provider)
        try:
            with host.store.db.read() as db:
                assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
                assert db.execute("SELECT count(*) FROM turns WHERE state = 'running'").fetchone()[0] == 0
                assert db.execute("SELECT count(*) FROM plan_approvals WHERE status = 'pending'"
                                  " OR execution_state IN ('queued', 'running')").fetchone()[0] == 0
                assert db.execute("SELECT count(*) FROM permission_requests WHERE status = 'pending'").fetchone()[0] == 0
                statuses = {r[0] for r in db.execute("SELECT status FROM sessions")}
                assert statuses <= {"idle"}
                rows = db.execute("SELECT id, session_id, seq FROM messages").fetchall()
                for status, in db.execute("SELECT status FROM plan_approvals WHERE id IN (%s)" % ",".join(
                        "?" * len(approved)), tuple(approved)) if approved else []:
                    assert status == "approved"  # an acknowledged approval is never undone
            ids = [r[0] for r in rows]
            assert len(ids) == len(set(ids)), "a message was indexed twice"
            per_session: dict[str, list[int]] = {}
            for _id, sid, seq in rows:
                per_session.setdefault(sid, []).append(seq)
            for seqs in per_session.values():
                assert len(seqs) == len(set(seqs)), "two messages share a seq"
            present = {r[0]: (r[1], r[2]) for r in rows}
            lost = {m: v for m, v in acknowledged.items() if present.get(m) != v}
            assert lost == {}, f"acknowledged messages lost or moved after kill {round_}: {lost}"
            assert provider.requests == [], "the restarted host called the model by itself"
        finally:
            await host.close()
    assert len(acknowledged) >= KILLS  # the soak really ran
