"""Thin commands over the protocol: sessions, plans, queue, notifications, audit.

Each is one or two RPC calls through ``connect`` (the running host, else an
embedded one) and prints a table, or the raw result with ``--json``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from functools import wraps
from pathlib import Path
from typing import Any

import click

Handler = Callable[..., Coroutine[Any, Any, Any]]


def rpc_command(group: click.Group, name: str, columns: tuple[str, ...] = (),
                **kwargs: Any) -> Callable[[Handler], click.Command]:
    """A command that gets a connected ``client`` and prints what its coroutine returns."""

    def decorate(fn: Handler) -> click.Command:
        @group.command(name, **kwargs)
        @click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=None)
        @click.option("--url", default=None, help="A running host's URL (default: from host.json).")
        @click.option("--token", default=None, help="The running host's token.")
        @click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
        @wraps(fn)
        def command(data_dir: Path | None, url: str | None, token: str | None, as_json: bool, **params: Any) -> None:
            import asyncio

            from pidesk.cli.connect import connect
            from pidesk.config import HostConfig

            async def go() -> Any:
                async with connect(HostConfig.from_environ(data_dir=data_dir), url, token) as client:
                    return await fn(client, **params)

            result = asyncio.run(go())
            if as_json:
                click.echo(json.dumps(result, indent=2))
            elif result is not None:
                render(result, columns)

        return command

    return decorate


def render(result: Any, columns: tuple[str, ...] = ()) -> None:
    """A list of objects as a table; a single object as key: value lines."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    rows = result if isinstance(result, list) else None
    if rows is None:
        for key, value in result.items():
            if isinstance(value, list) and value and isinstance(value[0], dict):
                rows = value
                break
    if rows is None:
        for key, value in result.items():
            console.print(f"[bold]{key}[/]: {value}")
        return
    if not rows:
        console.print("(none)")
        return
    shown = list(columns) or [c for c in rows[0] if not isinstance(rows[0][c], (dict, list))][:8]
    table = Table(*shown)
    for row in rows:
        table.add_row(*(_cell(row.get(c)) for c in shown))
    console.print(table)


def _cell(value: Any) -> str:
    if value is None:
        return "—"
    text = json.dumps(value) if isinstance(value, (dict, list)) else str(value)
    return text if len(text) <= 60 else text[:57] + "…"


@click.group()
def sessions() -> None:
    """List, show, create and configure sessions."""


@rpc_command(sessions, "list", columns=("id", "title", "mode", "permissionMode", "status", "planState", "projectPath"))
@click.option("--project", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None)
async def sessions_list(client: Any, project: Path | None) -> Any:
    params = {"projectPath": str(project.resolve())} if project else {}
    return (await client.call("session.list", params))["sessions"]


@rpc_command(sessions, "show")
@click.argument("session_id")
@click.option("--limit", type=int, default=50)
async def sessions_show(client: Any, session_id: str, limit: int) -> Any:
    got = await client.call("session.get", {"sessionId": session_id, "limit": limit})
    return [{"seq": m["seq"], "role": m["role"], "content": _summary(m["content"])} for m in got["messages"]]


