"""``pidesk run`` (unattended, through the running host or an embedded one) and ``pidesk status``.

Everything ``run`` can refuse by itself — an empty prompt, a Plan/Goal mode, a ``--model`` the
running host would ignore — it refuses before it creates anything: no session, no data dir.
``status`` asks the running host when there is one, else opens the data dir itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from typing import Any

import click

from pidesk.cli.connect import embedded, host_info, open_link, running_host
from pidesk.cli.say import compaction_line, sandbox_line, tool_line
from pidesk.config import HostConfig
from pidesk.core.errors import Code, Conflict, InvalidParams, PideskError


async def run_unattended(config: HostConfig, project: Path, prompt: str, mode: str, permission_mode: str,
                         as_json: bool, model: str | None = None, max_retries: int | None = None,
                         no_sandbox: bool = False, context_limit: int | None = None) -> int:
    """``model``: the ``--model`` given, if any (``config.model`` also holds PIDESK_MODEL and the config file's);
    ``max_retries``, ``no_sandbox`` and ``context_limit``: the flags given (a running host keeps its own: said on
    stderr)."""
    if not prompt.strip():  # argv cannot hold a NUL nor a megabyte: this is the host's only other refusal
        raise InvalidParams("the prompt is empty: say what to do, e.g. pidesk run . \"add a README\"")
    if mode != "agent":
        raise Conflict(f"{mode.title()} mode needs an interactive session to approve its contract; "
                       "run it with `pidesk chat`, or use --mode agent", Code.PLAN_REQUIRES_INTERACTIVE_SESSION)
    async with open_link(config, "run", model=model, max_retries=max_retries, no_sandbox=no_sandbox,
                         context_limit=context_limit) as link:
        return await _run(link, project, prompt, permission_mode, as_json)


async def _run(link: Any, project: Path, prompt: str, permission_mode: str, as_json: bool) -> int:
    async with link:
        session = await link.call("session.create", {"projectPath": str(project), "permissionMode": permission_mode})
        events = link.events()
        try:
            started = await link.call("agent.prompt", {"sessionId": session["id"], "text": prompt,
                                                       "unattended": True})
        except PideskError:  # refused before any turn began: leave no empty session behind
            with contextlib.suppress(PideskError):
                await link.call("session.delete", {"sessionId": session["id"]})
            raise
        async for event in events:
            if event.get("sessionId") not in (None, session["id"]):
                continue
            if event["type"].startswith("link."):  # the host went away (issue 31 §2)
                ended = await _after_link(link, event, session["id"], started["turnId"])
                if ended is None:
                    continue
                event = ended
            if as_json:
                if event["type"] == "turn.ended" and event["turnId"] == started["turnId"]:
                    event = {**event, "usage": await _turn_usage(link, session["id"], started["turnId"])}
                click.echo(json.dumps(event))
            else:
                _print(event)
            if event["type"] == "turn.ended" and event["turnId"] == started["turnId"]:
                if event["reason"] == "completed":
                    return 0
                click.echo(f"pidesk: turn {event['reason']}: {event.get('errorCode')}"
                           + (f": {event['errorMessage']}" if event.get("errorMessage") else ""), err=True)
                return 1
    return 1


async def _after_link(link: Any, event: dict[str, Any], session_id: str, turn_id: str) -> dict[str, Any] | None:
    """The run's turn's end when the host came back and it had ended meanwhile (a restart interrupts it), as
    the turn.ended event it missed; None while it still runs or the link is reconnecting."""
    if event["type"] == "link.lost":
        click.secho("pidesk: the host stopped — reconnecting…", err=True, dim=True)
        return None
    if event["type"] == "link.failed":
        raise PideskError(f"the host went away and did not come back: {event.get('reason')}")
    turns = (await link.call("session.turns", {"sessionId": session_id}))["turns"]
    turn = next((t for t in turns if t["id"] == turn_id), None)
    if turn is None or turn["state"] != "ended":
        return None
    return {"type": "turn.ended", "sessionId": session_id, "turnId": turn_id, "reason": turn["reason"],
            "errorCode": turn.get("errorCode"), "errorMessage": turn.get("errorMessage")}


async def _turn_usage(link: Any, session_id: str, turn_id: str) -> dict[str, int] | None:
    """The run's turn's token counts (cache reads and writes apart), for ``--json``'s turn.ended line."""
    turns = (await link.call("session.turns", {"sessionId": session_id}))["turns"]
    return next((t["usage"] for t in turns if t["id"] == turn_id), None)


def _print(event: dict[str, Any]) -> None:
    kind = event["type"]
    if kind == "message.delta":
        click.echo(event["text"], nl=False)
    elif kind == "tool.started":
        click.echo(click.style("\n" + tool_line(event["name"], event["args"], 120), dim=True))
    elif kind == "tool.finished":
        mark = "✓" if event["ok"] else f"✗ {event.get('errorCode') or ''}"
        click.echo(click.style(f"  {mark} {event['name']} ({event['durationMs']} ms)",
                               fg="green" if event["ok"] else "red"))
    elif kind == "context.compacted":
        click.echo(click.style(f"\n{compaction_line(event)}", dim=True))
    elif kind == "turn.ended":
        code = f": {event['errorCode']}" if event.get("errorCode") else ""
        click.echo(f"\n[turn {event['reason']}{code}]")


async def show_status(config: HostConfig, as_json: bool) -> None:
    """The running host's counts (``host.status``), else the data dir's, opened here (recovering it if needed)."""
    report: dict[str, Any] = {"dataDir": str(config.data_dir)}
    remote = running_host(config.data_dir)
    if remote is not None:
        report["host"] = {"url": remote.url, "pid": remote.pid, **host_info(config.data_dir)}
        report.update(await remote.call("host.status"))
        report["sandbox"] = (await remote.call("host.hello", {"protocolVersion": 1})).get("sandbox")
    else:
        report["host"] = None
        async with embedded(config, "scripted") as host:
            report.update(await host.call("host.status", {}))
            report["sandbox"] = (await host.sandbox_status()).to_wire()
            if host.recovery is not None:
                report["recovered"] = {"interrupted": host.recovery.interrupted,
                                       "heldQueues": host.recovery.held_queues,
                                       "restoredSessions": host.recovery.boot.restored_sessions,
                                       "quarantined": host.recovery.boot.quarantined}
    from pidesk.store.checkpoints import usage as checkpoint_usage

    repos, size = await asyncio.to_thread(checkpoint_usage, config.data_dir)
    report["checkpoints"] = {"repositories": repos, "bytes": size, "keepTurns": config.checkpoint_keep_turns,
                             "keepDays": config.checkpoint_keep_days}
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    click.echo(f"data dir: {report['dataDir']}")
    if remote is not None:
        since = f" since {report['host']['startedAt'][:19].replace('T', ' ')} UTC" if report["host"].get("startedAt") else ""
        idle = report["host"].get("idleExit")
        lifetime = (f"; started on demand, it exits after {idle / 60:g} min with nothing to do" if idle
                    else "")
        click.echo(f"host: serving at {remote.url} (pid {remote.pid}){since}{lifetime} · pidesk stop stops it")
    else:
        click.echo("host: not running (the data dir was opened here)")
    click.echo(f"sessions: {report['sessions']}")
    click.echo(f"running turns: {report['running']}")
    click.echo(f"pending plan approvals: {report['pendingApprovals']}")
    click.echo(f"queued prompts: {report['queued']}")
    if report["sandbox"] is not None:  # (an older host does not say)
        click.echo(sandbox_line(report["sandbox"]))
    click.echo(checkpoints_line(report["checkpoints"]))
    recovered = report.get("recovered")
    if recovered is None:
        return
    counts = [_count(n, what) for what, n in recovered["interrupted"].items() if n]
    click.echo(f"interrupted at open: {', '.join(counts)}" if counts else "interrupted at open: nothing")
    for session_id in recovered["heldQueues"]:
        click.echo(f"queued prompts held since the restart, until a client resumes them: {session_id}")
    for session_id in recovered["restoredSessions"]:
        click.echo(f"restored orphaned session: {session_id}")
    for path in recovered["quarantined"]:
        click.echo(f"quarantined transcript tail: {path}")


def checkpoints_line(found: dict[str, Any]) -> str:
    """The shadow repositories' size and the retention policy that bounds it."""
    turns, days = found["keepTurns"], found["keepDays"]
    kept = " made in ".join(part for part in (
        f"the last {turns} turns of each session" if turns else "", f"the last {days:g} days" if days else "") if part)
    if not kept:
        kept = "every turn (no limit)"
    elif not turns:
        kept = "turns made in " + kept
    repos = found["repositories"]
    return (f"checkpoints: {repos} shadow repositor{'y' if repos == 1 else 'ies'}, {found['bytes'] / 2**20:,.1f} MiB; "
            f"kept: {kept} (checkpoint_keep_turns, checkpoint_keep_days)")


_NOUNS = {"turns": "turn", "permissions": "permission request", "approvals": "plan approval",
          "executions": "plan execution"}


def _count(n: int, what: str) -> str:
    noun = _NOUNS.get(what, what)
    return f"{n} {noun}" + ("s" if n != 1 else "")
