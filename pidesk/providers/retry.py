"""Retries for HTTP provider streams: one policy, shared by every vendor.

An *attempt* is one HTTP request and the stream it answers. It yields stream
events and ends in one of two ways: a ``Done`` (the response was complete) or a
``Failure`` value (it was not). ``stream_with_retries`` drives attempts::

    attempt ──Done──────────────────────────────▶ Done (budget spent on nothing)
       │
       └─Failure ─ retryable, budget left, and no event of this attempt yielded?
                      ├─ yes: Retrying(…), sleep(delay), replay the same request
                      └─ no:  Done("error", code)

Invariants a reader must not break:

* Only the failed request is replayed, and only while nothing of its attempt
  reached the consumer — output is never duplicated. A retryable failure after
  output is ``STREAM_FAILED`` at once.
* Every sleep goes through the injected ``sleep``; cancellation (the abort
  signal) propagates from it and from the attempt untouched.
* The driver never raises anything but ``CancelledError``: an exception that
  escapes an attempt is a ``PROVIDER_ERROR``.
* A budget is one ``stream()`` call: it starts full for each model response.

Delays: a 429, 503 or 529 waits what ``retry-after-ms`` / ``retry-after`` ask, up to
``RetryPolicy.retry_after_cap`` (60 s unless configured), else the backoff 1, 2, 4, 8, 8, … s
that transient failures (5xx, 408, 409, dropped connections, broken streams) use.

What a person reads: a ``Done("error")``'s ``detail`` becomes the turn's ``errorMessage``. It
names the provider's HTTP status and message, or the address that could not be reached, or how
the stream broke, and the retries spent; the API key and any bearer token are blanked out, and
it is cut at ``MAX_DETAIL`` characters (an error page can be megabytes).
"""

from __future__ import annotations

import email.utils
import html
import re
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from contextlib import aclosing
from dataclasses import dataclass
from typing import Final, Literal

from pidesk.core.errors import Code
from pidesk.providers.base import Done, Retrying, StreamEvent, UsageReport

DEFAULT_RETRY_AFTER_CAP: Final = 60.0  # the longest wait a Retry-After header gets (HostConfig, retry_after_cap)
DEFAULT_IDLE_TIMEOUT: Final = 120.0  # seconds without a byte that make a stream broken (stream_idle_timeout)
MAX_BACKOFF: Final = 8.0
DEFAULT_MAX_RETRIES: Final = 10
MAX_DETAIL: Final = 1000  # characters of an error's detail kept for errorMessage
_MIN_SECRET: Final = 8
_BEARER: Final = re.compile(r"(?i)\b(bearer)\s+[^\s\"',;]+")

Sleep = Callable[[float], Awaitable[object]]

FailureKind = Literal["rate_limited", "transient", "broken", "unauthorized", "fatal"]

_CODES: Final[dict[FailureKind, Code]] = {
    "rate_limited": Code.PROVIDER_RATE_LIMITED,
    "transient": Code.PROVIDER_ERROR,
    "broken": Code.STREAM_FAILED,
    "unauthorized": Code.PROVIDER_UNAUTHORIZED,
    "fatal": Code.PROVIDER_ERROR,
}
_RETRYABLE: Final = frozenset({"rate_limited", "transient", "broken"})
_TRANSIENT_STATUSES: Final = frozenset({408, 409})  # as both SDKs retry them; plus every 5xx
_RETRY_AFTER_STATUSES: Final = frozenset({429, 503, 529})  # the statuses whose Retry-After is honoured


@dataclass(frozen=True)
class Failure:
    """Why an attempt did not complete; ``retry_after`` is the server's wish (the policy caps it)."""

    kind: FailureKind
    detail: str
    retry_after: float | None = None
    overflow: bool = False  # the input is longer than the model's window (``is_overflow``)

    @property
    def retryable(self) -> bool:
        return self.kind in _RETRYABLE

    @property
    def code(self) -> Code:
        return _CODES[self.kind]


def backoff(retries_taken: int) -> float:
    """1, 2, 4, 8, 8, … seconds before retry number ``retries_taken + 1``."""
    return min(2.0 ** retries_taken, MAX_BACKOFF)


