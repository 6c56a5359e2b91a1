"""Reasoning models and prompt caching (issue 16 §2-3), through the real providers and a real Host
against the vendor mocks: thinking stored in order and sent back as the vendor requires, reasoning
deltas, the Responses API's tool loop, cache breakpoints, cache usage split, smart stop."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from pidesk.cli.models import make_provider
from pidesk.core.errors import InvalidParams
from pidesk.providers.anthropic import AnthropicProvider
from pidesk.providers.openai import OpenAIProvider
from pidesk.providers.openai_responses import OpenAIResponsesProvider
from tests.providers.mock_vendors import (
    OPENAI_DONE,
    MockVendor,
    Sse,
    anthropic_end,
    anthropic_event,
    anthropic_redacted_block,
    anthropic_start,
    anthropic_text,
    anthropic_text_block,
    anthropic_thinking_block,
    anthropic_tool_use,
    openai_call_delta,
    openai_chunk,
    openai_usage,
    responses_call,
    responses_completed,
    responses_created,
    responses_reasoning,
    responses_text,
)
from tests.scenario import ended, prompt, session, state

KEY = "sk-test-0123456789"
EPHEMERAL = {"type": "ephemeral"}


def anthropic(vendor: MockVendor, **options: Any) -> AnthropicProvider:
    return AnthropicProvider("claude-test", api_key=KEY, base_url=vendor.url, max_tokens=1024, **options)


async def run_prompt(host: Any, project: Any, text: str = "read the readme") -> tuple[str, list[dict[str, Any]]]:
    s = await session(host, project)
    sub = host.subscribe()
    turn = await prompt(host, s["id"], text)
    assert (await ended(sub, turn["turnId"])).reason == "completed"
    return s["id"], (await state(host, s["id"]))["messages"]


@pytest.mark.asyncio
async def test_anthropic_thinking_goes_back_unchanged_with_its_signature_before_the_tool_use(make_host, project):
    """Issue 16 §2: with extended thinking and tools, the API refuses the next request unless the
    assistant's thinking blocks come back first, unchanged, signatures intact."""
    async with MockVendor() as vendor:
        vendor.script(
            Sse([anthropic_start(), *anthropic_thinking_block(0, "The user wants ", "the readme.", signature="sig-A1"),
                 *anthropic_text_block(1, "Reading."),
                 *anthropic_tool_use(2, "toolu_1", "Read", {"path": "README.md"}), *anthropic_end("tool_use")]),
            Sse([anthropic_start(), *anthropic_thinking_block(0, "It is short.", signature="sig-B2"),
                 *anthropic_text_block(1, "A demo project."), *anthropic_end()]),
        )
        host = make_host(provider=anthropic(vendor, thinking_budget=2048))
        _, messages = await run_prompt(host, project)

    first, second = (r.body for r in vendor.requests)
    assert first["thinking"] == {"type": "enabled", "budget_tokens": 2048}
    assert first["max_tokens"] == 1024 + 2048  # the budget comes on top of the answer's cap
    assert second["messages"][1] == {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "The user wants the readme.", "signature": "sig-A1"},
        {"type": "text", "text": "Reading."},
        {"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {"path": "README.md"}},
    ]}
    # the transcript keeps the thinking in order, the text after it
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant"]
    assert [(b["type"], b.get("text")) for b in messages[3]["content"]] == \
        [("thinking", "It is short."), ("text", "A demo project.")]
    assert messages[1]["content"][0]["redacted"] is False


