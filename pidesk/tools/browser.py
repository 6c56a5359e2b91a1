"""BrowserPreview: look at a page the agent is building, read-only, in every mode.

Only two kinds of URL are accepted: ``http(s)`` on 127.0.0.1, ``[::1]`` or
``localhost``, read as a browser reads them (``loopback_url``), and ``file:`` URLs
(or plain paths) that resolve inside the session root (secrets refused). Chromium
itself is held to the same three (``loopback_only``), so the page's own requests
cannot leave them either. With a Chromium on the
machine the page is rendered headless — its title, visible text and a
screenshot path come back; without one, the body is fetched (or read) and its
title and text extracted. A workspace file is never opened by Chromium as a
``file:`` URL (a page could then load any file on disk): it is served from a
loopback server that refuses every path outside the root. Nothing is written
inside the root: screenshots go to a temporary directory.
"""

from __future__ import annotations

import asyncio
import atexit
import re
import shutil
import socket
import tempfile
import threading
from collections import deque
from html.parser import HTMLParser
from pathlib import Path
from typing import Any, Final
from urllib.parse import quote, unquote, urlsplit

from pidesk.core.errors import Code
from pidesk.tools.base import Tool, ToolFailure, ToolResult
from pidesk.tools.children import spawn
from pidesk.tools.watchdog import GroupRecord, guard, release
from pidesk.tools.workspace import resolve_for_read

MAX_TEXT = 20_000
FETCH_TIMEOUT = 10.0
CHROMIUM_TIMEOUT = 30.0
CHROMIUM_KILL_WAIT = 5.0  # how long a killed Chromium is waited for
KEPT_PREVIEWS = 10  # screenshot directories kept (the newest)
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars")


def make_browser_preview_tool(root: Path, *, chromium: str | None = None, host_dir: Path | None = None,
                              process_groups: GroupRecord | None = None) -> Tool:
    """``host_dir``: the host's data directory, which the preview's page server refuses too;
    ``process_groups``: the store's record of running process groups, which boot kills (Chromium's
    group is guarded as Bash's are: the watchdog kills it if the host dies)."""
    browser = chromium if chromium is not None else (shutil.which("chromium") or shutil.which("chromium-browser"))

    async def tool(args: dict[str, Any]) -> ToolResult:
        raw = args.get("url")
        if not isinstance(raw, str) or not raw:
            raise ToolFailure(Code.INVALID_ARGUMENTS, "url must be a loopback http(s) URL or a file in the workspace")
        target = _target(root, raw)
        if browser and target.startswith("file:"):
            # Chromium never gets a file: URL: a page could pull in any file on disk from there.
            # It gets the page from a loopback server that serves the workspace and nothing else.
            with WorkspaceServer(root, host_dir) as server:
                page = server.url_for(Path(unquote(urlsplit(target).path)))
                html, shot = await _render(browser, page, process_groups)
        elif browser:
            html, shot = await _render(browser, target, process_groups)
        else:
            html, shot = await asyncio.to_thread(_fetch, target), None
        title, text = visible_text(html)
        cut = f"\n[{len(text) - MAX_TEXT} more characters cut]" if len(text) > MAX_TEXT else ""
        lines = [f"Title: {title or '(none)'}", f"URL: {target}"]
        if shot:
            lines.append(f"Screenshot: {shot}")
        return ToolResult(ok=True, output="\n".join(lines) + "\n\n" + text[:MAX_TEXT] + cut)

    return tool


def _target(root: Path, raw: str) -> str:
    url = urlsplit(raw)
    if url.scheme.lower() in ("http", "https"):
        return loopback_url(raw)
    if url.scheme in ("file", ""):
        path, _rel = resolve_for_read(root, unquote(url.path) if url.scheme == "file" else raw)
        if not path.is_file():
            raise ToolFailure(Code.FILE_NOT_FOUND, f"{raw} is not a file in the workspace")
        return path.as_uri()
    raise ToolFailure(Code.INVALID_ARGUMENTS, f"{raw}: only http(s) on loopback and file URLs are supported")


