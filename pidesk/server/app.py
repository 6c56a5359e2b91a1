"""The Starlette app: /healthz, /rpc over HTTP POST and WebSocket, the static UI at /.

Each WebSocket connection is one client: it gets its own id (for
``session.focus`` visibility), every host event as an ``event`` notification in
``seq`` order, and its requests are served concurrently (a long ``agent.abort``
does not hold up a ``session.get``). Closing the connection drops its focus.

A WebSocket client costs the host bounded memory however it behaves: it is sent
at most a window of events it has not confirmed reading (``protocol.Window``: a
pong to a ping placed after them), so the events a client has not read wait in
its bus subscription, which counts the unconfirmed ones too and is bounded
(``DoorLimits.max_behind_events``/``max_behind_bytes``: PROTOCOL.md "Limits");
past that the client is dropped and closed with 1013 at once (the close frame
queued behind what it has not read), to reconnect and re-read state. A client
reading slowly is neither closed earlier (the keepalive waits for it: protocol.py)
nor later (its own kernel's buffers do not hide events from the count).
At most ``MAX_IN_FLIGHT`` of a connection's requests run at once; the next frame
is read when one finishes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles
from starlette.websockets import WebSocket, WebSocketDisconnect

from pidesk.host import Host
from pidesk.host.bus import FellBehind
from pidesk.ids import new_id
from pidesk.server import rpc
from pidesk.server.door import Door
from pidesk.server.protocol import CLOSE_NOW, SEND_UTF8, WINDOW, DoorLimits, Window

log = logging.getLogger("pidesk.server")
STATIC = Path(__file__).parent.parent / "ui" / "static"
FELL_BEHIND = 1013  # "try again later": reconnect and re-read the state
MAX_IN_FLIGHT = 64
LARGE_FRAME = 1 << 20  # a frame this big is sent in fragments, the event loop free between them


def create_app(host: Host, token: str, port: Callable[[], int], extra_hosts: tuple[str, ...] = (),
               limits: DoorLimits = DoorLimits()) -> Door:
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
        host.client_opened(client_id)
        subscription = host.subscribe().bound(limits.max_behind_events, limits.max_behind_bytes)
        send_lock = asyncio.Lock()
        requests: set[asyncio.Task[None]] = set()
        slots = asyncio.Semaphore(MAX_IN_FLIGHT)
        close_now: Callable[[int, str], None] | None = websocket.scope.get("extensions", {}).get(CLOSE_NOW)
        send_utf8: Callable[[bytes], Awaitable[None]] | None = websocket.scope.get("extensions", {}).get(SEND_UTF8)
        window: Window | None = websocket.scope.get("extensions", {}).get(WINDOW)
        subscription.downstream = window

        async def send(payload: Any) -> None:
            await send_frame(rpc.encode(payload))

        async def send_frame(frame: bytes, *, event: bool = False) -> None:
            async with send_lock:
                with contextlib.suppress(WebSocketDisconnect, RuntimeError, OSError):  # the client went away
                    if send_utf8 is not None and len(frame) > LARGE_FRAME:
                        await send_utf8(frame)  # in fragments, the event loop free between them
                    else:
                        await websocket.send_text(frame.decode())
                    if window is not None:
                        window.sent(len(frame), event=event)

        async def push_events() -> None:
            with contextlib.suppress(FellBehind):
                while True:
                    if window is not None:
                        await window.room()  # the rest waits in the subscription, counted as behind
                    seq, encoded = await subscription.next_encoded()
                    if len(encoded) > LARGE_FRAME:
                        await asyncio.sleep(0)  # its encoding held the loop: others go before its framing
                    await send_frame(rpc.event_frame(seq, encoded), event=True)

        def fell_behind() -> None:
            pusher.cancel()  # it may be waiting for the socket to drain, which a stalled reader never lets happen
            reason = "fell too far behind the host's events: reconnect and re-read the state"
            if close_now is not None:
                close_now(FELL_BEHIND, reason)
            else:
                requests.add(asyncio.ensure_future(websocket.close(FELL_BEHIND, reason)))

        async def serve(raw: str | bytes) -> None:
            try:
                payload = await rpc.handle_frame(host, raw, client_id)
                if payload is not None:
                    await send(payload)
            finally:
                slots.release()

        def dropped() -> None:  # called inside the bus's publish: act once it has returned
            asyncio.get_running_loop().call_soon(fell_behind)

        pusher = asyncio.create_task(push_events())
        subscription.on_drop = dropped
        try:
            while True:
                await slots.acquire()
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
