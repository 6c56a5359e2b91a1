"""A real HTTP/1.1 server in the test process that speaks the vendors' streaming wire formats.

The official SDK clients talk to it through ``base_url``; nothing of theirs is
patched. Each test scripts the answers, in order, one per request::

    vendor.script(Reply(429, {...}, {"retry-after": "3"}), Sse(openai_text("Hi")))

and reads back what was asked in ``vendor.requests`` (method, path, lower-cased
headers, JSON body). An ``Sse`` answer is written as a chunked body, one chunk
per frame; ``cut=True`` closes the connection before the terminating chunk (a
stream that breaks off), ``hold=True`` keeps it open after the frames until the
client goes away (``vendor.holding`` / ``vendor.client_gone`` tell a test when).
Every response says ``Connection: close``: one request per connection.
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import aclosing, suppress
from dataclasses import dataclass, field
from http import HTTPStatus
from itertools import count
from types import TracebackType
from typing import Any

from pidesk.core.records import Block, Message
from pidesk.providers.base import ModelRequest, Retrying, StreamEvent

# ---- the server -------------------------------------------------------------------


@dataclass(frozen=True)
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: Any


@dataclass(frozen=True)
class Reply:
    """A plain (error) answer with a JSON body."""

    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Raw:
    """An answer with any body: an HTML error page, plain text, JSON where a stream was asked for."""

    status: int
    body: bytes
    content_type: str = "text/html"


@dataclass(frozen=True)
class Sse:
    frames: list[bytes]
    cut: bool = False
    hold: bool = False
    forever: bytes = b""  # a fault: after the frames, this one again and again until the client goes away


@dataclass(frozen=True)
class Silence:
    """A fault: the request is read and never answered, not one byte, until the client goes away."""


@dataclass(frozen=True)
class Echo:
    """A fault: an error answer built from the request (e.g. one that echoes its Authorization header)."""

    build: Callable[[Received], Reply]


Answer = Reply | Raw | Sse | Silence | Echo


class MockVendor:
    def __init__(self, keep_alive: bool = False) -> None:
        self.keep_alive = keep_alive  # answer many requests on one connection (else close after each)
        self.connections = 0
        self.requests: list[Received] = []
        self.holding = asyncio.Event()
        self.client_gone = asyncio.Event()
        self._answers: deque[Answer] = deque()
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()
        self.url = ""

    def script(self, *answers: Answer) -> None:
        self._answers.extend(answers)

    async def __aenter__(self) -> MockVendor:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._handlers):
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        self.connections += 1
        try:
            while await self._answer_one(reader, writer) and self.keep_alive:
                pass
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()
            with suppress(ConnectionError):
                await writer.wait_closed()
            self._handlers.discard(task)

    async def _answer_one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Read one request and answer it; False if the answer ended the connection."""
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        method, path, _ = head[0].split(" ", 2)
        headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in head[1:] if line)}
        raw = await reader.readexactly(int(headers.get("content-length", "0")))
        self.requests.append(Received(method, path, headers, json.loads(raw) if raw else None))
        answer = self._answers.popleft() if self._answers else Reply(
            400, {"error": {"type": "invalid_request_error", "message": "mock: no answer scripted"}}
        )
        if isinstance(answer, Echo):
            answer = answer.build(self.requests[-1])
        if isinstance(answer, Silence):
            return await self._silence(reader)
        if isinstance(answer, Reply):
            await self._reply(writer, answer)
            return True
        if isinstance(answer, Raw):
            headers = {"content-type": answer.content_type, "content-length": str(len(answer.body))}
            writer.write(_status_line(answer.status) + self._headers(headers) + answer.body)
            await writer.drain()
            return True
        return await self._stream(reader, writer, answer)

    async def _reply(self, writer: asyncio.StreamWriter, answer: Reply) -> None:
        body = json.dumps(answer.body).encode()
        headers = {"content-type": "application/json", "content-length": str(len(body)), **answer.headers}
        writer.write(_status_line(answer.status) + self._headers(headers) + body)
        await writer.drain()

    def _headers(self, headers: dict[str, str]) -> bytes:
        connection = {} if self.keep_alive else {"connection": "close"}
        return "".join(f"{k}: {v}\r\n" for k, v in {**headers, **connection}.items()).encode() + b"\r\n"

    async def _stream(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, answer: Sse) -> bool:
        writer.write(_status_line(200) + self._headers(
            {"content-type": "text/event-stream", "transfer-encoding": "chunked", "cache-control": "no-cache"}
        ))
        for frame in answer.frames:
            writer.write(b"%x\r\n%s\r\n" % (len(frame), frame))
            await writer.drain()
        if answer.forever:
            with suppress(ConnectionError):
                while True:
                    writer.write(b"%x\r\n%s\r\n" % (len(answer.forever), answer.forever))
                    await writer.drain()
            self.client_gone.set()
            return False
        if answer.cut:
            return False  # the connection closes with the body unfinished
        if answer.hold:
            self.holding.set()
            with suppress(ConnectionError):
                while await reader.read(4096):
                    pass
            self.client_gone.set()
            return False
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True


    async def _silence(self, reader: asyncio.StreamReader) -> bool:
        self.holding.set()
        with suppress(ConnectionError):
            while await reader.read(4096):
                pass
        self.client_gone.set()
        return False


