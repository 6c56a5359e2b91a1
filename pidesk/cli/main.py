"""``pidesk`` commands. Heavy imports happen inside the commands, so ``--help`` stays fast."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path
from collections.abc import Callable
from typing import Any, NoReturn

import click


class _Group(click.Group):
    """Every PideskError ends a command with its stable code and a message, never a traceback."""

    def invoke(self, ctx: click.Context) -> object:
        from pidesk.core.errors import PideskError, StartupRefused

        try:
            return super().invoke(ctx)
        except StartupRefused as exc:
            click.echo(f"pidesk: {exc.message}", err=True)
            sys.exit(2)
        except PideskError as exc:
            click.echo(f"pidesk: {exc.code}: {exc.message}", err=True)
            sys.exit(2)


def _leave(code: int) -> NoReturn:
    """End a one-shot command at once, skipping the interpreter's teardown of every module.

    Only once the command has returned: its host is closed by then (transcripts synced,
    index committed, the data dir's lock released) and its threads have ended; what is left
    is output to flush. Tearing down the SDK's thousands of model classes took 0.1–0.2 s of
    `pidesk run`'s wall time (docs/benchmarks-server.md).
    """
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a reader that went away (`| head`): nothing to add
            stream.flush()
    os._exit(code)


_NO_SANDBOX_HELP = ("Run Bash commands unconfined (else in a bubblewrap sandbox: writes only in the project, "
                    "no network). They can then read the host's token and reach the network.")
_MAX_RETRIES_HELP = ("Retries of a failed model request (default 10, or PIDESK_MAX_RETRIES, or max_retries "
                     "in the config file); 0: fail at the first error.")
_CONTEXT_LIMIT_HELP = ("The model's context window in tokens (at least 1000); wins over the config file's "
                       "context_limit and the built-in figure for the model. The conversation is compacted "
                       "before a request would fill most of it.")


def _context_limit(ctx: click.Context, param: click.Parameter, value: int | None) -> int | None:
    if value is not None and value < 1000:
        raise click.BadParameter(f"{value} is too small: the model's window takes a number of tokens of at least "
                                 "1000, e.g. --context-limit 32000", ctx, param)
    return value


def _context_limit_option(attached: str = "") -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    return click.option("--context-limit", type=int, default=None, callback=_context_limit, metavar="TOKENS",
                        help=_CONTEXT_LIMIT_HELP + attached)


_ATTACHED = " A running host keeps the window it was started with."


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="pidesk")
def main() -> None:
    """pidesk — a local agent host: coding agents in many sessions, one authority over what they may do."""


@main.command()
@click.argument("project", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("prompt")
@click.option("--mode", type=click.Choice(["agent", "plan", "goal"]), default="agent", show_default=True)
@click.option("--permission", "permission_mode", type=click.Choice(["ask", "accept-edits", "auto"]),
              default="ask", show_default=True, help="An Ask that nobody can answer fails the run.")
@click.option("--model", default=None,
              help="PROVIDER/MODEL, e.g. scripted/examples/notes.json (a running host must run this model).")
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=None)
@click.option("--json", "as_json", is_flag=True, help="Print every event as one JSON line.")
@click.option("--max-retries", type=click.IntRange(min=0), default=None, help=_MAX_RETRIES_HELP)
@click.option("--no-sandbox", is_flag=True, help=_NO_SANDBOX_HELP)
@_context_limit_option(_ATTACHED)
def run(project: Path, prompt: str, mode: str, permission_mode: str, model: str | None,
        data_dir: Path | None, as_json: bool, max_retries: int | None, no_sandbox: bool,
        context_limit: int | None) -> None:
    """Run PROMPT unattended in PROJECT (through the running host, else an embedded one); exit non-zero
    with the error code on failure."""
    import asyncio

    from pidesk.cli.run import run_unattended
    from pidesk.config import HostConfig

    config = HostConfig.from_environ(data_dir=data_dir, model=model, max_retries=max_retries, no_sandbox=no_sandbox,
                                     context_limit=context_limit)
    _leave(asyncio.run(run_unattended(config, project.resolve(), prompt, mode, permission_mode, as_json, model,
                                      max_retries, no_sandbox, context_limit)))


@main.command()
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=None)
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def status(data_dir: Path | None, as_json: bool) -> None:
    """Summarise what the data directory holds: the running host's view, else opened (and recovered) here."""
    import asyncio

    from pidesk.cli.run import show_status
    from pidesk.config import HostConfig

    asyncio.run(show_status(HostConfig.from_environ(data_dir=data_dir), as_json))


@main.command()
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=None)
def stop(data_dir: Path | None) -> None:
    """Stop the host serving the data dir (one started on demand, or `pidesk serve`), as Ctrl+C would."""
    from pidesk.cli.connect import stop_host
    from pidesk.config import HostConfig

    config = HostConfig.from_environ(data_dir=data_dir)
    stopped = stop_host(config.data_dir)
    click.echo(f"stopped the host at {stopped.url} (pid {stopped.pid})" if stopped is not None
               else f"no host is running for {config.data_dir}")


