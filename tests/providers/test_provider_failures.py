"""Failures a person can act on (issue 16 §4): each failure mode through the real provider code
against a fault-injecting mock, asserting the text a person reads (``Done.detail``, which becomes
the turn's ``errorMessage``) and the retries spent. Delays go through ``RecordedSleep`` (no real
backoff); the idle time is set small, so a stalled stream costs a fraction of a second."""

from __future__ import annotations

import asyncio

import pytest

from pidesk.core.records import TextBlock
from pidesk.providers import sse
from pidesk.providers.anthropic import AnthropicProvider
from pidesk.providers.base import Done, StreamEvent, TextDelta, ToolCall, UsageReport
from pidesk.providers.openai import OpenAIProvider
from pidesk.providers.retry import RetryPolicy
from pidesk.providers.sdk import SdkProvider
from tests.providers.mock_vendors import (
    OPENAI_DONE,
    Echo,
    MockVendor,
    Raw,
    Received,
    RecordedSleep,
    Reply,
    Silence,
    Sse,
    anthropic_error,
    anthropic_start,
    anthropic_text,
    anthropic_text_block,
    closed_port_url,
    collect,
    message,
    openai_call_delta,
    openai_chunk,
    openai_error,
    openai_text,
    openai_usage,
    request,
)

KEY = "sk-test-secret-0123456789abcdef"
IDLE = 0.3  # seconds: the stream idle time of the tests about a stalled stream
CALM = 30.0  # the others': a loaded CI machine must never turn a slow answer into a retry they do not expect


def openai(url: str, sleep: RecordedSleep, max_retries: int = 10, cap: float = 60.0,
           idle: float = CALM) -> OpenAIProvider:
    p = OpenAIProvider("gpt-test", api_key=KEY, base_url=f"{url}/v1", sleep=sleep)
    p.configure(RetryPolicy(max_retries, retry_after_cap=cap, idle_timeout=idle))
    return p


def anthropic(url: str, sleep: RecordedSleep, max_retries: int = 10, cap: float = 60.0,
              idle: float = CALM) -> AnthropicProvider:
    p = AnthropicProvider("claude-test", api_key=KEY, base_url=url, max_tokens=1024, sleep=sleep)
    p.configure(RetryPolicy(max_retries, retry_after_cap=cap, idle_timeout=idle))
    return p


async def ask(provider: SdkProvider) -> list[StreamEvent]:
    try:
        return await collect(provider.stream(request(message("user", TextBlock(text="hi")))))
    finally:
        await provider.aclose()


def call_answer(done: bool = True) -> Sse:
    """A tool call and nothing else: no text reaches the consumer before the response is complete."""
    frames = [openai_chunk(role="assistant", content=None),
              openai_chunk(tool_calls=[openai_call_delta(0, id="call_1", name="Read", arguments='{"path": "a"}')]),
              openai_chunk(finish_reason="tool_calls"), openai_usage(10, 2)]
    return Sse(frames + ([OPENAI_DONE] if done else []))


@pytest.mark.asyncio
async def test_a_key_the_server_echoes_never_reaches_the_error_message(vendor: MockVendor, sleep: RecordedSleep) -> None:
    """Issue 16 §4: errorMessage is the provider's status and message, secrets redacted — a server
    that echoes the Authorization header in its 401 body must not put the key in front of a person."""
    vendor.script(Echo(lambda r: openai_error(401, f"Incorrect API key; you sent '{r.headers['authorization']}'")))
    [done] = await ask(openai(vendor.url, sleep))
    assert isinstance(done, Done) and done.error_code == "PROVIDER_UNAUTHORIZED"
    assert done.detail == ("openai answered HTTP 401: Incorrect API key; you sent 'Bearer [redacted]' — check the "
                           "API key and its permissions")
    assert KEY not in done.detail and KEY[-12:] not in done.detail and sleep.delays == []


