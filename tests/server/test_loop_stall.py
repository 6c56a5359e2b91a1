"""Authority hole 6, CI size: no hostile call stalls the host's event loop (``bench/loop_stall.py --quick``).

Each case runs against a real ``pidesk serve`` subprocess while a probe process GETs ``/healthz``
every 10 ms. On the code before the attack pass the worst probe waited seconds (Grep ``(a*)*b``
25 s, Glob 5 s, ``markdown.render`` of ``"[" * 200_000`` seconds too). The benchmark's target is
50 ms at full size (docs/benchmarks.md); here, on a shared CI machine at reduced sizes, a stall
of 250 ms fails — any of the old holes misses it by an order of magnitude.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import loop_stall  # noqa: E402

CI_BOUND_MS = 250.0


@pytest.mark.timeout(240)
def test_no_hostile_call_stalls_the_event_loop() -> None:
    rows = loop_stall.run_cases(quick=True)
    assert [r.case for r in rows] == [c.name for c in loop_stall.CASES]
    for row in rows:
        assert row.probes >= 2, f"{row.case}: the probe barely ran ({row.probes} probes)"
    stalled = {r.case: round(r.worst_ms, 1) for r in rows if not r.worst_ms <= CI_BOUND_MS}
    assert not stalled, f"worst /healthz latency over {CI_BOUND_MS} ms: {stalled}"
    turns = {c.name for c in loop_stall.CASES if c.drive is loop_stall._turn}  # the cases that are a tool call
    failed = {r.case: r.answer for r in rows if r.case in turns and not r.answer.endswith(" ok; turn completed")}
    assert not failed, f"the hostile call did not do its work: {failed}"
