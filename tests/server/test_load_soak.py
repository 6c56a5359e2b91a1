"""Load soak, CI size (issue 7 item 6): ``bench/load_soak.py``'s driver at 20 sessions for ~8 s.

The same code as the full run (200 sessions for 10 minutes, ``flock /tmp/pidesk-bench.lock
.venv/bin/python bench/load_soak.py``; figures in docs/reliability.md): a real ``pidesk serve``
subprocess and the instant mock model (``bench/_mock_openai.py --policy load_mix``) in a process of
its own; prompts with Read/Bash calls, queue pushes while turns run, plans rejected, revised and
approved with each permission mode, executions whose Bash asks and is allowed. Every wait is on
events or responses, with deadlines; nothing here sleeps. Asserted: no event lost on any connection
(``seq`` gapless, every connection ends on the same seq), each session's stored messages are exactly
those announced, every approval, permission request and queued entry is accounted for, every turn
completed, and the host is idle, healthy and within a generous RSS bound afterwards.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import load_soak  # noqa: E402

RSS_BOUND_MB = 400  # generous: the full 200-session run peaks far below it


@pytest.mark.timeout(180)
def test_twenty_sessions_under_mixed_load_lose_no_event_and_account_for_every_approval_and_entry(
    tmp_path: Path,
) -> None:
    config = load_soak.SoakConfig(sessions=20, duration=8.0, clients=2, step_timeout=60.0, drain_timeout=60.0)

    result, _server = load_soak.soak(tmp_path, config)

    assert result.failures == [], "\n".join(result.failures)
    assert result.healthy
    # events: every connection saw every seq once, and the same span
    assert len(result.connections) == 3
    assert [(c.gaps, c.backwards) for c in result.connections] == [(0, 0)] * 3
    assert all(c.count == c.span > 0 for c in result.connections)
    assert len({(c.first, c.last) for c in result.connections}) == 1
    assert result.lost_events == 0
    # messages: exactly those announced, each sent text stored once
    assert result.messages_checked > 0
    assert (result.messages_missing, result.messages_unannounced, result.messages_duplicated,
            result.seq_mismatch, result.texts_wrong) == (0, 0, 0, 0, 0)
    # approvals, permissions, queue, turns
    assert result.plans_approved > 0 and result.plans_rejected > 0
    assert result.plans_submitted == result.plans_approved + result.plans_rejected == result.plans_resolved_events
    assert result.executions_completed == result.plans_approved
    assert result.permissions_requested == result.permissions_resolved == result.permissions_resolved_events > 0
    assert result.queue_pushed == result.queue_started > 0
    assert set(result.turns_ended) == {"completed"}
    assert sum(result.turns_started.values()) == sum(result.turns_ended.values())
    assert result.hwm_kib / 1024 < RSS_BOUND_MB