@pytest.mark.asyncio
async def test_an_anthropic_key_echoed_in_the_body_is_blanked_out(vendor: MockVendor, sleep: RecordedSleep) -> None:
    """Issue 16 §4: the key an Anthropic-compatible relay echoes is blanked out as well."""
    def echo(r: Received) -> Reply:
        sent = r.headers.get("x-api-key") or r.headers["authorization"].removeprefix("Bearer ")
        return anthropic_error(403, "permission_error", f"key {sent} may not")

    vendor.script(Echo(echo))
    [done] = await ask(anthropic(vendor.url, sleep))
    assert isinstance(done, Done) and done.error_code == "PROVIDER_UNAUTHORIZED"
    assert "anthropic answered HTTP 403: key [redacted] may not" in done.detail and KEY not in done.detail


@pytest.mark.asyncio
@pytest.mark.parametrize(("vendor_name", "status", "headers", "cap", "waited"), [
    ("openai", 503, {"retry-after": "2"}, 60.0, 2.0),
    ("anthropic", 529, {"retry-after-ms": "1500"}, 60.0, 1.5),
    ("anthropic", 503, {"retry-after": "3"}, 60.0, 3.0),
    ("openai", 429, {"retry-after": "600"}, 5.0, 5.0),  # capped by retry_after_cap
    ("openai", 503, {"retry-after": "600"}, 5.0, 5.0),
])
async def test_retry_after_is_honoured_on_429_503_529_up_to_the_cap(
    vendor: MockVendor, sleep: RecordedSleep, vendor_name: str, status: int, headers: dict[str, str], cap: float,
    waited: float,
) -> None:
    """Issue 16 §4: 503 and 529 ignored Retry-After (waiting 1 s into an overloaded server) and 429
    was cut at 30 s; each now waits what the server asks, up to the configurable cap."""
    if vendor_name == "openai":
        vendor.script(Reply(status, openai_error(status, "busy").body, headers), Sse(openai_text("ok")))
        provider: SdkProvider = openai(vendor.url, sleep, cap=cap)
    else:
        vendor.script(anthropic_error(status, "overloaded_error", "Overloaded", headers), Sse(anthropic_text("ok")))
        provider = anthropic(vendor.url, sleep, cap=cap)
    events = await ask(provider)
    assert isinstance(events[-1], Done) and events[-1].stop_reason == "end"
    assert sleep.delays == [waited] and len(vendor.requests) == 2


@pytest.mark.asyncio
async def test_a_server_that_never_answers_is_a_broken_stream_retried_then_given_up(
    vendor: MockVendor, sleep: RecordedSleep
) -> None:
    """Issue 16 §4: a server that accepts the request and then sends nothing used to hold the turn
    for the SDK's 10 minutes; after the idle time it is STREAM_FAILED, retried, and the message
    says so and how many retries were spent."""
    vendor.script(Silence(), Silence())
    [done] = await ask(openai(vendor.url, sleep, max_retries=1, idle=IDLE))
    assert isinstance(done, Done) and done.error_code == "STREAM_FAILED"
    assert done.detail == (f"the openai server sent nothing for {IDLE:g} s before its answer began "
                           "(stream_idle_timeout) (gave up after 1 retries)")
    assert sleep.delays == [1.0] and len(vendor.requests) == 2


@pytest.mark.asyncio
async def test_a_stream_that_stalls_mid_body_is_broken_and_replayed_while_nothing_was_shown(
    vendor: MockVendor, sleep: RecordedSleep
) -> None:
    """Issue 16 §4: a stream that stops sending mid-body (no byte for the idle time) is broken; with
    nothing of it shown, the request is replayed and the second answer is the turn's."""
    vendor.script(Sse([openai_chunk(role="assistant", content="")], hold=True), call_answer())
    events = await ask(openai(vendor.url, sleep, idle=IDLE))
    assert events[0] == ToolCall("call_1", "Read", {"path": "a"}) and events[-1] == Done("tool_calls")
    assert sleep.delays == [1.0] and len(vendor.requests) == 2


