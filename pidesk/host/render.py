"""Markdown to safe HTML, rendered by the host so no client needs a parser or a sanitizer — off the event loop.

The renderer itself (CommonMark, raw HTML shown as text, only http(s)/mailto/
relative links) is ``render_worker``. markdown-it-py is pure Python and holds
the GIL, and some small inputs are very slow (``"[" * 1_000_000`` took 18.8 s,
``"[](" * n`` grows as n²), so neither the loop nor a thread may run it: the
host renders in one long-lived worker process, fed through one thread.

Design and invariants:

- ``render_html`` never blocks the loop: the loop only awaits a future. The
  thread hashes, looks up the cache, talks to the worker and escapes text.
- Every answer comes within ``TIME_BOUND`` s of the request (``SLACK`` more
  at worst, plus escaping what waits in line). A render that has had the worker for ``TIME_BOUND`` s is given
  up on: the worker is killed and another started at once. A request that
  waited in line and has no answer by its deadline is not sent, or leaves its
  answer owed (the next request collects and caches it before its own; the
  worker serves one request at a time). Every such answer is the text escaped
  in ``<pre>`` under a line that says it is unformatted — never an error, so a
  plan can always be read.
- Text longer than ``MAX_RENDERED`` characters is never parsed: it is shown
  the same way. It is the longest text ``markdown.render`` accepts
  (``validate.MAX_TEXT``), hence also the longest Markdown a SubmitPlan or
  SubmitGoal may carry (``oversized_contract``): a plan that cannot be shown
  is refused at submission, before anything is written.
- Answers are cached by the SHA-256 of the text (at most ``CACHE_CHARS``
  characters of HTML, least recently used out first), so reopening a plan
  costs nothing. A render killed for running the whole bound is cached as its
  plain answer, so the same text never holds the worker again; an answer cut
  short by waiting in line is not cached.
- The thread is the worker's only user. It kills a render nobody waits for at
  the end of its bound too. The worker's address space is capped, and on
  Linux it dies with the host.
"""

from __future__ import annotations

import asyncio
import hashlib
import html
import json
import logging
import os
import queue
import select
import subprocess
import sys
import threading
import time
from collections import OrderedDict
from contextlib import suppress
from typing import Any, Final

from pidesk.host import render_worker, validate

log = logging.getLogger("pidesk.render")

TIME_BOUND: Final = 2.0  # seconds from a request to its answer (plus at most SLACK)
SLACK: Final = 0.25  # seconds a render that waited this little in line may run past its request's deadline
MAX_RENDERED: Final = validate.MAX_TEXT  # characters: longer text is shown unformatted, never parsed
CACHE_CHARS: Final = 16_000_000  # characters of rendered HTML kept
_CACHE_ENTRIES: Final = 1024
_CHUNK: Final = 1 << 20


def render_markdown(text: Any) -> str:
    """Render in this process (no time bound): what the worker runs. The host uses ``render_html``."""
    return render_worker.render(validate.text(text, "text", allow_empty=True))


async def render_html(text: str) -> str:
    """``text`` as safe HTML, within ``TIME_BOUND`` s, without blocking the event loop."""
    return await _service().render(text)


def oversized_contract(args: dict[str, Any]) -> str | None:
    """Why a SubmitPlan/SubmitGoal's Markdown is refused (too long to be shown), else ``None``."""
    markdown = args.get("markdown")
    if not isinstance(markdown, str) or len(markdown) <= MAX_RENDERED:
        return None
    return (
        f"markdown is {len(markdown):,} characters; a plan or goal may hold at most {MAX_RENDERED:,}, the most "
        "the user's client can open. Nothing was submitted: shorten it (summarize, and point to files in the "
        "workspace for detail), then submit again."
    )


def plain(text: str, why: str) -> str:
    """The text escaped in ``<pre>``, under a line saying why it is not formatted."""
    return f"<p><em>{html.escape(why)}; shown as plain text.</em></p>\n<pre>{html.escape(text)}</pre>\n"


_Request = tuple[str, float, asyncio.AbstractEventLoop, "asyncio.Future[str]"]


def _settle(answer: asyncio.Future[str], markup: str) -> None:
    if not answer.done():
        answer.set_result(markup)


class _Slow(Exception):
    """No answer by the deadline; ``whole_bound``: the request had the worker for all of ``time_bound``."""

    def __init__(self, whole_bound: bool = False) -> None:
        super().__init__()
        self.whole_bound = whole_bound


