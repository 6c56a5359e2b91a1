"""Fault injection at named persistence points, for crash tests.

A ``Faults`` value names the points at which the process must die (``kill``:
SIGKILL itself, as a power cut or OOM kill would) or fail (``raise``: an OSError
EIO, as a failing disk would; ``enospc``: an OSError ENOSPC, as a full one would). Production code calls ``faults.hit(point)`` at each
persistence point of seed 003 §4; with no points configured that is a set lookup.
The points are listed in docs/reliability.md.
"""

from __future__ import annotations

import errno
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
            raise InjectedFault(errno.EIO, f"injected I/O error at {point}")
        if self.action == "enospc":
            raise InjectedFault(errno.ENOSPC, f"injected full disk at {point}")
        os.kill(os.getpid(), signal.SIGKILL)


NO_FAULTS = Faults()
