"""The retry policy and driver shared by the HTTP providers, without HTTP: scripted attempts."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from email.utils import formatdate
from typing import Any

import pytest

from pidesk.providers.base import Done, Retrying, StreamEvent, TextDelta, ToolCall, UsageReport
from pidesk.providers.retry import (
    Failure,
    RetryPolicy,
    SdkErrors,
    backoff,
    classify_status,
    retry_after,
    stream_with_retries,
)
from tests.providers.mock_vendors import RecordedSleep, collect

Step = StreamEvent | Failure | Exception


class Attempts:
    """Each call plays the next script; an Exception in a script is raised there."""

    def __init__(self, *scripts: list[Step]) -> None:
        self.scripts = list(scripts)
        self.started = 0
        self.closed = 0

    async def __call__(self) -> AsyncGenerator[StreamEvent | Failure, None]:
        script = self.scripts[min(self.started, len(self.scripts) - 1)]
        self.started += 1
        try:
            for step in script:
                if isinstance(step, Exception):
                    raise step
                yield step
        finally:
            self.closed += 1


def run(attempts: Attempts, sleep: RecordedSleep, max_retries: int = 10, secret: str = "") -> Any:
    return collect(stream_with_retries(attempts, RetryPolicy(max_retries), sleep, secret=secret))


def test_backoff_doubles_from_one_second_up_to_eight() -> None:
    assert [backoff(n) for n in range(7)] == [1, 2, 4, 8, 8, 8, 8]


@pytest.mark.parametrize(("headers", "seconds"), [
    ({"retry-after-ms": "250"}, 0.25),
    ({"retry-after": "2"}, 2.0),
    ({"Retry-After": "2.5"}, 2.5),
    ({"retry-after-ms": "100", "retry-after": "9"}, 0.1),
    ({"retry-after-ms": "junk", "retry-after": "9"}, 9.0),
    ({"retry-after": "600"}, 600.0),  # uncapped here: RetryPolicy caps it
    ({"retry-after": formatdate(1_000_010, usegmt=True)}, 10.0),
    ({"retry-after": "soon"}, None),
    ({"retry-after": "-1"}, None),
    ({"retry-after": "nan"}, None),
    ({}, None),
])
def test_retry_after_headers(headers: dict[str, str], seconds: float | None) -> None:
    assert retry_after(headers, now=lambda: 1_000_000.0) == seconds


@pytest.mark.parametrize(("status", "kind", "code"), [
    (429, "rate_limited", "PROVIDER_RATE_LIMITED"),
    (401, "unauthorized", "PROVIDER_UNAUTHORIZED"),
    (403, "unauthorized", "PROVIDER_UNAUTHORIZED"),
    (500, "transient", "PROVIDER_ERROR"),
    (502, "transient", "PROVIDER_ERROR"),
    (503, "transient", "PROVIDER_ERROR"),
    (529, "transient", "PROVIDER_ERROR"),
    (408, "transient", "PROVIDER_ERROR"),
    (400, "fatal", "PROVIDER_ERROR"),
    (404, "fatal", "PROVIDER_ERROR"),
    (413, "fatal", "PROVIDER_ERROR"),
    (422, "fatal", "PROVIDER_ERROR"),
])
def test_status_classification(status: int, kind: str, code: str) -> None:
    failure = classify_status(status, {"retry-after": "4"}, f"x answered HTTP {status}")
    assert (failure.kind, failure.code) == (kind, code)
    assert failure.retryable == (kind in ("rate_limited", "transient"))
    assert failure.retry_after == (4.0 if status in (429, 503, 529) else None)


def test_policy_delays() -> None:
    policy = RetryPolicy(max_retries=3)
    assert policy.delay(Failure("transient", ""), 0) == 1.0
    assert policy.delay(Failure("broken", ""), 2) == 4.0
    assert policy.delay(Failure("rate_limited", "", retry_after=12.0), 0) == 12.0
    assert policy.delay(Failure("rate_limited", ""), 1) == 2.0
    assert policy.delay(Failure("transient", ""), 3) is None
    assert policy.delay(Failure("fatal", ""), 0) is None
    assert policy.delay(Failure("unauthorized", ""), 0) is None


@pytest.mark.asyncio
async def test_a_complete_attempt_passes_through_untouched() -> None:
    sleep = RecordedSleep()
    attempts = Attempts([TextDelta("a"), ToolCall("c1", "Read", {}), UsageReport(1, 2, 3), Done("tool_calls")])
    events = await run(attempts, sleep)
    assert events == [TextDelta("a"), ToolCall("c1", "Read", {}), UsageReport(1, 2, 3), Done("tool_calls")]
    assert (attempts.started, attempts.closed, sleep.delays) == (1, 1, [])


@pytest.mark.asyncio
async def test_each_stream_call_has_its_own_budget() -> None:
    sleep = RecordedSleep()
    attempts = Attempts([Failure("transient", "503")], [Failure("transient", "503")], [Done("end")],
                        [Failure("transient", "503")], [Failure("transient", "503")], [Done("end")])
    assert await run(attempts, sleep, max_retries=2) == [Done("end")]
    assert await run(attempts, sleep, max_retries=2) == [Done("end")]
    assert sleep.delays == [1.0, 2.0, 1.0, 2.0]
    assert attempts.started == attempts.closed == 6


@pytest.mark.asyncio
async def test_each_wait_is_announced_before_it_begins_with_its_count_and_reason() -> None:
    """Issue 30 §5: a retry's wait is visible: a Retrying notice (which retry, of how many, how long, why)
    comes before each sleep, none after the last failure."""
    sleep = RecordedSleep()
    attempts = Attempts([Failure("transient", "openai answered HTTP 503: busy")],
                        [Failure("rate_limited", "openai answered HTTP 429: slow down", 3.0)], [Done("end")])
    notices: list[Retrying] = []
    stream = stream_with_retries(attempts, RetryPolicy(10), sleep)
    assert await collect(stream, retries=notices) == [Done("end")]
    assert notices == [Retrying(1, 10, 1.0, "openai answered HTTP 503: busy"),
                       Retrying(2, 10, 3.0, "openai answered HTTP 429: slow down")]
    assert sleep.delays == [1.0, 3.0]
    notices.clear()
    spent = Attempts([Failure("transient", "503")], [Failure("transient", "503")])
    await collect(stream_with_retries(spent, RetryPolicy(1), sleep), retries=notices)
    assert [n.attempt for n in notices] == [1]


@pytest.mark.asyncio
@pytest.mark.parametrize(("kind", "code"), [
    ("rate_limited", "PROVIDER_RATE_LIMITED"), ("transient", "PROVIDER_ERROR"), ("broken", "STREAM_FAILED"),
])
async def test_a_spent_budget_ends_with_the_failure_code(kind: Any, code: str) -> None:
    sleep = RecordedSleep()
    attempts = Attempts([Failure(kind, "nope")])
    [done] = await run(attempts, sleep, max_retries=3)
    assert done == Done("error", code, "nope (gave up after 3 retries)")
    assert attempts.started == 4 and sleep.delays == [1.0, 2.0, 4.0]


@pytest.mark.asyncio
async def test_no_retries_at_all_when_the_budget_is_zero() -> None:
    sleep = RecordedSleep()
    attempts = Attempts([Failure("transient", "503")])
    assert await run(attempts, sleep, max_retries=0) == [Done("error", "PROVIDER_ERROR", "503 (gave up after 0 retries)")]
    assert attempts.started == 1 and sleep.delays == []


@pytest.mark.asyncio
async def test_output_already_yielded_is_never_replayed() -> None:
    sleep = RecordedSleep()
    attempts = Attempts([TextDelta("half"), Failure("transient", "dropped")], [TextDelta("again"), Done("end")])
    events = await run(attempts, sleep)
    assert events == [TextDelta("half"), Done("error", "STREAM_FAILED", "dropped (after part of the answer was streamed)")]
    assert attempts.started == 1 and sleep.delays == []


@pytest.mark.asyncio
async def test_a_terminal_failure_after_output_keeps_its_own_code() -> None:
    attempts = Attempts([TextDelta("half"), Failure("unauthorized", "revoked")])
    assert await run(attempts, RecordedSleep()) == [TextDelta("half"), Done("error", "PROVIDER_UNAUTHORIZED", "revoked")]


@pytest.mark.asyncio
async def test_usage_alone_is_not_output() -> None:
    sleep = RecordedSleep()
    attempts = Attempts([UsageReport(5, 0, 0), Failure("broken", "cut")], [Done("end")])
    assert await run(attempts, sleep) == [UsageReport(5, 0, 0), Done("end")]
    assert sleep.delays == [1.0]


@pytest.mark.asyncio
async def test_an_attempt_that_just_stops_broke_off_and_is_replayed() -> None:
    sleep = RecordedSleep()
    attempts = Attempts([], [Done("end")])
    assert await run(attempts, sleep) == [Done("end")]
    assert sleep.delays == [1.0]


@pytest.mark.asyncio
async def test_an_exception_escaping_an_attempt_is_a_provider_error_never_a_raise() -> None:
    sleep = RecordedSleep()
    attempts = Attempts([KeyError("choices")], [Done("end")])
    [done] = await run(attempts, sleep)
    assert isinstance(done, Done) and (done.stop_reason, done.error_code) == ("error", "PROVIDER_ERROR")
    assert "KeyError" in done.detail
    assert attempts.started == 1 and sleep.delays == []


@pytest.mark.asyncio
async def test_the_secret_is_blanked_out_of_details() -> None:
    secret = "sk-live-abcdef123456"
    attempts = Attempts([Failure("unauthorized", f"Incorrect API key provided: {secret}")])
    [done] = await run(attempts, RecordedSleep(), secret=secret)
    assert isinstance(done, Done) and secret not in done.detail and "[redacted]" in done.detail


@pytest.mark.asyncio
async def test_cancellation_while_backing_off_propagates_at_once() -> None:
    sleeping = asyncio.Event()

    async def never_wakes(delay: float) -> None:
        sleeping.set()
        await asyncio.Event().wait()

    attempts = Attempts([Failure("transient", "503")])

    async def consume() -> None:
        async for _ in stream_with_retries(attempts, RetryPolicy(), never_wakes):
            pass

    task = asyncio.create_task(consume())
    async with asyncio.timeout(5):
        await sleeping.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert attempts.started == attempts.closed == 1


# ---- SDK exceptions → failures (stand-ins with the SDKs' shape) --------------------


class FakeApiError(Exception):
    def __init__(self, message: str, body: object = None) -> None:
        super().__init__(message)
        self.message = message
        self.body = body


class FakeStatusError(FakeApiError):
    def __init__(self, status: int, body: object, headers: dict[str, str] | None = None) -> None:
        super().__init__(f"Error code: {status}", body)
        self.status_code = status
        self.response = type("Response", (), {"headers": headers or {}})()


class FakeConnectionError(FakeApiError):
    pass


class FakeTransportError(Exception):
    pass


ERRORS = SdkErrors("acme", FakeStatusError, FakeConnectionError, FakeApiError, (FakeTransportError,))


def test_sdk_status_errors_use_the_server_message_and_headers() -> None:
    failure = ERRORS.request_failure(
        FakeStatusError(429, {"error": {"type": "rate_limit_error", "message": "slow down"}}, {"retry-after": "2"})
    )
    assert failure == Failure("rate_limited", "acme answered HTTP 429: slow down", 2.0)


def test_connection_errors_are_transient_before_the_stream_and_broken_during_it() -> None:
    exc = FakeConnectionError("Connection error.")
    exc.__cause__ = FakeTransportError("connection refused")
    assert ERRORS.request_failure(exc) == Failure(
        "transient", "could not reach acme: Connection error. (FakeTransportError: connection refused)"
    )
    assert ERRORS.stream_failure(FakeTransportError("incomplete chunked read")).kind == "broken"
    assert ERRORS.stream_failure(OSError("reset")).kind == "broken"


@pytest.mark.parametrize(("body", "kind"), [
    ({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}, "transient"),
    ({"type": "error", "error": {"type": "rate_limit_error", "message": "slow"}}, "rate_limited"),
    ({"type": "error", "error": {"type": "invalid_request_error", "message": "bad"}}, "fatal"),
    ({"message": "upstream", "code": 502}, "transient"),
    ({"message": "upstream", "code": "504"}, "transient"),
    ({"message": "context too long", "code": "context_length_exceeded"}, "fatal"),
    ("not json", "fatal"),
])
def test_error_events_inside_a_stream_are_classified_by_their_type_or_code(body: object, kind: str) -> None:
    # the anthropic SDK raises an in-stream error event as a status error of the 200 response
    assert ERRORS.stream_failure(FakeStatusError(200, body)).kind == kind
    assert ERRORS.stream_failure(FakeApiError("error event", body)).kind == kind


def test_an_unknown_exception_mid_stream_is_not_retried() -> None:
    failure = ERRORS.stream_failure(ValueError("Expecting value: line 1 column 2"))
    assert failure.kind == "fatal" and "ValueError" in failure.detail
