"""A live connection for interactive clients: calls plus the event stream.

``RemoteLink`` speaks the WebSocket protocol to a running host; ``EmbeddedLink``
wraps an in-process Host. Both give ``call`` and ``events`` (``(seq, payload)``
with the wire's camelCase payloads), so ``pidesk chat`` is the same code either way.

A ``RemoteLink`` survives its host (issue 31 §2): when the connection drops, calls in flight
and made meanwhile fail with ``HostAway``, the event stream says ``{"type": "link.lost"}``,
and the link reconnects — to the same URL, or to whatever ``<data-dir>/host.json`` names
now (a restarted host may have a new port) — trying for ``RECONNECT_S``; then
``{"type": "link.restored"}`` (the client re-reads what it shows: events sent while it
was away are gone), or ``{"type": "link.failed", "reason"}`` and nothing more.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from pidesk.core.errors import Code, PideskError
from pidesk.core.events import event_payload


RECONNECT_S = 60.0  # how long a link tries to reach its host again before it gives up
RETRY_EVERY_S = 0.25


class HostAway(PideskError):
    """The host went away (stopped, restarted, killed): the link is reconnecting, or gave up."""

    def __init__(self, message: str = "the host went away; reconnecting") -> None:
        super().__init__(message, Code.INTERNAL)


class RemoteLink:
    def __init__(self, url: str, token: str, data_dir: Path | None = None) -> None:
        self.url = self._ws_url(url, token)
        self.data_dir = data_dir  # where a restarted host's host.json is (None: --url/--token, the same URL)
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[Any]] = {}
        self._events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._socket: Any = None
        self._reader: asyncio.Task[None] | None = None
        self._connected = asyncio.Event()

    @staticmethod
    def _ws_url(url: str, token: str) -> str:
        return url.replace("http://", "ws://", 1) + f"/rpc?token={token}"

    async def __aenter__(self) -> RemoteLink:
        await self._connect()
        self._reader = asyncio.create_task(self._read())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._reader is not None:
            self._reader.cancel()
        if self._socket is not None:
            await self._socket.close()

    async def _connect(self) -> None:
        from websockets.asyncio.client import connect

        self._socket = await connect(self.url, max_size=16 * 1024 * 1024)
        self._connected.set()

    async def _read(self) -> None:
        from websockets.exceptions import ConnectionClosed

        while True:
            try:
                async for raw in self._socket:
                    message = json.loads(raw)
                    if message.get("method") == "event":
                        self._events.put_nowait(message["params"])
                        continue
                    future = self._waiting.pop(message.get("id"), None)
                    if future is not None and not future.done():
                        future.set_result(message)
            except ConnectionClosed:
                pass
            if not await self._reconnect():
                return

    async def _reconnect(self) -> bool:
        """The connection ended: fail what waits on it, say so, and reach the host again (bounded)."""
        self._connected.clear()
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(HostAway())
        self._waiting.clear()
        self._events.put_nowait({"type": "link.lost"})
        deadline = time.monotonic() + RECONNECT_S
        while time.monotonic() < deadline:
            await asyncio.sleep(RETRY_EVERY_S)
            self._follow_host_json()
            try:
                await self._connect()
            except (OSError, Exception):  # refused, or the handshake failed: not up yet
                continue
            self._events.put_nowait({"type": "link.restored"})
            return True
        self._events.put_nowait({"type": "link.failed",
                                 "reason": f"the host did not come back within {RECONNECT_S:g} s"})
        return False

    def _follow_host_json(self) -> None:
        """A host restarted on the data dir may listen elsewhere, with another token: take what host.json says."""
        if self.data_dir is None:
            return
        try:
            info = json.loads((self.data_dir / "host.json").read_text())
            self.url = self._ws_url(str(info["url"]), str(info["token"]))
        except (OSError, ValueError, KeyError, TypeError):
            pass  # not written yet: keep trying the last URL

    async def call(self, method: str, params: dict[str, Any] | None = None) -> Any:
        if not self._connected.is_set():
            raise HostAway()
        request_id = next(self._ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiting[request_id] = future
        try:
            await self._socket.send(json.dumps({"jsonrpc": "2.0", "id": request_id, "method": method,
                                                "params": params or {}}))
        except Exception:  # the connection is closing: the reader's reconnect says so
            self._waiting.pop(request_id, None)
            raise HostAway() from None
        answer = await future
        if "error" in answer:
            code = (answer["error"].get("data") or {}).get("code", "INTERNAL")
            raise PideskError(answer["error"]["message"], Code(code) if code in Code.__members__ else Code.INTERNAL)
        return answer["result"]

    async def events(self) -> AsyncIterator[dict[str, Any]]:
        while True:
            yield await self._events.get()


class EmbeddedLink:
    def __init__(self, host: Any, client_id: str = "chat") -> None:
        self.host = host
        self.client_id = client_id
        self._sub = host.subscribe()

    async def __aenter__(self) -> EmbeddedLink:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._sub.close()
        self.host.client_closed(self.client_id)

    async def call(self, method: str, params: dict[str, Any] | None = None) -> Any:
        return await self.host.call(method, params or {}, client_id=self.client_id)

    async def events(self) -> AsyncIterator[dict[str, Any]]:
        while True:
            seq, event = await self._sub.next()
            yield event_payload(event, seq)
