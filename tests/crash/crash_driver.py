"""The child side of the crash tests: reach one persistence point, then die there.

Run as ``python crash_driver.py SCENARIO SPEC`` where SPEC is a JSON object
``{"dataDir": …, "project": …, "point": …, "nth": 1, …options}``.

A scenario opens a real ``Host`` on the data directory with a ``Faults`` that
SIGKILLs the process at ``point`` (the seed 003 §4 persistence point under
test), drives it through its wire API from its own asyncio code — it releases
its own scripted-provider gates and resolves its own approvals, because nobody
outside can — and prints one JSON object per acknowledgement on stdout,
flushed, *before* the point is reached. The parent learns what was
acknowledged from those lines and that the point was reached from the exit
status (-SIGKILL). A scenario that returns never reached its point: the driver
prints ``{"survived": true}`` and exits 0, which the parent reports as a failure.

``nth`` > 1 kills on that hit of the point (a point the scenario passes through
earlier, e.g. the user message before the tool row). A phase that must not be
killed (building the state a crash then hits) opens the host unarmed.

With ``options.lossy`` (``{"journal", "watch", "kill"}``) the lossy disk of
``lossy_disk.py`` is installed before the scenario runs, for the lost-writes tests.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import sys
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parents[1]), str(HERE.parent)]  # the repo (pidesk) and tests/ (scenario)

import scenario as sc  # noqa: E402

from crash_harness import ATTACHMENT, contract  # noqa: E402

from pidesk.config import HostConfig  # noqa: E402
from pidesk.core import events as ev  # noqa: E402
from pidesk.faults import NO_FAULTS, Faults  # noqa: E402
from pidesk.host import Host  # noqa: E402
from pidesk.providers.scripted import ScriptedProvider  # noqa: E402



def ack(**fields: Any) -> None:
    """Tell the parent what was acknowledged so far (before the point is reached)."""
    print(json.dumps(fields), flush=True)


@dataclass(frozen=True)
class KillOnNthHit(Faults):
    """``Faults`` that lets the first ``nth - 1`` hits of its points pass."""

    nth: int = 1
    hits: list[int] = field(default_factory=lambda: [0], compare=False)

    def hit(self, point: str) -> None:
        if point in self.points:
            self.hits[0] += 1
            if self.hits[0] >= self.nth:
                super().hit(point)


class Child:
    def __init__(self, spec: dict[str, Any]) -> None:
        self.data_dir = Path(spec["dataDir"])
        self.project = Path(spec["project"])
        self.point: str = spec["point"]
        self.nth: int = spec.get("nth", 1)
        self.options: dict[str, Any] = spec.get("options", {})
        self.provider = ScriptedProvider()

    def open(self, *, armed: bool = True) -> Host:
        """A Host on the data dir; ``armed``: with the fault at ``point`` configured."""
        faults: Faults = NO_FAULTS
        if armed:
            points = frozenset({self.point})
            faults = Faults(points, "kill") if self.nth == 1 else KillOnNthHit(points, "kill", nth=self.nth)
        self.provider = ScriptedProvider()
        return Host.open(HostConfig(data_dir=self.data_dir, faults=faults), self.provider)

    def die(self) -> None:
        """SIGKILL now; under the lossy disk, between two of its recorded operations."""
        if LOSSY:
            LOSSY[0].die()
        os.kill(os.getpid(), signal.SIGKILL)

    def transcript_sha(self, session_id: str) -> str:
        return hashlib.sha256((self.data_dir / "transcripts" / f"{session_id}.jsonl").read_bytes()).hexdigest()


Scenario = Callable[[Child], Coroutine[Any, Any, None]]
SCENARIOS: dict[str, Scenario] = {}


def scenario(fn: Scenario) -> Scenario:
    SCENARIOS[fn.__name__] = fn
    return fn


async def forever(sub: Any) -> None:
    """Wait for an event that only comes after the point: the kill ends the wait."""
    await sub.wait_for(lambda e: False, timeout=8)


# ---- sessions, modes, forks ------------------------------------------------------------


@scenario
async def create_session(c: Child) -> None:
    host = c.open(armed=False)
    kept = await sc.session(host, c.project, title="kept")
    ack(kept=kept["id"])
    await host.close()
    host = c.open()
    if c.options.get("temporary"):
        await sc.session(host, title="scratch work")
    else:
        await sc.session(host, c.project, title="restored", mode="plan")


@scenario
async def delete_session(c: Child) -> None:
    host = c.open()
    doomed = await sc.session(host, c.project, title="doomed")
    kept = await sc.session(host, c.project, title="kept")
    sub = host.subscribe()
    for sid in (doomed["id"], kept["id"]):
        started = await sc.prompt(host, sid, "hello")
        await sc.ended(sub, started["turnId"])
    ack(doomed=doomed["id"], kept=kept["id"], keptSha=c.transcript_sha(kept["id"]))
    await host.call("session.delete", {"sessionId": doomed["id"]})


@scenario
async def mode_change(c: Child) -> None:
    host = c.open()
    s = await sc.session(host, c.project)
    await host.call("session.setMode", {"sessionId": s["id"], "mode": "plan"})
    await host.call("session.setPermissionMode", {"sessionId": s["id"], "permissionMode": "auto"})
    ack(session=s["id"], mode="plan", permissionMode="auto")
    await sc.prompt(host, s["id"], "plan something")


@scenario
async def agent_mode_change(c: Child) -> None:
    host = c.open()  # nth=3: the user row, the EnterPlanMode row, then its tool result row
    s = await sc.session(host, c.project)
    c.provider.enqueue(s["id"], sc.tool("EnterPlanMode"), {"text": "Looking around."})
    ack(session=s["id"])
    sub = host.subscribe()
    await sc.prompt(host, s["id"], "think first")
    await forever(sub)


async def _source_with_history(c: Child) -> dict[str, Any]:
    """Phase one, unarmed: a source session with two completed turns, then a clean close."""
    host = c.open(armed=False)
    s = await sc.session(host, c.project, title="source", permissionMode="auto")
    c.provider.enqueue(s["id"], {"text": "First answer."}, {"text": "Second answer."})
    sub = host.subscribe()
    for text in ("first question", "second question"):
        started = await sc.prompt(host, s["id"], text)
        await sc.ended(sub, started["turnId"])
    messages = [m["id"] for m in (await sc.state(host, s["id"]))["messages"]]
    await host.close()
    ack(source=s["id"], sourceMessages=messages, sourceSha=c.transcript_sha(s["id"]))
    return s


@scenario
async def fork_then_crash(c: Child) -> None:
    source = await _source_with_history(c)
    host = c.open()  # point: turn.after_start of a prompt on the child
    messages = (await sc.state(host, source["id"]))["messages"]
    whole = await host.call("session.fork", {"sessionId": source["id"]})
    partial = await host.call("session.fork", {"sessionId": source["id"], "throughMessageId": messages[1]["id"]})
    ack(whole=whole["id"], partial=partial["id"])
    await sc.prompt(host, whole["id"], "continue in the fork")


@scenario
async def fork_crash_midway(c: Child) -> None:
    source = await _source_with_history(c)
    host = c.open()  # point: session.after_transcript of the child
    messages = (await sc.state(host, source["id"]))["messages"]
    ack(through=messages[1]["id"])
    await host.call("session.fork", {"sessionId": source["id"], "throughMessageId": messages[1]["id"]})


# ---- messages ------------------------------------------------------------------------


@scenario
async def user_message(c: Child) -> None:
    host = c.open(armed=False)
    s = await sc.session(host, c.project)
    sub = host.subscribe()
    started = await sc.prompt(host, s["id"], "first")
    await sc.ended(sub, started["turnId"])
    first = [m["id"] for m in (await sc.state(host, s["id"]))["messages"]]
    await host.close()
    ack(session=s["id"], first=first)
    host = c.open()
    await host.call("attachments.put", {"name": ATTACHMENT["name"], "mime": ATTACHMENT["mime"],
                                        "data": ATTACHMENT["data"]})
    await host.call("agent.prompt", {"sessionId": s["id"], "text": "second, with a screenshot",
                                     "attachments": [ATTACHMENT]})


@scenario
async def compaction(c: Child) -> None:
    """A session with two turns, compacted by hand in a host killed right after the compaction's message."""
    host = c.open(armed=False)
    s = await sc.session(host, c.project)
    sub = host.subscribe()
    for text in ("first request", "second request"):
        await sc.ended(sub, (await sc.prompt(host, s["id"], text))["turnId"])
    await host.close()
    ack(session=s["id"])
    host = c.open()
    c.provider.enqueue(s["id"], {"summary": "SUMMARY: two requests were answered"})
    await host.call("session.compact", {"sessionId": s["id"]})


