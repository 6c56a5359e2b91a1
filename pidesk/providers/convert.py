"""Our transcript → each vendor's request body (pure: no I/O, no SDK imports).

The transcript is the record; what a model sees is derived from it here, in
two steps:

1. ``exchanges`` turns the message list into a sequence that any vendor accepts:
   ``Said`` (user text), ``Answered`` (assistant text and tool calls) and
   ``Results`` (one result per call of the ``Answered`` just before, in call
   order). A call with no recorded result (a crash, an abort before the result
   was written) gets a synthesized ``TOOL_ABORTED`` error result, so a request
   is always valid; a result whose call is not pending (the history was
   compacted, or the result came late) is shown to the model as user text
   rather than dropped. Empty assistant messages are left out. A request
   converts only what is new (``ExchangeCache``): its view grew at the end.
2. ``openai_*`` / ``anthropic_*`` / ``responses_*`` render that sequence and
   the tool specs (``{name, description, parameters}``) in each wire format.

Thinking blocks ride with their ``Answered``. A vendor gets back only the blocks
its own kind wrote (``ThinkingBlock.opaque["vendor"]``), exactly as received:
Anthropic's signed ``thinking`` / ``redacted_thinking`` blocks, the Responses
API's reasoning items that carry ``encrypted_content``. Chat Completions never
takes reasoning back. Another vendor's reasoning is left out, never rewritten.

Attachments are references (``ref``) into the host's content store, never
bytes: they are shown to the model as a one-line note.
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from pidesk.core.errors import Code
from pidesk.core.records import AttachmentBlock, Message, TextBlock, ThinkingBlock, ToolCallBlock, ToolResultBlock
from pidesk.providers.base import ToolCall

MISSING_RESULT = "No result was recorded for this tool call: it was interrupted before it finished."


@dataclass(frozen=True)
class Said:
    text: str


@dataclass(frozen=True)
class Answered:
    text: str
    calls: list[ToolCallBlock]
    thinking: list[ThinkingBlock] = field(default_factory=list)


@dataclass(frozen=True)
class Results:
    results: list[ToolResultBlock]


Exchange = Said | Answered | Results


@dataclass
class _Pending:
    calls: list[ToolCallBlock] = field(default_factory=list)
    results: dict[str, ToolResultBlock] = field(default_factory=dict)
    strays: list[str] = field(default_factory=list)


def exchanges(messages: Sequence[Message]) -> list[Exchange]:
    return _marked(messages)[0]


def _marked(messages: Sequence[Message]) -> tuple[list[Exchange], list[int]]:
    """``exchanges(messages)``, and for each message where the sequence may be split — one that is not a
    tool's, before which nothing is pending — how many exchanges come before it (-1 for a tool's)."""
    out: list[Exchange] = []
    marks: list[int] = []
    pending = _Pending()

    def settle() -> None:
        if pending.calls:
            out.append(Results([pending.results.get(c.id) or _missing(c) for c in pending.calls]))
        if pending.strays:
            out.append(Said("\n\n".join(pending.strays)))
        pending.calls, pending.results, pending.strays = [], {}, []

    for message in messages:
        if message.role == "tool":
            marks.append(-1)
            for block in message.content:
                if isinstance(block, ToolResultBlock) and block.tool_call_id in {c.id for c in pending.calls}:
                    pending.results.setdefault(block.tool_call_id, block)
                elif isinstance(block, ToolResultBlock):
                    pending.strays.append(f"(Result of an earlier {block.name} call {block.tool_call_id}) "
                                          + result_text(block))
                elif text := _block_text(block):
                    pending.strays.append(text)
            continue
        settle()
        marks.append(len(out))
        if message.role == "assistant":
            calls = message.tool_calls()
            text = message.text()
            if calls or text.strip():
                out.append(Answered(text, calls, [b for b in message.content if isinstance(b, ThinkingBlock)]))
                pending.calls = calls
        else:
            text = "\n".join(t for t in (_block_text(b) for b in message.content) if t)
            if text:
                out.append(Said(text))
    settle()
    return out, marks


@dataclass
class _Kept:
    """A run of one session's messages that ends where its sequence may be split, converted."""

    ids: list[str]
    marks: list[int]  # ``_marked``'s, for these messages
    converted: list[Exchange]
    where: dict[str, int]  # a message's id -> its place in ``ids``


