"""Running the host as a server: lock, recover, listen, announce, and shut down cleanly.

Order of start: take the data dir's lock (a second host refuses to start), open
the Host (startup recovery completes here, before the port opens), bind and
listen (with the door's limits: a request deadline, a cap on connections below
the open-files limit, raised first; ``protocol.py``), then write ``host.json``
(mode 0600) and announce the URL. The token is the one kept in the data dir (``store/serving.py``)
unless ``--token``/``--new-token`` replace it, and the port the last one unless ``--port`` names
one, so a page left open reconnects to the next host by itself. What start-up allocated is frozen out of the
garbage collector's way just before (and the vendor SDK once its background
import is done), so a full collection walks only what the turns allocate. On SIGTERM/SIGINT: stop accepting, abort running turns (recorded),
close the store, remove ``host.json``, release the lock, exit 0. MCP tool servers start in the
background once the host serves (``plugins.list`` shows each one's state); shutdown stops them in any state. On SIGUSR1: write
the stack of every task (each turn's first) to stderr, to see what a stuck turn waits on.
"""

from __future__ import annotations

import asyncio
import gc
import os
import resource
import signal
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import uvicorn

from pidesk import PROTOCOL_VERSION
from pidesk.config import HostConfig
from pidesk.core.errors import StartupRefused
from pidesk.core.events import TurnEnded
from pidesk.host import Host
from pidesk.ids import now_iso
from pidesk.providers.base import Provider
from pidesk.server.app import create_app
from pidesk.server.protocol import DoorLimits, ListeningSocket, protocols
from pidesk.server.rpc import MAX_FRAME
from pidesk.store import serving
from pidesk.store.lock import DataDirLock
from pidesk.tools.children import use_pidfd_watcher

LOOPBACK = {"127.0.0.1", "localhost", "::1"}
IDLE_CHECK_S = 5.0  # how often a host started on demand looks whether it has anything to do


@dataclass(frozen=True)
class ServeOptions:
    bind: str = "127.0.0.1"
    port: int = 0
    token: str | None = None
    new_token: bool = False  # replace the kept token with a fresh one
    allow_remote: bool = False
    limits: DoorLimits = DoorLimits()
    idle_exit: float | None = None  # exit once idle (``Host.idle``) this many seconds: a host started on demand


async def serve(config: HostConfig, provider: Provider, options: ServeOptions,
                announce: Callable[[str, str], None]) -> None:
    if options.bind not in LOOPBACK and not options.allow_remote:
        raise StartupRefused(f"refusing to listen on {options.bind}: pass --allow-remote to serve beyond loopback")
    lock = DataDirLock(config.data_dir)
    use_pidfd_watcher()
    try:
        host = Host.open(config, provider)
        try:
            await _listen(host, config, options, announce)
        finally:
            await host.close()
            aclose = getattr(provider, "aclose", None)  # the SDK client's connection pool
            if callable(aclose):
                await aclose()
    finally:
        lock.release()


async def _listen(host: Host, config: HostConfig, options: ServeOptions, announce: Callable[[str, str], None]) -> None:
    token = serving.token_for(config.data_dir, options.token, new=options.new_token)
    sock = _bind(options.bind, options.port or serving.last_port(config.data_dir), fallback=not options.port)
    port = sock.getsockname()[1]
    serving.keep_port(config.data_dir, port)
    extra = () if options.bind in LOOPBACK else (options.bind,)
    app = create_app(host, token, lambda: port, extra, options.limits)
    _raise_fd_limit()  # before ``protocols``: the connection cap is taken from the raised limit
    http, ws = protocols(options.limits)
    server = uvicorn.Server(uvicorn.Config(
        app, http=http, ws=ws, ws_max_size=MAX_FRAME, log_level="warning",
        ws_ping_interval=options.limits.ping_interval, ws_ping_timeout=options.limits.ping_timeout,
        lifespan="off", timeout_graceful_shutdown=5, access_log=False,
    ))
    config_ = server.config
    config_.load()
    server.lifespan = config_.lifespan_class(config_)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):  # our own handlers: uvicorn's re-raise the signal at exit
        loop.add_signal_handler(sig, _request_exit, server)
    loop.add_signal_handler(signal.SIGUSR1, dump_tasks)
    host_json = config.data_dir / serving.HOST_JSON
    try:
        await server.startup(sockets=[sock])
        if server.should_exit:
            return
        shown = "[::1]" if options.bind == "::1" else "127.0.0.1" if options.bind in LOOPBACK else options.bind
        url = f"http://{shown}:{port}"
        serving.write_host_json(config.data_dir, {"url": url, "port": port, "token": token, "pid": os.getpid(),
                                                  "protocolVersion": PROTOCOL_VERSION, "startedAt": now_iso(),
                                                  "idleExit": options.idle_exit})
        _freeze_start_up()
        announce(url, token)
        warming = _warm_up(host)
        if warming is not None:  # (the SDK imported: freeze it too)
            warming.add_done_callback(lambda done: None if done.cancelled()
                                      else _freeze_start_up(busy=bool(host.parts.live.turns)))
        host.start_scheduler()
        failures = asyncio.create_task(_log_failed_turns(host, sys.stderr), name="serve: failed turns")
        idler = (asyncio.create_task(_exit_when_idle(host, server, options.idle_exit), name="serve: idle exit")
                 if options.idle_exit is not None else None)
        await host.start_plugins("background")  # MCP servers start while the host serves; close() stops them
        await server.main_loop()
        if warming is not None:
            warming.cancel()
        failures.cancel()
        if idler is not None:
            idler.cancel()
    finally:
        host_json.unlink(missing_ok=True)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
            loop.remove_signal_handler(sig)
        if server.started:
            await server.shutdown(sockets=[sock])
        sock.close()


