"""``pidesk run`` (unattended, through the running host or an embedded one) and ``pidesk status``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from pidesk.cli.connect import embedded, running_host
from pidesk.cli.link import EmbeddedLink, RemoteLink
from pidesk.config import HostConfig
from pidesk.core.errors import Code, Conflict


async def run_unattended(config: HostConfig, project: Path, prompt: str, mode: str, permission_mode: str,
                         as_json: bool) -> int:
    if mode != "agent":
        raise Conflict(f"{mode.title()} mode needs an interactive session to approve its contract; "
                       "run it with `pidesk chat`, or use --mode agent", Code.PLAN_REQUIRES_INTERACTIVE_SESSION)
    remote = running_host(config.data_dir)
    if remote is not None:
        return await _run(RemoteLink(remote.url, remote.token), project, prompt, permission_mode, as_json)
    async with embedded(config) as host:
        return await _run(EmbeddedLink(host, "run"), project, prompt, permission_mode, as_json)


async def _run(link: Any, project: Path, prompt: str, permission_mode: str, as_json: bool) -> int:
    async with link:
        session = await link.call("session.create", {"projectPath": str(project), "permissionMode": permission_mode})
        events = link.events()
        started = await link.call("agent.prompt", {"sessionId": session["id"], "text": prompt, "unattended": True})
        async for event in events:
            if event.get("sessionId") not in (None, session["id"]):
                continue
            if as_json:
                click.echo(json.dumps(event))
            else:
                _print(event)
            if event["type"] == "turn.ended" and event["turnId"] == started["turnId"]:
                if event["reason"] == "completed":
                    return 0
                click.echo(f"pidesk: turn {event['reason']}: {event.get('errorCode')}", err=True)
                return 1
    return 1


def _print(event: dict[str, Any]) -> None:
    kind = event["type"]
    if kind == "message.delta":
        click.echo(event["text"], nl=False)
    elif kind == "tool.started":
        click.echo(click.style(f"\n▸ {event['name']} {json.dumps(event['args'])[:120]}", dim=True))
    elif kind == "tool.finished":
        mark = "✓" if event["ok"] else f"✗ {event.get('errorCode') or ''}"
        click.echo(click.style(f"  {mark} {event['name']} ({event['durationMs']} ms)",
                               fg="green" if event["ok"] else "red"))
    elif kind == "turn.ended":
        code = f": {event['errorCode']}" if event.get("errorCode") else ""
        click.echo(f"\n[turn {event['reason']}{code}]")


async def show_status(config: HostConfig) -> None:
    async with embedded(config, "scripted") as host:
        status = await host.call("host.status", {})
        click.echo(f"data dir: {config.data_dir}")
        for key, value in status.items():
            click.echo(f"{key}: {value}")
        if host.recovery is not None:
            click.echo(f"recovered at open: {host.recovery.interrupted}")
            for path in host.recovery.boot.quarantined:
                click.echo(f"quarantined transcript tail: {path}")