@pytest.mark.asyncio
async def test_anthropic_redacted_thinking_goes_back_unchanged(make_host, project):
    """Issue 16 §2: a redacted_thinking block has no text, only encrypted data; dropping or
    altering it makes the API refuse the tool loop's next request."""
    async with MockVendor() as vendor:
        vendor.script(
            Sse([anthropic_start(), *anthropic_redacted_block(0, "EncRypTed=="),
                 *anthropic_thinking_block(1, "Then read.", signature="sig-C3"),
                 *anthropic_tool_use(2, "toolu_9", "Read", {"path": "README.md"}), *anthropic_end("tool_use")]),
            Sse(anthropic_text("Done.")),
        )
        host = make_host(provider=anthropic(vendor, effort="high"))
        _, messages = await run_prompt(host, project)

    first, second = (r.body for r in vendor.requests)
    assert (first["thinking"], first["output_config"]) == ({"type": "adaptive"}, {"effort": "high"})
    assert second["messages"][1]["content"][:2] == [
        {"type": "redacted_thinking", "data": "EncRypTed=="},
        {"type": "thinking", "thinking": "Then read.", "signature": "sig-C3"},
    ]
    assert messages[1]["content"][0]["type"] == "thinking" and messages[1]["content"][0]["redacted"] is True


@pytest.mark.asyncio
async def test_anthropic_cache_breakpoints_roll_with_the_loop_and_usage_keeps_reads_and_writes_apart(
    make_host, project
):
    """Issue 16 §3: breakpoints on tools, system and the last two user messages (never more than
    four), and Turn.usage counts cache reads and writes apart, cacheTokens their sum."""
    async with MockVendor() as vendor:
        vendor.script(
            Sse([anthropic_start(50, cache_read=0, cache_creation=900),
                 *anthropic_tool_use(0, "toolu_1", "Read", {"path": "README.md"}), *anthropic_end("tool_use")]),
            Sse([anthropic_start(20, cache_read=900, cache_creation=40),
                 *anthropic_tool_use(0, "toolu_2", "Read", {"path": "src/app.py"}), *anthropic_end("tool_use")]),
            Sse([anthropic_start(10, cache_read=940, cache_creation=30), *anthropic_text_block(0, "ok"),
                 *anthropic_end()]),
        )
        host = make_host(provider=anthropic(vendor))
        sid, _ = await run_prompt(host, project)

    for sent in vendor.requests:
        body = sent.body
        marked = [b for m in body["messages"] for b in m["content"] if "cache_control" in b]
        user_messages = [m for m in body["messages"] if m["role"] == "user"]
        assert body["tools"][-1]["cache_control"] == EPHEMERAL
        assert all("cache_control" not in t for t in body["tools"][:-1])
        assert body["system"][-1]["cache_control"] == EPHEMERAL
        assert marked == [m["content"][-1] for m in user_messages[-2:]]
        assert 1 + 1 + len(marked) <= 4
    assert len(vendor.requests[2].body["messages"]) == 5  # the pair moved with the loop
    turn = (await host.call("session.turns", {"sessionId": sid}))["turns"][-1]
    assert turn["usage"] == {"inputTokens": 80, "outputTokens": 15, "cacheTokens": 2810,
                             "cacheReadTokens": 1840, "cacheWriteTokens": 970}


@pytest.mark.asyncio
@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
async def test_openai_reasoning_deltas_become_thinking_blocks_never_sent_back(make_host, project, field):
    """Issue 16 §2: DeepSeek/vLLM/llama.cpp stream ``reasoning_content``, OpenRouter ``reasoning``;
    both were dropped. They become thinking blocks, before the text; Chat Completions takes no
    reasoning back. ``reasoning_effort`` and ``prompt_cache_key`` (the session id) are sent."""
    async with MockVendor() as vendor:
        vendor.script(
            Sse([openai_chunk(role="assistant", **{field: "I should "}), openai_chunk(**{field: "read it."}),
                 openai_chunk(tool_calls=[openai_call_delta(0, id="call_1", name="Read",
                                                            arguments='{"path": "README.md"}')]),
                 openai_chunk(finish_reason="tool_calls"), openai_usage(100, 20, cached=64), OPENAI_DONE]),
            Sse([openai_chunk(role="assistant", **{field: "Short file."}), openai_chunk(content="A demo."),
                 openai_chunk(finish_reason="stop"), openai_usage(130, 5), OPENAI_DONE]),
        )
        host = make_host(provider=OpenAIProvider("gpt-test", api_key=KEY, base_url=vendor.url,
                                                 reasoning_effort="high"))
        sid, messages = await run_prompt(host, project)

    assert [(b["type"], b.get("text")) for b in messages[1]["content"]] == \
        [("thinking", "I should read it."), ("toolCall", None)]
    assert [(b["type"], b.get("text")) for b in messages[3]["content"]] == \
        [("thinking", "Short file."), ("text", "A demo.")]
    first, second = (r.body for r in vendor.requests)
    assert (first["reasoning_effort"], first["prompt_cache_key"]) == ("high", sid)
    assert second["prompt_cache_key"] == sid
    assert second["messages"][-2] == {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "Read", "arguments": '{"path":"README.md"}'}}]}


