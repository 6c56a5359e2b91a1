"""Shared fixtures: a real Host on a real data directory, driven by the scripted provider."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from pidesk import config as pidesk_config
from pidesk.config import HostConfig
from pidesk.host import Host
from pidesk.providers.scripted import ScriptedProvider
from tests.sandboxing import sandbox_usable


def pytest_configure(config: pytest.Config) -> None:
    """Hosts run Bash in their sandbox, as a user's do; a machine without bubblewrap (never CI: .ci/run
    installs it) runs them with it off instead, and the sandbox's own tests skip."""
    if not sandbox_usable() and os.environ.get("CI") != "true":
        pidesk_config.DEFAULT_SANDBOX_ENABLED = False
        os.environ["PIDESK_SANDBOX"] = "off"  # (hosts the tests start as processes)
    # Commands run their host in their own process, as before hosts were started on demand: a test's
    # `pidesk run` must not leave a host behind. The tests of hosts on demand drop it for their commands.
    os.environ["PIDESK_EMBEDDED"] = "1"


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """No host a test started on demand may outlive the run (it would linger ten minutes): any left is
    stopped here, and the run fails naming it — a test that starts one must stop it."""
    import signal
    import subprocess

    factory = getattr(session.config, "_tmp_path_factory", None)
    if factory is None:
        return
    base = str(factory.getbasetemp())  # this run's own: a run beside it keeps its hosts
    listed = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True, check=False).stdout
    ours = [line.split(None, 1) for line in listed.splitlines()
            if "pidesk serve" in line and "--idle-exit" in line and f"--data-dir {base}/" in line]
    for pid, args in ours:
        os.kill(int(pid), signal.SIGTERM)
        print(f"\na host started on demand outlived its test, stopped now: {args}")
    if ours:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_report_header(config: pytest.Config) -> str:
    if sandbox_usable():
        return "pidesk sandbox: bubblewrap (Bash runs sandboxed)"
    return "pidesk sandbox: OFF — bubblewrap is not usable here (apt-get install bubblewrap); its tests skip"


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    root.mkdir()
    (root / "README.md").write_text("# demo project\n")
    (root / "src").mkdir()
    (root / "src" / "app.py").write_text("print('hello')\n")
    return root


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"


@pytest.fixture
def provider() -> ScriptedProvider:
    return ScriptedProvider()


HostFactory = Callable[..., Host]


@pytest_asyncio.fixture
async def make_host(data_dir: Path, provider: ScriptedProvider) -> AsyncIterator[HostFactory]:
    """Open hosts on the shared data dir; every host opened is closed at the end, and so is each
    provider a test handed one (a vendor provider's HTTP pool: a host never closes its provider)."""
    opened: list[Host] = []

    def open_host(**overrides: Any) -> Host:
        options = {k: v for k, v in overrides.items() if k not in ("provider", "clock", "hooks")}
        config = HostConfig(data_dir=data_dir, **options)
        extra = {k: overrides[k] for k in ("clock", "hooks") if k in overrides}
        host = Host.open(config, overrides.get("provider", provider), **extra)
        opened.append(host)
        return host

    yield open_host
    for host in opened:
        try:
            await host.close()
        except Exception:
            pass
    for given in {id(host.parts.provider): host.parts.provider for host in opened}.values():
        aclose = getattr(given, "aclose", None)
        if callable(aclose):
            await aclose()


@pytest_asyncio.fixture
async def host(make_host: HostFactory) -> Host:
    return make_host()
