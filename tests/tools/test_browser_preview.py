"""BrowserPreview: loopback pages and workspace files only, read-only, text extracted."""

from __future__ import annotations

import asyncio
import os
import shutil
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from pidesk.tools.base import run_tool
from pidesk.tools.browser import make_browser_preview_tool, visible_text
from pidesk.tools.reaper import running_members

PAGE = b"<html><head><title>My App</title><style>p{}</style></head><body><h1>Hello</h1><p>World <b>wide</b></p><script>x()</script></body></html>"


@pytest.fixture
def browser() -> str:
    """Debian's Chromium: required under CI, else the test is skipped with how to install it."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        if os.environ.get("CI") == "true":
            pytest.fail("CI must have Chromium: .ci/run installs the Debian package chromium")
        pytest.skip("Chromium is not installed: `apt-get install chromium` to run this test")
    return found


@pytest.fixture
def server():
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.end_headers()
            self.wfile.write(PAGE)

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    httpd.shutdown()


def test_visible_text_drops_scripts_styles_and_tags():
    assert visible_text(PAGE.decode()) == ("My App", "Hello\nWorld wide")


@pytest.mark.asyncio
async def test_a_loopback_page_is_read_without_a_browser(tmp_path, server):
    tool = make_browser_preview_tool(tmp_path, chromium="")
    result = await tool({"url": server})
    assert result.ok and "Title: My App" in result.output and "World wide" in result.output
    assert "x()" not in result.output
    assert list(tmp_path.iterdir()) == []  # read-only: nothing written in the root


@pytest.mark.asyncio
async def test_a_workspace_file_is_read_and_secrets_and_outside_files_are_refused(tmp_path):
    (tmp_path / "index.html").write_bytes(PAGE)
    (tmp_path / ".env").write_text("KEY=1")
    tool = make_browser_preview_tool(tmp_path, chromium="")
    assert "My App" in (await tool({"url": "index.html"})).output
    assert "My App" in (await tool({"url": (tmp_path / "index.html").as_uri()})).output
    assert (await run_tool(tool, {"url": ".env"})).error_code == "WORKSPACE_PATH_DENIED"
    assert (await run_tool(tool, {"url": "file:///etc/passwd"})).error_code == "PATH_OUTSIDE_WORKSPACE"


@pytest.mark.asyncio
@pytest.mark.parametrize("url", ["http://example.com/", "http://10.0.0.1/", "https://192.168.1.1/x",
                                 "ftp://127.0.0.1/", "javascript:alert(1)",
                                 # issue 29: what Python reads as 127.0.0.1 and a browser (WHATWG) does not
                                 "http://127.0.0.5:1\\@127.0.0.1:2/?leak=1", "http://evil.example\\@127.0.0.1/",
                                 "http://user@127.0.0.1/", "http://127.0.0.1\t.evil.example/", "http://127.1/",
                                 "http://0x7f.0.0.1/", "http://127.0.0.%31/", "http://127.0.0.5/", "http://localhost./"])
async def test_anything_but_loopback_or_workspace_files_is_refused(tmp_path, url):
    result = await run_tool(make_browser_preview_tool(tmp_path, chromium=""), {"url": url})
    assert not result.ok and result.error_code in ("PATH_OUTSIDE_WORKSPACE", "INVALID_ARGUMENTS")


@pytest.mark.asyncio
async def test_with_chromium_the_page_is_rendered_with_a_screenshot(tmp_path, server, browser):
    result = await make_browser_preview_tool(tmp_path, chromium=browser)({"url": server})
    assert result.ok and "Title: My App" in result.output
    shot = next(line.split(": ", 1)[1] for line in result.output.splitlines() if line.startswith("Screenshot: "))
    assert Path(shot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_preview_page_server_refuses_the_hosts_data_dir_inside_the_root(tmp_path):
    """Authority hole 12, the preview's side: a page rendered from the workspace was served by a loopback
    server that resolved paths like a Read but without the data dir, so a page in a project at $HOME
    could fetch the host's token file and transcripts from the data dir under it."""
    import urllib.error
    import urllib.request

    from pidesk.tools.browser import WorkspaceServer

    data = tmp_path / "data"
    data.mkdir()
    (data / "host.json").write_text('{"token": "secret"}')
    (tmp_path / "page.html").write_text("<title>page</title>")
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with WorkspaceServer(tmp_path, data) as pages:
        assert b"page" in opener.open(pages.url_for(tmp_path / "page.html"), timeout=5).read()
        with pytest.raises(urllib.error.HTTPError) as refused:
            opener.open(pages.url_for(tmp_path / "page.html").replace("page.html", "data/host.json"), timeout=5)
        assert refused.value.code == 404


