"""Markdown rendered by the host is safe to put in a page."""

from __future__ import annotations

import pytest

from pidesk.host.render import render_markdown


def test_markdown_renders_and_raw_html_is_shown_as_text():
    html = render_markdown("# Plan\n\n1. **Write** `NOTES.md`\n\n<script>alert(1)</script>\n<img src=x onerror=y>")
    assert "<h1>Plan</h1>" in html and "<strong>Write</strong>" in html and "<code>NOTES.md</code>" in html
    assert "<script" not in html and "<img" not in html and "&lt;script&gt;" in html


@pytest.mark.parametrize("link", ["javascript:alert(1)", "JAVASCRIPT:alert(1)", "data:text/html,x", "vbscript:x"])
def test_dangerous_links_are_not_links(link):
    assert "href" not in render_markdown(f"[click]({link})")


def test_safe_links_stay():
    html = render_markdown("[a](https://example.com) [b](docs/x.md) [c](mailto:me@example.com)")
    assert html.count("href=") == 3
