"""``pidesk run`` and ``pidesk status`` over an embedded Host."""

from __future__ import annotations

import json

import click
import msgspec

from pidesk.cli.connect import embedded
from pidesk.config import HostConfig
from pidesk.core import events as ev
from pidesk.core.errors import Code, Conflict
from pidesk.core.events import event_payload


async def run_unattended(config: HostConfig, project: object, prompt: str, mode: str, permission_mode: str,
                         as_json: bool) -> int:
    if mode != "agent":
        raise Conflict(f"{mode.title()} mode needs an interactive session to approve its contract; "
                       "run it with `pidesk chat`, or use --mode agent", Code.PLAN_REQUIRES_INTERACTIVE_SESSION)
    async with embedded(config) as host:
        sub = host.subscribe()
        session = await host.call("session.create", {"projectPath": str(project), "permissionMode": permission_mode})
        started = await host.agent_prompt(session["id"], prompt, unattended=True)
        while True:
            seq, event = await sub.next()
            if as_json:
                click.echo(json.dumps(event_payload(event, seq)))
            else:
                _print(event)
            if isinstance(event, ev.TurnEnded) and event.turn_id == started["turnId"]:
                if event.reason == "completed":
                    return 0
                click.echo(f"pidesk: turn {event.reason}: {event.error_code}", err=True)
                return 1


def _print(event: ev.AnyEvent) -> None:
    match event:
        case ev.MessageDelta(text=text):
            click.echo(text, nl=False)
        case ev.ToolStarted(name=name, args=args):
            click.echo(click.style(f"\n▸ {name} {json.dumps(args)[:120]}", dim=True))
        case ev.ToolFinished(name=name, ok=ok, error_code=code, duration_ms=ms):
            mark = "✓" if ok else f"✗ {code or ''}"
            click.echo(click.style(f"  {mark} {name} ({ms} ms)", fg="green" if ok else "red"))
        case ev.TurnEnded(reason=reason, error_code=code):
            click.echo(f"\n[turn {reason}{': ' + code if code else ''}]")
        case _:
            pass


async def show_status(config: HostConfig) -> None:
    async with embedded(config, "scripted") as host:
        status = await host.call("host.status", {})
        click.echo(f"data dir: {config.data_dir}")
        for key, value in status.items():
            click.echo(f"{key}: {value}")
        if host.recovery is not None:
            report = msgspec.to_builtins(host.recovery.interrupted)
            click.echo(f"recovered at open: {report}")
            for path in host.recovery.boot.quarantined:
                click.echo(f"quarantined transcript tail: {path}")
