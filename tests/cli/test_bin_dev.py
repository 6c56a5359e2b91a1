"""``bin/dev`` — what CI runs (``bin/dev test``) and what a developer types — under a pyenv-style shim."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).parents[2]
VENV = REPO / ".venv"


@pytest.mark.skipif(Path(sys.prefix).resolve() != VENV.resolve() or not (REPO / ".uv" / "bin" / "uv").exists(),
                    reason="runs bin/dev in the checkout whose .venv (and bootstrapped uv) runs these tests")
def test_bin_dev_keeps_the_venv_when_python3_is_a_shim(tmp_path):
    """Issue 18 item 10: under pyenv `command -v python3` is a shim script; bin/dev passed it to uv, which
    replaced .venv on every call (18–26 s, deleting the venv under a running `pidesk serve`). Now bin/dev
    names the interpreter itself: with a shim first on PATH, .venv is kept and a call takes under 2 s."""
    real = os.path.realpath(sys._base_executable)  # the interpreter .venv was made from
    shim = tmp_path / "python3"
    shim.write_text(f'#!/bin/sh\nexec "{real}" "$@"\n')
    shim.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}"}
    config = VENV / "pyvenv.cfg"
    before = config.stat()
    seconds = []
    for _ in range(2):
        started = time.monotonic()
        done = subprocess.run([str(REPO / "bin" / "dev"), "--version"], env=env, capture_output=True, text=True,
                              timeout=120)
        seconds.append(time.monotonic() - started)
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith("pidesk, version")
    after = config.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns), ".venv was re-created"
    assert seconds[1] < 2, seconds
