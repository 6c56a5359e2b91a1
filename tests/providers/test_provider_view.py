"""The request a turn sends is the same whether its session's view is kept warm, built again after a
smart stop cut the transcript, built cold after it was evicted, or built by a restarted host (issue 33
§2: a request decodes only what is new) — as sent over the wire to a loopback server speaking OpenAI's
format. A fork, and any other session, has a view of its own."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from pidesk.providers.openai import OpenAIProvider
from pidesk.runtime.context_window import model_view
from tests.providers.mock_vendors import (
    OPENAI_DONE,
    MockVendor,
    Silence,
    Sse,
    openai_call_delta,
    openai_chunk,
    openai_text,
    openai_usage,
)
from tests.scenario import ended, prompt, session

pytestmark = pytest.mark.asyncio
KEY = "sk-test-123456"


def read_call(call_id: str) -> Sse:
    return Sse([
        openai_chunk(role="assistant", content=""),
        openai_chunk(tool_calls=[openai_call_delta(0, id=call_id, name="Read", arguments='{"path": "README.md"}')]),
        openai_chunk(finish_reason="tool_calls"), openai_usage(100, 20), OPENAI_DONE,
    ])


def texts(body: dict[str, Any]) -> list[str]:
    out = []
    for m in body["messages"]:
        content = m.get("content") or ""
        out.append(content if isinstance(content, str) else "".join(c.get("text", "") for c in content))
    return out


async def test_the_request_is_the_same_warm_after_a_cut_evicted_and_after_a_restart(make_host, project):
    async with MockVendor() as vendor:
        vendor.script(Sse(openai_text("first answer", usage=(5500, 10))),  # nearly full: the next turn compacts
                      Sse(openai_text("SUMMARY: the user is writing notes")),
                      read_call("call_1"), Sse(openai_text("second answer")))
        provider = OpenAIProvider("gpt-test", api_key=KEY, base_url=vendor.url)
        host = make_host(provider=provider, context_limit=6000)
        s = await session(host, project, permissionMode="auto")
        other = await session(host, project)
        sub = host.subscribe()
        await ended(sub, (await prompt(host, s["id"], "first question"))["turnId"])
        await ended(sub, (await prompt(host, s["id"], "second question"))["turnId"])
        bodies: list[dict[str, Any]] = []

        async def third() -> None:
            """The next turn's request as sent; then a smart stop takes the turn back (the prompt is cut)."""
            vendor.holding.clear()
            vendor.script(Silence())
            turn = await prompt(host, s["id"], "third question")
            await asyncio.wait_for(vendor.holding.wait(), 10)
            bodies.append(vendor.requests[-1].body)
            aborted = await host.call("agent.abort", {"sessionId": s["id"], "smart": True})
            assert aborted["restoredDraft"]["text"] == "third question"
            await ended(sub, turn["turnId"])

        await third()  # warm: kept since the second turn
        await third()  # built again: the smart stop cut the transcript
        host.compactions.views.max_views = 1
        await host.call("session.context", {"sessionId": other["id"]})  # another session's view pushes it out
        assert s["id"] not in host.compactions.views._views
        await third()  # evicted: built cold
        await host.close()
        host = make_host(provider=provider, context_limit=6000)
        sub = host.subscribe()
        await third()  # a restarted host
        assert all(body == bodies[0] for body in bodies[1:])
        opening, *rest = texts(bodies[0])[1:]  # (after the system prompt)
        assert opening.startswith("[The host's record of this session") and opening.endswith(
            "SUMMARY: the user is writing notes")
        assert rest[0] == "second question" and rest[-1] == "third question"
        assert "first question" not in json.dumps(bodies[0])
        assert len(rest) == len(model_view(host.store.messages(s["id"]), 6000))  # (the opening aside, the prompt added)


async def test_a_fork_and_another_session_each_see_their_own_transcript(make_host, project):
    """A fork of a session with a kept view, then more turns on the source and on a third session: the
    fork's next request holds the source's history up to the fork and its own prompt, nothing after."""
    async with MockVendor() as vendor:
        vendor.script(*(Sse(openai_text(f"answer {n}")) for n in range(5)))
        host = make_host(provider=OpenAIProvider("gpt-test", api_key=KEY, base_url=vendor.url))
        source, third = await session(host, project), await session(host, project)
        sub = host.subscribe()
        await ended(sub, (await prompt(host, source["id"], "before the fork"))["turnId"])
        fork = await host.call("session.fork", {"sessionId": source["id"]})
        await ended(sub, (await prompt(host, source["id"], "source after the fork"))["turnId"])
        await ended(sub, (await prompt(host, third["id"], "another session"))["turnId"])
        await ended(sub, (await prompt(host, fork["id"], "in the fork"))["turnId"])
        await ended(sub, (await prompt(host, source["id"], "source again"))["turnId"])
        *_, in_fork, source_again = (texts(r.body)[1:] for r in vendor.requests)
        assert in_fork == ["before the fork", "answer 0", "in the fork"]
        assert source_again == ["before the fork", "answer 0", "source after the fork", "answer 1", "source again"]