# What BrowserPreview may load over http(s), as a browser reads it (PROTOCOL.md turn-3 limits). The
# grammar is narrower than a URL's on purpose: where Python's urlsplit and a browser's WHATWG parser
# could disagree — a backslash (``http://evil\@127.0.0.1/`` is evil to Chromium), userinfo, a tab or a
# newline (a browser drops them), a percent-encoded or numeric-shorthand host (``127.1``, ``0x7f.1``) —
# the URL is refused, and the one handed on is rebuilt from the parts read here.
LOOPBACK_HOSTS: Final = ("localhost", "127.0.0.1", "[::1]")
_LOOPBACK_URL: Final = re.compile(r"(?P<scheme>https?)://(?P<host>[^/?#:\[\]]+|\[[^\]/?#]*\])(?::(?P<port>\d{1,5}))?"
                                  r"(?P<rest>[/?#][^\\\s]*)?", re.IGNORECASE | re.ASCII)


def loopback_url(raw: str) -> str:
    """``raw`` rebuilt, if it names a page on 127.0.0.1, [::1] or localhost exactly as a browser would
    read it; else ``ToolFailure`` (PATH_OUTSIDE_WORKSPACE)."""
    match = _LOOPBACK_URL.fullmatch(raw)
    host = match["host"].lower() if match else ""
    port = int(match["port"]) if match and match["port"] else None
    if match is None or host not in LOOPBACK_HOSTS or (port is not None and not 0 < port < 65536) \
            or any(ord(c) < 0x21 or c == "\x7f" for c in raw):
        raise ToolFailure(Code.PATH_OUTSIDE_WORKSPACE,
                          f"{raw}: BrowserPreview opens pages on 127.0.0.1, [::1] or localhost (written plainly, "
                          "without a user name, a backslash or spaces) and workspace files only")
    return f"{match['scheme'].lower()}://{host}{f':{port}' if port else ''}{match['rest'] or '/'}"


def _fetch(target: str) -> str:
    if target.startswith("file:"):
        return Path(unquote(urlsplit(target).path)).read_text(errors="replace")
    import urllib.error  # imported on use: every host loads this module, few previews fetch over HTTP
    import urllib.request

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never through a proxy
    try:
        with opener.open(target, timeout=FETCH_TIMEOUT) as response:
            charset = str(response.headers.get_content_charset() or "utf-8")
            body: bytes = response.read(2_000_000)
            return body.decode(charset, "replace")
    except urllib.error.HTTPError as exc:
        error_body: bytes = exc.read(2_000_000)
        return error_body.decode("utf-8", "replace")
    except OSError as exc:
        raise ToolFailure(None, f"could not load {target}: {exc}") from None


async def _render(browser: str, target: str, process_groups: GroupRecord | None) -> tuple[str, str]:
    shots = _screenshots()
    shot = shots / "screenshot.png"
    profile = shots / "profile"
    with _nowhere() as proxy:
        common = (*CHROMIUM_FLAGS, *loopback_only(proxy), f"--user-data-dir={profile}", "--window-size=1280,800")
        try:
            dom = await _run(process_groups, browser, *common, "--dump-dom", target)
            await _run(process_groups, browser, *common, f"--screenshot={shot}", target)
        finally:
            shutil.rmtree(profile, ignore_errors=True)
    return dom, str(shot) if shot.exists() else ""


_SHOTS: deque[Path] = deque()  # this process's preview directories, oldest first


def _screenshots() -> Path:
    """A new directory for a render's screenshot (and Chromium's profile meanwhile); only the
    ``KEPT_PREVIEWS`` newest stay, and none past the process (they were never removed)."""
    if not _SHOTS:
        atexit.register(_remove_screenshots)
    _SHOTS.append(Path(tempfile.mkdtemp(prefix="pidesk-preview-")))
    while len(_SHOTS) > KEPT_PREVIEWS:
        shutil.rmtree(_SHOTS.popleft(), ignore_errors=True)
    return _SHOTS[-1]


def _remove_screenshots() -> None:
    while _SHOTS:
        shutil.rmtree(_SHOTS.popleft(), ignore_errors=True)


def loopback_only(proxy: int) -> tuple[str, ...]:
    """Chromium flags that keep the page, and everything it loads, on 127.0.0.1, [::1] and localhost:
    every other address goes through a proxy at ``proxy`` that refuses it (``_nowhere``) — other 127.x
    addresses too, which Chromium would otherwise reach directly — no name is resolved but those three
    (a prefetch could carry data out in a DNS query), and WebRTC sends no UDP but through that proxy.
    (Each of the three must be excluded from the resolver's rule by name, IP literals too.)"""
    return (f"--proxy-server=http://127.0.0.1:{proxy}", "--proxy-bypass-list=<-loopback>;" + ";".join(LOOPBACK_HOSTS),
            "--host-resolver-rules=MAP * ~NOTFOUND, " + ", ".join(f"EXCLUDE {host}" for host in LOOPBACK_HOSTS),
            "--force-webrtc-ip-handling-policy=disable_non_proxied_udp")