@scenario
async def tool_message(c: Child) -> None:
    host = c.open()  # nth=3: user row, assistant Read row, then the Read result row
    s = await sc.session(host, c.project)
    # the model answers only once the ack is out: the turn runs beside the prompt's return, and
    # its kill (in a worker thread) must not beat the ack the test reads
    c.provider.enqueue(s["id"], {**sc.tool("Read", path="README.md"), "gate": "acked"}, {"text": "Read it."})
    sub = host.subscribe()
    started = await sc.prompt(host, s["id"], "read the readme")
    ack(session=s["id"], turn=started["turnId"], message=started["messageId"])
    c.provider.release("acked")
    await forever(sub)


@scenario
async def smart_stop(c: Child) -> None:
    host = c.open()
    s = await sc.session(host, c.project)
    c.provider.enqueue(s["id"], {"gate": "hold", "text": "never streamed"})
    started = await sc.prompt(host, s["id"], "oops, wrong prompt")
    ack(session=s["id"], turn=started["turnId"], message=started["messageId"])
    await c.provider.wait_reached("hold")
    await host.call("agent.abort", {"sessionId": s["id"], "smart": True})


# ---- turns, abort, queue, notifications, permissions --------------------------------------


@scenario
async def abort_turn(c: Child) -> None:
    host = c.open()
    s = await sc.session(host, c.project)
    c.provider.enqueue(s["id"], {"gate": "hold"})
    started = await sc.prompt(host, s["id"], "long job")
    ack(session=s["id"], turn=started["turnId"], message=started["messageId"])
    await c.provider.wait_reached("hold")
    await host.call("agent.abort", {"sessionId": s["id"]})


