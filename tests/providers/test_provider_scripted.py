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

