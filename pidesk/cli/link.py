"""A live connection for interactive clients: calls plus the event stream.

``RemoteLink`` speaks the WebSocket protocol to a running host; ``EmbeddedLink``
wraps an in-process Host. Both give ``call`` and ``events`` (``(seq, payload)``
with the wire's camelCase payloads), so ``pidesk chat`` is the same code either way.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import AsyncIterator
from typing import Any

from pidesk.core.errors import Code, PideskError
from pidesk.core.events import event_payload


class RemoteLink:
    def __init__(self, url: str, token: str) -> None:
        self.url = url.replace("http://", "ws://", 1) + f"/rpc?token={token}"
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[Any]] = {}
        self._events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._socket: Any = None
        self._reader: asyncio.Task[None] | None = None

    async def __aenter__(self) -> RemoteLink:
        from websockets.asyncio.client import connect

        self._socket = await connect(self.url, max_size=16 * 1024 * 1024)
        self._reader = asyncio.create_task(self._read())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._reader is not None:
            self._reader.cancel()
        await self._socket.close()

    async def _read(self) -> None:
        async for raw in self._socket:
            message = json.loads(raw)
            if message.get("method") == "event":
                self._events.put_nowait(message["params"])
                continue
            future = self._waiting.pop(message.get("id"), None)
            if future is not None and not future.done():
                future.set_result(message)

    async def call(self, method: str, params: dict[str, Any] | None = None) -> Any:
        request_id = next(self._ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiting[request_id] = future
        await self._socket.send(json.dumps({"jsonrpc": "2.0", "id": request_id, "method": method,
                                            "params": params or {}}))
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
