"""What ``pidesk serve`` writes into the data dir for its clients: ``host.json``, the kept token, the last port.

- ``host.json`` (PROTOCOL.md "Starting and finding a host"): the URL, port, token, pid and
  protocol version of the host serving now; written once it accepts connections, removed
  on a clean exit.
- ``token``: the token kept across restarts (PROTOCOL.md "Additions"), so a page opened with
  ``?token=…`` is still let in by the next host on this data dir. ``--token`` replaces it;
  ``--new-token`` makes a fresh one (the way to lock out every page and client that knew it).
- ``last-port``: the port the host had, which the next one tries first, so the same open
  page finds it again.

Each file is 0600 like every file of the data dir and replaced whole (a temporary file,
fsync, rename): a crash leaves the old contents or the new, never a torn token.
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

from pidesk.store.transcripts import write_private

HOST_JSON = "host.json"
TOKEN = "token"
LAST_PORT = "last-port"


def token_for(data_dir: Path, given: str | None = None, *, new: bool = False) -> str:
    """The token to serve with: ``given`` (then kept), a fresh one if ``new`` or none is kept, else the kept one."""
    path = data_dir / TOKEN
    kept = None if new or given else _read(path)
    if kept:
        return kept
    token = given or secrets.token_urlsafe(32)
    _replace(path, token.encode())
    return token


def last_port(data_dir: Path) -> int | None:
    text = _read(data_dir / LAST_PORT)
    return int(text) if text is not None and text.isdigit() and 0 < int(text) < 65536 else None


def keep_port(data_dir: Path, port: int) -> None:
    _replace(data_dir / LAST_PORT, str(port).encode())


def write_host_json(data_dir: Path, data: dict[str, object]) -> Path:
    path = data_dir / HOST_JSON
    _replace(path, json.dumps(data).encode())
    return path


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except (OSError, UnicodeDecodeError):
        return None


def _replace(path: Path, data: bytes) -> None:
    temp = path.with_name(path.name + ".tmp")
    write_private(temp, data)
    os.replace(temp, path)