class ExchangeCache:
    """``exchanges`` of each session's successive views, converted for what is new.

    Between two requests a view grows at its end and, once it fills the window, loses messages at its
    front (``runtime/context_window.py``: the window then opens with a note, on a message that is not a
    tool's). So what the last view held is kept, up to its last point where the sequence may be split:
    the ids of those messages, where each such point falls among their exchanges, and the exchanges.
    A view that holds the kept messages from such a point on (after at most ``LEAD`` others: the note)
    converts only what comes before and after them: the same sequence as converting it whole, since
    ``exchanges`` settles at every such point. Any other view (a compaction, another session) is
    converted whole. 7,000 messages in view took 12 ms a request on the event loop; now what is new
    does. The last ``SESSIONS`` sessions' are kept."""

    SESSIONS = 64
    LEAD = 3  # messages a view may begin with before the kept ones (the window's note, a compaction's opening)

    def __init__(self) -> None:
        self._kept: OrderedDict[str, _Kept] = OrderedDict()
        self._lock = threading.Lock()  # (providers are shared: a host in another thread converts too)

    def __call__(self, messages: Sequence[Message]) -> list[Exchange]:
        if not messages:
            return []
        key = messages[0].session_id
        with self._lock:
            kept = self._kept.get(key)
        lead, ids, marks, converted = 0, [], [], []  # (nothing kept: the whole view is new)
        found = self._find(messages, kept) if kept is not None else None
        if found is not None and kept is not None:
            lead, at = found
            ids, converted = kept.ids[at:], kept.converted[kept.marks[at]:]
            marks = [m - kept.marks[at] if m >= 0 else m for m in kept.marks[at:]]
        start = lead + len(ids)
        if start < len(messages) and messages[start].role == "tool":  # (not where the kept part settled)
            lead, ids, marks, converted, start = 0, [], [], [], 0
        cut = next((n for n in range(len(messages) - 1, start - 1, -1) if messages[n].role != "tool"), start)
        more, more_marks = _marked(messages[start:cut])
        converted = [*converted, *more]
        marks = [*marks, *(m + len(converted) - len(more) if m >= 0 else m for m in more_marks)]
        ids = [*ids, *(m.id for m in messages[start:cut])]
        with self._lock:
            self._kept[key] = _Kept(ids, marks, converted, {i: n for n, i in enumerate(ids)})
            self._kept.move_to_end(key)
            while len(self._kept) > self.SESSIONS:
                self._kept.popitem(last=False)
        return [*exchanges(messages[:lead]), *converted, *exchanges(messages[cut:])]

    def _find(self, messages: Sequence[Message], kept: _Kept) -> tuple[int, int] | None:
        """(how many messages lead, where in the kept ones the view's run of them begins), if the view holds
        every kept message from a point where the sequence may be split on."""
        for lead in range(min(self.LEAD, len(messages))):
            at = kept.where.get(messages[lead].id)
            if at is None or kept.marks[at] < 0:
                continue
            run = len(kept.ids) - at
            if len(messages) - lead >= run and all(messages[lead + n].id == kept.ids[at + n] for n in range(run)):
                return lead, at
        return None


_exchanges = ExchangeCache()  # what every vendor's rendering below reads


def result_text(result: ToolResultBlock) -> str:
    """A tool result as the model reads it: failures start with their stable code."""
    if result.ok:
        return result.output
    return f"Error {result.error_code or 'TOOL_ERROR'}: {result.output}"


# A tool call's argument text kept for parsing: past it the rest is only counted. Above the runtime's
# 1 MiB bound (which refuses such a call with a note of its size): 120 MiB of arguments were gathered
# whole and parsed on the loop (issue 29).
MAX_ARGUMENT_TEXT = 2 << 20


