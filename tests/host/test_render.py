"""Markdown rendered by the host is safe to put in a page, and rendering it never holds the event loop."""

from __future__ import annotations

import asyncio
import contextlib
import html as html_module
import re
import time
import uuid
from pathlib import Path

import pytest
import pytest_asyncio
from hypothesis import given, settings
from hypothesis import strategies as st

from pidesk.core import events as ev
from pidesk.host.render import MAX_RENDERED, SLACK, TIME_BOUND, render_html, render_markdown
from tests.scenario import Ticker, ended, plan_requested, prompt, session, state, submit_goal, submit_plan, tool_results


def test_markdown_renders_and_raw_html_is_shown_as_text():
    html = render_markdown("# Plan\n\n1. **Write** `NOTES.md`\n\n<script>alert(1)</script>\n<img src=x onerror=y>")
    assert "<h1>Plan</h1>" in html and "<strong>Write</strong>" in html and "<code>NOTES.md</code>" in html
    assert "<script" not in html and "<img" not in html and "&lt;script&gt;" in html


@pytest.mark.parametrize("link", ["javascript:alert(1)", "JAVASCRIPT:alert(1)", "data:text/html,x", "vbscript:x"])
def test_dangerous_links_are_not_links(link):
    assert "href" not in render_markdown(f"[click]({link})")


def test_safe_links_stay():
    html = render_markdown("[a](https://example.com) [b](docs/x.md) [c](mailto:me@example.com)")
    assert html.count("href=") == 3


# ---- off the event loop, bounded (issue 15, authority hole 5) --------------------------------------

BOUND = TIME_BOUND + SLACK + 1.0  # the answer's bound, plus room for a busy machine to escape the text
# Seconds the event loop may go without running a 10 ms ticker. Idle, the loop here keeps it under
# ~20 ms while a render runs; but on a loaded 2-CPU machine an idle loop alone sees gaps of ~0.2 s
# (the scheduler's, not ours), while each render these tests make froze the loop for 6 s to minutes.
MAX_GAP = 0.5


@pytest_asyncio.fixture
async def warm() -> None:
    """The worker process started, as after the host's first render (its start-up, ~0.1-1 s, is not a render's)."""
    await render_html(unique("warm"))


def unique(text: str) -> str:
    """Each test its own text: answers are cached by content for the life of the process."""
    return f"{text} {uuid.uuid4().hex}"


@pytest.mark.asyncio
@pytest.mark.parametrize("pathological", ["[" * 1_000_000, "[](" * 250_000])
async def test_a_pathological_markdown_render_is_bounded_and_never_freezes_the_host(make_host, warm, pathological):
    """Authority hole 5: markdown.render of "[" * 1_000_000 froze the host for 18.8 s ("[](" repeated is
    quadratic). It now answers within the time bound with the text escaped in <pre> (saying so), and the
    event loop keeps ticking meanwhile."""
    host = make_host()
    text = unique(pathological[:-60]) + "<script>alert(1)</script>"
    async with Ticker() as ticker:
        began = time.monotonic()
        html = (await host.call("markdown.render", {"text": text}))["html"]
        took = time.monotonic() - began
    assert took < BOUND and ticker.worst < MAX_GAP, (took, ticker.worst)
    assert html.startswith("<p><em>Not formatted: formatting took longer than") and "plain text" in html
    assert html.endswith("&lt;script&gt;alert(1)&lt;/script&gt;</pre>\n") and "<script" not in html
    async with Ticker() as ticker:
        began = time.monotonic()
        assert (await host.call("markdown.render", {"text": text}))["html"] == html  # the same text: cached
        assert time.monotonic() - began < 0.5