@pytest.mark.asyncio
async def test_an_anthropic_stream_that_stalls_after_text_fails_with_what_happened(
    vendor: MockVendor, sleep: RecordedSleep
) -> None:
    """Issue 16 §4: a stall after text was shown cannot be replayed (it would repeat the text): it
    is STREAM_FAILED at once, and the message says the stream went quiet."""
    vendor.script(Sse(anthropic_text("Hel", "lo")[:3], hold=True))
    events = await ask(anthropic(vendor.url, sleep, idle=IDLE))
    assert events[0] == TextDelta("Hel")
    done = events[-1]
    assert isinstance(done, Done) and done.error_code == "STREAM_FAILED"
    assert done.detail == (f"the anthropic server sent nothing for {IDLE:g} s in the middle of its answer "
                           "(stream_idle_timeout) (after part of the answer was streamed)")
    assert sleep.delays == [] and len(vendor.requests) == 1


@pytest.mark.asyncio
async def test_an_openai_stream_cut_after_its_finish_reason_is_broken(vendor: MockVendor, sleep: RecordedSleep) -> None:
    """Issue 16 §4: an OpenAI stream that ends after the finish reason but before the usage chunk and
    ``data: [DONE]`` lost its end (a proxy closing a finished-looking body): it is broken — replayed
    while nothing was shown."""
    cut = Sse(call_answer().frames[:3])  # the call and its finish reason; no usage, no [DONE]
    vendor.script(cut, cut, call_answer(done=True))
    events = await ask(openai(vendor.url, sleep))
    assert events[-1] == Done("tool_calls") and sleep.delays == [1.0, 2.0]


@pytest.mark.asyncio
async def test_a_whole_openai_stream_without_done_is_taken_as_the_sdk_takes_it(
    vendor: MockVendor, sleep: RecordedSleep
) -> None:
    """Issue 30 §5: some OpenAI-compatible servers close the body after the finish reason and the usage
    chunk, without ``data: [DONE]``; the official SDK takes that answer, and so does pidesk."""
    vendor.script(call_answer(done=False), Sse(openai_text("Hi")[:-1]))
    assert (await ask(openai(vendor.url, sleep)))[-1] == Done("tool_calls")
    events = await ask(openai(vendor.url, sleep))
    assert events == [TextDelta("Hi"), UsageReport(10, 2, 0), Done("end")] and sleep.delays == []


@pytest.mark.asyncio
async def test_an_openai_text_stream_cut_after_its_finish_reason_fails_naming_the_missing_end(
    vendor: MockVendor, sleep: RecordedSleep
) -> None:
    """Issue 16 §4: with its text already shown, a stream cut after its finish reason fails as
    STREAM_FAILED and says which end was missing."""
    vendor.script(Sse(openai_text("Hi")[:-2]))
    events = await ask(openai(vendor.url, sleep))
    assert events[:-1] == [TextDelta("Hi")]
    assert events[-1] == Done("error", "STREAM_FAILED", "the openai stream ended without data: [DONE] or usage "
                              "after its finish reason (the answer may be cut short) (after part of the answer "
                              "was streamed)")


@pytest.mark.asyncio
@pytest.mark.parametrize("vendor_name", ["openai", "anthropic"])
async def test_a_corrupt_chunk_before_any_output_is_retried_like_a_cut(
    vendor: MockVendor, sleep: RecordedSleep, vendor_name: str
) -> None:
    """Issue 16 §4: an event that is not JSON used to fail the turn at once as an 'unexpected
    DecodeError'; before any output it is a broken stream, and the request is replayed."""
    corrupt = b'data: {"choices": [{"delta": {"content": "Hi\n\n'
    if vendor_name == "openai":
        vendor.script(Sse([openai_chunk(role="assistant", content=""), corrupt]), Sse(openai_text("Hello")))
        provider: SdkProvider = openai(vendor.url, sleep)
    else:
        vendor.script(Sse([anthropic_start(), corrupt]), Sse(anthropic_text("Hello")))
        provider = anthropic(vendor.url, sleep)
    events = await ask(provider)
    assert events[0] == TextDelta("Hello") and isinstance(events[-1], Done) and events[-1].stop_reason == "end"
    assert sleep.delays == [1.0] and len(vendor.requests) == 2