class _Worker:
    """One worker process. ``owed`` holds the key of a request sent whose answer is not read yet."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            # -I and an explicit path: nothing of the host's working directory or environment is imported
            [sys.executable, "-I", render_worker.__file__, json.dumps([os.path.abspath(p) for p in sys.path if p]),
             str(os.getpid())],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C at the terminal is the host's to handle, not the worker's
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.stdin = self.proc.stdin.fileno()
        self.stdout = self.proc.stdout.fileno()
        os.set_blocking(self.stdin, False)
        os.set_blocking(self.stdout, False)
        self.inbox = bytearray()  # what has been read of the next answer
        self.ready = False  # it has imported markdown-it and said so
        self.owed: bytes | None = None
        self.sent_at = 0.0

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait_ready(self, deadline: float) -> None:
        """Wait for the worker's ``R``; ``_Slow`` if it has not started by ``deadline`` (it goes on starting)."""
        if not self.ready:
            _fill(self.stdout, self.inbox, len(render_worker.READY), deadline)
            if self.inbox[:1] != render_worker.READY:
                raise ConnectionResetError("the markdown worker did not start")
            del self.inbox[:1]
            self.ready = True

    def send(self, key: bytes, payload: bytes, deadline: float) -> None:
        """Hand a ready worker one request; its time bound runs from now (it reads as we write)."""
        self.owed, self.sent_at = key, time.monotonic()
        _write_all(self.stdin, len(payload).to_bytes(render_worker.HEADER, "big") + payload, deadline)

    def receive(self, deadline: float) -> str | None:
        """The owed answer: HTML, or ``None`` if rendering failed. ``_Slow`` keeps what was read for the next try."""
        head = 1 + render_worker.HEADER
        _fill(self.stdout, self.inbox, head, deadline)
        size = head + int.from_bytes(self.inbox[1:head], "big")
        _fill(self.stdout, self.inbox, size, deadline)
        frame, self.inbox = bytes(self.inbox[:size]), self.inbox[size:]
        self.owed = None
        return frame[head:].decode("utf-8", "surrogatepass") if frame[:1] == b"+" else None

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()