@scenario
async def turn_start(c: Child) -> None:
    host = c.open()
    s = await sc.session(host, c.project)
    ack(session=s["id"])
    await sc.prompt(host, s["id"], "never answered")


@scenario
async def queued_prompt(c: Child) -> None:
    """A prompt queued behind a running turn, whose release the point interrupts.

    turn.after_start nth=2: the queued turn's start; message.after_transcript
    nth=3: the queued turn's user row (after the first turn's user and assistant rows).
    """
    host = c.open()
    s = await sc.session(host, c.project)
    if c.options.get("visible"):
        await host.call("session.focus", {"sessionId": s["id"]})
    c.provider.enqueue(s["id"], {"gate": "hold", "error": c.options["error"]} if c.options.get("error")
                       else {"gate": "hold"})
    sub = host.subscribe()
    started = await sc.prompt(host, s["id"], "first job")
    await c.provider.wait_reached("hold")
    pushed = await host.call("agent.queue.push", {"sessionId": s["id"], "text": "queued follow-up"})
    ack(session=s["id"], turn=started["turnId"], entry=pushed["entryId"], entryText="queued follow-up")
    c.provider.release("hold")
    await forever(sub)


@scenario
async def permission_pending(c: Child) -> None:
    host = c.open()  # point session.after_transcript, nth=2: the session created after the ask
    s = await sc.session(host, c.project)
    c.provider.enqueue(s["id"], sc.tool("Bash", command="touch ran.txt"))
    sub = host.subscribe()
    started = await sc.prompt(host, s["id"], "run it")
    asked = await sc.permission_requested(sub)
    ack(session=s["id"], turn=started["turnId"], request=asked.request.id)
    await sc.session(host, c.project, title="another tab")


# ---- Plan / Goal contracts ---------------------------------------------------------------


async def _submitted(c: Child, host: Host) -> tuple[dict[str, Any], dict[str, str], Any]:
    kind = c.options.get("kind", "plan")
    s = await sc.session(host, c.project, mode=kind)
    c.provider.enqueue(s["id"], {**contract(kind), "gate": "acked"})  # submitted only once acked (tool_message)
    sub = host.subscribe()
    started = await sc.prompt(host, s["id"], "make a contract")
    ack(session=s["id"], turn=started["turnId"], kind=kind)
    c.provider.release("acked")
    return s, started, sub


