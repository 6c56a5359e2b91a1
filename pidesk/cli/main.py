"""``pidesk`` commands. Heavy imports happen inside the commands, so ``--help`` stays fast."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import NoReturn

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
@click.option("--model", default=None, help="PROVIDER/MODEL, e.g. scripted/examples/notes.json")
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=None)
@click.option("--json", "as_json", is_flag=True, help="Print every event as one JSON line.")
def run(project: Path, prompt: str, mode: str, permission_mode: str, model: str | None,
        data_dir: Path | None, as_json: bool) -> None:
    """Run PROMPT unattended in PROJECT with an embedded host; exit non-zero with the error code on failure."""
    import asyncio

    from pidesk.cli.run import run_unattended
    from pidesk.config import HostConfig

    config = HostConfig.from_environ(data_dir=data_dir, model=model)
    _leave(asyncio.run(run_unattended(config, project.resolve(), prompt, mode, permission_mode, as_json)))


@main.command()
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=None)
def status(data_dir: Path | None) -> None:
    """Open the data directory (recovering it if needed) and summarise what it holds."""
    import asyncio

    from pidesk.cli.run import show_status
    from pidesk.config import HostConfig

    asyncio.run(show_status(HostConfig.from_environ(data_dir=data_dir)))


@main.command()
@click.argument("project", required=False, type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=None)
@click.option("--host", "bind", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=int, default=0, show_default=True, help="0 picks a free port.")
@click.option("--token", default=None, help="Use this token instead of a random one.")
@click.option("--model", default=None, help="PROVIDER/MODEL")
@click.option("--approval-timeout", type=float, default=None, help="Seconds a plan waits for a decision (1800).")
@click.option("--allow-remote", is_flag=True, help="Allow listening on a non-loopback address.")
@click.option("--no-open", is_flag=True, help="Do not open the browser.")
def serve(project: Path | None, data_dir: Path | None, bind: str, port: int, token: str | None, model: str | None,
          approval_timeout: float | None, allow_remote: bool, no_open: bool) -> None:
    """Run the host: JSON-RPC on /rpc, the web UI on /, until SIGTERM or Ctrl+C."""
    import asyncio

    from pidesk.cli.models import make_provider
    from pidesk.config import HostConfig
    from pidesk.server.serve import ServeOptions
    from pidesk.server.serve import serve as run_server

    config = HostConfig.from_environ(data_dir=data_dir, model=model, approval_timeout=approval_timeout)
    if bind not in ("127.0.0.1", "localhost", "::1") and allow_remote:
        click.echo(f"warning: listening on {bind}: anyone who can reach it and has the token controls "
                   "this machine's agents", err=True)

    def announce(url: str, secret: str) -> None:
        page = f"{url}/?token={secret}"
        if project is not None:
            page += f"&project={project.resolve()}"
        click.echo(f"pidesk serving at {page}", err=False)
        if not no_open:
            import webbrowser

            webbrowser.open(page)

    asyncio.run(run_server(config, make_provider(config.model, config.secrets, lean_http=config.lean_http),
                           ServeOptions(bind, port, token, allow_remote), announce))


def _add_groups() -> None:
    from pidesk.cli.commands import GROUPS

    for group in GROUPS:
        main.add_command(group)


_add_groups()


@main.command()
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=None)
def doctor(data_dir: Path | None) -> None:
    """Check the store's integrity, rebuild the index from the transcripts, report quarantined tails."""
    from pidesk.config import HostConfig
    from pidesk.store import Store
    from pidesk.store.lock import DataDirLock

    config = HostConfig.from_environ(data_dir=data_dir)
    lock = DataDirLock(config.data_dir)
    try:
        store = Store(config.data_dir)
        report = store.rebuild_index()
        quarantined = [str(p) for p in store.transcripts.quarantined()]
        store.close()
    finally:
        lock.release()
    click.echo(f"integrity: {report.integrity}")
    click.echo(f"rebuilt: {report.sessions} sessions, {report.messages} messages from their transcripts")
    for session_id in report.boot.restored_sessions:
        click.echo(f"restored orphaned session: {session_id}")
    for session_id in report.missing_transcripts:
        click.echo(f"session without a transcript: {session_id}")
    for path in quarantined:
        click.echo(f"quarantined tail: {path}")
    if report.integrity != "ok" or report.missing_transcripts:
        sys.exit(1)


@main.command()
@click.argument("project", required=False, type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--session", "session_id", default=None, help="Continue this session instead of creating one.")
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=None)
@click.option("--url", default=None)
@click.option("--token", default=None)
@click.option("--model", default=None, help="PROVIDER/MODEL for an embedded host.")
def chat(project: Path | None, session_id: str | None, data_dir: Path | None, url: str | None,
         token: str | None, model: str | None) -> None:
    """Chat with an agent in PROJECT (a running host, else an embedded one)."""
    import asyncio

    from pidesk.cli.chat import run_chat
    from pidesk.cli.connect import embedded, running_host
    from pidesk.cli.link import EmbeddedLink, RemoteLink
    from pidesk.config import HostConfig

    config = HostConfig.from_environ(data_dir=data_dir, model=model)
    where = str(project.resolve()) if project else None

    async def go() -> None:
        remote = (url, token) if url and token else None
        found = running_host(config.data_dir) if remote is None else None
        if remote or found:
            target_url, target_token = remote or (found.url, found.token)  # type: ignore[union-attr]
            await run_chat(RemoteLink(target_url, target_token), where, session_id)
            return
        async with embedded(config) as host:
            await run_chat(EmbeddedLink(host), where, session_id)

    asyncio.run(go())