@rpc_command(sessions, "new")
@click.argument("project", required=False, type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--mode", type=click.Choice(["agent", "plan", "goal"]), default=None)
@click.option("--permission", type=click.Choice(["ask", "accept-edits", "auto"]), default=None)
@click.option("--title", default=None)
async def sessions_new(client: Any, project: Path | None, mode: str | None, permission: str | None,
                       title: str | None) -> Any:
    params = {"projectPath": str(project.resolve()) if project else None, "mode": mode,
              "permissionMode": permission, "title": title}
    return await client.call("session.create", {k: v for k, v in params.items() if v is not None})


@rpc_command(sessions, "mode")
@click.argument("session_id")
@click.argument("mode", type=click.Choice(["agent", "plan", "goal"]))
async def sessions_mode(client: Any, session_id: str, mode: str) -> Any:
    return await client.call("session.setMode", {"sessionId": session_id, "mode": mode})


@rpc_command(sessions, "delete")
@click.argument("session_id")
async def sessions_delete(client: Any, session_id: str) -> Any:
    await client.call("session.delete", {"sessionId": session_id})
    return {"deleted": session_id}


@click.group()
def plans() -> None:
    """Pending plans and goals: show, approve, reject."""


@rpc_command(plans, "list", columns=("id", "kind", "title", "status", "executionState", "sessionId", "createdAt"))
@click.option("--session", "session_id", default=None, help="History of one session (default: all pending).")
async def plans_list(client: Any, session_id: str | None) -> Any:
    if session_id:
        return (await client.call("plans.list", {"sessionId": session_id}))["approvals"]
    return (await client.call("plans.pending", {}))["approvals"]


@rpc_command(plans, "show")
@click.argument("approval_id")
async def plans_show(client: Any, approval_id: str) -> Any:
    from rich.console import Console
    from rich.markdown import Markdown

    got = await client.call("plans.get", {"approvalId": approval_id})
    console = Console()
    console.print(f"[bold]{got['title']}[/] ({got['kind']}, {got['status']})")
    console.print(f"{got['artifactPath']}  sha256 {got['artifactSha256'][:12]}  {got['artifactSize']} bytes")
    console.print(Markdown(got["markdown"]))
    console.print(f"[bold]{got['question']}[/]")
    return None


@rpc_command(plans, "approve")
@click.argument("approval_id")
@click.option("--permission", type=click.Choice(["ask", "accept-edits", "auto"]), required=True,
              help="The permission mode the execution runs with.")
async def plans_approve(client: Any, approval_id: str, permission: str) -> Any:
    got = await client.call("plans.get", {"approvalId": approval_id})
    return await client.call("plans.resolve", {"approvalId": approval_id, "sessionId": got["sessionId"],
                                               "turnId": got["turnId"], "decision": "approve",
                                               "permissionMode": permission})


@rpc_command(plans, "reject")
@click.argument("approval_id")
@click.option("--feedback", default=None, help="Returned to the agent with the rejection.")
async def plans_reject(client: Any, approval_id: str, feedback: str | None) -> Any:
    got = await client.call("plans.get", {"approvalId": approval_id})
    params = {"approvalId": approval_id, "sessionId": got["sessionId"], "turnId": got["turnId"], "decision": "reject"}
    if feedback:
        params["feedback"] = feedback
    return await client.call("plans.resolve", params)


@click.group()
def queue() -> None:
    """A session's prompt queue."""


@rpc_command(queue, "list", columns=("id", "position", "text", "createdAt"))
@click.argument("session_id")
async def queue_list(client: Any, session_id: str) -> Any:
    return (await client.call("agent.queue.list", {"sessionId": session_id}))["entries"]


@rpc_command(queue, "push")
@click.argument("session_id")
@click.argument("text")
async def queue_push(client: Any, session_id: str, text: str) -> Any:
    return await client.call("agent.queue.push", {"sessionId": session_id, "text": text})


@rpc_command(queue, "remove")
@click.argument("session_id")
@click.argument("entry_id")
async def queue_remove(client: Any, session_id: str, entry_id: str) -> Any:
    await client.call("agent.queue.remove", {"sessionId": session_id, "entryId": entry_id})
    return {"removed": entry_id}


@click.group()
def notifications() -> None:
    """Finished turns nobody has seen yet."""


@rpc_command(notifications, "list", columns=("id", "kind", "sessionId", "turnId", "createdAt", "seenAt"))
@click.option("--unseen", is_flag=True)
async def notifications_list(client: Any, unseen: bool) -> Any:
    return (await client.call("notifications.list", {"unseenOnly": unseen}))["notifications"]


@rpc_command(notifications, "seen")
@click.option("--session", "session_id", default=None)
async def notifications_seen(client: Any, session_id: str | None) -> Any:
    await client.call("notifications.markSeen", {"sessionId": session_id} if session_id else {})
    return {"ok": True}


@click.group()
def audit() -> None:
    """The append-only audit log."""


@rpc_command(audit, "list", columns=("id", "action", "sessionId", "detail", "createdAt"))
@click.option("--session", "session_id", default=None)
@click.option("--limit", type=int, default=50)
async def audit_list(client: Any, session_id: str | None, limit: int) -> Any:
    params: dict[str, Any] = {"limit": limit}
    if session_id:
        params["sessionId"] = session_id
    return (await client.call("audit.list", params))["entries"]


def _summary(blocks: list[dict[str, Any]]) -> str:
    parts = []
    for block in blocks:
        if block["type"] == "text":
            parts.append(block["text"])
        elif block["type"] == "toolCall":
            parts.append(f"→ {block['name']}({json.dumps(block['args'])})")
        elif block["type"] == "toolResult":
            parts.append(f"← {block['name']}: {'ok' if block['ok'] else block.get('errorCode') or 'failed'}")
        else:
            parts.append(f"[{block['type']}]")
    return " ".join(parts)


@click.group()
def schedules() -> None:
    """Prompts that run unattended on a cron schedule (Plan/Goal schedules are refused at run time)."""


@rpc_command(schedules, "list", columns=("id", "name", "cron", "mode", "nextRunAt", "projectPath"))
async def schedules_list(client: Any) -> Any:
    return (await client.call("schedules.list"))["schedules"]


@rpc_command(schedules, "create")
@click.argument("name")
@click.argument("cron")
@click.argument("project", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("prompt")
@click.option("--mode", type=click.Choice(["agent", "plan", "goal"]), default="agent")
@click.option("--permission", type=click.Choice(["ask", "accept-edits", "auto"]), default="ask")
async def schedules_create(client: Any, name: str, cron: str, project: Path, prompt: str, mode: str,
                           permission: str) -> Any:
    return await client.call("schedules.create", {"name": name, "cron": cron, "projectPath": str(project.resolve()),
                                                  "prompt": prompt, "mode": mode, "permissionMode": permission})


@rpc_command(schedules, "delete")
@click.argument("schedule_id")
async def schedules_delete(client: Any, schedule_id: str) -> Any:
    await client.call("schedules.delete", {"scheduleId": schedule_id})
    return {"deleted": schedule_id}


@rpc_command(schedules, "run")
@click.argument("schedule_id")
async def schedules_run(client: Any, schedule_id: str) -> Any:
    return await client.call("schedules.runNow", {"scheduleId": schedule_id})


GROUPS = (sessions, plans, queue, notifications, audit, schedules)
