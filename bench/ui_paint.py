"""Opening a 5,000-message session in the web UI: time to first paint and to interactive.

A data dir holding one session of 5,000 messages (1,250 turns of prompt, tool call,
tool result, answer) is built in bulk by ``dataset.build``; the real server
(``pidesk.server.serve.serve``) serves it, and Debian's Chromium (headless,
through Playwright) opens ``/?token=…&session=<id>`` in a fresh browser context
each run (cold page cache, warm host). The page sets performance marks, read
back from the browser; every figure is milliseconds since navigation start:

- ``first-contentful-paint``: the browser's own paint timing (the page shell);
- ``pidesk:transcript-painted``: the first frame after the session's newest page
  of messages (200, from ``session.get``) is in the DOM — what the user waits for;
- ``pidesk:interactive``: the transcript painted, its Markdown rendered by the host
  (``markdown.render``, one batched frame) and swapped in, and a frame later; the
  composer, tabs and every button work from here.

Targets: median ``transcript-painted`` and ``interactive`` ≤ 500 ms. Context: the
time to load one earlier page (200 messages) by scrolling up. The first run of
each process warms the server and the browser and is not counted.

    .venv/bin/python bench/ui_paint.py [--quick] [--runs N] [--wait-idle SECONDS]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
from pathlib import Path
from typing import Any

import dataset
import harness
from harness import Figure

from pidesk.config import HostConfig
from pidesk.providers.scripted import ScriptedProvider
from pidesk.server.serve import ServeOptions, serve
from pidesk.store import repo
from pidesk.store.store import Store

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
TOKEN = "pidesk-bench-token-0123456789abcdef"
MESSAGES = 5000
TARGET_MS = 500.0

MARKS_JS = """() => {
  const mark = (name) => performance.getEntriesByName(name, 'mark')[0]?.startTime ?? null;
  const fcp = performance.getEntriesByName('first-contentful-paint')[0]?.startTime ?? null;
  return {fcp, script: mark('pidesk:script'), connected: mark('pidesk:connected'), snapshot: mark('pidesk:snapshot'),
          rendered: mark('pidesk:transcript-rendered'),
          painted: mark('pidesk:transcript-painted'), interactive: mark('pidesk:interactive'),
          messages: document.querySelectorAll('#messages > .msg').length,
          markdownPending: document.querySelectorAll('.md[data-pending]').length};
}"""


async def start(data_dir: Path) -> tuple[asyncio.Task[None], str]:
    ready = asyncio.Event()
    box: dict[str, str] = {}

    def announce(url: str, _token: str) -> None:
        box["url"] = url
        ready.set()

    task = asyncio.create_task(serve(HostConfig(data_dir=data_dir), ScriptedProvider(), ServeOptions(token=TOKEN),
                                     announce))
    waiter = asyncio.create_task(ready.wait())
    await asyncio.wait({task, waiter}, timeout=30, return_when=asyncio.FIRST_COMPLETED)
    if not ready.is_set():
        waiter.cancel()
        task.result()
        raise SystemExit("the server did not start")
    return task, box["url"]


async def one_run(browser: Any, url: str) -> dict[str, Any]:
    context = await browser.new_context(viewport={"width": 1280, "height": 820})
    try:
        page = await context.new_page()
        await page.goto(url)
        await page.wait_for_function("() => performance.getEntriesByName('pidesk:interactive', 'mark').length > 0",
                                     timeout=30_000)
        marks: dict[str, Any] = await page.evaluate(MARKS_JS)
        # one earlier page: scroll to the top and time the prepend (a context figure)
        before = marks["messages"]
        started = await page.evaluate("() => performance.now()")
        await page.evaluate("() => { document.getElementById('transcript').scrollTop = 0; }")
        await page.wait_for_function(f"() => document.querySelectorAll('#messages > .msg').length > {before}",
                                     timeout=30_000)
        marks["earlierMs"] = await page.evaluate("() => performance.now()") - started
        return marks
    finally:
        await context.close()


async def measure(data_dir: Path, session_id: str, runs: int) -> list[Figure]:
    from playwright.async_api import async_playwright

    task, base = await start(data_dir)
    try:
        url = f"{base}/?token={TOKEN}&session={session_id}"
        async with async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
            try:
                await one_run(browser, url)  # warm-up, not counted
                results = [await one_run(browser, url) for _ in range(runs)]
            finally:
                await browser.close()
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    for r in results:
        if r["messages"] < 150 or r["markdownPending"]:
            raise SystemExit(f"the page did not show the newest page of messages: {r}")

    def fig(name: str, key: str, target: float | None, note: str = "") -> Figure:
        values = sorted(r[key] for r in results)
        return Figure(name, statistics.median(values), "ms", target, at_least=False,
                      note=f"min {values[0]:.0f}, max {values[-1]:.0f}, n={len(values)}{note}")

    return [
        fig("first-contentful-paint (page shell)", "fcp", None),
        fig("pidesk:script (modules loaded and running)", "script", None),
        fig("pidesk:connected (hello + first reads, one frame)", "connected", None),
        fig("pidesk:transcript-rendered (newest page in the DOM)", "rendered", None),
        fig(f"transcript painted (newest 200 of {MESSAGES:,} messages)", "painted", TARGET_MS),
        fig("interactive (Markdown rendered, handlers live)", "interactive", TARGET_MS),
        fig("  load one earlier page (200 messages) on scroll-up", "earlierMs", None),
    ]


def main() -> int:
    def options(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--runs", type=int, default=None)
        parser.add_argument("--wait-idle", type=float, metavar="SECONDS", default=0,
                            help="first wait (at most SECONDS) for the CPUs to be quiet")

    args = harness.parse_args(__doc__ or "", options)
    runs = args.runs or (3 if args.quick else 15)
    harness.header("ui_paint", args.quick)
    if not CHROMIUM.exists():
        print(f"  {CHROMIUM} is missing: apt-get install chromium")
        return 1
    with harness.scratch("ui-paint") as tmp:
        data_dir = tmp / "data"
        project = tmp / "project"
        project.mkdir()
        (project / "README.md").write_text("# bench project\n")
        dataset.build(data_dir, 1, MESSAGES, project=project)
        dataset.verify(data_dir)
        store = Store(data_dir)
        try:
            with store.db.read() as db:
                session_id = next(iter(repo.session_watermarks(db)))
        finally:
            store.close()
        print(f"  one session of {MESSAGES:,} messages; Chromium headless; {runs} runs after one warm-up")
        if args.wait_idle:
            print(f"  {harness.wait_for_quiet(args.wait_idle)}")
        figures = asyncio.run(measure(data_dir, session_id, runs))
    return harness.report("ui_paint", figures, args.json)


if __name__ == "__main__":
    raise SystemExit(main())
