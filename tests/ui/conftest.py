"""Fixtures for the web UI tests: the REAL server in-process, the system Chromium, a page.

- ``browser`` is one headless Chromium for the whole run (Debian's ``/usr/bin/chromium``,
  driven by Playwright; never a downloaded browser). Without it the tests skip — or
  fail under ``CI=true``, where ``.ci/run`` installs it.
- ``ui`` starts ``pidesk.server.serve.serve`` as a task of the session's event loop
  (port 0, a fixed token, a tmp data dir and project, a ``ScriptedProvider`` the test
  keeps), opens a fresh browser context, and gives the test an ``Ui`` handle: the
  page, RPC over HTTP for set-up and checks, and screenshot saving. Readiness is the
  ``announce`` callback and every wait is on a page condition or a provider gate,
  never a sleep. Teardown fails the test on any uncaught page error.

Every test in this directory runs in the session's event loop (``loop_scope="session"``)
because the browser is shared; each test still gets its own server and data dir.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx2 as httpx
import pytest
import pytest_asyncio

from pidesk.config import HostConfig
from pidesk.providers.scripted import ScriptedProvider
from pidesk.server.serve import ServeOptions, serve

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
TOKEN = "pidesk-ui-test-token-0123456789abcdef"
# The README's screenshots are refreshed only on request, so a test run leaves the tree clean:
# PIDESK_UPDATE_SCREENSHOTS=1 bin/dev test tests/ui
SCREENSHOTS = (Path(__file__).resolve().parents[2] / "docs" / "screenshots" if os.environ.get("PIDESK_UPDATE_SCREENSHOTS")
               else Path(tempfile.gettempdir()) / "pidesk-ui-screenshots")
VIEWPORT = {"width": 1280, "height": 820}


def require_chromium() -> None:
    if CHROMIUM.exists():
        return
    message = f"the web UI tests need Debian's Chromium at {CHROMIUM}: apt-get install chromium"
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def browser() -> AsyncIterator[Any]:
    require_chromium()
    from playwright.async_api import async_playwright, expect

    expect.set_options(timeout=10_000)
    async with async_playwright() as pw:
        chromium = await pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        yield chromium
        await chromium.close()


class RpcFailed(Exception):
    def __init__(self, error: dict[str, Any]) -> None:
        self.code = (error.get("data") or {}).get("code")
        super().__init__(f"{self.code}: {error.get('message')}")


@dataclass
class Ui:
    page: Any
    context: Any
    url: str
    token: str
    provider: ScriptedProvider
    project: Path
    data_dir: Path
    http: httpx.AsyncClient
    errors: list[str] = field(default_factory=list)
    task: asyncio.Task[None] | None = None
    config: dict[str, Any] = field(default_factory=dict)

    async def stop(self) -> None:
        """Stop the host, as SIGTERM would (the page stays open and starts reconnecting)."""
        assert self.task is not None
        await stop_serve(self.task)
        self.task = None

    async def start(self) -> None:
        """Start a host again on the same data dir and port."""
        assert self.task is None
        port = int(self.url.rsplit(":", 1)[1])
        self.task, url = await start_serve(self.data_dir, self.provider, port=port, **self.config)
        assert url == self.url

    async def restart(self) -> None:
        await self.stop()
        await self.start()

    async def call(self, method: str, params: dict[str, Any] | None = None) -> Any:
        """One method over HTTP POST /rpc (its own connection: it focuses nothing)."""
        frame: dict[str, Any] = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params or {}}
        response = await self.http.post(f"{self.url}/rpc", content=json.dumps(frame),
                                        headers={"Authorization": f"Bearer {self.token}",
                                                 "Content-Type": "application/json"})
        assert response.status_code == 200, response.text
        body = response.json()
        if "error" in body:
            raise RpcFailed(body["error"])
        return body["result"]

    async def session(self, mode: str = "agent", permission_mode: str = "ask", title: str = "ui test") -> dict[str, Any]:
        return await self.call("session.create", {"projectPath": str(self.project), "title": title, "mode": mode,
                                                  "permissionMode": permission_mode})

    def page_url(self, session: str | None = None, project: str | None = None) -> str:
        query = {"token": self.token}
        if project is not None:
            query["project"] = project
        if session is not None:
            query["session"] = session
        return f"{self.url}/?{urlencode(query)}"

    async def open(self, session: str | None = None, project: str | None = None) -> None:
        """Load the page and wait until it is connected and showing what was asked for."""
        from playwright.async_api import expect

        await self.page.goto(self.page_url(session, project))
        await expect(self.page.locator("#conn")).to_have_text("connected")
        if session is not None:
            await expect(self.page.locator(f'.session-item[data-session="{session}"]')).to_have_class(
                _has("active"))
            await expect(self.page.locator("#messages")).not_to_have_class(_has("loading"))

    async def send(self, text: str) -> None:
        box = self.page.locator("#input")
        await box.fill(text)
        await box.press("Enter")

    async def screenshot(self, name: str) -> None:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        await self.page.screenshot(path=str(SCREENSHOTS / name))


def _expected_console(text: str) -> bool:
    """What Chromium logs on its own while the page reconnects to a host that went away."""
    return "WebSocket connection to" in text or "ERR_CONNECTION_REFUSED" in text


def _has(cls: str) -> Any:
    import re

    return re.compile(rf"(^|\s){re.escape(cls)}(\s|$)")


async def start_serve(data_dir: Path, provider: ScriptedProvider, port: int = 0, token: str | None = TOKEN,
                      **config: Any) -> tuple[asyncio.Task[None], str]:
    """``token=None`` and ``port=0``: what ``pidesk serve`` does by default (the kept token, the last port)."""
    ready = asyncio.Event()
    box: dict[str, str] = {}

    def announce(url: str, token: str) -> None:
        box["url"] = url
        ready.set()

    task = asyncio.create_task(serve(HostConfig(data_dir=data_dir, **config), provider, ServeOptions(port=port, token=token),
                                     announce))
    waiter = asyncio.create_task(ready.wait())
    await asyncio.wait({task, waiter}, timeout=15, return_when=asyncio.FIRST_COMPLETED)
    if not ready.is_set():
        waiter.cancel()
        if task.done():
            task.result()
        raise AssertionError("the server did not announce itself within 15 s")
    return task, box["url"]


async def stop_serve(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        async with asyncio.timeout(15):
            await task


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "host_config(**fields): HostConfig fields for the ui fixture's host")
    config.addinivalue_line("markers", "provider_script(responses): what every session's model says first "
                                       "(a session the test cannot name ahead, such as a scheduled run's)")


@pytest_asyncio.fixture(loop_scope="session")
async def ui(request: pytest.FixtureRequest, tmp_path: Path, browser: Any) -> AsyncIterator[Ui]:
    project = tmp_path / "project"
    project.mkdir()
    (project / "README.md").write_text("# demo project\n\nA small project for the UI tests.\n")
    (project / "src").mkdir()
    (project / "src" / "app.py").write_text("print('hello')\n")
    script = request.node.get_closest_marker("provider_script")
    provider = ScriptedProvider(list(script.args[0]) if script else None)
    marker = request.node.get_closest_marker("host_config")
    config = dict(marker.kwargs) if marker else {}
    task, url = await start_serve(tmp_path / "data", provider, **config)
    http = httpx.AsyncClient(trust_env=False, timeout=30, limits=httpx.Limits(max_keepalive_connections=0))
    context = await browser.new_context(viewport=VIEWPORT)
    page = await context.new_page()
    handle = Ui(page=page, context=context, url=url, token=TOKEN, provider=provider, project=project,
                data_dir=tmp_path / "data", http=http, task=task, config=config)
    page.on("pageerror", lambda exc: handle.errors.append(f"pageerror: {exc}"))
    page.on("console", lambda msg: handle.errors.append(f"console: {msg.text}")
            if msg.type == "error" and not _expected_console(msg.text) else None)
    try:
        yield handle
    finally:
        await context.close()
        await http.aclose()
        if handle.task is not None:
            await stop_serve(handle.task)
    assert not handle.errors, handle.errors
