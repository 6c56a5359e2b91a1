"""How the terminal commands word host state they all show (``pidesk chat``, ``status``, ``doctor``)."""

from __future__ import annotations

from typing import Any


def sandbox_line(sandbox: dict[str, Any]) -> str:
    """``Sandbox: bwrap (no network)`` — the ``sandbox`` of host.hello, host.status and host.doctor."""
    if sandbox["mode"] == "off":
        return "Sandbox: OFF — Bash runs with your full power (it can read the host's token, reach the network)"
    if not sandbox["available"]:
        return f"Sandbox: UNAVAILABLE — every Bash call fails: {sandbox['detail']}"
    return f"Sandbox: bwrap ({'network on' if sandbox['network'] else 'no network'})"
