"""How the terminal commands word host state they all show (``pidesk chat``, ``run``, ``status``, ``doctor``,
``sessions show``, ``compact``)."""

from __future__ import annotations

from typing import Any


def sandbox_line(sandbox: dict[str, Any]) -> str:
    """``Sandbox: bwrap (no network)`` — the ``sandbox`` of host.hello, host.status and host.doctor."""
    if sandbox["mode"] == "off":
        return "Sandbox: OFF — Bash runs with your full power (it can read the host's token, reach the network)"
    if not sandbox["available"]:
        return f"Sandbox: UNAVAILABLE — every Bash call fails: {sandbox['detail']}"
    return f"Sandbox: bwrap ({'network on' if sandbox['network'] else 'no network'})"


def compaction_line(compaction: dict[str, Any]) -> str:
    """``── context compacted (auto): 96,120 → 4,310 tokens ──`` — a compaction block (history,
    ``message.appended``) or a ``context.compacted`` event: both carry reason and the token counts."""
    if compaction.get("reason") == "fresh":
        return "── execution starts with a fresh context ──"
    return (f"── context compacted ({compaction.get('reason')}): {compaction.get('tokensBefore', 0):,} → "
            f"{compaction.get('tokensAfter', 0):,} tokens ──")


def window_line(window: dict[str, Any]) -> str:
    """``context: 54,210 / 128,000 tokens (42%) · 2 compactions`` — ``session.context``'s ``window``."""
    used, limit, count = window["usedTokens"], window["limitTokens"], window.get("compactions", 0)
    share = f" ({used / limit:.0%})" if limit else ""
    done = "no compaction yet" if not count else f"{count} compaction{'s' if count != 1 else ''}"
    return f"context: {used:,} / {limit:,} tokens{share} · {done}"


def tool_line(name: str, args: dict[str, Any], width: int = 100) -> str:
    """``▸ Read src/app.py`` — a tool call as a person reads it (issue 31 §3): the argument that says what
    it does, not its JSON; a tool this does not know (a plugin's) shows its arguments compactly."""
    def text(key: str) -> str:
        value = args.get(key)
        return value if isinstance(value, str) else ""

    first = text("command").splitlines()[0] if text("command") else ""
    summary = {
        "Read": text("path"), "Write": f"{text('path')} ({len(text('content').splitlines())} lines)",
        "Edit": text("path"), "Glob": text("pattern"),
        "Grep": f"{text('pattern')!r}" + (f" in {text('path')}" if text("path") else ""),
        "Bash": ("$ " + first + (" …" if "\n" in text("command") else "")) if first else "",
        "BrowserPreview": text("url"), "Task": text("description"),
        "SubmitPlan": text("title"), "SubmitGoal": text("title"),
    }.get(name)
    if summary is None:
        summary = ", ".join(f"{k}={v!r}" for k, v in args.items())
    line = f"▸ {name} {summary}".rstrip()
    return line if len(line) <= width else line[:width - 1] + "…"