@pytest.mark.asyncio
async def test_a_thousand_concurrent_slow_renders_never_freeze_the_host(make_host, warm):
    """Authority hole 5: a batch of 1,000 renders held the event loop for 146 s. Now 1,000 concurrent
    renders (each ~0.1 s of parsing) all answer within the time bound — rendered, or shown plain when
    the renderer was busy — while the loop keeps ticking."""
    host = make_host()
    texts = [unique("[" * 5_000) for _ in range(1000)]
    async with Ticker() as ticker:
        began = time.monotonic()
        calls = []
        for first in range(0, len(texts), 100):  # arriving as from many connections: 100 per loop iteration
            calls += [asyncio.create_task(host.call("markdown.render", {"text": t})) for t in texts[first:first + 100]]
            await asyncio.sleep(0)
        answers = await asyncio.gather(*calls)
        took = time.monotonic() - began
    assert took < BOUND and ticker.worst < MAX_GAP, (took, ticker.worst)
    rendered = 0
    for text, answer in zip(texts, answers):
        if answer["html"] == f"<p>{text}</p>\n":
            rendered += 1
        else:
            assert answer["html"] == f"<p><em>Not formatted: the formatter was busy for {TIME_BOUND:g} s; shown as " \
                                     f"plain text.</em></p>\n<pre>{text}</pre>\n"
    assert rendered >= 1


@pytest.mark.asyncio
async def test_normal_markdown_renders_through_the_worker_exactly_as_in_process():
    """Authority hole 5: moving rendering off the loop changes no output: every document of this
    repository renders through the worker exactly as markdown-it does in process."""
    root = Path(__file__).resolve().parents[2]
    documents = [p.read_text() for p in sorted((root / "docs").glob("*.md"))] + [
        "# Plan\n\n1. **Write** `NOTES.md`\n\n<script>alert(1)</script>\n<img src=x onerror=y>",
        "[a](javascript:alert(1)) [b](https://example.com) | a | b |\n|---|---|\n| 1 | 2 |\n", "", "\ud800 lone",
    ]
    for document in documents:
        assert await render_html(document) == render_markdown(document)


async def submitted(host, provider, project, markdown: str, kind: str = "plan") -> tuple[dict, list]:
    """A Plan/Goal session whose model submits ``markdown``: (the ended turn's session, its events)."""
    s = await session(host, project, mode=kind)
    sub = host.subscribe()
    if kind == "plan":
        provider.enqueue(s["id"], submit_plan(markdown=markdown), {"text": "I will shorten it"})
    else:
        call = submit_goal(["it works"])
        call["toolCalls"][0]["args"]["markdown"] = markdown
        provider.enqueue(s["id"], call, {"text": "I will shorten it"})
    turn = await prompt(host, s["id"])
    seen = []
    event = await sub.wait_for(lambda e: seen.append(e) or isinstance(e, (ev.TurnEnded, ev.PlanRequested)))
    return s, seen if isinstance(event, ev.TurnEnded) and event.turn_id == turn["turnId"] else [*seen, "waiting"]


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", ["plan", "goal"])
async def test_a_contract_too_long_to_open_is_refused_at_submission_writing_nothing(make_host, provider, project,
                                                                                       kind):
    """Authority hole 5: a SubmitPlan of 1,100,006 characters was accepted, then plans.get failed with
    INVALID_PARAMS while approve still worked — the user would approve a plan they could not open.
    Markdown over the limit is now refused with a tool error saying the limit and to shorten it;
    nothing is written under .pi/, no approval is pending, and the model is told."""
    host = make_host()
    s, seen = await submitted(host, provider, project, "x" * (MAX_RENDERED + 1), kind)
    assert "waiting" not in seen and not any(isinstance(e, ev.PlanRequested) for e in seen)
    [result] = tool_results((await state(host, s["id"]))["messages"], "SubmitPlan" if kind == "plan" else "SubmitGoal")
    assert result["errorCode"] == "INVALID_ARGUMENTS"
    assert f"{MAX_RENDERED:,}" in result["output"] and "shorten" in result["output"]
    assert not (project / ".pi").exists() or not any((project / ".pi").rglob("*.md"))
    assert (await host.call("plans.pending", {"sessionId": s["id"]}))["approvals"] == []
    assert len(provider.requests) == 2  # the model read the refusal