def retry_after(headers: Mapping[str, str], now: Callable[[], float] = time.time) -> float | None:
    """The wait an answer asks for: ``retry-after-ms``, else ``retry-after`` (seconds or an
    HTTP date); ``None`` when absent or unreadable. Uncapped: ``RetryPolicy`` caps it."""
    lowered = {k.lower(): v for k, v in headers.items()}
    seconds: float | None = None
    if (ms := lowered.get("retry-after-ms")) is not None:
        seconds = _number(ms)
        seconds = seconds / 1000 if seconds is not None else None
    if seconds is None and (value := lowered.get("retry-after")) is not None:
        seconds = _number(value)
        if seconds is None:
            try:
                seconds = email.utils.parsedate_to_datetime(value).timestamp() - now()
            except (TypeError, ValueError, IndexError):
                seconds = None
    if seconds is None or seconds < 0:
        return None
    return seconds


def _number(text: str) -> float | None:
    try:
        value = float(text.strip())
    except ValueError:
        return None
    return value if value == value and value != float("inf") else None  # no NaN / inf


# How servers say an input is longer than the model's window: OpenAI ("context_length_exceeded",
# "maximum context length is N tokens"), Anthropic ("prompt is too long: N tokens > M maximum"),
# vLLM, llama.cpp, Ollama and OpenRouter in their own words.
_OVERFLOW: Final = re.compile(
    r"context[_ ]length[_ ]exceeded|maximum context length|context window|prompt is too long"
    r"|input is too long|too many (?:input )?tokens|exceeds? (?:the )?(?:model'?s? )?(?:context|max(?:imum)? (?:input|sequence))"
    r"|longer than the model|request_too_large|prompt too long", re.IGNORECASE)


def is_overflow(status: int, detail: str) -> bool:
    """Whether an error answer refuses the input as longer than the model's window."""
    return status in (400, 413, 422) and bool(_OVERFLOW.search(detail))


def classify_status(status: int, headers: Mapping[str, str], detail: str) -> Failure:
    """An HTTP error answer as a ``Failure``; ``detail`` should already name the provider."""
    if is_overflow(status, detail):
        return Failure("fatal", detail, overflow=True)
    wait = retry_after(headers) if status in _RETRY_AFTER_STATUSES else None
    if status == 429:
        return Failure("rate_limited", detail, wait)
    if status in (401, 403):
        return Failure("unauthorized", f"{detail} — check the API key and its permissions")
    if status >= 500 or status in _TRANSIENT_STATUSES:
        return Failure("transient", detail, wait)
    return Failure("fatal", detail)


# In-stream error events carry no HTTP status; their error type (Anthropic) or a
# numeric code (OpenRouter and other OpenAI-compatible relays) stands for one.
_ERROR_TYPE_STATUS: Final = {
    "invalid_request_error": 400, "authentication_error": 401, "permission_error": 403,
    "not_found_error": 404, "request_too_large": 413, "rate_limit_error": 429,
    "rate_limit_exceeded": 429, "api_error": 500, "server_error": 500, "timeout_error": 504,
    "overloaded_error": 529,
}


