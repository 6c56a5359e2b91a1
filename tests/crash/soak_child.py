"""The child of the random-kill soak: a busy host until the parent kills it.

Run as ``python soak_child.py DATA_DIR PROJECT SEED``. It opens a real Host and
keeps several sessions busy at once — prompts with tool calls, queue pushes,
plan submissions resolved at random, aborts (never smart ones, which may cut
an acknowledged root user row by design) — printing one JSON line per
acknowledgement as soon as the host announces it durable:
``{"message": id, "session": sid, "seq": n}`` for every ``message.appended``, and
``{"approved": approval id}`` once a ``plans.resolve`` approve returns. The
parent SIGKILLs it at a random moment; the child never ends by itself.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parents[1])]

from pidesk.config import HostConfig  # noqa: E402
from pidesk.core import events as ev  # noqa: E402
from pidesk.core.errors import PideskError  # noqa: E402
from pidesk.host import Host  # noqa: E402
from pidesk.providers.scripted import ScriptedProvider  # noqa: E402


def ack(**fields: object) -> None:
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


def responses(rng: random.Random, n: int) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    for i in range(n):
        choice = rng.random()
        if choice < 0.3:
            out.append({"text": f"reading {i}", "toolCalls": [{"name": "Read", "args": {"path": "README.md"}}]})
        elif choice < 0.5:
            out.append({"toolCalls": [{"name": "Write", "args": {"path": f"out/{i}.txt", "content": f"{i}\n"}}]})
        elif choice < 0.65:
            out.append({"toolCalls": [{"name": "SubmitPlan", "args": {
                "title": f"plan {i}", "markdown": f"# Plan {i}\n", "question": "ok?"}}]})
        else:
            out.append({"text": f"answer {i} " * 5})
    return out


async def main(data_dir: Path, project: Path, seed: int) -> None:
    rng = random.Random(seed)
    provider = ScriptedProvider(responses(rng, 400))
    host = Host.open(HostConfig(data_dir=data_dir), provider)
    sub = host.subscribe()

    async def follow() -> None:
        while True:
            _seq, event = await sub.next()
            if isinstance(event, ev.MessageAppended):
                ack(message=event.message.id, session=event.session_id, seq=event.message.seq)
            elif isinstance(event, ev.PlanRequested):
                asyncio.get_running_loop().create_task(decide(event.approval.id, event.approval.session_id,
                                                              event.approval.turn_id))

    async def decide(approval_id: str, session_id: str, turn_id: str) -> None:
        approve = rng.random() < 0.6
        params = {"approvalId": approval_id, "sessionId": session_id, "turnId": turn_id,
                  "decision": "approve" if approve else "reject"}
        if approve:
            params["permissionMode"] = rng.choice(["ask", "accept-edits", "auto"])
        try:
            await host.call("plans.resolve", params)
            if approve:
                ack(approved=approval_id)
        except PideskError:
            pass

    follower = asyncio.create_task(follow())
    sessions = []
    for _ in range(4):
        mode = rng.choice(["agent", "plan"])
        created = await host.call("session.create", {"projectPath": str(project), "mode": mode,
                                                     "permissionMode": "auto"})
        sessions.append(created["id"])
    for step in range(10_000):  # bounded; the parent kills long before
        sid = rng.choice(sessions)
        action = rng.random()
        try:
            if action < 0.6:
                await host.call("agent.queue.push", {"sessionId": sid, "text": f"step {step}"})
            elif action < 0.7:
                await host.call("agent.abort", {"sessionId": sid})  # not smart: a smart stop may cut a row
            elif action < 0.8:
                await host.call("session.setMode", {"sessionId": sid, "mode": rng.choice(["agent", "plan"])})
            else:
                await host.call("session.focus", {"sessionId": sid})
        except PideskError:
            pass
        await asyncio.sleep(0)
    follower.cancel()


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])))