class ArgumentText:
    """A tool call's argument text as it streams in, kept up to ``MAX_ARGUMENT_TEXT`` characters."""

    def __init__(self, text: str = "") -> None:
        self.parts: list[str] = []
        self.size = 0
        if text:
            self.add(text)

    def add(self, piece: str) -> None:
        self.size += len(piece)
        if self.size <= MAX_ARGUMENT_TEXT:
            self.parts.append(piece)
        else:
            self.parts.clear()

    def tool_call(self, call_id: str, name: str, default: dict[str, Any] | None = None) -> ToolCall:
        """The call, its arguments parsed (``default`` when none came), or not kept when too long."""
        if self.size > MAX_ARGUMENT_TEXT:
            return ToolCall(call_id, name, {}, oversized=self.size)
        if not self.size and default is not None:
            return ToolCall(call_id, name, dict(default))
        return ToolCall(call_id, name, parse_arguments("".join(self.parts)))


def parse_arguments(text: str) -> dict[str, Any]:
    """Streamed tool arguments as a dict; anything but a JSON object is kept as
    ``{"_raw": text}``, so the tool answers ``INVALID_ARGUMENTS`` and the model can retry."""
    if not text.strip():
        return {}
    try:
        value = json.loads(text)
    except ValueError:
        return {"_raw": text}
    return value if isinstance(value, dict) else {"_raw": text}


def _missing(call: ToolCallBlock) -> ToolResultBlock:
    return ToolResultBlock(
        tool_call_id=call.id, name=call.name, ok=False, output=MISSING_RESULT, error_code=Code.TOOL_ABORTED.value
    )


def _block_text(block: object) -> str:
    if isinstance(block, TextBlock):
        return block.text
    if isinstance(block, AttachmentBlock):
        return f"[attached {block.kind} {block.name!r} ({block.mime}, {block.size} bytes), ref {block.ref}]"
    return ""


# ---- OpenAI Chat Completions ------------------------------------------------------