@dataclass(frozen=True)
class SdkErrors:
    """The exception classes of one vendor SDK, which its provider imports lazily.

    Both official SDKs share this shape: ``status`` (``APIStatusError``, with
    ``status_code``, ``response.headers`` and ``body``), ``connection``
    (``APIConnectionError``, timeouts included) and their base ``api``
    (``APIError``, also raised for an error event inside a stream).
    ``transport`` are the errors of the HTTP layer below that an SDK may let
    through mid-stream (the anthropic SDK does not wrap them); ``idle`` the read
    timeout among them (no byte for the idle time: a broken stream, before the
    answer's head or during its body). ``url`` is the base URL requests go to.
    """

    vendor: str
    status: type[Exception]
    connection: type[Exception]
    api: type[Exception]
    transport: tuple[type[BaseException], ...]
    idle: tuple[type[BaseException], ...] = ()
    url: str = ""
    idle_timeout: float = DEFAULT_IDLE_TIMEOUT

    def request_failure(self, exc: Exception) -> Failure:
        """A failure before the response started streaming."""
        if isinstance(exc, self.status):
            status = int(getattr(exc, "status_code", 0) or 0)
            headers = getattr(getattr(exc, "response", None), "headers", None) or {}
            return classify_status(status, headers, f"{self.vendor} answered HTTP {status}: {_message(exc)}")
        if self._idle(exc):
            return self._idle_failure("before its answer began")
        if isinstance(exc, (self.connection, *self.transport, OSError)):
            where = f"{self.vendor} at {self.url}" if self.url else self.vendor
            return Failure("transient", f"could not reach {where}: {_message(exc)}")
        return self.stream_failure(exc)

    def stream_failure(self, exc: Exception) -> Failure:
        """A failure while the response was streaming."""
        if isinstance(exc, self.status) and int(getattr(exc, "status_code", 0) or 0) >= 400:
            return self.request_failure(exc)
        if self._idle(exc):
            return self._idle_failure("in the middle of its answer")
        if isinstance(exc, CorruptEvent):
            return Failure("broken", f"the {self.vendor} stream sent an unreadable event: {exc}")
        if isinstance(exc, AnswerTooLarge):
            return Failure("fatal", f"the {self.vendor} answer went on for {exc}: not read further")
        if isinstance(exc, (self.connection, *self.transport, OSError)):
            return Failure("broken", f"the {self.vendor} stream broke off: {_message(exc)}")
        if isinstance(exc, self.api):
            detail = f"{self.vendor} sent an error in the stream: {_message(exc)}"
            status = _status_of_error_body(getattr(exc, "body", None))
            return classify_status(status, {}, detail) if status else Failure("fatal", detail)
        return Failure("fatal", f"unexpected {type(exc).__name__} reading the {self.vendor} stream: {exc}")

    def _idle(self, exc: BaseException) -> bool:
        """A read timeout: raised as is mid-body, wrapped by the SDK (its ``APITimeoutError``) before."""
        return bool(self.idle) and (isinstance(exc, self.idle) or isinstance(exc.__cause__, self.idle))

    def _idle_failure(self, when: str) -> Failure:
        return Failure("broken", f"the {self.vendor} server sent nothing for {self.idle_timeout:g} s {when} "
                                 "(stream_idle_timeout)")


class CorruptEvent(Exception):
    """An event in the stream that is not the JSON its vendor sends (``sse.Events`` raises it)."""


class AnswerTooLarge(Exception):
    """A response's body went past ``sse.MAX_ANSWER_BYTES`` (``sse.Events`` raises it)."""


def _message(exc: BaseException) -> str:
    """The server's own words when the body has them — a JSON error's message, or the text of a page
    that is not JSON (a proxy's HTML 502, a plain-text 503) — else the exception's text."""
    body = getattr(exc, "body", None)
    error = body.get("error", body) if isinstance(body, dict) else None
    if isinstance(error, dict) and isinstance(error.get("message"), str) and error["message"]:
        return str(error["message"])
    if isinstance(body, (str, bytes)) and (words := page_text(body)):
        return f'"{words}"'
    if body is None and (words := page_text(_response_text(exc))):
        return f'"{words}"'
    text = str(getattr(exc, "message", None) or exc or type(exc).__name__)
    if (cause := exc.__cause__) is not None:  # the SDKs wrap "Connection error." around the real reason
        text = f"{text} ({type(cause).__name__}: {cause})" if str(cause) else f"{text} ({type(cause).__name__})"
    return text


_TAGS: Final = re.compile(r"<(script|style)\b.*?</\1\s*>|<[^>]*>", re.IGNORECASE | re.DOTALL)
_SPACE: Final = re.compile(r"\s+")
PAGE_WORDS: Final = 300  # characters of a non-JSON error page quoted


def page_text(body: str | bytes) -> str:
    """What a person would read on an error page: its text without markup, on one line, cut short."""
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
    text = _SPACE.sub(" ", html.unescape(_TAGS.sub(" ", text[:20_000]))).strip()
    return text if len(text) <= PAGE_WORDS else text[:PAGE_WORDS - 1] + "…"


def _response_text(exc: BaseException) -> str:
    response = getattr(exc, "response", None)
    try:
        return str(getattr(response, "text", "") or "")
    except Exception:  # a streamed body never read
        return ""


