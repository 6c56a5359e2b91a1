"""The Starlette app: /healthz, /rpc over HTTP POST and WebSocket, the static UI at /.

Each WebSocket connection is one client: it gets its own id (for
``session.focus`` visibility), every host event as an ``event`` notification in
``seq`` order, and its requests are served concurrently (a long ``agent.abort``
does not hold up a ``session.get``). Closing the connection drops its focus.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles
from starlette.websockets import WebSocket, WebSocketDisconnect

from pidesk.core.events import event_payload
from pidesk.host import Host
from pidesk.ids import new_id
from pidesk.server import rpc
from pidesk.server.door import Door

log = logging.getLogger("pidesk.server")
STATIC = Path(__file__).parent.parent / "ui" / "static"


def create_app(host: Host, token: str, port: Callable[[], int], extra_hosts: tuple[str, ...] = ()) -> Door:
    async def healthz(_request: Request) -> Response:
        return JSONResponse({"ok": True})

    async def rpc_http(request: Request) -> Response:
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > rpc.MAX_FRAME:
            return _json(rpc.too_large(), 413)
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > rpc.MAX_FRAME:
                return _json(rpc.too_large(), 413)
        client_id = f"http-{new_id('c')}"
        try:
            payload = await rpc.handle_frame(host, bytes(body), client_id=client_id)
        finally:
            host.client_closed(client_id)  # an HTTP request is a connection that ends with its answer
        if payload is None:
            return Response(status_code=204)
        return _json(payload, 200)

    async def rpc_ws(websocket: WebSocket) -> None:
        await websocket.accept()
        client_id = new_id("c")
        subscription = host.subscribe()
        send_lock = asyncio.Lock()
        requests: set[asyncio.Task[None]] = set()

        async def send(payload: Any) -> None:
            async with send_lock:
                with contextlib.suppress(WebSocketDisconnect, RuntimeError):  # the client went away
                    await websocket.send_text(rpc.encode(payload).decode())

        async def push_events() -> None:
            while True:
                seq, event = await subscription.next()
                await send({"jsonrpc": "2.0", "method": "event", "params": event_payload(event, seq)})

        async def serve(raw: str | bytes) -> None:
            payload = await rpc.handle_frame(host, raw, client_id)
            if payload is not None:
                await send(payload)

        pusher = asyncio.create_task(push_events())
        try:
            while True:
                message = await websocket.receive()
                if message["type"] == "websocket.disconnect":
                    break
                text = message.get("text")
                raw: str | bytes = text if text is not None else message.get("bytes") or b""
                task = asyncio.create_task(serve(raw))
                requests.add(task)
                task.add_done_callback(requests.discard)
        except WebSocketDisconnect:
            pass
        finally:
            # In-flight requests are left to finish (cancelling one midway could split a host
            # operation); their answers have nowhere to go and are dropped.
            pusher.cancel()
            await asyncio.gather(pusher, *requests, return_exceptions=True)
            subscription.close()
            host.client_closed(client_id)

    routes = [
        Route("/healthz", healthz, methods=["GET"]),
        Route("/rpc", rpc_http, methods=["POST"]),
        WebSocketRoute("/rpc", rpc_ws),
        Mount("/", StaticFiles(directory=STATIC, html=True), name="ui"),
    ]
    return Door(Starlette(routes=routes), token, port, extra_hosts)


def _json(payload: Any, status: int) -> Response:
    return Response(rpc.encode(payload), status_code=status, media_type="application/json")
