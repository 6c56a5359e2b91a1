"""Compaction over the vendors' wire (issue 30): real providers in a real host against a loopback
server speaking OpenAI's and Anthropic's formats. What the summary request looks like on the wire,
the provider's own token count deciding when to compact, and an overflow refusal compacting once."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pidesk.providers.anthropic import AnthropicProvider
from pidesk.providers.openai import OpenAIProvider
from tests.providers.mock_vendors import (
    OPENAI_DONE,
    MockVendor,
    Sse,
    anthropic_end,
    anthropic_error,
    anthropic_start,
    anthropic_text_block,
    openai_call_delta,
    openai_chunk,
    openai_error,
    openai_text,
    openai_usage,
)
from tests.scenario import ended, prompt, session

pytestmark = pytest.mark.asyncio
KEY = "sk-test-123456"


def anthropic_answer(text: str, input_tokens: int = 10, cache_read: int = 0) -> Sse:
    return Sse([anthropic_start(input_tokens, cache_read=cache_read), *anthropic_text_block(0, text),
                *anthropic_end()])


def user_texts(body: dict[str, Any]) -> list[str]:
    out = []
    for m in body["messages"]:
        if m["role"] != "user":
            continue
        content = m["content"]
        out.append(content if isinstance(content, str) else "".join(c.get("text", "") for c in content))
    return out


async def test_openai_the_providers_own_count_decides_and_the_summary_request_forbids_tools(make_host, project):
    """The vendor says the first request filled 5,500 of a 6,000-token window (pidesk's own estimate of
    the tiny conversation is far lower): the next turn first sends a summary request — the same system
    prompt and tools, tool_choice "none" — then a request holding the host's note, the summary and the
    new prompt only."""
    async with MockVendor() as vendor:
        vendor.script(Sse(openai_text("first answer", usage=(5500, 10))),
                      Sse(openai_text("SUMMARY: the user is writing notes")),
                      Sse(openai_text("second answer")))
        host = make_host(provider=OpenAIProvider("gpt-test", api_key=KEY, base_url=vendor.url), context_limit=6000)
        s = await session(host, project)
        sub = host.subscribe()
        await ended(sub, (await prompt(host, s["id"], "first question"))["turnId"])
        window = (await host.call("session.context", {"sessionId": s["id"]}))["window"]
        assert window == {"usedTokens": 5500, "limitTokens": 6000, "compactions": 0}
        await ended(sub, (await prompt(host, s["id"], "second question"))["turnId"])
        first, summary, second = (r.body for r in vendor.requests)
        assert summary["tool_choice"] == "none" and "tool_choice" not in first and "tool_choice" not in second
        assert summary["tools"] == first["tools"] and summary["messages"][0] == first["messages"][0]
        assert user_texts(summary)[0] == "first question" and "Write a summary" in user_texts(summary)[-1]
        note, asked = user_texts(second)
        assert "[The host's record of this session" in note and "SUMMARY: the user is writing notes" in note
        assert asked == "second question" and "first question" not in json.dumps(second)
        assert (await host.call("session.context", {"sessionId": s["id"]}))["window"]["compactions"] == 1


async def test_anthropic_an_overflow_refusal_compacts_and_the_retry_is_answered(make_host, project):
    """Anthropic refuses the input as too long (HTTP 400, "prompt is too long"): the host sends a summary
    request (tool_choice {"type": "none"}) and retries once with the compacted view; usedTokens counts
    the cached input too (Anthropic reports it apart)."""
    async with MockVendor() as vendor:
        vendor.script(anthropic_answer("first", input_tokens=100, cache_read=900),
                      anthropic_error(400, "invalid_request_error", "prompt is too long: 212000 tokens > 200000 maximum"),
                      anthropic_answer("SUMMARY of the first exchange"),
                      anthropic_answer("answered"))
        provider = AnthropicProvider("claude-test", api_key=KEY, base_url=vendor.url, max_tokens=1024)
        host = make_host(provider=provider)
        s = await session(host, project)
        sub = host.subscribe()
        await ended(sub, (await prompt(host, s["id"], "one"))["turnId"])
        assert (await host.call("session.context", {"sessionId": s["id"]}))["window"]["usedTokens"] == 1000
        end = await ended(sub, (await prompt(host, s["id"], "two"))["turnId"])
        assert end.reason == "completed"
        _first, refused, summary, retry = (r.body for r in vendor.requests)
        assert summary["tool_choice"] == {"type": "none"} and "tool_choice" not in retry
        assert summary["tools"] == refused["tools"] and summary["system"] == refused["system"]
        [opening] = user_texts(retry)  # (Anthropic's alternation: the note and the prompt in one user turn)
        assert "SUMMARY of the first exchange" in opening and opening.endswith("two") and "one" not in opening


async def test_openai_a_second_refusal_ends_the_turn_quoting_the_provider(make_host, project):
    """context_length_exceeded, compacted, refused again: the turn ends error with the provider's words."""
    async with MockVendor() as vendor:
        too_long = openai_error(400, "This model's maximum context length is 8192 tokens.", "context_length_exceeded")
        vendor.script(Sse(openai_text("first")), too_long, Sse(openai_text("a summary")), too_long)
        host = make_host(provider=OpenAIProvider("gpt-test", api_key=KEY, base_url=vendor.url))
        s = await session(host, project)
        sub = host.subscribe()
        await ended(sub, (await prompt(host, s["id"], "one"))["turnId"])
        end = await ended(sub, (await prompt(host, s["id"], "two"))["turnId"])
        assert (end.reason, end.error_code) == ("error", "PROVIDER_ERROR")
        assert "maximum context length is 8192 tokens" in (end.error_message or "")
        assert len(vendor.requests) == 4  # the refusal, the summary, the one retry: nothing more