@pytest.mark.asyncio
async def test_an_aborted_preview_leaves_no_chromium_running(tmp_path, browser, stalling):
    """Abort while Chromium waits for the page: nothing of Chromium runs on (its process group is killed)."""
    url, asked = stalling
    preview = asyncio.ensure_future(make_browser_preview_tool(tmp_path, chromium=browser)({"url": url}))
    assert await asyncio.to_thread(asked.wait, 30)  # Chromium is up and loading the page
    leaders = [int(p) for p in os.listdir("/proc") if p.isdigit() and _cmdline_has(int(p), url.encode())]
    assert leaders
    preview.cancel()
    with pytest.raises(asyncio.CancelledError):
        await preview
    deadline = time.monotonic() + 10  # (a SIGKILLed process takes a moment to be gone: poll, bounded)
    while any(running_members(p) for p in leaders) and time.monotonic() < deadline:  # (each leads its group)
        await asyncio.sleep(0.05)
    assert not any(running_members(p) for p in leaders)


def _cmdline_has(pid: int, needle: bytes) -> bool:
    try:
        return needle in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


@pytest.fixture
def recorder():
    """A server on 127.0.0.5 — loopback, but not an address BrowserPreview may reach — that records every
    request: where an exfiltration would land."""
    hits: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            hits.append(self.path)
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.end_headers()
            self.wfile.write(b"recorded")

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.5", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd.server_address[1], hits
    httpd.shutdown()


@pytest.mark.asyncio
async def test_a_rendered_page_cannot_reach_past_loopback_by_itself(tmp_path, browser, recorder):
    """Issue 29 item 1, belt and braces: the page is on 127.0.0.1, but its image, fetch and iframe ask for
    another address. Chromium is held to 127.0.0.1/[::1]/localhost: none of them arrives, while the page's
    own loopback image does (so the recorder would have seen them)."""
    port, hits = recorder
    allowed: list[str] = []

    class Page(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            allowed.append(self.path)
            body = (f'<html><head><title>Probe</title></head><body><p>probe page</p>'
                    f'<img src="http://127.0.0.5:{port}/img"><img src="/own-image">'
                    f'<iframe src="http://127.0.0.5:{port}/frame"></iframe>'
                    f'<script>fetch("http://127.0.0.5:{port}/fetch").catch(() => null)</script></body></html>')
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        result = await make_browser_preview_tool(tmp_path, chromium=browser)(
            {"url": f"http://127.0.0.1:{httpd.server_address[1]}/"})
    finally:
        httpd.shutdown()
    assert result.ok and "probe page" in result.output
    assert "/own-image" in allowed  # the page's own loopback request went through
    assert hits == []


@pytest.fixture
def stalling():
    """A loopback page that never answers (until the test ends): ``(url, asked)``."""
    asked, release = threading.Event(), threading.Event()

    class Stalling(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            asked.set()
            release.wait(60)

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Stalling)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/stall", asked
    release.set()
    httpd.shutdown()


@pytest.mark.asyncio
async def test_a_page_that_never_loads_is_tool_timeout(tmp_path, browser, stalling, monkeypatch):
    """Issue 29 item 10: Chromium's deadline ended the call INTERNAL; it is TOOL_TIMEOUT, Chromium stopped."""
    import pidesk.tools.browser as browser_module

    monkeypatch.setattr(browser_module, "CHROMIUM_TIMEOUT", 3.0)
    url, _asked = stalling
    result = await run_tool(make_browser_preview_tool(tmp_path, chromium=browser), {"url": url})
    assert result.error_code == "TOOL_TIMEOUT" and "did not finish loading" in result.output
    assert [p for p in os.listdir("/proc") if p.isdigit() and _cmdline_has(int(p), url.encode())] == []


STAND_IN_HOST = """
import asyncio, sys
from pathlib import Path
from pidesk.tools import make_browser_preview_tool

async def main(root, chromium, url):
    await make_browser_preview_tool(Path(root), chromium=chromium)({"url": url})
    print("survived", flush=True)

asyncio.run(main(*sys.argv[1:]))
"""


def test_chromium_dies_with_a_host_killed_mid_page(tmp_path, browser, stalling):
    """Issue 29 item 9: BrowserPreview's Chromium (ten processes) outlived kill -9 of its host forever. Its
    group is guarded like Bash's: the host's watchdog kills it the moment the host dies."""
    import subprocess
    import sys

    url, asked = stalling
    host = subprocess.Popen([sys.executable, "-c", STAND_IN_HOST, str(tmp_path), browser, url],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert asked.wait(30), "Chromium never asked for the page"
        leaders = [int(p) for p in os.listdir("/proc") if p.isdigit() and _cmdline_has(int(p), url.encode())]
        assert leaders and any(running_members(p) for p in leaders)
        host.kill()
        host.wait(timeout=10)
        deadline = time.monotonic() + 10  # (a SIGKILLed group takes a moment to be gone: poll, bounded)
        while any(running_members(p) for p in leaders) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(running_members(p) for p in leaders)
    finally:
        if host.poll() is None:
            host.kill()
        host.communicate(timeout=10)


def test_only_the_newest_preview_directories_are_kept():
    """Issue 29 item 10: every render left a /tmp/pidesk-preview-* directory behind, for ever."""
    from pidesk.tools import browser as browser_module

    made = [browser_module._screenshots() for _ in range(browser_module.KEPT_PREVIEWS + 3)]
    assert [path.exists() for path in made] == [False] * 3 + [True] * browser_module.KEPT_PREVIEWS
    browser_module._remove_screenshots()
    assert not any(path.exists() for path in made)