@main.command()
@click.argument("project", required=False, type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=None)
@click.option("--host", "bind", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=int, default=0, show_default=True,
              help="0: the port this data dir's host had last time if it is free, else any free port.")
@click.option("--token", default=None, help="Use (and keep) this token instead of the kept one.")
@click.option("--new-token", is_flag=True, help="Replace the kept token with a fresh one (locks out old pages).")
@click.option("--model", default=None, help="PROVIDER/MODEL")
@click.option("--approval-timeout", type=float, default=None, help="Seconds a plan waits for a decision (1800).")
@click.option("--allow-remote", is_flag=True, help="Allow listening on a non-loopback address.")
@click.option("--no-open", is_flag=True, help="Do not open the browser.")
@click.option("--max-retries", type=click.IntRange(min=0), default=None, help=_MAX_RETRIES_HELP)
@click.option("--no-sandbox", is_flag=True, help=_NO_SANDBOX_HELP)
@_context_limit_option()
@click.option("--log-safe", is_flag=True, help="Announce the URL without its token (output going to a log: the "
              "token is in <data-dir>/token and host.json, readable only by you).")
@click.option("--idle-exit", type=click.FloatRange(min=0.1), default=None, metavar="SECONDS",
              help="Exit once nothing has happened for SECONDS: no client connected, no turn running, no "
                   "schedule enabled (a host clients start on demand uses 600). Default: run until stopped.")
def serve(project: Path | None, data_dir: Path | None, bind: str, port: int, token: str | None, new_token: bool,
          model: str | None, approval_timeout: float | None, allow_remote: bool, no_open: bool,
          max_retries: int | None, no_sandbox: bool, context_limit: int | None, log_safe: bool,
          idle_exit: float | None) -> None:
    """Run the host: JSON-RPC on /rpc, the web UI on /, until SIGTERM or Ctrl+C."""
    import asyncio

    from pidesk.cli.models import make_provider
    from pidesk.config import HostConfig
    from pidesk.server.serve import ServeOptions
    from pidesk.server.serve import serve as run_server

    config = HostConfig.from_environ(data_dir=data_dir, model=model, approval_timeout=approval_timeout,
                                     max_retries=max_retries, no_sandbox=no_sandbox, context_limit=context_limit)
    if bind not in ("127.0.0.1", "localhost", "::1") and allow_remote:
        click.echo(f"warning: listening on {bind}: anyone who can reach it and has the token controls "
                   "this machine's agents", err=True)

    def announce(url: str, secret: str) -> None:
        if log_safe:  # (a log must never hold the token)
            click.echo(f"pidesk serving at {url} (its token: {config.data_dir / 'token'})")
            return
        page = f"{url}/?token={secret}"
        if project is not None:
            page += f"&project={project.resolve()}"
        click.echo(f"pidesk serving at {page}", err=False)
        if not no_open:
            import webbrowser

            webbrowser.open(page)

    asyncio.run(run_server(config, make_provider(config.model, config.secrets, lean_http=config.lean_http,
                                                 settings=config.model_settings(), retry=config.retry),
                           ServeOptions(bind=bind, port=port, token=token, new_token=new_token,
                                        allow_remote=allow_remote, idle_exit=idle_exit), announce))


def _add_groups() -> None:
    from pidesk.cli.commands import COMMANDS, GROUPS

    for group in GROUPS:
        main.add_command(group)
    for command in COMMANDS:  # diff, revert, compact
        main.add_command(command)


_add_groups()