@pytest.mark.asyncio
async def test_plans_get_of_a_pathological_plan_stays_fast_and_readable(make_host, provider, project, warm):
    """Authority hole 5: a plan of "[](" repeated made every plans.get block the host for 9.4 s. Now
    the first plans.get answers within the time bound (the plan shown as plain text) without
    freezing the loop, the next ones come from the cache at once, and the plan can still be
    approved."""
    host = make_host()
    markdown = unique("[](" * 200_000)
    s = await session(host, project, mode="plan")
    sub = host.subscribe()
    provider.enqueue(s["id"], submit_plan(markdown=markdown))
    turn = await prompt(host, s["id"])
    approval = (await plan_requested(sub)).approval
    async with Ticker() as ticker:
        began = time.monotonic()
        got = await host.call("plans.get", {"approvalId": approval.id})
        first = time.monotonic() - began
        began = time.monotonic()
        again = await host.call("plans.get", {"approvalId": approval.id})
        second = time.monotonic() - began
    assert first < BOUND and second < 0.5 and ticker.worst < MAX_GAP, (first, second, ticker.worst)
    assert got["markdown"] == markdown and again["html"] == got["html"]
    assert got["html"].startswith("<p><em>Not formatted") and got["html"].endswith(f"{markdown}</pre>\n")
    await host.call("plans.resolve", {"approvalId": approval.id, "sessionId": s["id"], "turnId": turn["turnId"],
                                      "decision": "approve", "permissionMode": "ask"})
    await ended(sub, turn["turnId"])


@pytest.mark.asyncio
async def test_a_plan_stored_over_the_limit_still_opens_as_plain_text(make_host, provider, project):
    """Authority hole 5: plans.get of a plan over 1,000,000 characters (accepted before the limit
    existed) failed with INVALID_PARAMS. It now opens, shown as plain text without parsing."""
    host = make_host()
    s = await session(host, project, mode="plan")
    sub = host.subscribe()
    provider.enqueue(s["id"], submit_plan())
    await prompt(host, s["id"])
    approval = (await plan_requested(sub)).approval
    long = "# Plan\n" + "y" * 1_100_000
    (project / approval.artifact_path).write_text(long)  # as a submission from before the limit left it
    got = await host.call("plans.get", {"approvalId": approval.id})
    assert got["markdown"] == long
    assert got["html"] == f"<p><em>Not formatted: longer than {MAX_RENDERED:,} characters; shown as plain " \
                          f"text.</em></p>\n<pre>{long}</pre>\n"


def _words(text: str) -> list[str]:
    """The words of ``text``, less ordered-list numbers (``1.``: Markdown, not text)."""
    return re.findall(r"[A-Za-z0-9]+", re.sub(r"\b\d+\.\s", " ", text))


@pytest.mark.parametrize("source", [
    # issue 29 item 2: everything after the 9th level of nesting was dropped, later top-level steps included
    "- a\n" + "".join("  " * i + f"- level{i}\n" for i in range(1, 16)) + "- Then rm rf projects\n\n# Step 3\n",
    ">" * 25 + " deep\n\n# Step 3 after the quote\n",
    "1. one\n" + "".join("   " * i + f"1. item{i}\n" for i in range(1, 16)) + "\nlast words here\n",
    # a link reference definition is a line of the plan that a card would not show
    '[hidden]: http://example.com "rm rf everything"\n\n# Plan\n\nuse the [hidden] thing\n',
])
def test_every_word_of_the_text_is_shown(source: str) -> None:
    """What a person approves is what the execution reads: every word of the Markdown is in the HTML."""
    shown = html_module.unescape(re.sub(r"<[^>]+>", " ", render_markdown(source)))
    assert set(_words(source)) <= set(_words(shown))


@given(st.lists(st.sampled_from(["- ", "> ", "1. ", "* "]), max_size=60),
       st.lists(st.sampled_from(["alpha", "beta", "gamma"]), min_size=1, max_size=3))
@settings(max_examples=200, deadline=None)
def test_property_no_nesting_hides_a_word(containers: list[str], words: list[str]) -> None:
    """Containers nested on one line (``- > 1. - alpha``), as deep as 60, then a paragraph: both shown."""
    shown = render_markdown("".join(containers) + " ".join(words) + "\n\nfinal sentinel\n")
    assert "final sentinel" in shown and set(words) <= set(_words(shown))