def _status_line(status: int) -> bytes:
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = "Overloaded" if status == 529 else "Error"
    return f"HTTP/1.1 {status} {phrase}\r\n".encode()


async def closed_port_url() -> str:
    """A base URL nothing listens on (connections are refused)."""
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    return f"http://127.0.0.1:{port}"


# ---- OpenAI Chat Completions wire format ------------------------------------------

OPENAI_DONE = b"data: [DONE]\n\n"


def openai_chunk(
    *, content: str | None = None, tool_calls: list[dict[str, Any]] | None = None, role: str | None = None,
    finish_reason: str | None = None, usage: dict[str, Any] | None = None, no_choices: bool = False,
    reasoning_content: str | None = None, reasoning: str | None = None,
) -> bytes:
    delta: dict[str, Any] = {}
    if role is not None:
        delta["role"] = role
    if reasoning_content is not None:  # DeepSeek, vLLM, llama.cpp
        delta["reasoning_content"] = reasoning_content
    if reasoning is not None:  # OpenRouter, Ollama
        delta["reasoning"] = reasoning
    if content is not None:
        delta["content"] = content
    if tool_calls is not None:
        delta["tool_calls"] = tool_calls
    chunk = {
        "id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1700000000, "model": "gpt-test",
        "choices": [] if no_choices else [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
        "usage": usage,
    }
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


def openai_usage(prompt: int, completion: int, cached: int | None = None) -> bytes:
    usage: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": completion,
                             "total_tokens": prompt + completion}
    if cached is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    return openai_chunk(usage=usage, no_choices=True)


def openai_call_delta(index: int, *, id: str | None = None, name: str | None = None,
                      arguments: str | None = None) -> dict[str, Any]:
    part: dict[str, Any] = {"index": index, "function": {}}
    if id is not None:
        part["id"], part["type"] = id, "function"
    if name is not None:
        part["function"]["name"] = name
    if arguments is not None:
        part["function"]["arguments"] = arguments
    return part


def openai_text(*pieces: str, usage: tuple[int, int] = (10, 2)) -> list[bytes]:
    """A complete text answer, streamed in ``pieces``."""
    return [
        openai_chunk(role="assistant", content=""),
        *(openai_chunk(content=p) for p in pieces),
        openai_chunk(finish_reason="stop"),
        openai_usage(*usage),
        OPENAI_DONE,
    ]


def openai_error(status: int, message: str, code: str | None = None) -> Reply:
    return Reply(status, {"error": {"message": message, "type": "invalid_request_error", "param": None,
                                    "code": code}})


# ---- Anthropic Messages wire format -----------------------------------------------


def anthropic_event(kind: str, **payload: Any) -> bytes:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **payload})}\n\n".encode()


def anthropic_start(input_tokens: int = 10, *, cache_read: int = 0, cache_creation: int = 0) -> bytes:
    return anthropic_event("message_start", message={
        "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-test", "content": [],
        "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": input_tokens, "output_tokens": 1, "cache_read_input_tokens": cache_read,
                  "cache_creation_input_tokens": cache_creation},
    })


def anthropic_text_block(index: int, *pieces: str) -> list[bytes]:
    return [
        anthropic_event("content_block_start", index=index, content_block={"type": "text", "text": ""}),
        *(anthropic_event("content_block_delta", index=index, delta={"type": "text_delta", "text": p})
          for p in pieces),
        anthropic_event("content_block_stop", index=index),
    ]


def anthropic_tool_start(index: int, id: str, name: str) -> bytes:
    return anthropic_event("content_block_start", index=index,
                           content_block={"type": "tool_use", "id": id, "name": name, "input": {}})


def anthropic_json(index: int, piece: str) -> bytes:
    return anthropic_event("content_block_delta", index=index,
                           delta={"type": "input_json_delta", "partial_json": piece})


def anthropic_end(stop_reason: str = "end_turn", output_tokens: int = 5) -> list[bytes]:
    return [
        anthropic_event("message_delta", delta={"stop_reason": stop_reason, "stop_sequence": None},
                        usage={"output_tokens": output_tokens}),
        anthropic_event("message_stop"),
    ]


def anthropic_text(*pieces: str) -> list[bytes]:
    """A complete text answer, streamed in ``pieces``."""
    return [anthropic_start(), *anthropic_text_block(0, *pieces), *anthropic_end()]


def anthropic_thinking_block(index: int, *pieces: str, signature: str) -> list[bytes]:
    """An extended-thinking block: its text in pieces, then its signature (as the API sends them)."""
    return [
        anthropic_event("content_block_start", index=index,
                        content_block={"type": "thinking", "thinking": "", "signature": ""}),
        *(anthropic_event("content_block_delta", index=index, delta={"type": "thinking_delta", "thinking": p})
          for p in pieces),
        anthropic_event("content_block_delta", index=index, delta={"type": "signature_delta", "signature": signature}),
        anthropic_event("content_block_stop", index=index),
    ]


