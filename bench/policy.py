"""The policy gate: ``policy.decide`` decisions per second over every cell of its table.

The cells are every (mode × permission mode × tool) — the built-in tools, an
unknown name and a plugin tool at each risk — each with and without a session
grant and in a temporary or project session (and, where ``decide`` takes
``delegate``, from a parent and from a delegate): 3 × 3 × 19 × 2 × 2 (× 2) calls
per sweep, made exactly as the host makes them (keyword arguments). The figure
includes the loop; the cost of the same loop calling a do-nothing function of the
same signature is shown for context. Also: ``batch_is_exclusive_violation`` over
batches of one to five calls, some holding an Enter*/Submit* tool.
Target: ≥ 500k decisions/s.

    .venv/bin/python bench/policy.py [--quick]
"""

from __future__ import annotations

import inspect
import itertools
import random
import time
from collections import Counter
from collections.abc import Callable

import harness
from harness import Figure

from pidesk.core.modes import Mode, PermissionMode
from pidesk.core.policy import (
    ALLOW,
    BUILTIN_TOOLS,
    Allow,
    Ask,
    Decision,
    Deny,
    PluginRisk,
    batch_is_exclusive_violation,
    decide,
)

Cell = tuple[Mode, PermissionMode, str, PluginRisk | None, bool, bool, bool]
HAS_DELEGATE = "delegate" in inspect.signature(decide).parameters


def cells() -> list[Cell]:
    tools: list[tuple[str, PluginRisk | None]] = [(name, None) for name in BUILTIN_TOOLS]
    tools.append(("NoSuchTool", None))
    tools += [(f"mcp__files__{risk.value}", risk) for risk in PluginRisk]
    delegates = (False, True) if HAS_DELEGATE else (False,)
    return [
        (mode, permission, name, risk, granted, temporary, delegate)
        for mode, permission, (name, risk), granted, temporary, delegate in itertools.product(
            Mode, PermissionMode, tools, (False, True), (False, True), delegates
        )
    ]


def noop(
    mode: Mode, permission_mode: PermissionMode, tool: str, *, plugin_risk: PluginRisk | None = None,
    granted: bool = False, temporary: bool = False, delegate: bool = False,
) -> Decision:
    return ALLOW


def one(fn: Callable[..., Decision], cell: Cell) -> Decision:
    mode, permission, name, risk, granted, temporary, delegate = cell
    if HAS_DELEGATE:
        return fn(mode, permission, name, plugin_risk=risk, granted=granted, temporary=temporary, delegate=delegate)
    return fn(mode, permission, name, plugin_risk=risk, granted=granted, temporary=temporary)


def sweep_rate(fn: Callable[..., Decision], table: list[Cell], sweeps: int, repeats: int) -> float:
    """Best of ``repeats`` timings of ``sweeps`` passes over the table, in calls per second."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(sweeps):
            if HAS_DELEGATE:
                for mode, permission, name, risk, granted, temporary, delegate in table:
                    fn(mode, permission, name, plugin_risk=risk, granted=granted, temporary=temporary,
                       delegate=delegate)
            else:
                for mode, permission, name, risk, granted, temporary, _ in table:
                    fn(mode, permission, name, plugin_risk=risk, granted=granted, temporary=temporary)
        best = min(best, time.perf_counter() - start)
    return sweeps * len(table) / best


def batches(count: int) -> list[list[str]]:
    rng = random.Random(3)
    names = list(BUILTIN_TOOLS)
    return [rng.choices(names, k=rng.randint(1, 5)) for _ in range(count)]


def batch_rate(table: list[list[str]], sweeps: int, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(sweeps):
            for batch in table:
                batch_is_exclusive_violation(batch)
        best = min(best, time.perf_counter() - start)
    return sweeps * len(table) / best


def main() -> int:
    args = harness.parse_args(__doc__ or "")
    sweeps, repeats = (150, 3) if args.quick else (1500, 7)  # 684 (1368) calls a sweep
    harness.header("policy", args.quick)
    table = cells()
    verdicts = Counter(type(one(decide, cell)).__name__ for cell in table)
    assert set(verdicts) == {Allow.__name__, Ask.__name__, Deny.__name__}
    print(f"  {len(table)} cells: {dict(verdicts)}; best of {repeats} × {sweeps * len(table):,} calls")
    rate = sweep_rate(decide, table, sweeps, repeats)
    loop = sweep_rate(noop, table, sweeps, repeats)
    some_batches = batches(1000)
    violations = sum(batch_is_exclusive_violation(b) for b in some_batches)
    figures = [
        Figure("policy.decide over all cells", rate, "calls/s", 500_000),
        Figure("  the same loop calling a no-op", loop, "calls/s",
               note=f"decide itself ≈ {1e9 / rate - 1e9 / loop:.0f} ns of {1e9 / rate:.0f} ns a call"),
        Figure("batch_is_exclusive_violation, 1-5 calls", batch_rate(some_batches, sweeps, repeats), "calls/s",
               note=f"{violations / 10:.0f}% of batches violate"),
    ]
    return harness.report("policy", figures, args.json)


if __name__ == "__main__":
    raise SystemExit(main())