@main.command()
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=None)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def doctor(data_dir: Path | None, as_json: bool) -> None:
    """Check the store's integrity, rebuild the index from the transcripts, report quarantined tails.

    While a host serves the data dir, only the checks run, through that host; the repairs
    need it stopped.
    """
    from pidesk.cli.connect import running_host
    from pidesk.config import HostConfig

    from pidesk.cli.say import sandbox_line

    config = HostConfig.from_environ(data_dir=data_dir)
    remote = running_host(config.data_dir)
    if remote is not None:
        import asyncio

        report = asyncio.run(remote.call("host.doctor"))
        report = {"dataDir": str(config.data_dir), "host": {"url": remote.url, "pid": remote.pid},
                  "repaired": False, **report}
        if as_json:
            click.echo(json.dumps(report, indent=2))
        else:
            click.echo(f"host: serving at {remote.url} (pid {remote.pid}); checked through it, nothing repaired")
            click.echo(f"integrity: {report['integrity']}")
            click.echo(f"sessions: {report['sessions']}")
            if "sandbox" in report:
                click.echo(sandbox_line(report["sandbox"]))
            for session_id in report["missingTranscripts"]:
                click.echo(f"session without a transcript: {session_id}")
            _say_lost(report.get("lostMessages") or {})
            for path in report["quarantined"]:
                click.echo(f"quarantined tail: {path}")
            click.echo(f"repairs (rebuilding the index from the transcripts) need the host stopped: stop it "
                       f"(Ctrl+C where it runs, or kill {remote.pid}), then run `pidesk doctor` again")
        if report["integrity"] != "ok" or report["missingTranscripts"] or report.get("lostMessages"):
            sys.exit(1)
        return

    from pidesk.host.tooling import sandbox_status
    from pidesk.store import Store
    from pidesk.store.lock import DataDirLock

    lock = DataDirLock(config.data_dir)
    try:
        store = Store(config.data_dir)
        lost = store.lost_messages()  # (before the rebuild, which would index the transcripts as they are now)
        rebuilt = store.rebuild_index()
        quarantined = [str(p) for p in store.transcripts.quarantined()]
        store.close()
    finally:
        lock.release()
    sandbox = sandbox_status(config).to_wire()
    if as_json:
        click.echo(json.dumps({
            "dataDir": str(config.data_dir), "host": None, "repaired": True, "integrity": rebuilt.integrity,
            "sessions": rebuilt.sessions, "messages": rebuilt.messages,
            "restoredSessions": rebuilt.boot.restored_sessions, "missingTranscripts": rebuilt.missing_transcripts,
            "quarantined": quarantined, "lostMessages": lost, "sandbox": sandbox}, indent=2))
    else:
        click.echo(f"integrity: {rebuilt.integrity}")
        click.echo(f"rebuilt: {rebuilt.sessions} sessions, {rebuilt.messages} messages from their transcripts")
        click.echo(sandbox_line(sandbox))
        for session_id in rebuilt.boot.restored_sessions:
            click.echo(f"restored orphaned session: {session_id}")
        for session_id in rebuilt.missing_transcripts:
            click.echo(f"session without a transcript: {session_id}")
        _say_lost(lost)
        for path in quarantined:
            click.echo(f"quarantined tail: {path}")
    if rebuilt.integrity != "ok" or rebuilt.missing_transcripts or lost:
        sys.exit(1)


def _say_lost(lost: dict[str, int]) -> None:
    for session_id, count in lost.items():
        click.echo(f"session {session_id}: its transcript lost {count} acknowledged message"
                   f"{'s' if count != 1 else ''} (rewritten outside the host)")


@main.command()
@click.argument("project", required=False, type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--session", "session_id", default=None, help="Continue this session instead of creating one.")
@click.option("--continue", "latest", is_flag=True, help="Continue the project's newest session (a new one if it has "
              "none); its recent history is shown first.")
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=None)
@click.option("--url", default=None)
@click.option("--token", default=None)
@click.option("--model", default=None, help="PROVIDER/MODEL (a running host must run this model).")
@click.option("--max-retries", type=click.IntRange(min=0), default=None, help=_MAX_RETRIES_HELP)
@click.option("--no-sandbox", is_flag=True, help=_NO_SANDBOX_HELP)
@_context_limit_option(_ATTACHED)
def chat(project: Path | None, session_id: str | None, latest: bool, data_dir: Path | None, url: str | None,
         token: str | None, model: str | None, max_retries: int | None, no_sandbox: bool,
         context_limit: int | None) -> None:
    """Chat with an agent in PROJECT (a running host, else an embedded one)."""
    import asyncio

    from pidesk.cli.chat import run_chat
    from pidesk.cli.connect import open_link
    from pidesk.config import HostConfig

    config = HostConfig.from_environ(data_dir=data_dir, model=model, max_retries=max_retries, no_sandbox=no_sandbox,
                                     context_limit=context_limit)
    where = str(project.resolve()) if project else None

    async def go() -> None:
        async with open_link(config, "chat", url=url, token=token, model=model, max_retries=max_retries,
                             no_sandbox=no_sandbox, context_limit=context_limit) as link:
            await run_chat(link, where, session_id, latest)

    asyncio.run(go())


@main.command()
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=None)
@click.option("--model", default=None, help="PROVIDER/MODEL (a running host must run this model).")
@click.option("--max-retries", type=click.IntRange(min=0), default=None, help=_MAX_RETRIES_HELP)
@click.option("--no-sandbox", is_flag=True, help=_NO_SANDBOX_HELP)
@_context_limit_option(_ATTACHED)
def acp(data_dir: Path | None, model: str | None, max_retries: int | None, no_sandbox: bool,
        context_limit: int | None) -> None:
    """Speak the Agent Client Protocol on stdin/stdout, for an editor (Zed, JetBrains, Neovim, Emacs).

    The editor starts this command; its sessions are the host's (a running one, else one started
    on demand), so the web page shows them live. README: "Use pidesk from your editor"."""
    import asyncio

    from pidesk.acp.agent import PideskAgent
    from pidesk.acp.stdio import serve, take_stdio
    from pidesk.cli.connect import open_link
    from pidesk.config import HostConfig

    proto_in, proto_out = take_stdio()  # first: nothing else may write to the editor's stream
    config = HostConfig.from_environ(data_dir=data_dir, model=model, max_retries=max_retries, no_sandbox=no_sandbox,
                                     context_limit=context_limit)

    async def go() -> None:
        async with open_link(config, "acp", model=model, max_retries=max_retries, no_sandbox=no_sandbox,
                             context_limit=context_limit) as link, link:
            await serve(PideskAgent(link), proto_in, proto_out)

    asyncio.run(go())
