"""Helpers for driving a Host in tests: wire calls and waiting on events (never on time)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from pathlib import Path
from typing import Any

from pidesk.core import events as ev
from pidesk.host import Host
from pidesk.host.bus import Subscription


def submit_plan(title: str = "Add notes", markdown: str = "# Plan\n\n1. Write NOTES.md\n",
                question: str = "Shall I?") -> dict[str, Any]:
    return {"toolCalls": [{"name": "SubmitPlan", "args": {"title": title, "markdown": markdown, "question": question}}]}


def submit_goal(criteria: list[str], title: str = "Notes exist") -> dict[str, Any]:
    return {"toolCalls": [{"name": "SubmitGoal", "args": {
        "title": title, "markdown": "# Goal\n\nNOTES.md exists.\n\n## Criteria\n" + "".join(f"- {c}\n" for c in criteria),
        "question": "Approve?", "criteria": criteria}}]}


def tool(name: str, **args: Any) -> dict[str, Any]:
    return {"toolCalls": [{"name": name, "args": args}]}


async def ended(sub: Subscription, turn_id: str | None = None, timeout: float = 10.0) -> ev.TurnEnded:
    """The end of ``turn_id`` (or of any turn); ``timeout`` bounds a turn that runs a browser or a slow tool."""
    event = await sub.wait_for(lambda e: isinstance(e, ev.TurnEnded) and (turn_id is None or e.turn_id == turn_id),
                               timeout)
    assert isinstance(event, ev.TurnEnded)
    return event


async def all_ended(sub: Subscription, turn_ids: list[str], timeout: float = 10.0) -> dict[str, ev.TurnEnded]:
    """The ends of every turn in ``turn_ids``, in whatever order they come."""
    waiting, ends = set(turn_ids), {}
    while waiting:
        event = await sub.wait_for(lambda e: isinstance(e, ev.TurnEnded) and e.turn_id in waiting, timeout)
        assert isinstance(event, ev.TurnEnded)
        waiting.discard(event.turn_id)
        ends[event.turn_id] = event
    return ends


async def plan_requested(sub: Subscription) -> ev.PlanRequested:
    event = await sub.wait_for(lambda e: isinstance(e, ev.PlanRequested))
    assert isinstance(event, ev.PlanRequested)
    return event


async def permission_requested(sub: Subscription) -> ev.PermissionRequested:
    event = await sub.wait_for(lambda e: isinstance(e, ev.PermissionRequested))
    assert isinstance(event, ev.PermissionRequested)
    return event


async def session(host: Host, project: Any = None, **params: Any) -> dict[str, Any]:
    if project is not None:
        params["projectPath"] = str(project)
    result: dict[str, Any] = await host.call("session.create", params)
    return result


async def prompt(host: Host, session_id: str, text: str = "go") -> dict[str, str]:
    result: dict[str, str] = await host.call("agent.prompt", {"sessionId": session_id, "text": text})
    return result


async def completed_turn(host: Host, provider: Any, session_id: str, *responses: dict[str, Any],
                         text: str = "go") -> str:
    """Run one turn of ``responses`` (then "Done.") to its end, asserting it completed; its id."""
    sub = host.subscribe()
    provider.enqueue(session_id, *responses, {"text": "Done."})
    turn = await prompt(host, session_id, text)
    assert (await ended(sub, turn["turnId"])).reason == "completed"
    return str(turn["turnId"])


def small_projects(base: Path, count: int) -> list[Path]:
    """``count`` projects under ``base`` (``p0``, ``p1``, …), each holding one small file, ``a.txt``."""
    roots = []
    for n in range(count):
        root = base / f"p{n}"
        root.mkdir()
        (root / "a.txt").write_text(f"{n}\n")
        roots.append(root)
    return roots


async def state(host: Host, session_id: str) -> dict[str, Any]:
    result: dict[str, Any] = await host.call("session.get", {"sessionId": session_id})
    return result


def tool_results(messages: list[dict[str, Any]], name: str | None = None) -> list[dict[str, Any]]:
    """Every toolResult block of a session.get page, optionally of one tool."""
    return [b for m in messages for b in m["content"]
            if b["type"] == "toolResult" and (name is None or b["name"] == name)]


async def pid_from_file(path: Any, timeout: float = 10.0) -> int:
    """The pid a Bash command wrote to ``path``: observing an external process means polling its file, bounded."""
    async with asyncio.timeout(timeout):
        while not path.exists() or not path.read_text().strip():
            await asyncio.sleep(0.01)
    return int(path.read_text())


async def process_running(marker: str, timeout: float = 10.0) -> int:
    """The pid (as this host sees it) of the running process whose command line holds ``marker``: a Bash
    command's own ``$$`` is its pid inside the sandbox's pid namespace, so tests look for the process."""
    async with asyncio.timeout(timeout):
        while not (found := running_with(marker.encode())):
            await asyncio.sleep(0.01)
    return min(found)


def running_with(marker: bytes) -> set[int]:
    """Every live process (anyone's child) whose command line holds ``marker``."""
    found = set()
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if marker in cmdline and int(entry) != os.getpid() and alive(int(entry)):
            found.add(int(entry))
    return found


def alive(pid: int) -> bool:
    """Whether a process still runs (a zombie awaiting its reaper counts as gone)."""
    return not gone(pid)


def gone(pid: int) -> bool:
    """Whether a process has exited: no longer there, or a zombie awaiting its reaper."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):  # (reaped between the open and the read: ESRCH)
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


async def die(host: Host) -> None:
    """The host process dies, in process: every turn stops where it is and records nothing more (a
    real kill -9 is tests/crash/); the store closes without ``close()``'s graceful aborts."""
    for live in host.parts.live.turns.values():
        live.decided = True  # nothing may record an end now: the next host's recovery does
    tasks = list(host.turns._tasks)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    host.store.close()


def spare_shells() -> set[int]:
    """This process's children that are Bash spare shells waiting for a command (tools/bash.py)."""
    return shells(b"__pidesk_command")


def cold_shells() -> set[int]:
    """This process's children that are Bash cold shells, waiting for their go-ahead or running."""
    return shells(b"__pidesk_go")


def shells(marker: bytes) -> set[int]:
    """This process's live children whose command line holds ``marker``."""
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_bytes().rsplit(b")", 1)[1].split()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if int(stat[1]) == os.getpid() and marker in cmdline and stat[0] not in (b"Z", b"X"):
            found.add(int(entry))
    return found


class Ticker:
    """A task ticking every 10 ms, as a /healthz probe would: ``worst`` is the longest the loop kept it waiting."""

    def __init__(self) -> None:
        self.worst = 0.0
        self._last = time.monotonic()
        self._task: asyncio.Task[None] | None = None

    async def _tick(self) -> None:
        while True:  # ends when cancelled
            await asyncio.sleep(0.01)
            self._tick_now()

    def _tick_now(self) -> None:
        now = time.monotonic()
        self.worst = max(self.worst, now - self._last)
        self._last = now

    async def __aenter__(self) -> Ticker:
        self._task = asyncio.create_task(self._tick())
        await asyncio.sleep(0.02)  # it has ticked once: the loop is measured from here
        self.worst = 0.0
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._tick_now()  # a loop held until now never let it tick: that gap counts too
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
