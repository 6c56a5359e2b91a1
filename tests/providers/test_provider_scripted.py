"""The scripted provider's ``thinking`` fields: reasoning a test can script, with no vendor."""

from __future__ import annotations

import pytest

from pidesk.providers.base import Done, ModelRequest, StreamEvent, TextDelta, ThinkingDelta, Thought
from pidesk.providers.scripted import ScriptedProvider
from tests.scenario import ended, prompt, session


async def play(provider: ScriptedProvider) -> list[StreamEvent]:
    request = ModelRequest(session_id="s1", turn_id="t1", system="", messages=[], tools=[])
    return [event async for event in provider.stream(request)]


@pytest.mark.asyncio
async def test_a_scripted_response_streams_thinking_then_a_thought_before_its_text() -> None:
    """Issue 16 §2 (a fixture for `pidesk chat`'s dimmed thinking): a script could not make the model
    think, so no client test could see a thinking block. ``thinking`` streams its words as
    ThinkingDelta and ends in one Thought, before the text; ``thinkingRedacted`` gives a redacted one."""
    provider = ScriptedProvider([{"thinking": "Look at the README.", "text": "Hello."},
                                 {"thinkingRedacted": True, "text": "Again."}])
    first = await play(provider)
    assert [e for e in first if isinstance(e, ThinkingDelta)] == [ThinkingDelta("Look "), ThinkingDelta("at "),
                                                                  ThinkingDelta("the "), ThinkingDelta("README.")]
    kinds = [type(e) for e in first if not isinstance(e, ThinkingDelta)]
    assert kinds == [Thought, TextDelta, Done]
    assert first[4] == Thought("Look at the README.")
    second = await play(provider)
    assert second[0] == Thought("", redacted=True) and isinstance(second[1], TextDelta)


@pytest.mark.asyncio
async def test_thinking_from_a_script_is_stored_in_order_in_the_transcript(make_host, project) -> None:
    """Issue 16 §2: the scripted thinking reaches the transcript as a thinking block before the text."""
    host = make_host(provider=ScriptedProvider([{"thinking": "Hmm.", "text": "Answer."}]))
    s = await session(host, project)
    sub = host.subscribe()
    turn = await prompt(host, s["id"], "think")
    assert (await ended(sub, turn["turnId"])).reason == "completed"
    got = await host.session_get(s["id"])
    content = got["messages"][-1].content
    assert [type(b).__name__ for b in content] == ["ThinkingBlock", "TextBlock"]
    assert content[0].text == "Hmm." and content[1].text == "Answer."


@pytest.mark.asyncio
async def test_the_demo_model_answers_a_summary_request_with_a_summary_and_no_call() -> None:
    """Issue 30: `pidesk compact` on a demo session recorded the demo's next step as the summary."""
    from pidesk.core.records import Message, TextBlock
    from pidesk.providers.base import ModelRequest, TextDelta, ToolCall
    from pidesk.providers.demo import DemoProvider

    def user(seq: int, text: str) -> Message:
        return Message(id=f"m{seq}", session_id="s", turn_id="t", seq=seq, role="user",
                       content=[TextBlock(text=text)], created_at="")

    request = ModelRequest(session_id="s", turn_id="t", system="", tools=[{"name": "Write"}],
                           messages=[user(1, "add a changelog"), user(2, "Write a summary…")], tool_choice="none")
    events = [e async for e in DemoProvider().stream(request)]
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    assert text.startswith("## Goal\nadd a changelog") and not any(isinstance(e, ToolCall) for e in events)


@pytest.mark.asyncio
async def test_the_demo_model_counts_its_whole_input_and_never_quotes_the_hosts_note() -> None:
    """Issue 30, found using it: the demo model counted only the messages (a session never reached its
    window), and after a compaction its plan quoted the host's opening note as "You asked"."""
    from pidesk.core.records import Message, TextBlock, ToolCallBlock, ToolResultBlock
    from pidesk.providers.base import ModelRequest, ToolCall, UsageReport
    from pidesk.providers.demo import DemoProvider

    def user(seq: int, text: str) -> Message:
        return Message(id=f"m{seq}", session_id="s", turn_id="t", seq=seq, role="user",
                       content=[TextBlock(text=text)], created_at="")

    def answer(seq: int, name: str, output: str) -> list[Message]:
        call = ToolCallBlock(id=f"c{seq}", name=name, args={})
        result = ToolResultBlock(tool_call_id=f"c{seq}", name=name, ok=True, output=output)
        return [Message(id=f"m{seq}", session_id="s", turn_id="t", seq=seq, role="assistant", content=[call],
                        created_at=""),
                Message(id=f"m{seq}r", session_id="s", turn_id="t", seq=seq + 1, role="tool", content=[result],
                        created_at="")]

    tools = [{"name": "SubmitPlan", "description": "x" * 4000, "parameters": {}}, {"name": "Glob"}]
    # a compacted view: the host's opening note (seq 0), then the request kept verbatim, then the investigation
    messages = [user(0, "[The host's record of this session]"), user(7, "add a changelog"),
                *answer(8, "Glob", "README.md"), *answer(10, "Read", "# demo")]
    request = ModelRequest(session_id="s", turn_id="t", system="s" * 8000, tools=tools, messages=messages)
    events = [e async for e in DemoProvider().stream(request)]
    [usage] = [e for e in events if isinstance(e, UsageReport)]
    assert usage.prompt_tokens > 3000  # the system prompt and the tools, not only the messages
    [submit] = [e for e in events if isinstance(e, ToolCall)]
    assert submit.name == "SubmitPlan" and "You asked: “add a changelog”" in submit.args["markdown"]