def openai_messages(system: str, messages: Sequence[Message], reasoning_back: bool = False) -> list[dict[str, Any]]:
    """Chat Completions messages. ``reasoning_back``: an answer that called tools carries its reasoning
    back as ``reasoning_content``, which DeepSeek's and Kimi's thinking models require in a tool loop
    (and others refuse: a per-model setting)."""
    out: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    for item in _exchanges(messages):
        if isinstance(item, Said):
            out.append({"role": "user", "content": item.text})
        elif isinstance(item, Answered):
            message: dict[str, Any] = {"role": "assistant", "content": item.text or None}
            if reasoning_back and item.calls and (said := "".join(t.text for t in item.thinking if not t.redacted)):
                message["reasoning_content"] = said
            if item.calls:
                message["tool_calls"] = [
                    {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": _json(c.args)}}
                    for c in item.calls
                ]
            out.append(message)
        else:
            out.extend(
                {"role": "tool", "tool_call_id": r.tool_call_id, "content": result_text(r)} for r in item.results
            )
    return out


def _json(value: Any) -> str:
    return _encode(value).decode()


_encode = msgspec.json.Encoder().encode  # a tenth of json.dumps's time, for every call in the history


def openai_tools(specs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    return [
        {"type": "function", "function": {
            "name": s["name"], "description": s.get("description", ""), "parameters": s["parameters"],
        }}
        for s in specs
    ]


# ---- Anthropic Messages -----------------------------------------------------------

_ANTHROPIC_ID = re.compile(r"[^a-zA-Z0-9_-]")


def anthropic_messages(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """Tool results travel in a user message; consecutive same-role messages are merged
    (tool results first, as the API requires), and the first message is a user's."""
    out: list[dict[str, Any]] = []
    for item in _exchanges(messages):
        blocks: list[dict[str, Any]]
        if isinstance(item, Said):
            role, blocks = "user", [{"type": "text", "text": item.text}]
        elif isinstance(item, Answered):
            role = "assistant"
            blocks = [b for b in map(_anthropic_thinking, item.thinking) if b is not None]
            blocks += [{"type": "text", "text": item.text}] if item.text.strip() else []
            blocks += [
                {"type": "tool_use", "id": anthropic_id(c.id), "name": c.name, "input": c.args} for c in item.calls
            ]
        else:
            role, blocks = "user", [
                {"type": "tool_result", "tool_use_id": anthropic_id(r.tool_call_id),
                 "content": result_text(r) or "(no output)", "is_error": not r.ok}
                for r in item.results
            ]
        if out and out[-1]["role"] == role:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": role, "content": blocks})
    if out and out[0]["role"] != "user":
        out.insert(0, {"role": "user", "content": [{"type": "text", "text": "(The conversation continues.)"}]})
    return out


def anthropic_id(call_id: str) -> str:
    """Anthropic accepts tool ids of ``[a-zA-Z0-9_-]`` only; other vendors' ids may hold more."""
    return _ANTHROPIC_ID.sub("_", call_id) or "call"


def anthropic_tools(specs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    return [
        {"name": s["name"], "description": s.get("description", ""), "input_schema": s["parameters"]}
        for s in specs
    ]


def _anthropic_thinking(block: ThinkingBlock) -> dict[str, Any] | None:
    """A thinking block as Anthropic sent it (its signature or encrypted data unchanged), or None
    when it is not Anthropic's (the API refuses a thinking block it cannot verify)."""
    opaque = block.opaque or {}
    if opaque.get("vendor") != "anthropic":
        return None
    if block.redacted:
        return {"type": "redacted_thinking", "data": opaque["data"]} if opaque.get("data") else None
    if not opaque.get("signature"):
        return None  # the stream broke off before the signature: the API would refuse it
    return {"type": "thinking", "thinking": block.text, "signature": opaque["signature"]}


CACHE_BREAKPOINTS = 4  # the Messages API's limit per request
_EPHEMERAL = {"type": "ephemeral"}


def anthropic_cache(body: dict[str, Any]) -> None:
    """Mark ``body`` (a Messages request) for prompt caching, in place: a breakpoint on the last
    tool and one on the system prompt (the stable prefix), and a rolling pair on the last block
    of the last two user messages. In a tool loop each request then reads the prefix the
    previous one wrote (its last user message) and writes one more step; the pair means a
    request whose newest message changed (a steer, a retry) still reads the one before.
    At most ``CACHE_BREAKPOINTS``; thinking blocks are never marked (the API refuses that)."""
    if body.get("tools"):
        body["tools"][-1] = {**body["tools"][-1], "cache_control": _EPHEMERAL}
    if isinstance(system := body.get("system"), str) and system:
        body["system"] = [{"type": "text", "text": system, "cache_control": _EPHEMERAL}]
    marked = 0
    for message in reversed(body.get("messages", ())):
        if marked == 2:
            break
        if message["role"] != "user" or not message["content"]:
            continue
        message["content"][-1] = {**message["content"][-1], "cache_control": _EPHEMERAL}
        marked += 1


# ---- OpenAI Responses -------------------------------------------------------------


def responses_input(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """The conversation as Responses API input items (the system prompt goes in ``instructions``).

    With ``store=false`` nothing is kept server-side: a reasoning item is sent back whole, as
    received, and only when it carries ``encrypted_content`` (without it the API would look
    the item up by id, and find nothing)."""
    out: list[dict[str, Any]] = []
    for item in _exchanges(messages):
        if isinstance(item, Said):
            out.append({"role": "user", "content": item.text})
        elif isinstance(item, Answered):
            for thought in item.thinking:
                opaque = thought.opaque or {}
                reasoning = opaque.get("item")
                if opaque.get("vendor") == "openai-responses" and isinstance(reasoning, dict) \
                        and reasoning.get("encrypted_content"):
                    out.append(reasoning)
            if item.text.strip():
                out.append({"type": "message", "role": "assistant",
                            "content": [{"type": "output_text", "text": item.text}]})
            out.extend({"type": "function_call", "call_id": c.id, "name": c.name, "arguments": _json(c.args)}
                       for c in item.calls)
        else:
            out.extend({"type": "function_call_output", "call_id": r.tool_call_id, "output": result_text(r)}
                       for r in item.results)
    return out


def responses_tools(specs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    return [
        {"type": "function", "name": s["name"], "description": s.get("description", ""),
         "parameters": s["parameters"], "strict": False}
        for s in specs
    ]
