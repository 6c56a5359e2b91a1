"""Thin commands over the protocol: sessions, plans, queue, notifications, audit.

Each is one or a few RPC calls through ``connect`` (the running host, else an
embedded one) and prints a table, or the raw result with ``--json``.

Ids are printed whole, always: a person copies them into the next command
(``plans approve pa_…``). A table whose ids cannot fit the terminal's width
becomes one plain line per row; other cells may be folded or shortened, ids never.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from functools import wraps
from pathlib import Path
from typing import Any

import click

from pidesk.cli.say import compaction_line

Handler = Callable[..., Coroutine[Any, Any, Any]]
CELL = 60  # characters a non-id cell shows before "…"
SQUEEZED = 10  # the narrowest a folded column may get before the table becomes plain lines


def rpc_command(group: click.Group, name: str, columns: tuple[str, ...] = (),
                show: Callable[[Any], None] | None = None, *, model: bool = False,
                **kwargs: Any) -> Callable[[Handler], click.Command]:
    """A command that gets a connected ``client`` and prints what its coroutine returns:
    ``--json`` as JSON, else through ``show`` (default: ``render`` with ``columns``).

    ``model``: the command asks the model (``compact``): it takes ``--model`` for an embedded host,
    and a running host must run that model (``insist_on_model``)."""

    def decorate(fn: Handler) -> click.Command:
        @group.command(name, **kwargs)
        @click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=None)
        @click.option("--url", default=None, help="A running host's URL (default: from host.json).")
        @click.option("--token", default=None, help="The running host's token.")
        @click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
        @wraps(fn)
        def command(data_dir: Path | None, url: str | None, token: str | None, as_json: bool, **params: Any) -> None:
            import asyncio

            from pidesk.cli.connect import Remote, connect, insist_on_model
            from pidesk.config import HostConfig

            chosen = params.pop("model", None) if model else None

            async def go() -> Any:
                config = HostConfig.from_environ(data_dir=data_dir, model=chosen)
                async with connect(config, url, token, model=chosen) as client:
                    if isinstance(client, Remote):
                        await insist_on_model(client, chosen, None if url else config.data_dir)
                    return await fn(client, **params)

            result = asyncio.run(go())
            if as_json:
                click.echo(json.dumps(result, indent=2))
            elif show is not None:
                show(result)
            elif result is not None:
                render(result, columns)

        if model:
            command = click.option("--model", default=None, help="PROVIDER/MODEL that writes the summary "
                                   "(a running host must run this model).")(command)
        return command

    return decorate


def render(result: Any, columns: tuple[str, ...] = ()) -> None:
    """A list of objects as a table; a single object as key: value lines."""
    rows = result if isinstance(result, list) else None
    if rows is None:
        for key, value in result.items():
            if isinstance(value, list) and value and isinstance(value[0], dict):
                rows = value
                break
    if rows is None:
        for key, value in result.items():
            click.echo(f"{key}: {_cell(value, whole=True)}")
        return
    if not rows:
        click.echo("(none)")
        return
    shown = list(columns) or [c for c in rows[0] if not isinstance(rows[0][c], (dict, list))][:8]
    cells = [[_cell(row.get(c), whole=_is_id(c)) for c in shown] for row in rows]
    _table(shown, cells)


def _table(shown: list[str], cells: list[list[str]]) -> None:
    from rich.cells import cell_len
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = Console(highlight=False)
    widths = [max(cell_len(c), *(cell_len(row[i]) for row in cells)) for i, c in enumerate(shown)]
    needed = sum(w if _is_id(c) else min(w, SQUEEZED) for c, w in zip(shown, widths, strict=True))
    if needed + 3 * len(shown) + 1 > console.width:  # each column: a border and two spaces of padding
        for row in cells:
            click.echo("  ".join(v if c == "id" else f"{c}: {v}" for c, v in zip(shown, row, strict=True)))
        return
    table = Table()
    for column, width in zip(shown, widths, strict=True):
        if _is_id(column):
            table.add_column(column, no_wrap=True, min_width=width)
        else:
            table.add_column(column, overflow="fold")
    for row in cells:
        table.add_row(*(Text(value) for value in row))  # Text: a title holding "[bold]" is not markup
    console.print(table)


def _is_id(column: str) -> bool:
    return column == "id" or column.endswith("Id")


def _cell(value: Any, whole: bool = False) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    text = json.dumps(value) if isinstance(value, (dict, list)) else str(value)
    text = " ".join(text.split()) if not whole else text  # a newline would break the row
    return text if whole or len(text) <= CELL else text[: CELL - 1] + "…"


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
@click.argument("session", required=False, default=None)
@click.option("--session", "session_id", default=None, help="History of one session (default: all pending).")
async def plans_list(client: Any, session: str | None, session_id: str | None) -> Any:
    """Every pending plan and goal; with a SESSION (or --session), that session's whole history."""
    session_id = session_id or session
    if session_id:
        return (await client.call("plans.list", {"sessionId": session_id}))["approvals"]
    return (await client.call("plans.pending", {}))["approvals"]