@pytest.mark.asyncio
async def test_corrupt_chunks_every_time_give_up_saying_the_event_was_unreadable(
    vendor: MockVendor, sleep: RecordedSleep
) -> None:
    """Issue 16 §4: the corrupt event is named (its start) and the retries spent are counted."""
    corrupt = Sse([openai_chunk(role="assistant", content=""), b"data: <html>Bad gateway</html>\n\n"])
    vendor.script(corrupt, corrupt, corrupt)
    [done] = await ask(openai(vendor.url, sleep, max_retries=2))
    assert isinstance(done, Done) and done.error_code == "STREAM_FAILED"
    assert done.detail.startswith("the openai stream sent an unreadable event: ")
    assert "<html>Bad gateway</html>" in done.detail and done.detail.endswith("(gave up after 2 retries)")


@pytest.mark.asyncio
@pytest.mark.parametrize("vendor_name", ["openai", "anthropic"])
async def test_an_answer_that_never_ends_is_cut_off_and_not_asked_again(
    vendor: MockVendor, sleep: RecordedSleep, vendor_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server that streams without end (a loop, a hostile proxy) must not grow the host's memory
    without bound: past ``MAX_ANSWER_BYTES`` (made 1 MiB here) the body is not read further, the
    connection is closed, and the request is not sent again (it would only repeat)."""
    monkeypatch.setattr(sse, "MAX_ANSWER_BYTES", 1 << 20)
    if vendor_name == "openai":
        vendor.script(Sse([openai_chunk(role="assistant", content="")], forever=openai_chunk(content="x" * 1000)))
        provider: SdkProvider = openai(vendor.url, sleep)
    else:
        forever = anthropic_text_block(0, "x" * 1000)[1]
        vendor.script(Sse([anthropic_start(), anthropic_text_block(0)[0]], forever=forever))
        provider = anthropic(vendor.url, sleep)
    events = await ask(provider)
    done = events[-1]
    assert isinstance(done, Done) and done.error_code == "PROVIDER_ERROR"
    assert done.detail.startswith(f"the {vendor_name} answer went on for more than 1,048,576 bytes without ending: "
                                  "not read further")
    assert sum(len(e.text) for e in events if isinstance(e, TextDelta)) < 1 << 20
    assert len(vendor.requests) == 1 and sleep.delays == []
    await asyncio.wait_for(vendor.client_gone.wait(), 5)


@pytest.mark.asyncio
async def test_an_event_too_large_to_keep_is_a_broken_stream(vendor: MockVendor, sleep: RecordedSleep) -> None:
    """An event of more than 16 MiB, well-formed or not (no real one comes near it: tool arguments past
    1 MiB are refused anyway), is not kept whole waiting for its end: the stream is broken, and retried
    like one."""
    huge = Sse([openai_chunk(role="assistant", content=""), openai_chunk(content="x" * sse.MAX_EVENT_BYTES)])
    vendor.script(huge, Sse(openai_text("Hello")))
    events = await ask(openai(vendor.url, sleep))
    assert events[0] == TextDelta("Hello") and isinstance(events[-1], Done) and events[-1].stop_reason == "end"
    assert sleep.delays == [1.0] and len(vendor.requests) == 2


@pytest.mark.asyncio
@pytest.mark.parametrize("vendor_name", ["openai", "anthropic"])
async def test_a_refused_connection_says_which_address_could_not_be_reached(
    transport: str, sleep: RecordedSleep, vendor_name: str
) -> None:
    """Issue 16 §4: a refused connection fails, after the budget, with "could not reach <url>"."""
    url = await closed_port_url()
    provider = openai(url, sleep, max_retries=2) if vendor_name == "openai" else anthropic(url, sleep, max_retries=2)
    [done] = await ask(provider)
    assert isinstance(done, Done) and done.error_code == "PROVIDER_ERROR"
    where = f"{url}/v1" if vendor_name == "openai" else url
    assert done.detail.startswith(f"could not reach {vendor_name} at {where}: ")
    assert done.detail.endswith("(gave up after 2 retries)") and sleep.delays == [1.0, 2.0]


@pytest.mark.asyncio
async def test_a_huge_error_body_is_cut_but_keeps_the_retries_spent(vendor: MockVendor, sleep: RecordedSleep) -> None:
    """Issue 16 §4: an error page of megabytes does not become a megabyte errorMessage; the part
    a person needs (status, start of the message, retries spent) stays."""
    vendor.script(*[openai_error(502, "x" * 200_000)] * 2)
    [done] = await ask(openai(vendor.url, sleep, max_retries=1))
    assert isinstance(done, Done) and done.detail.startswith("openai answered HTTP 502: xxx")
    assert len(done.detail) < 1100 and done.detail.endswith("… (gave up after 1 retries)")



NGINX_502 = (b"<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n<center><h1>502 Bad Gateway</h1>"
             b"</center>\r\n<hr><center>nginx/1.25.3</center>\r\n</body>\r\n</html>\r\n")


@pytest.mark.asyncio
@pytest.mark.parametrize("vendor_name", ["openai", "anthropic"])
async def test_an_error_page_that_is_not_json_is_quoted_not_reduced_to_its_code(
    vendor: MockVendor, sleep: RecordedSleep, vendor_name: str
) -> None:
    """Issue 30 §5: a proxy's HTML 502 and a plain-text 503 said only "Error code: 502": a person reads
    the page's words (markup removed), then the retries spent."""
    make = openai if vendor_name == "openai" else anthropic
    vendor.script(Raw(502, NGINX_502), Raw(503, b"upstream connect error or disconnect/reset before headers",
                                           "text/plain"))
    [done] = await ask(make(vendor.url, sleep, max_retries=1))
    assert done == Done("error", "PROVIDER_ERROR", f'{vendor_name} answered HTTP 503: "upstream connect error or '
                        'disconnect/reset before headers" (gave up after 1 retries)')
    vendor.script(Raw(502, NGINX_502))
    [done] = await ask(make(vendor.url, sleep, max_retries=0))
    assert isinstance(done, Done) and done.detail == (f'{vendor_name} answered HTTP 502: "502 Bad Gateway 502 Bad '
                                                      'Gateway nginx/1.25.3" (gave up after 0 retries)')


@pytest.mark.asyncio
@pytest.mark.parametrize("vendor_name", ["openai", "anthropic"])
async def test_a_server_that_answers_a_stream_with_json_is_named_and_not_asked_again(
    vendor: MockVendor, sleep: RecordedSleep, vendor_name: str
) -> None:
    """Issue 30 §5: a server (or proxy) that answers ``stream: true`` with one JSON body was read as a
    stream cut short and asked again ten times; it is named for what it is, once, with its error if any."""
    make = openai if vendor_name == "openai" else anthropic
    vendor.script(Raw(200, b'{"id": "x", "choices": [{"message": {"content": "hi"}}]}', "application/json"))
    [done] = await ask(make(vendor.url, sleep))
    assert isinstance(done, Done) and (done.error_code, len(vendor.requests), sleep.delays) == (
        "PROVIDER_ERROR", 1, [])
    assert done.detail == (f"the {vendor_name} server answered a streaming request with plain JSON "
                           "(application/json), not a stream of events: it does not stream, or a proxy in between "
                           "buffers it")
    vendor.script(Raw(200, b'{"error": {"message": "streaming is disabled for this key"}}',
                      "application/json; charset=utf-8"))
    [done] = await ask(make(vendor.url, sleep))
    assert isinstance(done, Done) and done.detail.endswith('; it said "streaming is disabled for this key"')


@pytest.mark.asyncio
async def test_an_error_inside_an_openai_stream_is_quoted(vendor: MockVendor, sleep: RecordedSleep) -> None:
    """Issue 30 §5: an OpenAI-compatible server that reports its failure inside the event stream (status
    200): a person reads its words, not a code."""
    vendor.script(Sse([openai_chunk(role="assistant", content=""),
                       b'data: {"error": {"message": "the model backend crashed: CUDA out of memory", '
                       b'"type": "server_error", "code": 500}}\n\n']))
    [done] = await ask(openai(vendor.url, sleep, max_retries=0))
    assert done == Done("error", "PROVIDER_ERROR", "openai sent an error in the stream: the model backend crashed: "
                        "CUDA out of memory (gave up after 0 retries)")
