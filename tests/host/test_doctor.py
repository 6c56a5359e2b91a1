"""``host.doctor`` notices what it must (issue 29 item 5): a transcript that lost acknowledged messages."""

from __future__ import annotations

import pytest

from tests.scenario import ended, prompt, session

pytestmark = pytest.mark.asyncio


async def test_doctor_names_a_transcript_that_lost_acknowledged_messages(host, provider, project):
    """A revert of a project that was the data dir's transcripts/ rewrote another session's JSONL: it lost 2
    messages and host.doctor said ok. It now names the session and how many."""
    sessions = []
    for _ in range(2):
        s = await session(host, project)
        sub = host.subscribe()
        provider.enqueue(s["id"], {"text": "first answer"})
        await ended(sub, (await prompt(host, s["id"], "one"))["turnId"])
        provider.enqueue(s["id"], {"text": "second answer"})
        await ended(sub, (await prompt(host, s["id"], "two"))["turnId"])
        sessions.append(s["id"])
    report = await host.call("host.doctor", {})
    assert report["lostMessages"] == {} and report["integrity"] == "ok"
    damaged = host.store.transcripts.path(sessions[0])
    lines = damaged.read_bytes().splitlines(keepends=True)
    damaged.write_bytes(b"".join(lines[:-2]))  # the last turn's prompt and answer: gone
    report = await host.call("host.doctor", {})
    assert report["lostMessages"] == {sessions[0]: 2}
