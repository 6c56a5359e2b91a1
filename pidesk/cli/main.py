"""``pidesk`` commands. Heavy imports happen inside the commands, so ``--help`` stays fast."""

from __future__ import annotations

import sys
from pathlib import Path

import click


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
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
    from pidesk.core.errors import PideskError

    config = HostConfig.from_environ(data_dir=data_dir, model=model)
    try:
        code = asyncio.run(run_unattended(config, project.resolve(), prompt, mode, permission_mode, as_json))
    except PideskError as exc:
        click.echo(f"pidesk: {exc.code}: {exc.message}", err=True)
        sys.exit(2)
    sys.exit(code)


@main.command()
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=None)
def status(data_dir: Path | None) -> None:
    """Open the data directory (recovering it if needed) and summarise what it holds."""
    import asyncio

    from pidesk.cli.run import show_status
    from pidesk.config import HostConfig

    asyncio.run(show_status(HostConfig.from_environ(data_dir=data_dir)))
