"""The OpenAI Responses API (``openai-responses/<model>``), streamed, on the official ``openai`` SDK.

OpenAI's own newer API, and one that local servers (vLLM, llama.cpp, Ollama,
LM Studio) speak too. Request and response differ from Chat Completions:

* The request: ``instructions`` (the system prompt), ``input`` items
  (``convert.responses_input``), ``tools`` as flat function specs,
  ``store=false`` (nothing is kept server-side: every request carries the
  whole conversation, as with the other providers) and ``prompt_cache_key`` =
  the session id. Whenever the model reasons — ``reasoning_effort`` configured, a
  reasoning model by its name (o1, o3, o4, gpt-5, codex, gpt-oss), or one that sent a
  reasoning item back already — ``reasoning: {summary: "auto"}`` (and the effort) and
  ``include=["reasoning.encrypted_content"]``, so each reasoning item comes back
  encrypted and can be sent back on the next request (store=false leaves the server
  nothing to look it up by), and its summary is shown.
* The stream: typed events, no ``[DONE]``. Text is ``response.output_text.delta``;
  reasoning text is ``response.reasoning_summary_text.delta`` (OpenAI) or
  ``response.reasoning_text.delta`` (open models) — yielded as ``ThinkingDelta``.
  Each finished output item arrives whole in ``response.output_item.done``: a
  ``reasoning`` item becomes a ``Thought`` carrying the item, unchanged, in
  ``opaque``; a ``function_call`` item a tool call (yielded, parsed, once the
  response is complete, in output order). ``response.completed`` ends the
  response and carries usage (``input_tokens`` include the cached ones:
  ``input_tokens_details.cached_tokens`` are cache reads).
* ``response.failed`` and an ``error`` event raise the SDK's ``APIError`` with
  the error as its body, as an in-stream error of the other providers does, so
  ``retry`` classifies it by its code; ``response.incomplete`` ends the answer
  where it stopped (``max_output_tokens``), or as an error for a content filter.
* The SDK is imported on the first ``stream()``; importing this module must not
  import it. Its own retries are off; ``retry.stream_with_retries`` decides.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from pidesk.core.errors import Code
from pidesk.providers.base import Done, ModelRequest, StreamEvent, ThinkingDelta, Thought, UsageReport
from pidesk.providers.convert import ArgumentText, responses_input, responses_tools
from pidesk.providers.openai import OpenAIClient

VENDOR = "openai-responses"  # the ``opaque["vendor"]`` of the reasoning items this provider writes
REASONING_MODELS = ("o1", "o3", "o4", "gpt-5", "codex", "gpt-oss")  # names of models that always reason


class _InputDetails(msgspec.Struct):
    cached_tokens: int | None = None


class _Usage(msgspec.Struct):
    input_tokens: int | None = None
    output_tokens: int | None = None
    input_tokens_details: _InputDetails | None = None


class _Incomplete(msgspec.Struct):
    reason: str | None = None


class _Response(msgspec.Struct):
    usage: _Usage | None = None
    error: Any = None
    incomplete_details: _Incomplete | None = None


class _Event(msgspec.Struct):
    """The fields of a Responses stream event pidesk reads; the rest are skipped while decoding.
    An ``output_item.done`` item is kept whole (a reasoning item goes back unchanged)."""

    type: str = ""
    delta: str | None = None
    output_index: int = 0
    item: dict[str, Any] | None = None
    response: _Response | None = None
    code: Any = None  # an ``error`` event's
    message: str | None = None


class OpenAIResponsesProvider(OpenAIClient):
    vendor = VENDOR
    path = "/responses"
    decoder = msgspec.json.Decoder(_Event)
    _reasoned = False  # a reasoning item has come back from this model

    def _params(self, request: ModelRequest) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model, "input": responses_input(request.messages), "stream": True,
                                "store": False}
        if request.system:
            body["instructions"] = request.system
        if request.tools:
            body["tools"] = responses_tools(request.tools)
            if request.tool_choice == "none":
                body["tool_choice"] = "none"
        if self._reasoning_effort or self._reasons:
            body["reasoning"] = {"summary": "auto"} | ({"effort": self._reasoning_effort} if self._reasoning_effort else {})
            body["include"] = ["reasoning.encrypted_content"]
        if self._cache:
            body["prompt_cache_key"] = request.session_id
        return body

    @property
    def _reasons(self) -> bool:
        """Whether the model reasons: by its name, or because it has sent a reasoning item."""
        return self._reasoned or self.model.lower().startswith(REASONING_MODELS)

    def _reply(self) -> _Reply:
        assert self._errors is not None  # set with the client, before any reply
        return _Reply(self._errors.api, self._learn)

    def _learn(self) -> None:
        self._reasoned = True  # it reasons: from now on ask for the encrypted item and a summary


@dataclass
class _Reply:
    """One response being assembled from its events."""

    api_error: Any  # the SDK's APIError: an error inside the stream is raised as one
    reasoned: Callable[[], None]  # called when a reasoning item comes
    calls: dict[int, dict[str, Any]] = field(default_factory=dict)  # finished function_call items, by output index
    usage: UsageReport | None = None
    stop: str | None = None  # "completed" or "incomplete"
    incomplete: str | None = None
    out: list[StreamEvent] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return self.stop is not None

    @property
    def last(self) -> bool:
        return self.stop is not None

    def feed(self, event: Any) -> str:
        kind = event.type
        if kind == "response.output_text.delta":
            return event.delta or ""
        if kind in ("response.reasoning_summary_text.delta", "response.reasoning_text.delta"):
            if event.delta:
                self.out.append(ThinkingDelta(event.delta))
        elif kind == "response.output_item.done" and event.item is not None:
            self._item(event.output_index, event.item)
        elif kind in ("response.completed", "response.incomplete"):
            response = event.response
            self._usage(getattr(response, "usage", None))
            self.stop = "completed" if kind == "response.completed" else "incomplete"
            details = getattr(response, "incomplete_details", None)
            self.incomplete = getattr(details, "reason", None)
        elif kind == "response.failed":
            error = getattr(event.response, "error", None)
            self._raise(error if isinstance(error, dict) else {"message": "the response failed"})
        elif kind == "error":
            self._raise({"code": event.code, "message": event.message or "an error occurred during streaming"})
        return ""

    def _raise(self, error: dict[str, Any]) -> None:
        raise self.api_error(str(error.get("message") or "the response failed"), None, body={"error": error})

    def _item(self, index: int, item: dict[str, Any]) -> None:
        kind = item.get("type")
        if kind == "function_call":
            self.calls[index] = item
        elif kind == "reasoning":
            self.reasoned()
            parts = item.get("summary") or item.get("content") or []
            text = "\n\n".join(str(p.get("text", "")) for p in parts if isinstance(p, dict))
            self.out.append(Thought(text, opaque={"vendor": VENDOR, "item": item}))  # the item as received

    def _usage(self, usage: Any) -> None:
        if usage is None:
            return
        details = getattr(usage, "input_tokens_details", None)
        self.usage = UsageReport(
            input_tokens=getattr(usage, "input_tokens", None) or 0,
            output_tokens=getattr(usage, "output_tokens", None) or 0,
            cache_read_tokens=getattr(details, "cached_tokens", None) or 0,
        )

    def finish(self) -> list[StreamEvent]:
        events: list[StreamEvent] = [
            ArgumentText(str(item.get("arguments") or "")).tool_call(
                str(item.get("call_id") or f"call_{secrets.token_hex(8)}"), str(item.get("name") or ""))
            for _, item in sorted(self.calls.items())
        ]
        if self.usage is not None:
            events.append(self.usage)
        if self.incomplete == "content_filter" and not self.calls:
            events.append(Done("error", Code.PROVIDER_ERROR, "the provider's content filter stopped the answer"))
        else:
            events.append(Done("tool_calls" if self.calls else "end"))
        return events