def anthropic_redacted_block(index: int, data: str) -> list[bytes]:
    """A redacted_thinking block: encrypted, whole in its start event."""
    return [
        anthropic_event("content_block_start", index=index, content_block={"type": "redacted_thinking", "data": data}),
        anthropic_event("content_block_stop", index=index),
    ]


def anthropic_tool_use(index: int, id: str, name: str, args: dict[str, Any]) -> list[bytes]:
    return [anthropic_tool_start(index, id, name), anthropic_json(index, json.dumps(args)),
            anthropic_event("content_block_stop", index=index)]


def anthropic_error(status: int, kind: str, message: str, headers: dict[str, str] | None = None) -> Reply:
    return Reply(status, {"type": "error", "error": {"type": kind, "message": message}}, headers or {})


# ---- OpenAI Responses wire format -------------------------------------------------

_sequence = count()


def responses_event(kind: str, **payload: Any) -> bytes:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, 'sequence_number': next(_sequence), **payload})}\n\n".encode()


def _response(status: str, usage: dict[str, Any] | None = None, **more: Any) -> dict[str, Any]:
    return {"id": "resp_1", "object": "response", "created_at": 1700000000, "model": "gpt-test", "status": status,
            "output": [], "usage": usage, **more}


def responses_created() -> bytes:
    return responses_event("response.created", response=_response("in_progress"))


def responses_reasoning(index: int, id: str, *summary: str, encrypted: str | None = None) -> list[bytes]:
    """A reasoning item: its summary streamed, then the whole item (with ``encrypted_content``)."""
    item = {"type": "reasoning", "id": id, "summary": [], "status": "in_progress"}
    done = {"type": "reasoning", "id": id, "summary": [{"type": "summary_text", "text": "".join(summary)}],
            "encrypted_content": encrypted, "status": "completed"}
    return [
        responses_event("response.output_item.added", output_index=index, item=item),
        *(responses_event("response.reasoning_summary_text.delta", item_id=id, output_index=index, summary_index=0,
                          delta=p) for p in summary),
        responses_event("response.output_item.done", output_index=index, item=done),
    ]


def responses_text(index: int, *pieces: str) -> list[bytes]:
    item_id = f"msg_{index}"
    text = "".join(pieces)
    return [
        responses_event("response.output_item.added", output_index=index,
                        item={"type": "message", "id": item_id, "role": "assistant", "content": [],
                              "status": "in_progress"}),
        *(responses_event("response.output_text.delta", item_id=item_id, output_index=index, content_index=0,
                          delta=p, logprobs=[]) for p in pieces),
        responses_event("response.output_item.done", output_index=index,
                        item={"type": "message", "id": item_id, "role": "assistant", "status": "completed",
                              "content": [{"type": "output_text", "text": text, "annotations": []}]}),
    ]


def responses_call(index: int, call_id: str, name: str, args: dict[str, Any]) -> list[bytes]:
    arguments = json.dumps(args)
    item = {"type": "function_call", "id": f"fc_{index}", "call_id": call_id, "name": name}
    half = len(arguments) // 2
    return [
        responses_event("response.output_item.added", output_index=index,
                        item={**item, "arguments": "", "status": "in_progress"}),
        *(responses_event("response.function_call_arguments.delta", item_id=item["id"], output_index=index, delta=p)
          for p in (arguments[:half], arguments[half:])),
        responses_event("response.output_item.done", output_index=index,
                        item={**item, "arguments": arguments, "status": "completed"}),
    ]


def responses_completed(input_tokens: int = 10, output_tokens: int = 5, cached: int = 0) -> bytes:
    return responses_event("response.completed", response=_response("completed", {
        "input_tokens": input_tokens, "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": output_tokens, "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": input_tokens + output_tokens,
    }))


# ---- driving a provider -----------------------------------------------------------


class RecordedSleep:
    """Stands in for ``asyncio.sleep``: records each delay and returns at once."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, delay: float) -> None:
        self.delays.append(delay)
        await asyncio.sleep(0)


_seq = count(1)


def message(role: str, *content: Block) -> Message:
    n = next(_seq)
    return Message(id=f"m{n}", session_id="s1", turn_id="t1", seq=n, role=role, content=list(content),
                   created_at="2025-01-01T00:00:00Z")


def request(*messages: Message, system: str = "", tools: Iterable[dict[str, Any]] = ()) -> ModelRequest:
    return ModelRequest(session_id="s1", turn_id="t1", system=system, messages=list(messages), tools=list(tools))


async def collect(stream: AsyncIterator[StreamEvent], timeout: float = 10.0,
                  retries: list[Retrying] | None = None) -> list[StreamEvent]:
    """The stream's events, but for the ``Retrying`` notices of its waits, which go to ``retries`` when
    given (the tests about what a retry ends in compare the rest; tests of the notices read them)."""
    events: list[StreamEvent] = []
    async with asyncio.timeout(timeout):
        async with aclosing(stream) as events_in:  # type: ignore[type-var]
            async for event in events_in:
                if isinstance(event, Retrying):
                    if retries is not None:
                        retries.append(event)
                    continue
                events.append(event)
    return events