async def _log_failed_turns(host: Host, out: TextIO) -> None:
    """serve's log (stderr): a line for each turn that ends in error, with its errorMessage (the
    provider's words and the retries spent; keys already blanked out by the provider layer)."""
    sub = host.subscribe()
    try:
        async for _seq, event in sub:
            if isinstance(event, TurnEnded) and event.reason == "error":
                words = f": {event.error_message}" if event.error_message else ""
                out.write(f"pidesk: turn {event.turn_id} in session {event.session_id} failed: "
                          f"{event.error_code}{words}\n")
                out.flush()
    finally:
        sub.close()


def _bind(address: str, port: int | None, *, fallback: bool) -> ListeningSocket:
    """A socket bound to ``port``; with ``fallback`` (the port was only preferred: the last one),
    to any free port when that one is taken."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    for candidate in ([port, 0] if port and fallback else [port or 0]):
        # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on sockets it knows are TCP
        sock = ListeningSocket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((address, candidate))
            return sock
        except OSError as exc:
            sock.close()
            failure = exc
    raise StartupRefused(f"cannot listen on {address}:{port}: {failure.strerror or failure}") from None


def dump_tasks(out: TextIO | None = None) -> None:
    """Write what every task awaits right now (turns first) to ``out`` (stderr): each task's chain
    of awaiting coroutines, innermost last, then the object it waits on."""
    out = out or sys.stderr
    tasks = sorted(asyncio.all_tasks(), key=lambda t: (not t.get_name().startswith("turn "), t.get_name()))
    out.write(f"pidesk: {len(tasks)} tasks\n")
    for task in tasks:
        out.write(f"--- task {task.get_name()}\n")
        awaited: object = task.get_coro()
        for _ in range(100):  # bounded: a chain of awaits is never this deep
            frame = getattr(awaited, "cr_frame", None) or getattr(awaited, "ag_frame", None)
            if frame is None:
                break
            out.write(f"  {frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}\n")
            awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "ag_await", None)
        out.write(f"  waiting on {awaited!r:.300}\n")
    out.write("pidesk: end of tasks\n")
    out.flush()


def _freeze_start_up(busy: bool = False) -> None:
    """Move every object alive now (modules, the SDK, the store, recovery's work: ~90k) to the
    collector's permanent generation, so a full collection stops walking them: under the load
    soak its pauses went from 60–80 ms to 8–18 ms (docs/reliability.md, "Load"). A frozen object
    that later becomes cyclic garbage is never freed, so what is garbage now is collected first —
    unless a turn runs (``busy``): that collection would hold the loop ~30 ms, and what a turn's
    objects could leak, once, is small beside a 30 ms pause at every full collection after."""
    if not busy:
        gc.collect()
    gc.freeze()


def _warm_up(host: Host) -> asyncio.Future[None] | None:
    """Import a vendor SDK in the background once serving, so the first prompt does not pay for it."""
    warm_up = getattr(host.parts.provider, "warm_up", None)
    return asyncio.ensure_future(asyncio.to_thread(warm_up)) if callable(warm_up) else None


def _raise_fd_limit() -> None:
    """Every client is a descriptor: take the soft open-files limit up to the hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 65536)
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


async def _exit_when_idle(host: Host, server: uvicorn.Server, after: float) -> None:
    """A host started on demand: exit (as on SIGTERM) once it has had nothing to do for ``after`` seconds —
    no client connected, no turn running, no schedule to fire (``Host.idle``)."""
    loop = asyncio.get_running_loop()
    since: float | None = None
    while not server.should_exit:
        await asyncio.sleep(min(after, IDLE_CHECK_S))
        if not host.idle():
            since = None
            continue
        since = loop.time() if since is None else since
        if loop.time() - since >= after:
            sys.stderr.write(f"pidesk: nothing to do for {after:g} s: the host started on demand exits\n")
            sys.stderr.flush()
            server.should_exit = True


def _request_exit(server: uvicorn.Server) -> None:
    server.should_exit = True