def _status_of_error_body(body: object) -> int:
    error = body.get("error", body) if isinstance(body, dict) else None
    if not isinstance(error, dict):
        return 0
    code = error.get("code")
    if isinstance(code, int) or (isinstance(code, str) and code.isdigit()):
        return int(code) if 400 <= int(code) <= 599 else 0
    return _ERROR_TYPE_STATUS.get(str(error.get("type") or code or ""), 0)


@dataclass(frozen=True)
class RetryPolicy:
    """How long a provider keeps trying (``HostConfig.retry``: ``--max-retries``,
    ``PIDESK_MAX_RETRIES``, ``PIDESK_RETRY_AFTER_CAP``, ``PIDESK_STREAM_IDLE_TIMEOUT``)."""

    max_retries: int = DEFAULT_MAX_RETRIES
    retry_after_cap: float = DEFAULT_RETRY_AFTER_CAP  # a longer Retry-After waits this long
    idle_timeout: float = DEFAULT_IDLE_TIMEOUT  # no byte for this long: the stream broke

    def delay(self, failure: Failure, retries_taken: int) -> float | None:
        """Seconds to wait before the next retry, or ``None``: give up with ``failure``."""
        if not failure.retryable or retries_taken >= self.max_retries:
            return None
        if failure.retry_after is not None:
            return min(failure.retry_after, self.retry_after_cap)
        return backoff(retries_taken)


Attempt = Callable[[], AsyncGenerator[StreamEvent | Failure, None]]


async def stream_with_retries(
    attempt: Attempt, policy: RetryPolicy, sleep: Sleep, *, secret: str = ""
) -> AsyncGenerator[StreamEvent, None]:
    """Run ``attempt`` until one completes or the policy gives up; always ends with one ``Done``.

    ``secret`` (the API key) and any bearer token are blanked out of every error
    detail, as some servers echo a rejected key (a key too short to be real is
    left alone, or it would blank out parts of words).
    """
    async with aclosing(_drive(attempt, policy, sleep, secret)) as events:
        async for event in events:
            if isinstance(event, Done) and event.detail:
                event = Done(event.stop_reason, event.error_code, redact(event.detail, secret), event.overflow)
            yield event


def redact(detail: str, secret: str = "") -> str:
    """``detail`` fit for a person to read and a log to keep: no key, no bearer token, bounded."""
    if len(secret) >= _MIN_SECRET:
        detail = detail.replace(secret, "[redacted]")
    return _BEARER.sub(r"\1 [redacted]", detail)


def _cut(detail: str) -> str:
    return detail if len(detail) <= MAX_DETAIL else detail[:MAX_DETAIL - 1] + "…"


async def _drive(attempt: Attempt, policy: RetryPolicy, sleep: Sleep, secret: str) -> AsyncGenerator[StreamEvent, None]:
    retries_taken = 0
    while True:
        yielded = False
        failure: Failure | None = None
        try:
            async with aclosing(attempt()) as events:
                async for event in events:
                    if isinstance(event, Failure):
                        failure = event
                        break
                    yield event
                    if isinstance(event, Done):
                        return
                    yielded = yielded or not isinstance(event, UsageReport)
        except Exception as exc:  # an attempt must not raise; if one does, it is a provider error
            failure = Failure("fatal", f"unexpected {type(exc).__name__} in the provider: {exc}")
        if failure is None:
            failure = Failure("broken", "the response ended without a stop reason")
        detail = _cut(redact(failure.detail, secret))  # redacted before it is cut: no half key survives
        if yielded and failure.retryable:
            yield Done("error", Code.STREAM_FAILED, f"{detail} (after part of the answer was streamed)")
            return
        delay = policy.delay(failure, retries_taken)
        if delay is None:
            spent = (f" (gave up after {retries_taken} retries)" if failure.retryable
                     else f" (after {retries_taken} retries)" if retries_taken else "")
            yield Done("error", failure.code, detail + spent, overflow=failure.overflow)
            return
        retries_taken += 1
        yield Retrying(retries_taken, policy.max_retries, delay, detail)  # (shown while it waits)
        await sleep(delay)