@scenario
async def submit(c: Child) -> None:
    host = c.open()
    _s, _started, sub = await _submitted(c, host)
    await forever(sub)


@scenario
async def approve(c: Child) -> None:
    host = c.open()
    s, started, sub = await _submitted(c, host)
    requested = await sc.plan_requested(sub)
    ack(approval=requested.approval.id, artifact=requested.approval.artifact_path)
    await host.call("plans.resolve", {
        "approvalId": requested.approval.id, "sessionId": s["id"], "turnId": started["turnId"],
        "decision": "approve", "permissionMode": "auto",
    })
    ack(approved=True)
    await forever(sub)


# ---- recovery ------------------------------------------------------------------------------


@scenario
async def open_only(c: Child) -> None:
    c.open()


@scenario
async def messy_crash(c: Child) -> None:
    """Leave every kind of unfinished business, then die (message.after_transcript nth=4).

    P: a pending plan approval on a running turn (rows 1, 2); R: a running turn held
    on a gate with a queued prompt behind it (row 3); Q: a user row fsynced, not indexed (4).
    """
    host = c.open()
    sub = host.subscribe()
    p = await sc.session(host, c.project, title="P", mode="plan")
    c.provider.enqueue(p["id"], contract("plan"))
    await sc.prompt(host, p["id"], "plan it")
    requested = await sc.plan_requested(sub)
    r = await sc.session(host, c.project, title="R")
    c.provider.enqueue(r["id"], {"gate": "hold"})
    await sc.prompt(host, r["id"], "slow job")
    await c.provider.wait_reached("hold")
    entry = await host.call("agent.queue.push", {"sessionId": r["id"], "text": "after the slow job"})
    q = await sc.session(host, c.project, title="Q")
    ack(p=p["id"], approval=requested.approval.id, r=r["id"], entry=entry["entryId"], q=q["id"])
    await sc.prompt(host, q["id"], "lost in the outbox? never")


@scenario
async def recovery_killed(c: Child) -> None:
    """Open an unarmed host whose startup recovery dies at ``options.where``."""
    from pidesk.store import repo
    from pidesk.store.store import Store

    def die() -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    if c.options["where"] == "after_first_reconcile_step":
        original_reindex = Store._reindex_tail

        def reindex_then_die(self: Store, *args: Any) -> None:
            original_reindex(self, *args)
            die()

        Store._reindex_tail = reindex_then_die  # type: ignore[method-assign]
    else:
        original_interrupt = repo.interrupt_everything

        def interrupt_then_die(db: Any) -> dict[str, int]:
            original_interrupt(db)
            die()
            raise AssertionError("unreachable")

        repo.interrupt_everything = interrupt_then_die
    ack(recovering=True)
    c.open(armed=False)


# ---- lost and torn writes: under the lossy disk (tests/crash/lossy_disk.py) -------------------------
#
# These scenarios run with every transcript, blob and artifact mutation journaled, and end by
# dying (or the layer kills them at a chosen mutation). They acknowledge one record per line:
# {"message", "session", "seq", "role"} once the host announces a message, {"session"} once
# session.create or session.fork returns, {"blob"} once attachments.put returns,
# {"approval", "artifact", "sha"} once a plan is requested, {"approved"} once its approval
# returns, {"deleting"} / {"deleted"} around session.delete.


def follow_messages(host: Host, quiet: set[str]) -> asyncio.Task[None]:
    """Acknowledge every message the host announces, except in ``quiet`` sessions (a smart stop may cut them)."""
    sub = host.subscribe()

    async def run() -> None:
        while True:
            _seq, event = await sub.next()
            if isinstance(event, ev.MessageAppended) and event.session_id not in quiet:
                m = event.message
                ack(message=m.id, session=m.session_id, seq=m.seq, role=m.role)

    return asyncio.get_running_loop().create_task(run())


