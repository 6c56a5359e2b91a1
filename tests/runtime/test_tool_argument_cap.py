"""A tool call's arguments are bounded: what a model may send in one call never holds the host."""

from __future__ import annotations

from pathlib import Path

import pytest

from pidesk.core import events as ev
from pidesk.host import Host
from pidesk.providers.scripted import ScriptedProvider
from pidesk.runtime.loop import MAX_TOOL_ARGUMENTS
from tests.scenario import ended, prompt, session, state, tool, tool_results

pytestmark = pytest.mark.asyncio


async def test_a_tool_call_with_arguments_over_the_limit_is_not_kept_shown_or_run(
        host: Host, provider: ScriptedProvider, project: Path) -> None:
    """Authority hole 6 (10 MB tool arguments): every copy of a huge argument — the transcript line, the
    tool.started and message.appended events, each later request's history — held the event loop for
    one uninterruptible encoding (~25 ms per 10 MB, stalls of 80-140 ms in all). Past 1 MiB the call is
    kept with a note of its size instead, answered INVALID_ARGUMENTS telling the model to write in
    parts, and nothing is written; the turn goes on."""
    content = "a" * (MAX_TOOL_ARGUMENTS + 1)
    s = await session(host, project, permissionMode="auto")
    sub, watch = host.subscribe(), host.subscribe()
    provider.enqueue(s["id"], tool("Write", path="big.txt", content=content), tool("Write", path="ok.txt", content="ok"),
                     {"text": "done"})
    end = await ended(sub, (await prompt(host, s["id"]))["turnId"])
    assert end.reason == "completed"
    got = await state(host, s["id"])
    refused, written = tool_results(got["messages"], "Write")
    assert refused["errorCode"] == "INVALID_ARGUMENTS" and "write large content in parts" in refused["output"]
    assert written["ok"] is True and (project / "ok.txt").read_text() == "ok"
    assert not (project / "big.txt").exists()
    call = next(b for m in got["messages"] for b in m["content"] if b["type"] == "toolCall")
    assert set(call["args"]) == {"omitted"} and "over the 1,048,576-byte limit" in call["args"]["omitted"]
    assert host.store.transcripts.path(s["id"]).stat().st_size < MAX_TOOL_ARGUMENTS
    started = [e for _, e in watch.pending() if isinstance(e, ev.ToolStarted)]
    assert len(started[0].args["omitted"]) < 200
    # the model's next request carries the note, not the megabyte
    assert all(len(str(m.content)) < MAX_TOOL_ARGUMENTS for m in provider.requests[-1].messages)


async def test_arguments_at_the_limit_are_run(host: Host, provider: ScriptedProvider, project: Path) -> None:
    content = "b" * (MAX_TOOL_ARGUMENTS - 100)
    s = await session(host, project, permissionMode="auto")
    sub = host.subscribe()
    provider.enqueue(s["id"], tool("Write", path="big.txt", content=content), {"text": "done"})
    await ended(sub, (await prompt(host, s["id"]))["turnId"])
    assert (project / "big.txt").read_text() == content


async def test_a_call_whose_arguments_the_provider_did_not_keep_is_refused_with_its_size(
        host: Host, provider: ScriptedProvider, project: Path) -> None:
    """Issue 29 item 7: a provider that counted a call's arguments past what it keeps hands the runtime the
    call with its size only; the runtime refuses it with the same note as any oversized call."""
    from pidesk.providers.base import ToolCall

    original = provider.stream

    async def stream(request):  # the scripted answer, its Write's arguments not kept
        async for event in original(request):
            yield ToolCall(event.id, event.name, {}, oversized=120 << 20) if isinstance(event, ToolCall) else event

    provider.stream = stream  # type: ignore[method-assign]
    s = await session(host, project, permissionMode="auto")
    sub = host.subscribe()
    provider.enqueue(s["id"], tool("Write", path="big.txt", content="x"), {"text": "done"})
    assert (await ended(sub, (await prompt(host, s["id"]))["turnId"])).reason == "completed"
    refused = tool_results((await state(host, s["id"]))["messages"], "Write")[0]
    assert refused["errorCode"] == "INVALID_ARGUMENTS" and "125,829,120 bytes" in refused["output"]
    assert not (project / "big.txt").exists()
