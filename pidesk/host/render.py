"""Markdown to safe HTML, rendered by the host so no client needs a parser or a sanitizer.

markdown-it-py in CommonMark mode with raw HTML disabled (any ``<tag>`` in the
source is shown as text) and links limited to http(s), mailto and relative
URLs: a plan or an assistant message cannot inject markup or a ``javascript:``
link into the page that shows it.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from pidesk.host import validate

SAFE_SCHEMES = ("http:", "https:", "mailto:")


@lru_cache(maxsize=1)
def _renderer() -> Any:
    from markdown_it import MarkdownIt

    md = MarkdownIt("commonmark", {"html": False, "linkify": False, "typographer": False}).enable("table")
    md.validateLink = _safe_link  # type: ignore[method-assign]
    return md


def _safe_link(url: str) -> bool:
    lowered = url.strip().lower()
    return ":" not in lowered.split("/", 1)[0] or lowered.startswith(SAFE_SCHEMES)


def render_markdown(text: Any) -> str:
    body = validate.text(text, "text", allow_empty=True)
    html: str = _renderer().render(body)
    return html
