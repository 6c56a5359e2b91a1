"""One host per data directory: an exclusive flock held for the life of the process."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from pidesk.core.errors import StartupRefused


class DataDirLock:
    """An exclusive flock on ``<data_dir>/host.lock`` for the life of the host."""

    def __init__(self, data_dir: Path) -> None:
        data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)  # the Store tightens one that existed
        self.path = data_dir / "host.lock"
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self.fd)
            raise StartupRefused(
                f"another pidesk host is already serving {data_dir} (it holds {self.path}); "
                "stop it first (pidesk stop), or pass a different --data-dir"
            ) from None

    def release(self) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)
