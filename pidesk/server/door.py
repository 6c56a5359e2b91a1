"""Security at the door, before any route or method runs (PROTOCOL.md "Door order").

1. ``Host`` must be ``127.0.0.1:PORT``, ``localhost:PORT`` or ``[::1]:PORT`` (DNS
   rebinding) — else 403. With ``--allow-remote`` the bound address is accepted too.
2. ``Origin``, when present, must be one of the host's own origins — else 403
   (``Origin: null`` included: sandboxed pages and files are foreign).
3. The token, from ``Authorization: Bearer`` (HTTP and WebSocket) or ``?token=``
   (WebSocket only), compared in constant time — else 401, and a WebSocket is
   refused before the upgrade. ``/healthz`` and the static UI need no token.

No cookie is ever read. The token is never logged.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs

Scope = dict[str, Any]
ASGIApp = Callable[..., Any]

TOKEN_PATHS = frozenset({"/rpc"})


class Door:
    def __init__(self, app: ASGIApp, token: str, port: Callable[[], int], extra_hosts: tuple[str, ...] = ()) -> None:
        self.app = app
        self.token = token.encode()
        self.port = port
        self.extra_hosts = extra_hosts

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        verdict = self.check(scope, headers)
        if verdict is None:
            await self.app(scope, receive, send)
            return
        status, message = verdict
        if scope["type"] == "websocket":
            await send({"type": "websocket.http.response.start", "status": status,
                        "headers": [(b"content-type", b"text/plain")]})
            await send({"type": "websocket.http.response.body", "body": message.encode()})
            return
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"text/plain"), (b"content-length", str(len(message)).encode())]})
        await send({"type": "http.response.body", "body": message.encode()})

    def check(self, scope: Scope, headers: dict[str, str]) -> tuple[int, str] | None:
        port = self.port()
        own_hosts = {f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}",
                     *(f"{h}:{port}" for h in self.extra_hosts)}
        if headers.get("host", "").lower() not in own_hosts:
            return 403, "forbidden: unexpected Host header"
        origin = headers.get("origin")
        if origin is not None and origin.lower() not in {f"http://{h}" for h in own_hosts}:
            return 403, "forbidden: cross-origin request"
        path = scope.get("path", "")
        if path not in TOKEN_PATHS:  # exactly: a static file named rpc*.js is not the endpoint
            return None
        if not self._token_ok(scope, headers):
            return 401, "unauthorized: a valid token is required"
        return None

    def _token_ok(self, scope: Scope, headers: dict[str, str]) -> bool:
        presented = ""
        auth = headers.get("authorization", "")
        if auth.startswith("Bearer "):
            presented = auth[len("Bearer "):]
        elif scope["type"] == "websocket":
            values = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("token", [])
            presented = values[0] if len(values) == 1 else ""
        return hmac.compare_digest(presented.encode(), self.token)