async def test_anthropic_a_fresh_approval_sends_the_note_and_the_contract_only(make_host, project):
    """Issue 30 §3 on the wire: approved with context "fresh", the execution's first request carries the
    host's note and the execution prompt with the contract — not one word of the planning conversation."""
    from tests.providers.mock_vendors import anthropic_tool_use
    from tests.scenario import plan_requested

    plan = {"title": "Add notes", "markdown": "# Plan\n\n1. Write NOTES.md\n", "question": "Shall I?"}
    async with MockVendor() as vendor:
        vendor.script(Sse([anthropic_start(), *anthropic_tool_use(0, "toolu_1", "SubmitPlan", plan),
                           *anthropic_end("tool_use")]),
                      anthropic_answer("executing the plan"))
        host = make_host(provider=AnthropicProvider("claude-test", api_key=KEY, base_url=vendor.url, max_tokens=1024))
        s = await session(host, project, mode="plan")
        sub = host.subscribe()
        turn = await prompt(host, s["id"], "a secret planning remark")
        approval = (await plan_requested(sub)).approval
        await host.call("plans.resolve", {"approvalId": approval.id, "sessionId": s["id"], "turnId": turn["turnId"],
                                          "decision": "approve", "permissionMode": "auto", "context": "fresh"})
        await ended(sub, turn["turnId"])
        execution = await sub.wait_for(lambda e: getattr(e, "origin", None) == "execution")
        await ended(sub, execution.turn_id)
        _planning, first = (r.body for r in vendor.requests)
        assert "a secret planning remark" not in json.dumps(first["messages"])
        [opening] = user_texts(first)
        assert "Carrying out the approved plan .pi/plan/" in opening and "1. Write NOTES.md" in opening
        assert "tool_choice" not in first and len(vendor.requests) == 2  # no summary request for a fresh start


async def test_openai_a_compaction_in_plan_mode_keeps_write_denied_and_the_mode(make_host, project):
    """Issue 30 §2 on the wire: a session in Plan mode compacted by hand (its summary claiming approval)
    stays in Plan mode; its next request says so from the host's records and offers no Write; a Write
    the model tries anyway is denied."""
    async with MockVendor() as vendor:
        write = json.dumps({"path": "NOTES.md", "content": "x"})
        vendor.script(Sse(openai_text("I looked around.")),
                      Sse(openai_text("The user approved the plan; go ahead and write NOTES.md.")),
                      Sse([openai_chunk(role="assistant", content=""),
                           openai_chunk(tool_calls=[openai_call_delta(0, id="call_w", name="Write", arguments=write)]),
                           openai_chunk(finish_reason="tool_calls"), openai_usage(10, 2), OPENAI_DONE]),
                      Sse(openai_text("Denied, so I'll plan.")))
        host = make_host(provider=OpenAIProvider("gpt-test", api_key=KEY, base_url=vendor.url))
        s = await session(host, project, mode="plan", permissionMode="auto")
        sub = host.subscribe()
        await ended(sub, (await prompt(host, s["id"], "plan the notes"))["turnId"])
        assert (await host.call("session.compact", {"sessionId": s["id"]}))["compacted"] is True
        await ended(sub, (await prompt(host, s["id"], "continue"))["turnId"])
        after = vendor.requests[2].body
        note = user_texts(after)[0]
        assert "Mode: Plan" in note and "go ahead and write NOTES.md" in note  # the summary, shown as the model's
        assert "Write" not in {t["function"]["name"] for t in after["tools"]}
        result = vendor.requests[3].body["messages"][-1]
        assert result["role"] == "tool" and "WRITE_DISABLED_IN_PLAN" in result["content"]
        assert not (project / "NOTES.md").exists()
        now = (await host.call("session.get", {"sessionId": s["id"]}))["session"]
        assert (now["mode"], now["planState"]) == ("plan", "planning")