class MarkdownService:
    """One worker process and the thread that feeds it (see the module docstring)."""

    def __init__(self, *, time_bound: float = TIME_BOUND, max_rendered: int = MAX_RENDERED) -> None:
        self.time_bound = time_bound
        self.max_rendered = max_rendered
        self._requests: queue.SimpleQueue[_Request] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._worker: _Worker | None = None
        self._cache: OrderedDict[bytes, str] = OrderedDict()
        self._cached_chars = 0
        self.kills = 0  # workers killed because one render ran the whole time bound

    async def render(self, text: str) -> str:
        """Queue ``text`` for the thread and await its answer (a few microseconds of the loop's time)."""
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[str] = loop.create_future()
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name="pidesk-markdown", daemon=True)
            self._thread.start()
        self._requests.put((text, time.monotonic() + self.time_bound, loop, answer))
        return await answer

    # ---- in the thread ------------------------------------------------------------

    def _serve(self) -> None:
        while True:  # the host's lifetime: a daemon thread, blocked on the queue when idle
            owed = self._worker is not None and self._worker.owed is not None
            try:  # an answer still owed is collected, or its render killed, at the end of its bound
                request = self._requests.get(timeout=self._owed_until() - time.monotonic() if owed else None)
            except queue.Empty:
                with suppress(OSError):
                    self._free_worker(self._owed_until())
                continue
            text, deadline, loop, answer = request
            if answer.cancelled():
                continue
            try:
                markup = self._render(text, deadline)
            except Exception as exc:  # a bug here must not end the thread, nor leave a caller waiting
                log.exception("markdown rendering failed")
                markup = plain(text, f"Not formatted: {type(exc).__name__}")
            with suppress(RuntimeError):  # the caller's loop has closed: nobody is waiting
                loop.call_soon_threadsafe(_settle, answer, markup)

    # ---- in the thread ------------------------------------------------------------

    def _render(self, text: str, deadline: float) -> str:
        payload = text.encode("utf-8", "surrogatepass")
        key = hashlib.sha256(payload).digest()
        cached = self._cache.get(key)
        if cached is not None:
            self._cache.move_to_end(key)
            return cached
        if len(text) > self.max_rendered:
            return self._keep(key, plain(text, f"Not formatted: longer than {self.max_rendered:,} characters"))
        busy = f"Not formatted: the formatter was busy for {self.time_bound:g} s"
        try:
            worker = self._free_worker(deadline) if time.monotonic() < deadline else None
            if worker is None or time.monotonic() >= deadline:
                return plain(text, busy)
            answer = self._ask(worker, key, payload, deadline)
        except _Slow as slow:
            if slow.whole_bound:
                return self._keep(key, plain(text, f"Not formatted: formatting took longer than {self.time_bound:g} s"))
            return plain(text, busy)
        except OSError:  # the worker died or could not start: the next request starts another
            self._drop()
            return plain(text, "Not formatted: the formatter stopped")
        if answer is None:
            return self._keep(key, plain(text, "Not formatted: the formatter could not read it"))
        return self._keep(key, answer)

    def _owed_until(self) -> float:
        return (self._worker.sent_at if self._worker is not None else 0.0) + self.time_bound

    def _free_worker(self, deadline: float) -> _Worker | None:
        """A running worker with no answer owed, or ``None`` if there is none by ``deadline``.

        An owed answer is collected (and cached). A request that has had the worker for
        ``time_bound`` s is given up on: that worker is killed and another started.
        """
        worker = self._worker
        if worker is not None and not worker.alive:
            self._drop()
            worker = None
        if worker is None:
            worker = self._worker = _Worker()
        if worker.owed is None:
            return self._started(worker, deadline)
        owed, cutoff = worker.owed, worker.sent_at + self.time_bound
        try:
            answer = worker.receive(min(deadline, cutoff))
        except _Slow:
            if time.monotonic() < cutoff:
                return None
            self._restart()
            return self._started(self._worker, deadline)
        except OSError:  # it died on the abandoned text: this request gets a new worker
            self._drop()
            worker = self._worker = _Worker()
            return self._started(worker, deadline)
        if answer is not None:
            self._keep(owed, answer)
        return worker

    @staticmethod
    def _started(worker: _Worker | None, deadline: float) -> _Worker | None:
        """``worker`` once it is ready, or ``None`` if it is not by ``deadline``."""
        if worker is None:
            return None
        try:
            worker.wait_ready(deadline)
        except _Slow:
            return None
        return worker

    def _ask(self, worker: _Worker, key: bytes, payload: bytes, deadline: float) -> str | None:
        """One request to a free worker; ``_Slow`` if no answer by ``deadline``, the answer then being owed."""
        try:
            worker.send(key, payload, deadline)
        except _Slow:
            self._drop()  # a request half written leaves the pipe unusable
            raise
        try:
            return worker.receive(deadline)
        except _Slow:
            budget_end = worker.sent_at + self.time_bound
            if time.monotonic() < budget_end - SLACK:
                raise  # it waited in line: its answer is owed, and collected by the next request
        try:  # it had nearly the whole bound: it gets the rest of it, then the worker is killed
            return worker.receive(budget_end)
        except _Slow:
            self._restart()
            raise _Slow(whole_bound=True) from None

    def _keep(self, key: bytes, answer: str) -> str:
        if len(answer) <= CACHE_CHARS // 4:
            self._cache[key] = answer
            self._cached_chars += len(answer)
            while self._cache and (self._cached_chars > CACHE_CHARS or len(self._cache) > _CACHE_ENTRIES):
                _, dropped = self._cache.popitem(last=False)
                self._cached_chars -= len(dropped)
        return answer

    def _restart(self) -> None:
        """Kill the worker and start another now, so it is ready for the next request."""
        self.kills += 1
        self._drop()
        with suppress(OSError):
            self._worker = _Worker()

    def _drop(self) -> None:
        worker, self._worker = self._worker, None
        if worker is not None:
            worker.kill()


def _write_all(fd: int, data: bytes, deadline: float) -> None:
    view = memoryview(data)
    while view:  # each pass writes something or waits for room; the deadline bounds it
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise _Slow
        if not _ready(fd, select.POLLOUT, remaining):
            continue
        try:
            view = view[os.write(fd, view[:_CHUNK]):]
        except BlockingIOError:
            continue


def _fill(fd: int, inbox: bytearray, size: int, deadline: float) -> None:
    """Read from ``fd`` into ``inbox`` until it holds ``size`` bytes."""
    while len(inbox) < size:  # each pass reads something or waits for it; the deadline bounds it
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise _Slow
        if not _ready(fd, select.POLLIN, remaining):
            continue
        try:
            chunk = os.read(fd, max(size - len(inbox), _CHUNK))
        except BlockingIOError:
            continue
        if not chunk:
            raise ConnectionResetError("the markdown worker exited")
        inbox += chunk


def _ready(fd: int, event: int, timeout: float) -> bool:
    """Whether ``fd`` is ready for ``event`` (or failed: the next read or write says how) within ``timeout`` s."""
    poller = select.poll()  # not select(): the host may hold more than FD_SETSIZE descriptors
    poller.register(fd, event)
    return bool(poller.poll(max(1, int(timeout * 1000))))


_services: list[MarkdownService] = []


def _service() -> MarkdownService:
    """The host's one renderer, made on first use (it owns no event-loop object, so any loop may use it)."""
    if not _services:
        _services.append(MarkdownService())
    return _services[0]