def _show_plan(got: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.markdown import Markdown
    from rich.markup import escape

    console = Console(highlight=False)
    console.print(f"[bold]{escape(got['title'])}[/] ({got['kind']} {got['id']}, {got['status']})")
    console.print(f"{escape(got['artifactPath'])}  sha256 {got['artifactSha256'][:12]}  {got['artifactSize']} bytes")
    console.print(Markdown(got["markdown"]))
    console.print(f"[bold]{escape(got['question'])}[/]")


@rpc_command(plans, "show", show=_show_plan)
@click.argument("approval_id")
async def plans_show(client: Any, approval_id: str) -> Any:
    return await client.call("plans.get", {"approvalId": approval_id})


_CONTEXT_WORDS = {"keep": "it sees the whole conversation", "compact": "it sees a summary of the conversation",
                  "fresh": "it starts fresh from the {kind} alone"}


def _show_resolved(got: dict[str, Any]) -> None:
    """What the decision did, in words: never the raw record (``criteria: None``)."""
    what = f"{got['kind']} {got['id']} \u201c{got['title']}\u201d"
    if got["status"] == "approved":
        click.echo(f"approved {what}")
        if got.get("executionId"):
            click.echo(f"execution {got['executionId']}: {got['executionState']} in session {got['sessionId']}, "
                       f"permission {got['permissionMode']}")
        if got.get("context") in _CONTEXT_WORDS:  # (a host before issue 30 does not say)
            click.echo(f"context {got['context']}: " + _CONTEXT_WORDS[got["context"]].format(kind=got["kind"]))
        return
    click.echo(f"{got['status']} {what}")
    if got.get("feedback"):
        click.echo(f"the agent in session {got['sessionId']} gets your feedback and revises it")
    else:
        click.echo(f"session {got['sessionId']} keeps planning")


@rpc_command(plans, "approve", show=_show_resolved)
@click.argument("approval_id")
@click.option("--permission", type=click.Choice(["ask", "accept-edits", "auto"]), required=True,
              help="The permission mode the execution runs with.")
@click.option("--context", type=click.Choice(["keep", "compact", "fresh"]), default=None,
              help="What the execution sees of the conversation: all of it (keep, the default), the model's "
                   "summary of it (compact), or the plan alone (fresh).")
async def plans_approve(client: Any, approval_id: str, permission: str, context: str | None) -> Any:
    got = await client.call("plans.get", {"approvalId": approval_id})
    params = {"approvalId": approval_id, "sessionId": got["sessionId"], "turnId": got["turnId"],
              "decision": "approve", "permissionMode": permission}
    if context is not None:
        params["context"] = context
    return await client.call("plans.resolve", params)


@rpc_command(plans, "reject", show=_show_resolved)
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


@rpc_command(notifications, "list",
             columns=("id", "outcome", "sessionId", "sessionTitle", "task", "createdAt", "seenAt"))
@click.option("--unseen", is_flag=True)
async def notifications_list(client: Any, unseen: bool) -> Any:
    """Each notification with what finished: its session's title, the prompt that started the turn,
    and how the turn ended (the wire's fields, plus sessionTitle, task, reason, errorCode and outcome)."""
    notes = (await client.call("notifications.list", {"unseenOnly": unseen}))["notifications"]
    if not notes:
        return notes
    titles = {s["id"]: s["title"] for s in (await client.call("session.list"))["sessions"]}
    turns: dict[str, dict[str, Any]] = {}
    tasks: dict[str, str] = {}
    for session_id in sorted({n["sessionId"] for n in notes} & set(titles)):
        for turn in (await client.call("session.turns", {"sessionId": session_id, "limit": 1000}))["turns"]:
            turns[turn["id"]] = turn
        got = await client.call("session.get", {"sessionId": session_id, "limit": 200})  # recent turns' prompts
        for message in got["messages"]:
            if message["role"] == "user" and message.get("turnId") and message["turnId"] not in tasks:
                tasks[message["turnId"]] = _summary(message["content"])
    for note in notes:
        turn = turns.get(note["turnId"], {})
        reason, code = turn.get("reason"), turn.get("errorCode")
        note.update(sessionTitle=titles.get(note["sessionId"]), task=tasks.get(note["turnId"]), reason=reason,
                    errorCode=code,
                    outcome=(reason or note["kind"].removeprefix("task.")) + (f": {code}" if code else ""))
    return notes


def _show_seen(result: dict[str, Any]) -> None:
    click.echo("marked seen")


@rpc_command(notifications, "seen", show=_show_seen)
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
        elif block["type"] == "compaction":
            parts.append(compaction_line(block))
        else:
            parts.append(f"[{block['type']}]")
    return " ".join(parts)


@click.group()
def schedules() -> None:
    """Prompts that run unattended on a cron schedule (Plan/Goal schedules are refused at run time)."""


def _show_schedules(schedules: list[dict[str, Any]]) -> None:
    """The table, with each schedule's last run and how it ended (``--json`` keeps the wire's lastRun)."""
    def last(run: dict[str, Any] | None) -> str:
        if not run:
            return "never"
        code = f" {run['errorCode']}" if run.get("errorCode") else ""
        return f"{run['status']}{code} {run['at'][:16].replace('T', ' ')}"

    render([{**s, "lastRun": last(s.get("lastRun"))} for s in schedules],
           ("id", "name", "cron", "mode", "nextRunAt", "lastRun", "projectPath"))


@rpc_command(schedules, "list", show=_show_schedules)
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


# ---- diff and revert (issue 17: checkpoints) ----------------------------------------------


@click.group()
def _top() -> None:
    """Holds the top-level commands defined here; ``main`` adds them (``COMMANDS``)."""


def _show_diff(result: dict[str, Any]) -> None:
    turns = result.get("turns", [])
    if result.get("note"):
        click.secho(f"note: {result['note']}", fg="yellow", err=True)
    stat_only = result.get("stat", False)
    for turn in turns:
        files = turn["files"]
        added = sum(f["additions"] for f in files)
        removed = sum(f["deletions"] for f in files)
        label = "revert" if turn.get("revert") else "turn"
        click.secho(f"{label} {turn['turnId']}: {len(files)} file{'s' if len(files) != 1 else ''} changed, "
                    f"+{added} -{removed}", bold=True)
        if stat_only:
            width = max((len(f["path"]) for f in files), default=0)
            for f in files:
                counts = "too large to checkpoint" if f.get("tooLarge") else "binary" if f.get("binary") else (
                    click.style(f"+{f['additions']}", fg="green") + " " + click.style(f"-{f['deletions']}", fg="red"))
                click.echo(f" {f['path'].ljust(width)} | {f['status']:<8} {counts}")
            continue
        for f in files:
            if f["diff"] == "binary":
                click.secho(f"diff --git a/{f['path']} b/{f['path']}", bold=True)
                click.echo(f"Binary file {f['status']}")
                continue
            for line in f["diff"].splitlines():
                click.echo(_coloured(line))
    if not turns:
        click.echo("no turns")


def _coloured(line: str) -> str:
    """A unified diff line, coloured as ``git diff`` colours it (plain when not a terminal)."""
    if line.startswith(("diff --git", "index ", "--- ", "+++ ", "new file", "deleted file")):
        return click.style(line, bold=True)
    if line.startswith("@@"):
        return click.style(line, fg="cyan")
    if line.startswith("+"):
        return click.style(line, fg="green")
    if line.startswith("-"):
        return click.style(line, fg="red")
    return line


@rpc_command(_top, "diff", show=_show_diff)
@click.argument("session_id")
@click.option("--turn", "turn_id", default=None, help="Only this turn (default: every turn, oldest first).")
@click.option("--stat", "stat", is_flag=True, help="Files and line counts only.")
async def diff(client: Any, session_id: str, turn_id: str | None, stat: bool) -> Any:
    """What each turn of a session changed in its workspace (any tool: Write, Edit, Bash, plugins)."""
    params = {"sessionId": session_id} | ({"turnId": turn_id} if turn_id else {})
    result = await client.call("session.changes", params)
    if stat:  # no diff text: {binary} says which files have none
        result = {**result, "stat": True, "turns": [
            {**t, "files": [{k: v for k, v in f.items() if k != "diff"} | {"binary": f["diff"] == "binary"}
                            for f in t["files"]]} for t in result["turns"]]}
    return result


def _show_reverted(result: dict[str, Any]) -> None:
    if result.get("cancelled"):
        click.echo("Nothing reverted.")
        return
    files = result["files"]
    click.echo(f"Reverted {len(files)} file{'s' if len(files) != 1 else ''}" + (":" if files else "."))
    for path in files:
        click.echo(f"  {path}")
    kept = result.get("notRestored", [])
    if kept:
        click.secho("Left as they are (too large to checkpoint, so their content at that point is unknown):",
                    fg="yellow")
        for path in kept:
            click.echo(f"  {path}")
    click.echo(f"Undo this revert with: pidesk revert {result['sessionId']} --turn {result['revertId']}")


@rpc_command(_top, "revert", show=_show_reverted)
@click.argument("session_id")
@click.option("--turn", "turn_id", required=True, help="Restore the workspace to its state before this turn.")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
async def revert(client: Any, session_id: str, turn_id: str, yes: bool) -> Any:
    """Put the workspace back as it was before a turn, undoing that turn and every later one."""
    changes = (await client.call("session.changes", {"sessionId": session_id}))["turns"]
    ids = [t["turnId"] for t in changes]
    if turn_id not in ids:
        await client.call("session.changes", {"sessionId": session_id, "turnId": turn_id})  # NOT_FOUND, worded
    later = changes[ids.index(turn_id):] if turn_id in ids else []
    paths = sorted({f["path"] for t in later for f in t["files"]})
    if not yes:
        click.echo(f"Revert the workspace to its state before {turn_id}, undoing it and "
                   f"{len(later) - 1} later turn{'s' if len(later) != 2 else ''}. Files the turns changed:")
        for path in paths or ["(none recorded)"]:
            click.echo(f"  {path}")
        click.echo("Files changed by hand (or by another session in this project) since then are reverted too; "
                   "files ignored by .gitignore and .pi/ are never touched. The revert can itself be reverted.")
        if not click.confirm("Revert?", default=False):
            return {"cancelled": True}
    result = await client.call("session.revert", {"sessionId": session_id, "turnId": turn_id})
    return {**result, "sessionId": session_id}


# ---- compact (issue 30: context compaction) ------------------------------------------------


def _show_compacted(result: dict[str, Any]) -> None:
    if not result["compacted"]:
        click.echo(f"nothing to compact in session {result['sessionId']}: nothing was said since it began or "
                   "was last compacted")
        return
    block = result.get("compaction")
    click.echo(compaction_line(block) if block else f"compacted session {result['sessionId']}")
    if block and block.get("summary"):
        click.echo(block["summary"])


@rpc_command(_top, "compact", show=_show_compacted, model=True)
@click.argument("session_id")
@click.option("--instructions", default=None, help="What the summary must keep, e.g. \"the failing test's name\".")
async def compact(client: Any, session_id: str, instructions: str | None) -> Any:
    """Fold an idle session's conversation into the model's summary now: its next request starts from that
    summary (the transcript keeps every message)."""
    params = {"sessionId": session_id} | ({"instructions": instructions} if instructions else {})
    result = dict(await client.call("session.compact", params), sessionId=session_id)
    if result["compacted"]:
        # its message is the newest, unless a prompt queued meanwhile has started since
        recent = (await client.call("session.get", {"sessionId": session_id, "limit": 20}))["messages"]
        result["compaction"] = next((b for m in reversed(recent) for b in m["content"] if b["type"] == "compaction"),
                                    None)
    return result


COMMANDS = tuple(_top.commands.values())
