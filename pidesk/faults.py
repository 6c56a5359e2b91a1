"""Fault injection at named persistence points, for crash tests.

A ``Faults`` value names the points at which the process must die (``kill``:
SIGKILL itself, as a power cut or OOM kill would) or fail (``raise``: an OSError,
as a full disk would). Production code calls ``faults.hit(point)`` at each
persistence point of seed 003 §4; with no points configured that is a set lookup.
The points are listed in docs/reliability.md.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass, field


class InjectedFault(OSError):
    pass


@dataclass(frozen=True)
class Faults:
    points: frozenset[str] = field(default_factory=frozenset)
    action: str = "kill"

    def hit(self, point: str) -> None:
        if point not in self.points:
            return
        if self.action == "raise":
            raise InjectedFault(f"injected fault at {point}")
        os.kill(os.getpid(), signal.SIGKILL)


NO_FAULTS = Faults()
