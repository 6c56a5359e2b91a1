from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def root(tmp_path: Path) -> Path:
    path = tmp_path / "root"
    path.mkdir()
    return path


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A sibling of the root holding a file no tool may reach."""
    path = tmp_path / "outside"
    path.mkdir()
    (path / "secret.txt").write_text("outside data\n")
    return path
