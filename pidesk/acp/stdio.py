"""ACP over the process's standard input and output, with both kept for the protocol alone.

Standard output carries the editor's JSON-RPC: a stray ``print``, a library's warning or a child
process writing to it would corrupt the stream. So the protocol takes private copies of fds 0
and 1 before anything else runs; fd 1 then points at standard error and fd 0 at /dev/null, so
whatever else writes (or reads) there goes harmlessly aside.

A line that is not JSON gets the JSON-RPC parse error (-32700), and a JSON value that is not a
request object gets "invalid request" (-32600), both with id null; then the next line is read.
(The ACP package itself logs such lines and answers nothing: a client waiting on an answer would
wait forever.)
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

LINE_LIMIT = 64 * 1024 * 1024  # one message's bytes (an image in a prompt is base64 inside one line)


def take_stdio() -> tuple[int, int]:
    """Private copies of fds 0 and 1 for the protocol; fd 0 becomes /dev/null and fd 1 standard error."""
    proto_in, proto_out = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return proto_in, proto_out


async def serve(agent: Any, proto_in: int, proto_out: int) -> None:
    """Serve ``agent`` (a ``pidesk.acp.agent.PideskAgent``) until the editor closes its end."""
    from acp.agent.connection import AgentSideConnection

    loop = asyncio.get_running_loop()
    raw = asyncio.StreamReader(limit=LINE_LIMIT)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(raw), os.fdopen(proto_in, "rb", 0))
    writer = await _writer(loop, proto_out)
    checked = asyncio.StreamReader(limit=LINE_LIMIT)  # what the ACP package reads: well-formed lines only
    connection = AgentSideConnection(agent, writer, checked, listening=False)
    listening = asyncio.create_task(connection.listen(), name="acp connection")
    try:
        await _check_lines(raw, checked, writer)
        await listening
    finally:
        listening.cancel()
        await agent.close()


async def _check_lines(raw: asyncio.StreamReader, checked: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Pass each well-formed message on; answer the others' errors here. Ends at end of input."""
    while True:
        try:
            line = await raw.readuntil(b"\n")
        except asyncio.IncompleteReadError as exc:
            line = exc.partial
        except asyncio.LimitOverrunError as exc:  # a line over the limit: drop it whole, say so
            await _drop_long_line(raw, exc.consumed)
            _answer_error(writer, -32600, f"a message over {LINE_LIMIT:,} bytes")
            continue
        if not line:
            checked.feed_eof()
            return
        if not line.strip():
            continue
        try:
            message = json.loads(line)
        except ValueError:
            _answer_error(writer, -32700, "Parse error: the line is not JSON")
            continue
        if not isinstance(message, dict) or not (isinstance(message.get("method"), str) or "id" in message):
            _answer_error(writer, -32600, "Invalid request: a JSON-RPC message is an object with a method or an id")
            continue
        checked.feed_data(line if line.endswith(b"\n") else line + b"\n")


async def _drop_long_line(raw: asyncio.StreamReader, consumed: int) -> None:
    await raw.readexactly(consumed)
    while True:  # bounded by the input: each round consumes what it finds
        try:
            await raw.readuntil(b"\n")
            return
        except asyncio.LimitOverrunError as exc:
            await raw.readexactly(exc.consumed)
        except asyncio.IncompleteReadError:
            return


def _answer_error(writer: asyncio.StreamWriter, code: int, message: str) -> None:
    writer.write(json.dumps({"jsonrpc": "2.0", "id": None, "error": {"code": code, "message": message}}).encode()
                 + b"\n")


async def _writer(loop: asyncio.AbstractEventLoop, fd: int) -> asyncio.StreamWriter:
    from acp.stdio import _WritePipeProtocol  # the package's own write protocol: it provides drain

    protocol = _WritePipeProtocol()
    transport, _ = await loop.connect_write_pipe(lambda: protocol, os.fdopen(fd, "wb", 0))
    return asyncio.StreamWriter(transport, protocol, None, loop)
