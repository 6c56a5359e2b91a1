"""Retries for HTTP provider streams: one policy, shared by every vendor.

An *attempt* is one HTTP request and the stream it answers. It yields stream
events and ends in one of two ways: a ``Done`` (the response was complete) or a
``Failure`` value (it was not). ``stream_with_retries`` drives attempts::

    attempt ──Done──────────────────────────────▶ Done (budget spent on nothing)
       │
       └─Failure ─ retryable, budget left, and no event of this attempt yielded?
                      ├─ yes: sleep(delay), replay the same request
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

Delays: a 429 waits what ``retry-after-ms`` / ``retry-after`` ask (capped at
``MAX_RETRY_AFTER`` s), else the backoff 1, 2, 4, 8, 8, … s that transient
failures (5xx, 408, 409, dropped connections, broken streams) use.
"""

from __future__ import annotations

import email.utils
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from contextlib import aclosing
from dataclasses import dataclass
from typing import Final, Literal

from pidesk.core.errors import Code
from pidesk.providers.base import Done, StreamEvent, UsageReport

MAX_RETRY_AFTER: Final = 30.0
MAX_BACKOFF: Final = 8.0
DEFAULT_MAX_RETRIES: Final = 10
_MIN_SECRET: Final = 8

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


@dataclass(frozen=True)
class Failure:
    """Why an attempt did not complete; ``retry_after`` is the server's wish, capped."""

    kind: FailureKind
    detail: str
    retry_after: float | None = None

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
    """The wait a 429 asks for: ``retry-after-ms``, else ``retry-after`` (seconds or an
    HTTP date), capped at ``MAX_RETRY_AFTER``; ``None`` when absent or unreadable."""
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
    return min(seconds, MAX_RETRY_AFTER)


def _number(text: str) -> float | None:
    try:
        value = float(text.strip())
    except ValueError:
        return None
    return value if value == value and value != float("inf") else None  # no NaN / inf


def classify_status(status: int, headers: Mapping[str, str], detail: str) -> Failure:
    """An HTTP error answer as a ``Failure``; ``detail`` should already name the provider."""
    if status == 429:
        return Failure("rate_limited", detail, retry_after(headers))
    if status in (401, 403):
        return Failure("unauthorized", f"{detail} — check the API key and its permissions")
    if status >= 500 or status in _TRANSIENT_STATUSES:
        return Failure("transient", detail)
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
    through mid-stream (the anthropic SDK does not wrap them).
    """

    vendor: str
    status: type[Exception]
    connection: type[Exception]
    api: type[Exception]
    transport: tuple[type[BaseException], ...]

    def request_failure(self, exc: Exception) -> Failure:
        """A failure before the response started streaming."""
        if isinstance(exc, self.status):
            status = int(getattr(exc, "status_code", 0) or 0)
            headers = getattr(getattr(exc, "response", None), "headers", None) or {}
            return classify_status(status, headers, f"{self.vendor} answered HTTP {status}: {_message(exc)}")
        if isinstance(exc, (self.connection, *self.transport, OSError)):
            return Failure("transient", f"could not reach {self.vendor}: {_message(exc)}")
        return self.stream_failure(exc)

    def stream_failure(self, exc: Exception) -> Failure:
        """A failure while the response was streaming."""
        if isinstance(exc, self.status) and int(getattr(exc, "status_code", 0) or 0) >= 400:
            return self.request_failure(exc)
        if isinstance(exc, (self.connection, *self.transport, OSError)):
            return Failure("broken", f"the {self.vendor} stream broke off: {_message(exc)}")
        if isinstance(exc, self.api):
            detail = f"{self.vendor} sent an error in the stream: {_message(exc)}"
            status = _status_of_error_body(getattr(exc, "body", None))
            return classify_status(status, {}, detail) if status else Failure("fatal", detail)
        return Failure("fatal", f"unexpected {type(exc).__name__} reading the {self.vendor} stream: {exc}")


def _message(exc: BaseException) -> str:
    """The server's own words when the body has them, else the exception's text."""
    body = getattr(exc, "body", None)
    error = body.get("error", body) if isinstance(body, dict) else None
    if isinstance(error, dict) and isinstance(error.get("message"), str) and error["message"]:
        return str(error["message"])
    text = str(getattr(exc, "message", None) or exc or type(exc).__name__)
    if (cause := exc.__cause__) is not None:  # the SDKs wrap "Connection error." around the real reason
        text = f"{text} ({type(cause).__name__}: {cause})" if str(cause) else f"{text} ({type(cause).__name__})"
    return text


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
    max_retries: int = DEFAULT_MAX_RETRIES

    def delay(self, failure: Failure, retries_taken: int) -> float | None:
        """Seconds to wait before the next retry, or ``None``: give up with ``failure``."""
        if not failure.retryable or retries_taken >= self.max_retries:
            return None
        if failure.kind == "rate_limited" and failure.retry_after is not None:
            return failure.retry_after
        return backoff(retries_taken)


Attempt = Callable[[], AsyncGenerator[StreamEvent | Failure, None]]


async def stream_with_retries(
    attempt: Attempt, policy: RetryPolicy, sleep: Sleep, *, secret: str = ""
) -> AsyncGenerator[StreamEvent, None]:
    """Run ``attempt`` until one completes or the policy gives up; always ends with one ``Done``.

    ``secret`` (the API key) is blanked out of every error detail, as some
    servers echo a rejected key (a key too short to be real is left alone, or
    it would blank out parts of words).
    """
    async with aclosing(_drive(attempt, policy, sleep)) as events:
        async for event in events:
            if isinstance(event, Done) and len(secret) >= _MIN_SECRET and secret in event.detail:
                event = Done(event.stop_reason, event.error_code, event.detail.replace(secret, "[redacted]"))
            yield event


async def _drive(attempt: Attempt, policy: RetryPolicy, sleep: Sleep) -> AsyncGenerator[StreamEvent, None]:
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
        if yielded and failure.retryable:
            yield Done("error", Code.STREAM_FAILED, f"{failure.detail} (after part of the answer was streamed)")
            return
        delay = policy.delay(failure, retries_taken)
        if delay is None:
            spent = f" (gave up after {retries_taken} retries)" if failure.retryable else ""
            yield Done("error", failure.code, failure.detail + spent)
            return
        retries_taken += 1
        await sleep(delay)