@pytest.mark.asyncio
async def test_responses_api_tool_loop_round_trips_encrypted_reasoning_with_store_false(make_host, project):
    """Issue 16 §2: ``openai-responses/<model>``: function calls, reasoning items sent back whole
    with their encrypted content (store=false keeps nothing server-side), usage recorded."""
    async with MockVendor() as vendor:
        vendor.script(
            Sse([responses_created(), *responses_reasoning(0, "rs_1", "Need the ", "readme.", encrypted="gAAAenc1"),
                 *responses_call(1, "call_r1", "Read", {"path": "README.md"}),
                 responses_completed(200, 30, cached=128)]),
            Sse([responses_created(), *responses_text(0, "A demo ", "project."), responses_completed(260, 8)]),
        )
        host = make_host(provider=OpenAIResponsesProvider("gpt-test", api_key=KEY, base_url=vendor.url,
                                                          reasoning_effort="medium"))
        sid, messages = await run_prompt(host, project)

    first, second = vendor.requests
    assert first.path == "/responses"
    assert {k: first.body[k] for k in ("store", "include", "reasoning", "prompt_cache_key", "stream")} == {
        "store": False, "include": ["reasoning.encrypted_content"], "reasoning": {"effort": "medium", "summary": "auto"},
        "prompt_cache_key": sid, "stream": True}
    assert first.body["instructions"] and first.body["input"] == [{"role": "user", "content": "read the readme"}]
    assert {"type": "function", "name": "Read"}.items() <= first.body["tools"][0].items()
    assert second.body["input"][1:] == [
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "Need the readme."}],
         "encrypted_content": "gAAAenc1", "status": "completed"},
        {"type": "function_call", "call_id": "call_r1", "name": "Read", "arguments": '{"path":"README.md"}'},
        {"type": "function_call_output", "call_id": "call_r1", "output": second.body["input"][3]["output"]},
    ]
    assert "demo project" in second.body["input"][3]["output"]
    assert messages[1]["content"][0]["text"] == "Need the readme."
    assert messages[3]["content"] == [{"type": "text", "text": "A demo project."}]
    turn = (await host.call("session.turns", {"sessionId": sid}))["turns"][-1]
    assert turn["usage"] == {"inputTokens": 460, "outputTokens": 38, "cacheTokens": 128,
                             "cacheReadTokens": 128, "cacheWriteTokens": 0}


@pytest.mark.asyncio
async def test_a_smart_stop_after_only_thinking_restores_no_draft(make_host, project):
    """Seed 003 §3 rule 4 names thinking as output: a smart stop once the model has begun to think
    keeps the prompt in the transcript instead of handing the draft back as if nothing happened."""
    async with MockVendor() as vendor:
        vendor.script(Sse([anthropic_start(), anthropic_event("content_block_start", index=0, content_block={
            "type": "thinking", "thinking": "", "signature": ""}),
            anthropic_event("content_block_delta", index=0, delta={"type": "thinking_delta", "thinking": "Hmm"})],
            hold=True))
        host = make_host(provider=anthropic(vendor, thinking_budget=1024))
        s = await session(host, project)
        await host.call("agent.prompt", {"sessionId": s["id"], "text": "think first"})
        await vendor.holding.wait()
        live = host.parts.live.turns[s["id"]]
        async with asyncio.timeout(10):  # the thinking delta reaches the loop
            while not live.has_output:
                await asyncio.sleep(0.005)
        aborted = await host.call("agent.abort", {"sessionId": s["id"], "smart": True})
        assert aborted == {"aborted": True}
        assert [m["role"] for m in (await state(host, s["id"]))["messages"]] == ["user"]


