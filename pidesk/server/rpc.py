"""JSON-RPC 2.0 framing over the Host's method table — no decisions here.

A frame is one request object or a batch (a non-empty array). Every failure is
a JSON-RPC error object, never an exception out of this module:

    -32700 parse error           the bytes are not JSON
    -32600 invalid request        not a request object (data.code LIMIT_EXCEEDED for oversize)
    -32601 method not found       data.code METHOD_NOT_FOUND
    -32602 invalid params         data.code INVALID_PARAMS
    -32000 everything else        data.code: the PideskError's stable code

Requests without an ``id`` are notifications and get no response.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import msgspec

from pidesk.core.errors import Code, PideskError
from pidesk.host import Host

log = logging.getLogger("pidesk.rpc")

PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS, SERVER_ERROR = -32700, -32600, -32601, -32602, -32000
MAX_FRAME = 16 * 1024 * 1024
MAX_BATCH = 1000
MAX_BATCH_REPLY = 16 * 1024 * 1024  # bytes of answers a batch may build (as a request frame may carry); the rest is not run
BATCH_SLICE_S = 0.05  # a batch runs at most this long on the loop before others get a turn

_decoder = msgspec.json.Decoder()
_encoder = msgspec.json.Encoder()


def error(request_id: Any, code: int, message: str, data_code: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"code": code, "message": message}
    if data_code is not None:
        body["data"] = {"code": data_code}
    return {"jsonrpc": "2.0", "id": request_id, "error": body}


def encode(payload: Any) -> bytes:
    return _encoder.encode(payload)


def event_frame(seq: int, event: bytes) -> bytes:
    """The ``event`` notification for an event's JSON (``{"type": …}``, encoded once by the bus), with
    ``seq`` spliced in as the first field of its ``params``: no decode and re-encode per client."""
    head = b'{"jsonrpc":"2.0","method":"event","params":{"seq":%d' % seq
    rest = memoryview(event)[1:]
    return b"".join((head, b"," if len(rest) > 1 else b"", rest, b"}"))


def too_large() -> dict[str, Any]:
    return error(None, INVALID_REQUEST, f"request larger than {MAX_FRAME} bytes", Code.LIMIT_EXCEEDED.value)


async def handle_frame(host: Host, raw: bytes | str, client_id: str) -> Any:
    """One frame in, the response payload out (None when nothing is to be sent)."""
    if len(raw) > MAX_FRAME:
        return too_large()
    try:
        message = _decoder.decode(raw)
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        return error(None, PARSE_ERROR, f"parse error: {exc}")
    except RecursionError:
        return error(None, PARSE_ERROR, "parse error: nested too deeply")
    if isinstance(message, list):
        if not message:
            return error(None, INVALID_REQUEST, "an empty batch is not a request")
        if len(message) > MAX_BATCH:
            return error(None, INVALID_REQUEST, f"a batch holds at most {MAX_BATCH} requests",
                         Code.LIMIT_EXCEEDED.value)
        return await _handle_batch(host, message, client_id)
    return await handle_request(host, message, client_id)


async def _handle_batch(host: Host, batch: list[Any], client_id: str) -> list[msgspec.Raw] | None:
    """The batch's answers, each encoded as it comes, the loop given a turn after a costly request (a fifth of
    ``BATCH_SLICE_S``) and at least every ``BATCH_SLICE_S``; once they pass
    ``MAX_BATCH_REPLY`` bytes the rest are answered LIMIT_EXCEEDED without running (issue 29: a 5.6 KB
    batch of 100 ``session.list`` over 10,000 sessions built a 405 MB reply and held the loop 17 s)."""
    answered: list[msgspec.Raw] = []
    size = 0
    loop = asyncio.get_running_loop()
    slice_began = loop.time()
    for item in batch:
        if size > MAX_BATCH_REPLY:
            request_id = item.get("id") if isinstance(item, dict) and _valid_id(item.get("id")) else None
            if isinstance(item, dict) and "id" not in item:
                continue  # (a notification: no answer either way)
            response: dict[str, Any] | None = error(
                request_id, SERVER_ERROR, f"not run: this batch's answers passed {MAX_BATCH_REPLY // (1 << 20)} MiB",
                Code.LIMIT_EXCEEDED.value)
        else:
            began = loop.time()
            response = await handle_request(host, item, client_id)
            now = loop.time()
            if now - began > BATCH_SLICE_S / 5 or now - slice_began > BATCH_SLICE_S:  # (a cheap batch runs
                await asyncio.sleep(0)                                  # through: its answer comes before
                slice_began = loop.time()                               # those of frames sent after it)
        if response is not None:
            encoded = encode(response)
            size += len(encoded)
            answered.append(msgspec.Raw(encoded))
    return answered or None


def _valid_id(value: Any) -> bool:
    return value is None or (isinstance(value, str) and len(value) <= 256) or (
        isinstance(value, int) and not isinstance(value, bool) and abs(value) < 2**53)


async def handle_request(host: Host, message: Any, client_id: str) -> dict[str, Any] | None:
    if not isinstance(message, dict):
        return error(None, INVALID_REQUEST, "a request is a JSON object")
    request_id = message.get("id")
    if message.get("jsonrpc") != "2.0" or not isinstance(message.get("method"), str) or not _valid_id(request_id):
        return error(request_id if _valid_id(request_id) else None, INVALID_REQUEST,
                     'a request needs "jsonrpc": "2.0", a string "method" and a string or integer "id"')
    is_notification = "id" not in message
    try:
        result = await host.call(message["method"], message.get("params"), client_id=client_id)
    except PideskError as exc:
        if is_notification:
            return None
        if exc.code is Code.METHOD_NOT_FOUND:
            return error(request_id, METHOD_NOT_FOUND, exc.message, exc.code.value)
        if exc.code is Code.INVALID_PARAMS:
            return error(request_id, INVALID_PARAMS, exc.message, exc.code.value)
        return error(request_id, SERVER_ERROR, exc.message, exc.code.value)
    except Exception:
        log.exception("%s failed inside the host", message["method"])
        return None if is_notification else error(request_id, SERVER_ERROR, "internal error", Code.INTERNAL.value)
    if is_notification:
        return None
    return {"jsonrpc": "2.0", "id": request_id, "result": result}
