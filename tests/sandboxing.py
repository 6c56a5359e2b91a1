"""Whether this machine can run pidesk's Bash sandbox (bubblewrap), for the tests that need it.

CI must have it (``.ci/run`` installs the Debian package ``bubblewrap``): there a test that needs
it fails without it. Elsewhere such a test skips, saying how to install it, and every other test
runs with the sandbox off (tests/conftest.py), as a host configured ``sandbox = "off"`` would.
"""

from __future__ import annotations

import os
from functools import cache

import pytest

from pidesk.tools.sandbox import probe

INSTALL = "bubblewrap is not usable here: `apt-get install bubblewrap` (and user namespaces enabled) to run this test"


@cache
def sandbox_usable() -> bool:
    return probe(True, False).available


def require_sandbox() -> None:
    if sandbox_usable():
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI must have a working bubblewrap: .ci/run installs the Debian package bubblewrap "
                    f"({probe(True, False).detail})")
    pytest.skip(INSTALL)
