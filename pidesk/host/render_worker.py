"""The Markdown renderer, and the worker process that runs it for the host (``python -I render_worker.py``).

markdown-it-py in CommonMark mode (plus tables) with raw HTML disabled — any
``<tag>`` in the source is shown as text — and links limited to http(s),
mailto and relative URLs: a plan or an assistant message cannot inject markup
or a ``javascript:`` link into the page that shows it. Nothing of the text is
dropped: no nesting limit stops the parse, and link reference definitions are
shown as they are written.

This module imports nothing of pidesk's, so the worker starts with nothing but
markdown-it. Run as a script, it takes the host's ``sys.path`` (JSON) and pid
as its arguments, dies with the host (Linux), imports markdown-it, writes ``R`` (ready), then serves framed
requests on stdin until EOF (the host is gone): a request is an 8-byte big-endian length and that many UTF-8 bytes of
Markdown; the answer is ``+`` (HTML) or ``-`` (the error), an 8-byte length and
that many UTF-8 bytes. Lone surrogates travel as ``surrogatepass``. Its
address space is capped (``MEMORY_CAP``), so a pathological input fails here
with ``MemoryError`` rather than starving the machine.
"""

from __future__ import annotations

import json
import os
import sys
from functools import lru_cache
from typing import Any, BinaryIO, Final

SAFE_SCHEMES: Final = ("http:", "https:", "mailto:")
MEMORY_CAP: Final = 2 << 30  # bytes of address space the worker may use
HEADER: Final = 8  # bytes of a frame's length
READY: Final = b"R"  # written once, when the worker can take requests
MAX_BLOCK_NESTING: Final = 100_000  # never reached: a RecursionError comes first (see renderer)


@lru_cache(maxsize=1)
def renderer() -> Any:
    from markdown_it import MarkdownIt

    md = MarkdownIt("commonmark", {"html": False, "linkify": False, "typographer": False}).enable("table")
    # Link reference definitions are not consumed: they would hide a line of a plan from the card,
    # never from the agent that executes it.
    md.disable("reference")
    # markdown-it stops parsing blocks nested deeper than ``maxNesting`` (CommonMark's preset: 20)
    # and drops the rest of the text: an approval card lost every step after a deep list (issue 29).
    # Blocks get no such limit (past Python's recursion limit the render fails instead, and the host
    # shows the text unformatted: every character either way). Inline parsing keeps it: there it
    # only stops looking for deeper links and emphasis — the text stays — and keeps "[" * 5000 fast.
    inline_limit = md.options["maxNesting"]
    md.core.ruler.before("block", "blocks_unlimited", lambda state: _nesting(state, MAX_BLOCK_NESTING))
    md.core.ruler.after("block", "inline_limited", lambda state: _nesting(state, inline_limit))
    md.validateLink = safe_link  # type: ignore[method-assign]
    return md


def _nesting(state: Any, limit: int) -> None:
    state.md.options["maxNesting"] = limit


def safe_link(url: str) -> bool:
    lowered = url.strip().lower()
    return ":" not in lowered.split("/", 1)[0] or lowered.startswith(SAFE_SCHEMES)


def render(text: str) -> str:
    html: str = renderer().render(text)
    return html


def serve(stdin: BinaryIO, stdout: BinaryIO) -> None:
    """Answer framed requests until EOF (one request at a time, in order)."""
    while True:  # ends at EOF: the host closed the pipe or is gone
        header = stdin.read(HEADER)
        if len(header) < HEADER:
            return
        size = int.from_bytes(header, "big")
        data = stdin.read(size)
        if len(data) < size:
            return
        try:
            status, body = b"+", render(data.decode("utf-8", "surrogatepass")).encode("utf-8", "surrogatepass")
        except Exception as exc:  # RecursionError, MemoryError…: the host shows the text unformatted
            status, body = b"-", f"{type(exc).__name__}: {exc}".encode("utf-8", "replace")
        stdout.write(status + len(body).to_bytes(HEADER, "big") + body)
        stdout.flush()


def main() -> None:
    sys.path[:] = json.loads(sys.argv[1])
    _die_with_host(int(sys.argv[2]))
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))
    except (ImportError, ValueError, OSError):
        pass  # no cap on this platform: the host's time bound still ends a runaway render
    renderer()  # imported before the first request, so it does not count against that request's time
    sys.stdout.buffer.write(READY)
    sys.stdout.buffer.flush()
    serve(sys.stdin.buffer, sys.stdout.buffer)


def _die_with_host(host: int) -> None:
    """Linux: be killed when the host dies, even mid-render (stdin's EOF is only seen between requests)."""
    try:
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != host:  # the host died before the request was made
        os._exit(0)


if __name__ == "__main__":
    main()
