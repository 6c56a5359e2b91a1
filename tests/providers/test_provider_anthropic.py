"""AnthropicProvider: the real ``anthropic`` SDK against a local server speaking Messages SSE."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from pidesk.core.records import TextBlock, ToolCallBlock, ToolResultBlock
from pidesk.providers.anthropic import AnthropicProvider
from pidesk.providers.base import Done, StreamEvent, TextDelta, ToolCall, UsageReport
from pidesk.providers.convert import MISSING_RESULT
from pidesk.tools.specs import TOOL_SPECS
from tests.providers.mock_vendors import (
    MockVendor,
    RecordedSleep,
    Reply,
    Sse,
    anthropic_end,
    anthropic_error,
    anthropic_event,
    anthropic_json,
    anthropic_start,
    anthropic_text,
    anthropic_text_block,
    anthropic_tool_start,
    collect,
    message,
    request,
)

KEY = "sk-ant-test-0123456789"


def provider(vendor: MockVendor, sleep: RecordedSleep, max_retries: int = 10) -> AnthropicProvider:
    return AnthropicProvider("claude-test", api_key=KEY, base_url=vendor.url, max_retries=max_retries,
                             max_tokens=1024, sleep=sleep)


def hello() -> list[StreamEvent]:
    return [TextDelta("Hel"), TextDelta("lo"), UsageReport(10, 5, input_includes_cache=False), Done("end")]


def ask(vendor: MockVendor, sleep: RecordedSleep, max_retries: int = 10) -> AsyncIterator[StreamEvent]:
    return provider(vendor, sleep, max_retries).stream(request(message("user", TextBlock(text="hi"))))


@pytest.mark.asyncio
async def test_text_streams_as_deltas_with_usage_counting_both_cache_kinds(
    vendor: MockVendor, sleep: RecordedSleep
) -> None:
    vendor.script(Sse([
        anthropic_start(25, cache_read=100, cache_creation=7),
        anthropic_event("ping"),
        *anthropic_text_block(0, "Hel", "lo"),
        *anthropic_end("end_turn", output_tokens=15),
    ]))
    events = await collect(provider(vendor, sleep).stream(request(message("user", TextBlock(text="hi")),
                                                                  system="You are pidesk.")))
    assert events == [TextDelta("Hel"), TextDelta("lo"), UsageReport(25, 15, 100, 7, input_includes_cache=False), Done("end")]
    assert events[2].prompt_tokens == 132  # the window the request filled: Anthropic counts cached input apart
    [sent] = vendor.requests
    assert (sent.method, sent.path) == ("POST", "/v1/messages")
    # anthropic 2.x sends an api_key as ``authorization: Bearer``; older SDKs used ``x-api-key``
    assert KEY in (sent.headers.get("x-api-key"), sent.headers.get("authorization", "").removeprefix("Bearer "))
    assert "anthropic-version" in sent.headers
    assert sent.headers["content-type"] == "application/json"
    assert sent.body == {
        "model": "claude-test", "max_tokens": 1024, "stream": True,
        "system": [{"type": "text", "text": "You are pidesk.", "cache_control": {"type": "ephemeral"}}],
        "messages": [{"role": "user", "content": [
            {"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}]}],
    }


@pytest.mark.asyncio
async def test_requests_one_after_another_share_one_kept_alive_connection(
    sleep: RecordedSleep, transport: str
) -> None:
    # (over TLS to a real API, a new connection a request would be a new handshake each time)
    async with MockVendor(keep_alive=True) as vendor:
        answer = Sse([anthropic_start(10), *anthropic_text_block(0, "Hel", "lo"), *anthropic_end("end_turn")])
        vendor.script(answer, answer, answer)
        model = provider(vendor, sleep)
        for _ in range(3):
            assert await collect(model.stream(request(message("user", TextBlock(text="hi"))))) == hello()
        await model.aclose()
    assert (len(vendor.requests), vendor.connections) == (3, 1)  # each body read to its end after message_stop


@pytest.mark.asyncio
async def test_request_carries_tool_use_and_tool_result_blocks_with_matching_ids(
    vendor: MockVendor, sleep: RecordedSleep
) -> None:
    vendor.script(Sse(anthropic_text("ok")))
    history = [
        message("user", TextBlock(text="look around")),
        message("assistant", TextBlock(text="Reading."),
                ToolCallBlock(id="toolu_1", name="Read", args={"path": "README.md"}),
                ToolCallBlock(id="functions.Glob:1", name="Glob", args={"pattern": "*.py"})),
        message("tool", ToolResultBlock(tool_call_id="toolu_1", name="Read", ok=True, output="1 # demo")),
        message("tool", ToolResultBlock(tool_call_id="functions.Glob:1", name="Glob", ok=False, output="bad glob",
                                        error_code="INVALID_ARGUMENTS")),
        message("user", TextBlock(text="steer: only src/")),
        message("assistant", ToolCallBlock(id="toolu_3", name="Bash", args={"command": "ls"})),
        # toolu_3 has no result: the request still answers it
    ]
    specs = [TOOL_SPECS["Read"], TOOL_SPECS["Glob"]]
    await collect(provider(vendor, sleep).stream(request(*history, tools=specs)))

    body = vendor.requests[0].body
    assert "system" not in body
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "look around"}]},
        {"role": "assistant", "content": [
            {"type": "text", "text": "Reading."},
            {"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {"path": "README.md"}},
            {"type": "tool_use", "id": "functions_Glob_1", "name": "Glob", "input": {"pattern": "*.py"}},
        ]},
        {"role": "user", "content": [  # the results, then the steer, in one user message
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "1 # demo", "is_error": False},
            {"type": "tool_result", "tool_use_id": "functions_Glob_1",
             "content": "Error INVALID_ARGUMENTS: bad glob", "is_error": True},
            {"type": "text", "text": "steer: only src/", "cache_control": {"type": "ephemeral"}},
        ]},
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "toolu_3", "name": "Bash", "input": {"command": "ls"}},
        ]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_3", "content": f"Error TOOL_ABORTED: {MISSING_RESULT}",
             "is_error": True, "cache_control": {"type": "ephemeral"}},
        ]},
    ]
    assert body["tools"] == [
        {"name": "Read", "description": specs[0]["description"], "input_schema": specs[0]["parameters"]},
        {"name": "Glob", "description": specs[1]["description"], "input_schema": specs[1]["parameters"],
         "cache_control": {"type": "ephemeral"}},
    ]


@pytest.mark.asyncio
async def test_a_tool_use_split_across_json_deltas_is_assembled(vendor: MockVendor, sleep: RecordedSleep) -> None:
    pieces = ['{"pa', 'th": "s', "rc/app", '.py", ', '"lim', 'it": 2', "0}"]
    vendor.script(Sse([
        anthropic_start(30),
        *anthropic_text_block(0, "Let me look."),
        anthropic_tool_start(1, "toolu_01", "Read"),
        *(anthropic_json(1, p) for p in pieces),
        anthropic_event("content_block_stop", index=1),
        *anthropic_end("tool_use", output_tokens=40),
    ]))
    events = await collect(provider(vendor, sleep).stream(request(message("user", TextBlock(text="read")))))
    assert events == [
        TextDelta("Let me look."),
        ToolCall("toolu_01", "Read", {"path": "src/app.py", "limit": 20}),
        UsageReport(30, 40, input_includes_cache=False),
        Done("tool_calls"),
    ]


@pytest.mark.asyncio
async def test_parallel_tool_uses_keep_their_order_and_bad_json_is_passed_raw(
    vendor: MockVendor, sleep: RecordedSleep
) -> None:
    vendor.script(Sse([
        anthropic_start(),
        anthropic_tool_start(0, "toolu_a", "Glob"),
        anthropic_json(0, '{"pattern": '),
        anthropic_event("ping"),
        anthropic_json(0, '"*.md"}'),
        anthropic_event("content_block_stop", index=0),
        anthropic_tool_start(1, "toolu_b", "EnterPlanMode"),  # no input at all
        anthropic_event("content_block_stop", index=1),
        anthropic_tool_start(2, "toolu_c", "Write"),
        anthropic_json(2, '{"path": "x.py", "content": "unterminated'),
        anthropic_event("content_block_stop", index=2),
        *anthropic_end("tool_use"),
    ]))
    events = await collect(provider(vendor, sleep).stream(request(message("user", TextBlock(text="go")))))
    assert events == [
        ToolCall("toolu_a", "Glob", {"pattern": "*.md"}),
        ToolCall("toolu_b", "EnterPlanMode", {}),
        ToolCall("toolu_c", "Write", {"_raw": '{"path": "x.py", "content": "unterminated'}),
        UsageReport(10, 5, input_includes_cache=False),
        Done("tool_calls"),
    ]


@pytest.mark.asyncio
@pytest.mark.parametrize(("headers", "waited"), [
    ({"retry-after-ms": "2500", "retry-after": "3"}, 2.5),  # the finer header wins
    ({"retry-after": "7"}, 7.0),
    ({}, 1.0),  # no header: the backoff
])
async def test_429_waits_what_retry_after_asks_then_retries(
    vendor: MockVendor, sleep: RecordedSleep, headers: dict[str, str], waited: float
) -> None:
    vendor.script(anthropic_error(429, "rate_limit_error", "Number of requests exceeded", headers),
                  Sse(anthropic_text("Hel", "lo")))
    assert await collect(ask(vendor, sleep)) == hello()
    assert sleep.delays == [waited]
    assert len(vendor.requests) == 2
    assert vendor.requests[0].body == vendor.requests[1].body


@pytest.mark.asyncio
@pytest.mark.parametrize("status", [500, 529])
async def test_a_server_error_then_success_backs_off_one_second(
    vendor: MockVendor, sleep: RecordedSleep, status: int
) -> None:
    vendor.script(anthropic_error(status, "overloaded_error", "Overloaded"), Sse(anthropic_text("Hel", "lo")))
    assert await collect(ask(vendor, sleep)) == hello()
    assert sleep.delays == [1.0]
    assert len(vendor.requests) == 2


@pytest.mark.asyncio
async def test_an_overloaded_error_event_before_output_is_replayed(vendor: MockVendor, sleep: RecordedSleep) -> None:
    overloaded = anthropic_event("error", error={"type": "overloaded_error", "message": "Overloaded"})
    vendor.script(Sse([anthropic_start(), overloaded]), Sse(anthropic_text("Hel", "lo")))
    assert await collect(ask(vendor, sleep)) == hello()
    assert sleep.delays == [1.0]


@pytest.mark.asyncio
async def test_an_error_event_after_text_fails_the_stream(vendor: MockVendor, sleep: RecordedSleep) -> None:
    overloaded = anthropic_event("error", error={"type": "overloaded_error", "message": "Overloaded"})
    vendor.script(Sse([anthropic_start(), *anthropic_text_block(0, "Hel")[:2], overloaded]))
    events = await collect(ask(vendor, sleep))
    assert events[0] == TextDelta("Hel")
    assert isinstance(events[1], Done) and (events[1].stop_reason, events[1].error_code) == ("error", "STREAM_FAILED")
    assert len(vendor.requests) == 1 and sleep.delays == []


@pytest.mark.asyncio
@pytest.mark.parametrize(("answer", "code"), [
    (anthropic_error(429, "rate_limit_error", "slow down"), "PROVIDER_RATE_LIMITED"),
    (anthropic_error(529, "overloaded_error", "Overloaded"), "PROVIDER_ERROR"),
    (Sse([anthropic_start()], cut=True), "STREAM_FAILED"),
    (Sse([anthropic_start(), *anthropic_text_block(0)]), "STREAM_FAILED"),  # ends cleanly, no message_stop
])
async def test_spent_retries_end_with_the_failure_code(
    vendor: MockVendor, sleep: RecordedSleep, answer: Reply | Sse, code: str
) -> None:
    vendor.script(*[answer] * 3)
    [done] = await collect(ask(vendor, sleep, max_retries=2))
    assert isinstance(done, Done) and (done.stop_reason, done.error_code) == ("error", code)
    assert len(vendor.requests) == 3
    assert sleep.delays == [1.0, 2.0]


@pytest.mark.asyncio
async def test_a_stream_cut_before_any_output_is_replayed(vendor: MockVendor, sleep: RecordedSleep) -> None:
    vendor.script(
        Sse([anthropic_start(), anthropic_tool_start(0, "toolu_1", "Read"), anthropic_json(0, '{"pa')], cut=True),
        Sse(anthropic_text("Hel", "lo")),
    )
    assert await collect(ask(vendor, sleep)) == hello()  # the half tool call was never yielded
    assert sleep.delays == [1.0]
    assert len(vendor.requests) == 2


@pytest.mark.asyncio
async def test_a_stream_cut_after_text_fails_without_replay(vendor: MockVendor, sleep: RecordedSleep) -> None:
    vendor.script(Sse([anthropic_start(), *anthropic_text_block(0, "Hel")[:2]], cut=True),
                  Sse(anthropic_text("never sent")))
    events = await collect(ask(vendor, sleep))
    assert events[0] == TextDelta("Hel")
    assert isinstance(events[1], Done) and (events[1].stop_reason, events[1].error_code) == ("error", "STREAM_FAILED")
    assert "broke off" in events[1].detail
    assert len(events) == 2
    assert len(vendor.requests) == 1 and sleep.delays == []


@pytest.mark.asyncio
@pytest.mark.parametrize(("status", "kind"), [(401, "authentication_error"), (403, "permission_error")])
async def test_401_and_403_are_unauthorized_at_once(
    vendor: MockVendor, sleep: RecordedSleep, status: int, kind: str
) -> None:
    vendor.script(anthropic_error(status, kind, f"invalid x-api-key {KEY}"))
    [done] = await collect(ask(vendor, sleep))
    assert isinstance(done, Done) and (done.stop_reason, done.error_code) == ("error", "PROVIDER_UNAUTHORIZED")
    assert KEY not in done.detail and "check the API key" in done.detail
    assert len(vendor.requests) == 1 and sleep.delays == []


@pytest.mark.asyncio
async def test_a_bad_request_is_a_provider_error_without_retry(vendor: MockVendor, sleep: RecordedSleep) -> None:
    vendor.script(anthropic_error(400, "invalid_request_error", "max_tokens: too large"))
    [done] = await collect(ask(vendor, sleep))
    assert isinstance(done, Done) and (done.stop_reason, done.error_code) == ("error", "PROVIDER_ERROR")
    assert done.detail == "anthropic answered HTTP 400: max_tokens: too large"
    assert len(vendor.requests) == 1 and sleep.delays == []


@pytest.mark.asyncio
async def test_cancelling_the_consumer_closes_the_stream_promptly(vendor: MockVendor, sleep: RecordedSleep) -> None:
    vendor.script(Sse([anthropic_start(), *anthropic_text_block(0, "Hel")[:2]], hold=True))
    first = asyncio.Event()
    seen: list[StreamEvent] = []

    async def consume() -> None:
        async for event in ask(vendor, sleep):
            seen.append(event)
            first.set()

    task = asyncio.create_task(consume())
    async with asyncio.timeout(5):
        await first.wait()
        await vendor.holding.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await vendor.client_gone.wait()
    assert seen == [TextDelta("Hel")]
    assert sleep.delays == []
