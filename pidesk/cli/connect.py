"""How a command reaches a host: the running one (``host.json`` or ``--url/--token``), else one it
starts on demand, else (``PIDESK_EMBEDDED=1``) an embedded one that holds the data dir's lock for as
long as the command runs.

**A host on demand** (issue 31): a command that finds no host starts ``pidesk serve`` for the data
dir in the background — its own session, detached from the terminal, logging to
``<data-dir>/host.log`` (moved to ``host.log.1`` at a start once past 10 MiB), with the kept token and port and the flags the command was given
(``--model``, ``--max-retries``, ``--no-sandbox``, ``--context-limit``) — waits for it to answer
``/healthz`` (``START_TIMEOUT_S``), says so on one dim line of stderr, and talks to it like any
running host. So no command locks another out: the next one finds the same host. It stays while a
client is connected, a turn runs or a schedule is enabled, and exits once it has been idle for
``ON_DEMAND_IDLE_S`` (``pidesk stop`` stops it at once; ``pidesk status`` says since when it runs).
Two commands starting at once start two serves: one takes the data dir's lock, the other exits,
and both commands use the one that serves. ``PIDESK_EMBEDDED=1`` (the test suite's setting) keeps
the single-process mode.

Either way the command sees one ``Client``: ``await client.call(method, params)`` with
PROTOCOL.md names, raising ``PideskError`` with the wire's stable code.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import click

from pidesk.config import HostConfig
from pidesk.core.errors import Code, PideskError


class Client(Protocol):
    async def call(self, method: str, params: dict[str, Any] | None = None) -> Any: ...


@dataclass(frozen=True)
class Remote:
    url: str
    token: str
    pid: int | None = None  # from host.json; None for --url/--token

    async def call(self, method: str, params: dict[str, Any] | None = None) -> Any:
        import asyncio

        return await asyncio.to_thread(self._post, method, params or {})

    def _post(self, method: str, params: dict[str, Any]) -> Any:
        import urllib.error  # with http.client and ssl, 15 ms that `run` with an embedded host never needs
        import urllib.request

        body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).encode()
        request = urllib.request.Request(
            f"{self.url}/rpc", data=body, method="POST",
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                answer = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            raise PideskError(f"the host at {self.url} refused the request: HTTP {exc.code}") from None
        except OSError as exc:
            raise PideskError(f"cannot reach the host at {self.url}: {exc}") from None
        if "error" in answer:
            error = answer["error"]
            code = (error.get("data") or {}).get("code", Code.INTERNAL.value)
            raise PideskError(error.get("message", "error"), Code(code) if code in Code.__members__ else Code.INTERNAL)
        return answer["result"]


ON_DEMAND_IDLE_S = 600.0  # a host started on demand exits after this long with nothing to do
START_TIMEOUT_S = 30.0  # how long a command waits for the host it started to answer
HOST_LOG = "host.log"
HOST_LOG_MAX = 10 << 20  # bytes: past this, the next host started on demand moves the log to host.log.1


def host_log(data_dir: Path) -> Path:
    """The log a host started on demand writes to: ``host.log``, moved to ``host.log.1`` (replacing an
    older one) first once it is past ``HOST_LOG_MAX``, so the logs of hosts started on demand keep at
    most two files."""
    path = data_dir / HOST_LOG
    try:
        if path.stat().st_size > HOST_LOG_MAX:
            os.replace(path, path.with_name(HOST_LOG + ".1"))
    except FileNotFoundError:
        pass
    return path


def embedded_only() -> bool:
    """``PIDESK_EMBEDDED=1``: commands run a host in their own process (tests, CI, one-shot scripts)."""
    return os.environ.get("PIDESK_EMBEDDED", "").lower() in ("1", "true", "yes")


def start_host(config: HostConfig, *, model: str | None = None, max_retries: int | None = None,
               no_sandbox: bool = False, context_limit: int | None = None) -> Remote:
    """Start ``pidesk serve`` for ``config.data_dir`` in the background and wait until it answers (or
    until another command's serve does: the data dir has one host). Blocking: call it off the loop.
    A model it could not run (a key missing, a setting wrong) is refused here, as an embedded host
    refuses it, rather than in a log nobody reads."""
    from pidesk.cli.models import make_provider

    make_provider(model or config.model, config.secrets, settings=config.model_settings(model))  # (raises)
    config.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    argv = [sys.executable, "-m", "pidesk", "serve", "--data-dir", str(config.data_dir), "--no-open", "--log-safe",
            "--idle-exit", f"{ON_DEMAND_IDLE_S:g}"]
    argv += ["--model", model] if model else []
    argv += ["--max-retries", str(max_retries)] if max_retries is not None else []
    argv += ["--no-sandbox"] if no_sandbox else []
    argv += ["--context-limit", str(context_limit)] if context_limit is not None else []
    log_path = host_log(config.data_dir)
    said = log_path.stat().st_size if log_path.exists() else 0  # what earlier hosts logged: not ours to relay
    with open(log_path, "ab", opener=lambda path, flags: os.open(path, flags, 0o600)) as log:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
                                close_fds=True, cwd=config.data_dir)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        remote = running_host(config.data_dir)
        if remote is not None and _healthy(remote.url):
            mine = remote.pid == proc.pid
            click.secho(f"pidesk: {'started a host' if mine else 'another command started the host'} for "
                        f"{config.data_dir} at {remote.url} (it exits after {ON_DEMAND_IDLE_S / 60:g} min with "
                        "nothing to do; pidesk stop stops it)", err=True, dim=True)
            if mine:
                _relay(log_path, said)
                _plugins_settled(remote, deadline + PLUGINS_WAIT_S)
            return remote
        if proc.poll() is not None and time.monotonic() > deadline - START_TIMEOUT_S + 5:
            break  # ours gave up, and no other has served for 5 s: say why ours did
        time.sleep(0.05)
    raise PideskError(f"could not start a pidesk host for {config.data_dir}: {_log_tail(log_path)} "
                      f"(its log: {log_path})")


STOP_TIMEOUT_S = 30.0  # a host's clean exit: its turns aborted and recorded, its MCP servers stopped


def stop_host(data_dir: Path) -> Remote | None:
    """SIGTERM the host serving ``data_dir`` and wait (bounded) until its process is gone; None: none ran."""
    remote = running_host(data_dir)
    if remote is None or remote.pid is None:
        return None
    import signal

    os.kill(remote.pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            os.kill(remote.pid, 0)
        except ProcessLookupError:
            return remote
        if not (data_dir / "host.json").exists() and not _alive_child(remote.pid):
            return remote
        time.sleep(0.05)
    raise PideskError(f"the host at {remote.url} (pid {remote.pid}) did not stop within {STOP_TIMEOUT_S:g} s")


def _alive_child(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie our own child left counts as gone: reap it)."""
    try:
        done, _status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:  # not ours: it runs as long as it exists
        return True
    return done == 0


PLUGINS_WAIT_S = 30.0  # beyond the start: how long the first command waits for MCP servers to be ready


def _relay(log_path: Path, offset: int) -> None:
    """What the new host said at start beyond its URL (a config file's broken plugin table), on stderr:
    a command that starts a host must not hide what an embedded one would have shown."""
    try:
        with open(log_path, "rb") as log:
            log.seek(offset)
            text = log.read(64 * 1024).decode(errors="replace")
    except OSError:
        return
    for line in text.splitlines():
        if line.strip() and not line.startswith("pidesk serving at "):
            click.echo(line, err=True)


def _plugins_settled(remote: Remote, deadline: float) -> None:
    """Wait (bounded) until no MCP server of the new host is still starting: the command's first turn sees
    their tools, as an embedded host's first turn does."""
    while time.monotonic() < deadline:
        try:
            plugins = remote._post("plugins.list", {}).get("plugins", [])
        except PideskError:
            return
        if not any(p.get("state") == "starting" for p in plugins):
            return
        time.sleep(0.1)


def _healthy(url: str) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(f"{url}/healthz", timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def _log_tail(path: Path) -> str:
    try:
        lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        lines = []
    return lines[-1] if lines else "it exited without a word"


def host_info(data_dir: Path) -> dict[str, Any]:
    """What host.json says of the running host beyond how to reach it: since when it runs (``startedAt``)
    and, for one started on demand, after how many idle seconds it exits (``idleExit``)."""
    try:
        info = json.loads((data_dir / "host.json").read_text())
    except (OSError, ValueError):
        return {}
    return {k: info[k] for k in ("startedAt", "idleExit") if isinstance(info, dict) and info.get(k) is not None}


def running_host(data_dir: Path) -> Remote | None:
    """The host serving ``data_dir``, if its host.json names a live process."""
    try:
        info = json.loads((data_dir / "host.json").read_text())
        os.kill(int(info["pid"]), 0)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return Remote(str(info["url"]), str(info["token"]), int(info["pid"]))


def say_ignored(url: str, *, max_retries: int | None, no_sandbox: bool, context_limit: int | None = None) -> None:
    """On stderr: the flags a running host does not take from a client (it runs as it was started)."""
    if max_retries is not None:
        click.echo(f"pidesk: --max-retries {max_retries} does not apply: the running host at {url} "
                   "retries as it was started (pidesk serve --max-retries N)", err=True)
    if no_sandbox:
        click.echo(f"pidesk: --no-sandbox does not apply: the running host at {url} runs Bash as it was "
                   "started (pidesk serve --no-sandbox)", err=True)
    if context_limit is not None:
        click.secho(f"pidesk: --context-limit {context_limit} does not apply: the running host at {url} keeps the "
                    "window it was started with (pidesk serve --context-limit N)", err=True, dim=True)


async def insist_on_model(remote: Remote, model: str | None, data_dir: Path | None = None) -> None:
    """Refuse ``--model`` that a running host would ignore: it runs the model it was started with.

    Called before anything is created. A ``--model`` equal to the host's own model goes through;
    any other is ``MODEL_NOT_CONFIGURED`` naming the host's model and the ways out.
    """
    if model is None:
        return
    try:
        theirs: str | None = str((await remote.call("host.doctor"))["model"])
    except (PideskError, KeyError, TypeError):  # an older host: it cannot say which model it runs
        theirs = None
    if theirs == model:
        return
    served = f" serves {data_dir}" if data_dir is not None else ""
    who = f"the pidesk host at {remote.url}" + (f" (pid {remote.pid})" if remote.pid is not None else "")
    runs = f"runs {theirs}" if theirs else "runs the model it was started with"
    raise PideskError(
        f"{who}{served} and {runs}; it cannot run --model {model}. Drop --model to use "
        f"{theirs or 'its model'}, stop that host to run {model} in this data dir, or pass another "
        "--data-dir to run it in a host of its own", Code.MODEL_NOT_CONFIGURED)


class Embedded:
    def __init__(self, host: Any) -> None:
        self.host = host

    async def call(self, method: str, params: dict[str, Any] | None = None) -> Any:
        return await self.host.call(method, params or {}, client_id="cli")


@asynccontextmanager
async def connect(config: HostConfig, url: str | None = None, token: str | None = None,
                  model: str | None = None) -> AsyncIterator[Client]:
    """The running host, else one started on demand (``model``: the ``--model`` given), else embedded."""
    if url is not None:
        if token is None:
            raise PideskError("--url needs --token", Code.INVALID_PARAMS)
        yield Remote(url.rstrip("/"), token)
        return
    remote = running_host(config.data_dir)
    if remote is not None:
        yield remote
        return
    if not embedded_only():
        import asyncio

        yield await asyncio.to_thread(start_host, config, model=model)
        return
    async with embedded(config) as host:
        yield Embedded(host)


@asynccontextmanager
async def open_link(config: HostConfig, client: str, *, url: str | None = None, token: str | None = None,
                    model: str | None = None, max_retries: int | None = None, no_sandbox: bool = False,
                    context_limit: int | None = None) -> AsyncIterator[Any]:
    """The live link (``pidesk.cli.link``, not yet entered) of an interactive client — ``chat``, ``run``,
    ``acp``: to ``--url/--token`` or the running host, else to one started on demand, else to an
    embedded host that lives as long as the block. ``client`` names the client to an embedded host.
    The flags are the ones given: a running host keeps its own (said on stderr), ``--model`` it
    cannot run is refused before anything is created."""
    import asyncio

    from pidesk.cli.link import EmbeddedLink, RemoteLink

    target = Remote(url.rstrip("/"), token) if url and token else running_host(config.data_dir)
    follow = None if url and token else config.data_dir  # where a restarted host says where it is
    if target is not None:
        await insist_on_model(target, model, follow)
        say_ignored(target.url, max_retries=max_retries, no_sandbox=no_sandbox, context_limit=context_limit)
        yield RemoteLink(target.url, target.token, follow)
        return
    if not embedded_only():  # a host of its own, in the background: other commands reach it meanwhile
        started = await asyncio.to_thread(start_host, config, model=model, max_retries=max_retries,
                                          no_sandbox=no_sandbox, context_limit=context_limit)
        await insist_on_model(started, model, config.data_dir)  # (another command's host may have won)
        yield RemoteLink(started.url, started.token, config.data_dir)
        return
    async with embedded(config) as host:
        yield EmbeddedLink(host, client)


@asynccontextmanager
async def embedded(config: HostConfig, model: str | None = None) -> AsyncIterator[Any]:
    """An in-process Host holding the data dir's lock (a served data dir refuses it).

    It has the same MCP tool servers as a served host: its first turn starts them and waits (bounded)
    for them, and closing it stops them; a command that runs no turn spawns none."""
    from pidesk.cli.models import make_provider

    provider = make_provider(model or config.model, config.secrets, lean_http=config.lean_http,
                             settings=config.model_settings(model), retry=config.retry)
    _warm_up(provider)  # first: the host's own imports and opening then overlap it

    from pidesk.host import Host
    from pidesk.store.lock import DataDirLock
    from pidesk.tools.children import use_pidfd_watcher

    lock = DataDirLock(config.data_dir)
    use_pidfd_watcher()
    try:
        host = Host.open(config, provider)
        try:
            await host.start_plugins("first turn")
            yield host
        finally:
            await host.close()
    finally:
        lock.release()


def _warm_up(provider: object) -> None:
    """Start importing a vendor SDK (~0.5 s) now, in a thread, so it overlaps the host's imports,
    its opening and the prompt's durable writes instead of following them; with the collector off
    until it is done, then the start-up frozen.

    The SDK's import makes ~100k objects that live as long as the process. Collecting as they
    came took 45–55 ms of the first request's wait (some 180 young collections, 17 older and one
    full one, each walking more of them), and found next to nothing to free. The freeze (as ``serve``
    does once it is up) then moves every object alive to the collector's permanent generation.
    Without it a turn's second full collection, some 60 calls in, walked them all: a 60–70 ms
    stall of one tool call (docs/benchmarks.md, the peer benchmark). Unlike ``serve``'s it runs
    beside the first turn and collects nothing first (a collection would hold the GIL the first
    request waits on): what of that turn is alive then is frozen too and, should it become cyclic
    garbage, never freed — once per process, bounded by what a turn's start holds."""
    warm_up = getattr(provider, "warm_up", None)
    if callable(warm_up):
        def warm_up_and_freeze() -> None:
            try:
                warm_up()
            finally:
                gc.freeze()
                gc.enable()

        gc.disable()
        threading.Thread(target=warm_up_and_freeze, name="sdk-warm-up", daemon=True).start()