def test_thinking_settings_are_checked_and_name_the_key() -> None:
    """A bad per-model setting is MODEL_NOT_CONFIGURED naming the key, not a 400 from the vendor later."""
    secrets = {"ANTHROPIC_API_KEY": KEY}
    with pytest.raises(InvalidParams, match="thinking_budget must be at least 1024"):
        make_provider("anthropic/claude-x", secrets, settings={"thinking_budget": 100})
    with pytest.raises(InvalidParams, match="effort = 'extreme'"):
        make_provider("anthropic/claude-x", secrets, settings={"effort": "extreme"})
    responses = make_provider("openai-responses/o4-mini", {"OPENAI_API_KEY": KEY},
                              settings={"reasoning_effort": "low"})
    assert isinstance(responses, OpenAIResponsesProvider) and responses.name == "openai-responses/o4-mini"


@pytest.mark.asyncio
@pytest.mark.parametrize("send_back", [True, False])
async def test_thinking_models_that_need_their_reasoning_in_a_tool_loop_get_it_back(make_host, project, send_back):
    """Issue 30 §5: DeepSeek's and Kimi's thinking models refuse a tool loop whose assistant turns lost
    their ``reasoning_content``; with the model's ``reasoning_content = true`` setting the answer that
    called a tool carries it back. Without it, nothing changes (other servers refuse the field)."""
    async with MockVendor() as vendor:
        vendor.script(
            Sse([openai_chunk(role="assistant", reasoning_content="I should read it."),
                 openai_chunk(tool_calls=[openai_call_delta(0, id="call_1", name="Read",
                                                            arguments='{"path": "README.md"}')]),
                 openai_chunk(finish_reason="tool_calls"), openai_usage(100, 20), OPENAI_DONE]),
            Sse([openai_chunk(role="assistant", content="A demo."), openai_chunk(finish_reason="stop"),
                 openai_usage(130, 5), OPENAI_DONE]),
        )
        provider = make_provider("openai/kimi-k2-thinking", {"OPENAI_API_KEY": KEY, "OPENAI_BASE_URL": vendor.url},
                                 settings={"reasoning_content": send_back})
        host = make_host(provider=provider)
        await run_prompt(host, project)
    assistant = vendor.requests[1].body["messages"][-2]
    assert assistant["tool_calls"][0]["id"] == "call_1"
    assert assistant.get("reasoning_content") == ("I should read it." if send_back else None)


@pytest.mark.asyncio
@pytest.mark.parametrize(("model", "asks_first"), [("o4-mini", True), ("gpt-5-codex", True), ("local-model", False)])
async def test_the_responses_api_asks_for_encrypted_reasoning_whenever_the_model_reasons(
        make_host, project, model, asks_first):
    """Issue 30 §5: a reasoning model asked nothing about reasoning sent back items the next request could
    not use (store=false) and showed no summary. A model known to reason asks from its first request;
    any other asks once it has sent a reasoning item."""
    async with MockVendor() as vendor:
        vendor.script(
            Sse([responses_created(), *responses_reasoning(0, "rs_1", "Need the readme."),
                 *responses_call(1, "call_r1", "Read", {"path": "README.md"}), responses_completed(200, 30)]),
            Sse([responses_created(), *responses_text(0, "A demo project."), responses_completed(260, 8)]),
        )
        host = make_host(provider=OpenAIResponsesProvider(model, api_key=KEY, base_url=vendor.url))
        await run_prompt(host, project)
    first, second = (r.body for r in vendor.requests)
    asked = {"reasoning": {"summary": "auto"}, "include": ["reasoning.encrypted_content"]}
    assert {k: first.get(k) for k in asked} == (asked if asks_first else {"reasoning": None, "include": None})
    assert {k: second.get(k) for k in asked} == asked
    assert not any(item.get("type") == "reasoning" for item in second["input"])  # (it came without encryption)
