"""A real provider inside a real Host: the agent loop over the vendor wire format, usage stored."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest

from pidesk.core.events import TurnEnded
from pidesk.providers.openai import OpenAIProvider
from tests.providers.mock_vendors import OPENAI_DONE, MockVendor, Sse, openai_call_delta, openai_chunk, openai_text, openai_usage
from tests.scenario import ended, prompt, session, state


def write_call() -> Sse:
    args = json.dumps({"path": "hello.txt", "content": "hi\n"})
    return Sse([
        openai_chunk(role="assistant", content=""),
        openai_chunk(tool_calls=[openai_call_delta(0, id="call_1", name="Write", arguments=args[:10])]),
        openai_chunk(tool_calls=[openai_call_delta(0, arguments=args[10:])]),
        openai_chunk(finish_reason="tool_calls"), openai_usage(100, 20, cached=40), OPENAI_DONE,
    ])


@pytest.mark.asyncio
async def test_an_openai_turn_runs_tools_through_the_host_and_records_usage(make_host, project):
    async with MockVendor() as vendor:
        vendor.script(write_call(), Sse(openai_text("Wrote ", "it.", usage=(150, 5))))
        host = make_host(provider=OpenAIProvider("gpt-test", api_key="sk-test-123456", base_url=vendor.url))
        s = await session(host, project, permissionMode="accept-edits")
        sub = host.subscribe()
        turn = await prompt(host, s["id"], "write hello")
        assert (await ended(sub, turn["turnId"])).reason == "completed"
        assert (project / "hello.txt").read_text() == "hi\n"
        second = vendor.requests[1].body["messages"]
        assert [m["role"] for m in second][-3:] == ["user", "assistant", "tool"]
        assert second[-1]["tool_call_id"] == "call_1"
        row = (await host.call("session.turns", {"sessionId": s["id"]}))["turns"][-1]
        assert row["usage"] == {"inputTokens": 250, "outputTokens": 25, "cacheTokens": 40,
                                "cacheReadTokens": 40, "cacheWriteTokens": 0}
        assert (await state(host, s["id"]))["messages"][-1]["content"][0]["text"] == "Wrote it."


def test_a_missing_key_is_a_clear_error_not_a_traceback(project, data_dir):
    done = subprocess.run([sys.executable, "-m", "pidesk", "run", str(project), "hi", "--model", "anthropic/claude-x",
                           "--data-dir", str(data_dir)], capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(data_dir)})
    assert done.returncode == 2
    assert "PROVIDER_SECRET_MISSING" in done.stderr and "ANTHROPIC_API_KEY" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.asyncio
async def test_usage_is_summed_on_the_session(host, provider, project):
    s = await session(host, project)
    sub = host.subscribe()
    provider.enqueue(s["id"], {"text": "a", "usage": {"inputTokens": 10, "outputTokens": 2}},
                     {"text": "b", "usage": {"inputTokens": 7, "outputTokens": 1, "cacheTokens": 3}})
    await ended(sub, (await prompt(host, s["id"]))["turnId"])
    await ended(sub, (await prompt(host, s["id"]))["turnId"])
    got = (await state(host, s["id"]))["session"]["usage"]
    assert got == {"inputTokens": 17, "outputTokens": 3, "cacheTokens": 3, "cacheReadTokens": 3,
                   "cacheWriteTokens": 0}


@pytest.mark.asyncio
async def test_abort_mid_stream_closes_the_request_and_records_nothing_after_it(make_host, project):
    async with MockVendor() as vendor:
        vendor.script(Sse([openai_chunk(role="assistant", content=""), openai_chunk(content="thinking about ")],
                          hold=True))
        host = make_host(provider=OpenAIProvider("gpt-test", api_key="sk-test-123456", base_url=vendor.url))
        s = await session(host, project)
        sub = host.subscribe()
        turn = await prompt(host, s["id"], "go")
        await vendor.holding.wait()
        assert (await host.call("agent.abort", {"sessionId": s["id"]}))["aborted"] is True
        await asyncio.wait_for(vendor.client_gone.wait(), 10)
        end = [e for _, e in sub.pending() if isinstance(e, TurnEnded)]
        assert [(e.turn_id, e.reason) for e in end] == [(turn["turnId"], "aborted")]
        assert [m["role"] for m in (await state(host, s["id"]))["messages"]] == ["user"]
        assert len(vendor.requests) == 1  # an aborted stream is never retried


@pytest.mark.asyncio
async def test_a_retry_wait_is_announced_as_turn_retrying(make_host, project):
    """Issue 30 §5: while a turn's request waits to be sent again, clients hear turn.retrying
    {attempt, of, waitS, reason} — then the turn completes on the retry."""
    from pidesk.core.events import TurnRetrying
    from pidesk.providers.retry import RetryPolicy
    from tests.providers.mock_vendors import RecordedSleep, openai_error

    async with MockVendor() as vendor:
        vendor.script(openai_error(503, "the server is busy"), Sse(openai_text("fine now")))
        sleep = RecordedSleep()
        provider = OpenAIProvider("gpt-test", api_key="sk-test-123456", base_url=vendor.url, sleep=sleep)
        provider.configure(RetryPolicy(4))
        host = make_host(provider=provider)
        s = await session(host, project)
        sub = host.subscribe()
        turn = await prompt(host, s["id"], "hi")
        retry = await sub.wait_for(lambda e: isinstance(e, TurnRetrying))
        assert isinstance(retry, TurnRetrying)
        assert (retry.session_id, retry.turn_id, retry.attempt, retry.of, retry.wait_s) == (
            s["id"], turn["turnId"], 1, 4, 1.0)
        assert retry.reason == "openai answered HTTP 503: the server is busy"
        assert (await ended(sub, turn["turnId"])).reason == "completed"
        await provider.aclose()