class _nowhere:
    """A loopback port held (bound, never listening) for as long as a render runs: a connection to it
    is refused, and nothing else can take it meanwhile."""

    def __enter__(self) -> int:
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        port: int = self._sock.getsockname()[1]
        return port

    def __exit__(self, *exc: object) -> None:
        self._sock.close()


class WorkspaceServer:
    """A loopback HTTP server, alive for one render, that serves readable workspace files only.

    Every request path is resolved like a Read (symlinks followed, secrets and the
    host's data directory refused); anything outside the root is a 404, so a page
    cannot reach past its workspace, nor into the host's files inside it.
    """

    def __init__(self, root: Path, host_dir: Path | None = None) -> None:
        from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer  # 9 ms, only for a preview

        self.root = root.resolve()
        workspace = self.root

        class Handler(SimpleHTTPRequestHandler):
            def translate_path(self, path: str) -> str:
                relative = unquote(urlsplit(path).path).lstrip("/") or "."
                try:
                    target, _rel = resolve_for_read(workspace, relative, host_dir)
                except ToolFailure:
                    return str(workspace / ".pidesk-refused")  # does not exist: 404
                return str(target)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    def url_for(self, path: Path) -> str:
        relative = path.resolve().relative_to(self.root).as_posix()
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/{quote(relative)}"

    def __enter__(self) -> WorkspaceServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)


async def _run(process_groups: GroupRecord | None, *argv: str) -> str:
    """Chromium's standard output; on the deadline (``TOOL_TIMEOUT``) or cancellation its whole process
    group (the browser and the renderers it started) is killed and waited for, bounded. The group is
    guarded meanwhile: if the host dies, its watchdog (or the next boot) kills it."""
    process = await spawn(argv, stderr=False, start_new_session=True)
    assert process.stdout is not None
    try:
        guarded = guard(process.pid, process_groups)
    except OSError as exc:  # not recorded: it must not run on
        await process.stop(CHROMIUM_KILL_WAIT)
        raise ToolFailure(None, f"BrowserPreview: cannot record Chromium's process group: {exc}") from None
    stopped = False
    try:
        async with asyncio.timeout(CHROMIUM_TIMEOUT):
            out = await process.stdout.read()
            await process.wait()
        stopped = True
    except TimeoutError:
        stopped = await process.stop(CHROMIUM_KILL_WAIT)
        raise ToolFailure(Code.TOOL_TIMEOUT, f"the page did not finish loading within {CHROMIUM_TIMEOUT:.0f} s; "
                                             "Chromium was stopped") from None
    except asyncio.CancelledError:
        stopped = await process.stop(CHROMIUM_KILL_WAIT)
        raise
    finally:
        if stopped:  # (one that would not stop stays guarded: the watchdog or boot kills it)
            release(guarded, process_groups)
    return out.decode("utf-8", "replace")


class _Text(HTMLParser):
    SKIP = {"script", "style", "noscript", "template", "head"}

    def __init__(self) -> None:
        super().__init__()
        self.title = ""
        self.parts: list[str] = []
        self._skipping = 0
        self._in_title = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "title":
            self._in_title = True
        elif tag in self.SKIP:
            self._skipping += 1
        elif tag in ("p", "div", "br", "li", "h1", "h2", "h3", "h4", "tr", "section", "article"):
            self.parts.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag == "title":
            self._in_title = False
        elif tag in self.SKIP and self._skipping:
            self._skipping -= 1

    def handle_data(self, data: str) -> None:
        if self._in_title:
            self.title += data
        elif not self._skipping:
            self.parts.append(data)


def visible_text(html: str) -> tuple[str, str]:
    parser = _Text()
    parser.feed(html)
    lines = (" ".join(line.split()) for line in "".join(parser.parts).splitlines())
    return parser.title.strip(), "\n".join(line for line in lines if line)


__all__ = ["make_browser_preview_tool", "visible_text"]