async def _attach(c: Child, host: Host, sub: Any) -> None:
    """Put an attachment, then prompt a new session with it."""
    put = await host.call("attachments.put", {"name": ATTACHMENT["name"], "mime": ATTACHMENT["mime"],
                                              "data": ATTACHMENT["data"]})
    ack(blob=put["ref"])
    s = await sc.session(host, c.project, title="attached", permissionMode="auto")
    ack(session=s["id"])
    started = await host.call("agent.prompt", {"sessionId": s["id"], "text": "look at this",
                                               "attachments": [ATTACHMENT]})
    await sc.ended(sub, started["turnId"])


async def _plan_approved_and_executed(c: Child, host: Host, sub: Any) -> None:
    p = await sc.session(host, c.project, title="P", mode="plan")
    ack(session=p["id"])
    c.provider.enqueue(p["id"], contract("plan"), {"text": "Executed the plan."})
    started = await sc.prompt(host, p["id"], "plan it")
    requested = (await sc.plan_requested(sub)).approval
    ack(approval=requested.id, artifact=requested.artifact_path, sha=requested.artifact_sha256)
    await host.call("plans.resolve", {"approvalId": requested.id, "sessionId": p["id"], "turnId": started["turnId"],
                                      "decision": "approve", "permissionMode": "auto"})
    ack(approved=requested.id)
    await sub.wait_for(lambda e: isinstance(e, ev.TurnEnded) and e.session_id == p["id"]
                       and e.turn_id != started["turnId"])


@scenario
async def lossy_workload(c: Child) -> None:
    """Every kind of durable write the store does, in order, then death: appends (user, assistant,
    tool), a blob, a plan artifact and its approval and execution, a fork, a delete, a smart stop."""
    host = c.open(armed=False)
    quiet: set[str] = set()
    follow_messages(host, quiet)
    sub = host.subscribe()
    a = await sc.session(host, c.project, title="A", permissionMode="auto")
    ack(session=a["id"])
    c.provider.enqueue(a["id"], sc.tool("Read", path="README.md"), {"text": "Read it."}, {"text": "Second answer."})
    started = await sc.prompt(host, a["id"], "read the readme")
    await sc.ended(sub, started["turnId"])
    started = await sc.prompt(host, a["id"], "and again")
    await sc.ended(sub, started["turnId"])
    await _attach(c, host, sub)
    await _plan_approved_and_executed(c, host, sub)
    fork = await host.call("session.fork", {"sessionId": a["id"]})
    ack(session=fork["id"])
    for m in (await sc.state(host, fork["id"]))["messages"]:
        ack(message=m["id"], session=fork["id"], seq=m["seq"], role=m["role"])
    started = await sc.prompt(host, fork["id"], "continue in the fork")
    await sc.ended(sub, started["turnId"])
    d = await sc.session(host, c.project, title="D")
    ack(session=d["id"])
    started = await sc.prompt(host, d["id"], "doomed")
    await sc.ended(sub, started["turnId"])
    ack(deleting=d["id"])
    await host.call("session.delete", {"sessionId": d["id"]})
    ack(deleted=d["id"])
    s = await sc.session(host, c.project, title="S")
    quiet.add(s["id"])
    ack(session=s["id"])
    c.provider.enqueue(s["id"], {"gate": "hold"})
    await sc.prompt(host, s["id"], "oops")
    await c.provider.wait_reached("hold")
    await host.call("agent.abort", {"sessionId": s["id"], "smart": True})
    c.die()


@scenario
async def lossy_attach(c: Child) -> None:
    """Put an attachment and send it in a prompt, then die."""
    host = c.open(armed=False)
    follow_messages(host, set())
    await _attach(c, host, host.subscribe())
    c.die()


@scenario
async def lossy_plan(c: Child) -> None:
    """Submit a plan, approve it, let it execute, then die."""
    host = c.open(armed=False)
    follow_messages(host, set())
    await _plan_approved_and_executed(c, host, host.subscribe())
    c.die()


LOSSY: list[Any] = []


def main() -> None:
    name, spec = sys.argv[1], json.loads(sys.argv[2])
    lossy = spec.get("options", {}).get("lossy")
    if lossy:
        from lossy_disk import install

        LOSSY.append(install(Path(lossy["journal"]), [Path(p) for p in lossy["watch"]], lossy.get("kill")).layer)
    asyncio.run(SCENARIOS[name](Child(spec)))
    ack(survived=True)


if __name__ == "__main__":
    main()
