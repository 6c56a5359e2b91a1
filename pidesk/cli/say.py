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
