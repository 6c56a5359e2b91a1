"""Random operation sequences through a real Host: a hypothesis state machine.

One machine owns a real Host (real SQLite, real JSONL transcripts, real tools) on
a temporary data directory and four sessions — Agent, Plan and Goal sessions on
their own projects, and a temporary (project-less) Agent session. Hypothesis
draws sequences of the rules below; after every step the machine *settles* (every
running turn has ended or is parked at a gate, a permission request or a pending
approval — waited for on events and tasks, never on time) and then checks the
invariants from durable state (session.get, session.turns, plans.list,
permissions.pending, audit.list, notifications.list, the project files) and from
the host's live state.

The model is scripted per turn, not per session: every prompt and queue entry
carries a ``[[key]]`` and a turn plays the script registered under the key in
its root user message through its own ``ScriptedProvider`` (an approved
contract's Markdown carries the key of its execution's script). Leftovers of an
aborted or stopped turn are dropped with it, so queued and execution turns
always play what was drawn for them.

Rules: send (agent.prompt or agent.queue.push of a drawn script: up to two of
Write / Bash / EnterPlanMode / EnterGoalMode, then plain text, a gate, a gated
Write, or SubmitPlan / SubmitGoal of the session's kind or the other one, whose
execution script — done, Write, Bash, ReportCriteria, gate — is drawn too);
queue_edit (remove, clear, prioritize, sendNow); decide_racing (plans.resolve
with an abort, stop, sendNow or queue push 0-3 loop passes behind it); abort (smart or not, then again:
idempotent); abort_racing_prompt (prompt and abort arriving together);
stop_or_steer (stop, steer the running turn, steer an ended one); configure
(setMode / setPermissionMode); focus; resolve_permission (allow/deny, maybe
remembered); decide (approve with a random permission mode, or reject with
feedback); stale_answer (a settled permission request, a settled approval, or a
pending one named with another turn); submission_expires (the host's approval
timeout is 0 for that one prompt, so expiry is immediate and deterministic);
release_gate; crash_and_restart (the turn tasks are cancelled, the store is
closed and a new Host is opened on the same data directory — ``close()``'s
graceful abort never runs).

Invariants: at most one running turn per session, agreeing with the session's
status, currentTurnId and the live turn, and no turn task running without its
turn; waiting_permission exactly while a request of the current turn is
pending; at most one pending approval, and then the session is in that kind's
mode, awaiting_approval, running that turn; planState is the projection of mode
and approval; approved ⇔ executionId (+ permission mode + an execution state),
execution ids unique, no execution left queued at rest, a running execution is
the running turn, a completed Goal execution reported its criteria; every
artifact exists with its recorded sha256 and size, one file per approval row;
the durable mode equals the model's expected mode (idle setMode, successful
Enter*Mode results, approvals) and the replay of the transcript, and the
audit's ``mode.changed`` entries form a chain whose causes match that evidence;
no Write succeeds in a contract mode (its result is WRITE_DISABLED_IN_PLAN) and
marker files exist exactly for the successful Writes, in the session's own
root; Enter*/Submit* outside their mode fail with their codes; the queue is FIFO
(the host's queue is always a suffix of the model's, every consumed entry is one
queued turn) and an idle session keeps entries only while restored entries are
held after a restart, or after an abort; one notification per unseen
completed/failed turn, none for aborted or visible ones; after a restart
nothing is pending, queued or running and the recovery counts match what was in
flight.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import re
import shutil
import tempfile
from collections.abc import AsyncGenerator, AsyncIterator, Coroutine
from contextlib import aclosing
from pathlib import Path
from typing import Any, cast

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from pidesk.config import HostConfig
from pidesk.core import events as ev
from pidesk.core.errors import PideskError
from pidesk.core.records import TextBlock
from pidesk.host import Host
from pidesk.host.live import LiveTurn
from pidesk.ids import parse_iso, utcnow
from pidesk.providers.base import ModelRequest, StreamEvent
from pidesk.providers.scripted import ScriptedProvider
from tests.scenario import die, ended, plan_requested, prompt, session, state, submit_goal

KEY = re.compile(r"\[\[([kx]\d+)\]\]")
CONTRACT = ("plan", "goal")
ENTER = {"EnterPlanMode": "plan", "EnterGoalMode": "goal"}
SUBMIT = {"SubmitPlan": "plan", "SubmitGoal": "goal"}
PERMISSION_MODES = ("ask", "accept-edits", "auto")
SETTLE_TIMEOUT = 20.0

ACTIONS = ("write", "bash", "enter_plan", "enter_goal")
# "own" submits the kind of the mode the session will be in (plan from Agent, where it is refused)
FINALS = ("text", "gate", "gate_write", "submit_own", "submit_own", "submit_own", "submit_other")
EXECUTIONS = ("done", "write", "report", "gate", "bash")
script_st = st.tuples(
    st.lists(st.sampled_from(ACTIONS), max_size=2), st.sampled_from(FINALS), st.sampled_from(EXECUTIONS)
)
session_st = st.integers(0, 3)
pick_st = st.integers(0, 7)


# ---- the provider: one ScriptedProvider per turn, chosen by the [[key]] of its root message


class TurnScripts:
    """A Provider that gives each turn its own ScriptedProvider, picked by the turn's root ``[[key]]``.

    Gates are the ScriptedProvider's own; ``gate_waiters`` (its public ``wait_reached``) tell the machine
    that a turn got to one, so settling can wake on it.
    """

    name = "scripted/turns"

    def __init__(self) -> None:
        self.scripts: dict[str, ScriptedProvider] = {}
        self.gates: dict[str, list[str]] = {}  # key -> its gates
        self.gate_waiters: dict[str, asyncio.Future[None]] = {}  # gate -> done once reached
        self.released: set[str] = set()
        self.turn_keys: dict[str, str | None] = {}  # turn id -> key of its script
        self._unscripted: dict[str, ScriptedProvider] = {}

    def register(self, key: str, responses: list[dict[str, Any]]) -> None:
        inner = self.scripts[key] = ScriptedProvider(responses)
        self.gates[key] = [r["gate"] for r in responses if "gate" in r]
        for gate in self.gates[key]:
            self.gate_waiters[gate] = asyncio.ensure_future(inner.wait_reached(gate, timeout=3600))

    def release(self, gate: str) -> None:
        self.released.add(gate)
        for key, gates in self.gates.items():
            if gate in gates:
                self.scripts[key].release(gate)

    def reached(self, gate: str) -> bool:
        waiter = self.gate_waiters[gate]
        return waiter.done() and not waiter.cancelled() and waiter.exception() is None

    def parked_gate(self, turn_id: str) -> str | None:
        key = self.turn_keys.get(turn_id)
        for gate in self.gates.get(key or "", []):
            if gate not in self.released and self.reached(gate):
                return gate
        return None

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        if request.turn_id not in self.turn_keys:
            self.turn_keys[request.turn_id] = _key_of(request)
        key = self.turn_keys[request.turn_id]
        inner = self.scripts.get(key) if key else None
        if inner is None:  # a turn nobody scripted answers "Done."
            inner = self._unscripted.setdefault(request.turn_id, ScriptedProvider())
        async with aclosing(cast(AsyncGenerator[StreamEvent, None], inner.stream(request))) as events:
            async for event in events:
                yield event


def _key_of(request: ModelRequest) -> str | None:
    for message in request.messages:
        if message.turn_id == request.turn_id and message.role == "user":
            found = KEY.search("".join(b.text for b in message.content if isinstance(b, TextBlock)))
            return found.group(1) if found else None
    return None


# ---- helpers over wire values


def _blocks(messages: list[dict[str, Any]], kind: str) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    return [(m, b) for m in messages for b in m["content"] if b["type"] == kind]


def _calls(messages: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {b["id"]: b for _m, b in _blocks(messages, "toolCall")}


class HostMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.tmp = Path(tempfile.mkdtemp(prefix="pidesk-sm-"))
        self.config = HostConfig(data_dir=self.tmp / "data")
        self.provider = TurnScripts()
        self.host = Host.open(self.config, self.provider)
        self.sub = self.host.subscribe()
        self.counter = 0
        self.sids: list[str] = []
        self.initial_mode: dict[str, str] = {}
        self.expected_mode: dict[str, str] = {}
        self.expected_permission: dict[str, str] = {}
        self.user_changes: dict[str, list[tuple[int, str]]] = {}  # (last seq before it, new mode)
        self.enters_seen: dict[str, int] = {}
        self.queue_model: dict[str, list[str]] = {}
        self.queued_turns_seen: dict[str, int] = {}
        self.restored: dict[str, set[str]] = {}  # session -> queue entries restored by the last restart
        self.stopping: set[str] = set()  # turns asked to stop (agent.stop, or sendNow while running)
        self.focused: str | None = None
        self.turn_end_visible: dict[str, bool] = {}  # ended turn -> its session was focused when it ended
        self.seen_requests: dict[str, dict[str, Any]] = {}
        self.seen_approvals: dict[str, dict[str, Any]] = {}
        self.snapshot: dict[str, Any] = {"requests": [], "approvals": [], "gates": [], "in_flight": False}
        self.restarts = 0
        self.run(self._create_sessions())

    # ---- plumbing ------------------------------------------------------------------

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return self.loop.run_until_complete(coro)

    def step(self, coro: Coroutine[Any, Any, Any]) -> None:
        async def body() -> None:
            await coro
            await self._settle()

        self.run(body())

    async def call(self, method: str, params: dict[str, Any]) -> Any:
        return await self.host.call(method, params)

    async def fails(self, codes: str | tuple[str, ...], method: str, params: dict[str, Any]) -> str:
        codes = (codes,) if isinstance(codes, str) else codes
        with pytest.raises(PideskError) as info:
            await self.call(method, params)
        assert info.value.code in codes, f"{method} {params}: {info.value!r}, wanted {codes}"
        return str(info.value.code)

    def new_key(self, prefix: str = "k") -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    async def _create_sessions(self) -> None:
        for i, mode in enumerate(("agent", "plan", "goal", "agent")):
            params: dict[str, Any] = {"mode": mode, "title": f"s{i}"}
            if i < 3:
                project = self.tmp / f"project{i}"
                project.mkdir()
                (project / "README.md").write_text("# demo\n")
                params["projectPath"] = str(project)
            s = await self.call("session.create", params)
            sid = s["id"]
            self.sids.append(sid)
            self.initial_mode[sid] = self.expected_mode[sid] = mode
            self.expected_permission[sid] = "ask"
            self.user_changes[sid] = []
            self.enters_seen[sid] = 0
            self.queue_model[sid] = []
            self.queued_turns_seen[sid] = 0

    # ---- settling: every turn ended or parked ---------------------------------------

    def _parked(self, live: LiveTurn) -> bool:
        if live.decided:
            return False
        if any(not f.done() for f in live.permission_waiters.values()):
            return True
        if live.approval_waiter is not None and not live.approval_waiter[1].done():
            with self.host.store.db.read() as db:
                row = db.execute("SELECT status, deadline FROM plan_approvals WHERE id = ?",
                                 (live.approval_waiter[0],)).fetchone()
            return row is not None and row[0] == "pending" and parse_iso(row[1]) > utcnow()
        return self.provider.parked_gate(live.turn_id) is not None

    def _unsettled(self) -> set[asyncio.Task[None]]:
        parked = {lt.task for lt in self.host.parts.live.turns.values() if lt.task is not None and self._parked(lt)}
        return {t for t in self.host.turns._tasks if not t.done() and t not in parked}

    async def _settle(self) -> None:
        try:
            async with asyncio.timeout(SETTLE_TIMEOUT):
                while busy := self._unsettled():
                    self.sub.pending()
                    wakers: set[asyncio.Future[Any]] = {asyncio.ensure_future(self.sub.next())}
                    gates = {w for w in self.provider.gate_waiters.values() if not w.done()}
                    await asyncio.wait(busy | wakers | gates, return_when=asyncio.FIRST_COMPLETED)
                    for waker in wakers:
                        waker.cancel()
        except TimeoutError:
            live = {sid: (lt.turn_id, lt.decided, lt.stop_requested) for sid, lt in self.host.parts.live.turns.items()}
            raise AssertionError(f"the host did not settle within {SETTLE_TIMEOUT}s; live turns {live}") from None
        for task in self.host.turns._tasks:  # a turn task never dies of an exception
            if task.done() and not task.cancelled():
                assert task.exception() is None, repr(task.exception())

    # ---- model helpers --------------------------------------------------------------

    async def _state(self, sid: str) -> dict[str, Any]:
        state: dict[str, Any] = await self.call("session.get", {"sessionId": sid, "limit": 1000})
        assert not state["hasMore"]
        return state

    async def _busy(self, sid: str) -> bool:
        state = await self._state(sid)
        if state["session"]["status"] != "idle" or state["pendingApproval"] is not None:
            return True
        approvals = (await self.call("plans.list", {"sessionId": sid}))["approvals"]
        return any(a["executionState"] in ("queued", "running") for a in approvals)

    async def _turns(self, sid: str) -> list[dict[str, Any]]:
        turns: list[dict[str, Any]] = (await self.call("session.turns", {"sessionId": sid, "limit": 1000}))["turns"]
        return turns

    def _script(self, key: str, mode: str, actions: list[str], final: str, execution: str) -> list[dict[str, Any]]:
        responses = [self._action(key, str(i), a) for i, a in enumerate(actions)]
        for action in actions:
            if action.startswith("enter_") and mode == "agent":
                mode = action.removeprefix("enter_")
        own = mode if mode in CONTRACT else "plan"
        if final == "text":
            responses.append({"text": f"done {key}"})
        elif final == "gate":
            responses.append({"gate": f"{key}-g", "text": f"held {key}"})
        elif final == "gate_write":
            responses.append({"gate": f"{key}-g", **self._action(key, "g", "write")})
        else:
            kind = own if final == "submit_own" else {"plan": "goal", "goal": "plan"}[own]
            responses.append(self._submit(key, kind, execution))
        return responses

    def _action(self, key: str, i: str, action: str) -> dict[str, Any]:
        call_id = f"{key}-{i}"
        if action == "write":
            call = {"id": call_id, "name": "Write", "args": {"path": f"markers/{key}-{i}.txt", "content": key}}
        elif action == "bash":
            call = {"id": call_id, "name": "Bash", "args": {"command": "true"}}
        elif action == "report":
            call = {"id": call_id, "name": "ReportCriteria",
                    "args": {"results": [{"criterion": "c1", "outcome": "met", "evidence": "checked"}]}}
        else:
            call = {"id": call_id, "name": "EnterPlanMode" if action == "enter_plan" else "EnterGoalMode", "args": {}}
        return {"toolCalls": [call]}

    def _submit(self, key: str, kind: str, execution: str) -> dict[str, Any]:
        xkey = self.new_key("x")
        if execution == "gate":
            self.provider.register(xkey, [{"gate": f"{xkey}-g", "text": f"held {xkey}"}])
        elif execution == "done":
            self.provider.register(xkey, [])
        else:
            self.provider.register(xkey, [self._action(xkey, "0", execution)])
        args: dict[str, Any] = {"title": f"{kind} {key}", "markdown": f"# {kind} [[{xkey}]]\n\n1. write a marker\n",
                                "question": "Go ahead?"}
        if kind == "goal":
            args["criteria"] = ["c1"]
        name = "SubmitPlan" if kind == "plan" else "SubmitGoal"
        return {"toolCalls": [{"id": f"{key}-s", "name": name, "args": args}]}

    async def _last_seq(self, sid: str) -> int:
        messages = (await self._state(sid))["messages"]
        return messages[-1]["seq"] if messages else 0

    # ---- rules: prompts and the queue ------------------------------------------------

    @rule(s=session_st, script=script_st, queued=st.booleans())
    def send(self, s: int, script: tuple[list[str], str, str], queued: bool) -> None:
        """agent.prompt, or agent.queue.push (which starts at once on an idle session with an empty queue)."""
        if queued:
            self.step(self._queue_push(self.sids[s], script))
        else:
            self.step(self._prompt(self.sids[s], script))

    async def _prompt(self, sid: str, script: tuple[list[str], str, str]) -> None:
        key = self.new_key()
        self.provider.register(key, self._script(key, self.expected_mode[sid], *script))
        busy = await self._busy(sid)
        params = {"sessionId": sid, "text": f"[[{key}]] go"}
        if busy:
            await self.fails("AGENT_BUSY", "agent.prompt", params)
            return
        result = await self.call("agent.prompt", params)
        assert result["turnId"] and result["messageId"]

    async def _queue_push(self, sid: str, script: tuple[list[str], str, str]) -> None:
        key = self.new_key()
        self.provider.register(key, self._script(key, self.expected_mode[sid], *script))
        idle_and_empty = not await self._busy(sid) and not (await self._state(sid))["queue"]
        result = await self.call("agent.queue.push", {"sessionId": sid, "text": f"[[{key}]] queued"})
        self.queue_model[sid].append(result["entryId"])
        if idle_and_empty:  # PROTOCOL: a push on an idle session with an empty queue starts it at once
            state = await self._state(sid)
            assert result["entryId"] not in [e["id"] for e in state["queue"]], "the push did not start at once"

    @rule(s=session_st, op=st.sampled_from(("remove", "clear", "prioritize", "sendNow")), pick=pick_st)
    def queue_edit(self, s: int, op: str, pick: int) -> None:
        self.step(self._queue_edit(self.sids[s], op, pick))

    async def _queue_edit(self, sid: str, op: str, pick: int) -> None:
        entries = (await self._state(sid))["queue"]
        assert [e["id"] for e in entries] == self.queue_model[sid]
        method = "agent.queue.remove" if op == "clear" else f"agent.queue.{op}"
        if not entries:
            await self.fails("NOT_FOUND", method, {"sessionId": sid, "entryId": "q_missing"})
            return
        if op == "clear":
            for e in entries:
                await self.call("agent.queue.remove", {"sessionId": sid, "entryId": e["id"]})
            self.queue_model[sid] = []
            assert (await self._state(sid))["queue"] == []
            return
        entry = entries[pick % len(entries)]["id"]
        busy = await self._busy(sid)
        current = (await self._state(sid))["session"]["currentTurnId"]
        if op == "sendNow" and current is not None:
            self.stopping.add(current)
        result = await self.call(method, {"sessionId": sid, "entryId": entry})
        self.queue_model[sid].remove(entry)
        if op == "remove":
            assert [e["id"] for e in (await self._state(sid))["queue"]] == self.queue_model[sid]
            return
        self.queue_model[sid].insert(0, entry)
        if op == "prioritize":
            assert [e["id"] for e in result["entries"]] == self.queue_model[sid]
        elif not busy:  # sendNow on an idle session starts the entry at once, held queue or not
            assert entry not in [e["id"] for e in (await self._state(sid))["queue"]], "sendNow did not start it"

    # ---- rules: abort, stop, configuration, focus ------------------------------------

    @rule(s=session_st, smart=st.booleans())
    def abort(self, s: int, smart: bool) -> None:
        self.step(self._abort(self.sids[s], smart))

    async def _abort(self, sid: str, smart: bool) -> None:
        before = await self._state(sid)
        turn_id = before["session"]["currentTurnId"]
        result = await self.call("agent.abort", {"sessionId": sid, "smart": smart})
        assert result["aborted"] == (turn_id is not None), (result, before["session"])
        after = await self._state(sid)
        if turn_id is None:
            assert "restoredDraft" not in result
        else:
            turn = next(t for t in await self._turns(sid) if t["id"] == turn_id)
            assert (turn["state"], turn["reason"]) == ("ended", "aborted")
            assert after["session"]["status"] == "idle" and after["session"]["currentTurnId"] is None
            assert after["pendingApproval"] is None and after["pendingPermissions"] == []
            assert [e["id"] for e in after["queue"]] == [e["id"] for e in before["queue"]], "abort released the queue"
            if before["pendingApproval"] is not None:
                plans = (await self.call("plans.list", {"sessionId": sid}))["approvals"]
                row = next(a for a in plans if a["id"] == before["pendingApproval"]["id"])
                assert row["status"] == "interrupted"
            if "restoredDraft" in result:
                assert smart
                root = next(m for m in before["messages"] if m["turnId"] == turn_id)
                assert result["restoredDraft"]["text"] == root["content"][0]["text"]
                assert not [m for m in after["messages"] if m["turnId"] == turn_id]
        again = await self.call("agent.abort", {"sessionId": sid, "smart": smart})
        assert again == {"aborted": False}

    @rule(s=session_st, op=st.sampled_from(("stop", "steer", "steer_ended")))
    def stop_or_steer(self, s: int, op: str) -> None:
        self.step(self._stop_or_steer(self.sids[s], op))

    async def _stop_or_steer(self, sid: str, op: str) -> None:
        current = (await self._state(sid))["session"]["currentTurnId"]
        if op == "stop":
            await self.call("agent.stop", {"sessionId": sid})
            if current is not None:
                self.stopping.add(current)
            return
        if op == "steer" and current is not None:
            params = {"sessionId": sid, "turnId": current, "text": "also mind the tests"}
            if current in self.stopping:
                await self.fails("TURN_ENDED", "agent.steer", params)
            else:
                assert await self.call("agent.steer", params) == {}
            return
        ended = [t["id"] for t in await self._turns(sid) if t["state"] == "ended"]
        turn_id = ended[-1] if ended else "t_missing"
        code = "TURN_ENDED" if ended else "NOT_FOUND"
        await self.fails(code, "agent.steer", {"sessionId": sid, "turnId": turn_id, "text": "too late"})

    @rule(s=session_st, smart=st.booleans())
    def abort_racing_prompt(self, s: int, smart: bool) -> None:
        self.step(self._abort_racing_prompt(self.sids[s], smart))

    async def _abort_racing_prompt(self, sid: str, smart: bool) -> None:
        """agent.prompt and agent.abort arrive together, as two requests on one connection would."""
        key = self.new_key()
        self.provider.register(key, [{"text": f"reply {key}"}])
        params = {"sessionId": sid, "text": f"[[{key}]] go"}
        if await self._busy(sid):
            await self.fails("AGENT_BUSY", "agent.prompt", params)
            return
        prompt = asyncio.ensure_future(self.call("agent.prompt", params))
        # One pass of the loop, not a wait for time: the prompt runs synchronously up to its first
        # suspension (the root message being written in a thread), so the abort lands mid-start.
        await asyncio.sleep(0)
        aborted = await self.call("agent.abort", {"sessionId": sid, "smart": smart})
        turn_id = (await prompt)["turnId"]
        assert aborted["aborted"] is True
        await self._settle()
        turn = next(t for t in await self._turns(sid) if t["id"] == turn_id)
        assert (turn["state"], turn["reason"]) == ("ended", "aborted")
        # nothing runs after an acknowledged abort
        roles = [m["role"] for m in (await self._state(sid))["messages"] if m["turnId"] == turn_id]
        assert turn_id not in self.provider.turn_keys and roles in ([], ["user"]), roles

    @rule(s=session_st, value=st.sampled_from(("agent", "plan", "goal", *PERMISSION_MODES)))
    def configure(self, s: int, value: str) -> None:
        """session.setMode or session.setPermissionMode: accepted only while idle."""
        if value in PERMISSION_MODES:
            self.step(self._set_permission_mode(self.sids[s], value))
        else:
            self.step(self._set_mode(s, value))

    async def _set_mode(self, s: int, mode: str) -> None:
        sid = self.sids[s]
        params = {"sessionId": sid, "mode": mode}
        if await self._busy(sid):
            await self.fails("AGENT_BUSY", "session.setMode", params)
        elif s == 3 and mode in CONTRACT:
            await self.fails("PLAN_WORKSPACE_REQUIRED", "session.setMode", params)
        else:
            last = await self._last_seq(sid)
            session = await self.call("session.setMode", params)
            assert session["mode"] == mode
            if mode != self.expected_mode[sid]:
                self.user_changes[sid].append((last, mode))
            self.expected_mode[sid] = mode

    async def _set_permission_mode(self, sid: str, permission: str) -> None:
        params = {"sessionId": sid, "permissionMode": permission}
        if await self._busy(sid):
            await self.fails("AGENT_BUSY", "session.setPermissionMode", params)
            return
        session = await self.call("session.setPermissionMode", params)
        assert session["permissionMode"] == permission
        self.expected_permission[sid] = permission

    @rule(s=st.one_of(st.none(), session_st))
    def focus(self, s: int | None) -> None:
        sid = None if s is None else self.sids[s]
        self.focused = sid
        self.restored.pop(sid or "", None)
        self.step(self.call("session.focus", {"sessionId": sid}))

    # ---- rules: permission requests --------------------------------------------------

    @precondition(lambda self: bool(self.snapshot["requests"]))
    @rule(pick=pick_st, allow=st.booleans(), remember=st.booleans())
    def resolve_permission(self, pick: int, allow: bool, remember: bool) -> None:
        request = self.snapshot["requests"][pick % len(self.snapshot["requests"])]
        params: dict[str, Any] = {"requestId": request["id"], "sessionId": request["sessionId"],
                                  "turnId": request["turnId"], "decision": "allow" if allow else "deny"}
        if remember:
            params["remember"] = "session"
        self.step(self.call("permissions.resolve", params))

    # ---- rules: plan / goal approvals ------------------------------------------------

    @precondition(lambda self: bool(self.snapshot["approvals"]))
    @rule(pick=pick_st, approve=st.booleans(), permission=st.sampled_from(PERMISSION_MODES),
          feedback=st.sampled_from((None, "", "smaller steps please")))
    def decide(self, pick: int, approve: bool, permission: str, feedback: str | None) -> None:
        """plans.resolve on the pending approval: approve with a permission mode, or reject with feedback."""
        if approve:
            self.step(self._approve(pick, permission))
        else:
            self.step(self._reject(pick, feedback))

    async def _approve(self, pick: int, permission: str) -> None:
        pending = self.snapshot["approvals"][pick % len(self.snapshot["approvals"])]
        sid = pending["sessionId"]
        before = (await self._state(sid))["session"]
        assert before["mode"] == pending["kind"]
        row = await self.call("plans.resolve", {"approvalId": pending["id"], "sessionId": sid,
                                                "turnId": pending["turnId"], "decision": "approve",
                                                "permissionMode": permission})
        assert row["status"] == "approved" and row["executionId"] and row["permissionMode"] == permission
        assert row["executionState"] in ("queued", "running")
        session = (await self._state(sid))["session"]
        assert (session["mode"], session["permissionMode"]) == ("agent", permission)
        self.expected_mode[sid] = "agent"
        self.expected_permission[sid] = permission

    async def _reject(self, pick: int, feedback: str | None) -> None:
        pending = self.snapshot["approvals"][pick % len(self.snapshot["approvals"])]
        params: dict[str, Any] = {"approvalId": pending["id"], "sessionId": pending["sessionId"],
                                  "turnId": pending["turnId"], "decision": "reject"}
        if feedback is not None:
            params["feedback"] = feedback
        row = await self.call("plans.resolve", params)
        assert row["status"] == "rejected" and row["executionId"] is None and row["feedback"] == feedback
        assert (await self._state(pending["sessionId"]))["session"]["mode"] == pending["kind"]

    @rule(s=st.integers(1, 2), approve=st.booleans(), permission=st.sampled_from(PERMISSION_MODES),
          racer=st.sampled_from(("abort", "stop", "sendNow", "push")), passes=st.integers(0, 3),
          script=script_st, execution=st.sampled_from(EXECUTIONS))
    def decide_racing(self, s: int, approve: bool, permission: str, racer: str, passes: int,
                      script: tuple[list[str], str, str], execution: str) -> None:
        """plans.resolve and an abort, stop, sendNow or queue push arriving together, the second
        0-3 loop passes after the first (authority hole 1: approve + abort wedged the session).
        The session's pending approval is raced; a session at rest in a contract mode submits one first."""
        self.step(self._decide_racing(self.sids[s], approve, permission, racer, passes, script, execution))

    async def _decide_racing(self, sid: str, approve: bool, permission: str, racer: str, passes: int,
                             script: tuple[list[str], str, str], execution: str) -> None:
        pending = (await self._state(sid))["pendingApproval"]
        if pending is None:
            mode = self.expected_mode[sid]
            if mode not in CONTRACT or await self._busy(sid):
                return
            key = self.new_key()
            self.provider.register(key, [self._submit(key, mode, execution)])
            await self.call("agent.prompt", {"sessionId": sid, "text": f"[[{key}]] submit"})
            await self._settle()
            pending = (await self._state(sid))["pendingApproval"]
            assert pending is not None, "the submission did not wait for a decision"
        params: dict[str, Any] = {"approvalId": pending["id"], "sessionId": sid, "turnId": pending["turnId"],
                                  "decision": "approve" if approve else "reject"}
        if approve:
            params["permissionMode"] = permission
        if racer == "sendNow" and not (await self._state(sid))["queue"]:
            await self._queue_push(sid, script)  # something to send now
        deciding = asyncio.ensure_future(self.call("plans.resolve", params))
        for _ in range(passes):
            await asyncio.sleep(0)  # loop passes, not time: where in the approval's wake-up the racer lands
        if racer == "abort":
            await self.call("agent.abort", {"sessionId": sid})
        elif racer == "stop":
            self.stopping.add(pending["turnId"])
            await self.call("agent.stop", {"sessionId": sid})
        elif racer == "sendNow":
            entry = (await self._state(sid))["queue"][0]["id"]
            current = (await self._state(sid))["session"]["currentTurnId"]
            if current is not None:
                self.stopping.add(current)
            await self.call("agent.queue.sendNow", {"sessionId": sid, "entryId": entry})
        else:
            await self._queue_push(sid, script)
        try:
            row = await deciding
        except PideskError as exc:  # the abort settled the approval before the decision arrived
            assert racer == "abort" and exc.code in ("PLAN_ALREADY_RESOLVED", "PLAN_APPROVAL_STALE"), exc
            row = next(a for a in (await self.call("plans.list", {"sessionId": sid}))["approvals"]
                       if a["id"] == pending["id"])
            assert row["status"] == "interrupted", row
        if row["status"] == "approved":
            self.expected_mode[sid] = "agent"
            self.expected_permission[sid] = permission

    @precondition(lambda self: bool(self._stale_requests()) or bool(self.seen_approvals))
    @rule(pick=pick_st, approve=st.booleans())
    def stale_answer(self, pick: int, approve: bool) -> None:
        """A permission answer for a settled request, or a decision on a settled or mismatched approval."""
        if self.seen_approvals and (approve or not self._stale_requests()):
            self.step(self._stale_plan(pick, approve))
        else:
            self.step(self._stale_permission(pick, approve))

    def _stale_requests(self) -> list[dict[str, Any]]:
        pending = {r["id"] for r in self.snapshot["requests"]}
        return [r for rid, r in self.seen_requests.items() if rid not in pending]

    async def _stale_permission(self, pick: int, allow: bool) -> None:
        stale = self._stale_requests()
        request = stale[pick % len(stale)]
        session = (await self._state(request["sessionId"]))["session"]
        code = "STALE_REQUEST" if session["currentTurnId"] == request["turnId"] else "TURN_ENDED"
        await self.fails(code, "permissions.resolve", {
            "requestId": request["id"], "sessionId": request["sessionId"], "turnId": request["turnId"],
            "decision": "allow" if allow else "deny"})

    async def _stale_plan(self, pick: int, approve: bool) -> None:
        rows = list(self.seen_approvals.values())
        row = rows[pick % len(rows)]
        params: dict[str, Any] = {"approvalId": row["id"], "sessionId": row["sessionId"], "turnId": row["turnId"],
                                  "decision": "approve" if approve else "reject", "permissionMode": "auto"}
        if any(p["id"] == row["id"] for p in self.snapshot["approvals"]):
            params["turnId"] = "t_someone_else"  # pending, but named with another turn
            await self.fails("PLAN_APPROVAL_STALE", "plans.resolve", params)
        else:
            await self.fails("PLAN_ALREADY_RESOLVED", "plans.resolve", params)

    @rule(s=st.integers(0, 2), execution=st.sampled_from(EXECUTIONS))
    def submission_expires(self, s: int, execution: str) -> None:
        self.step(self._expire(self.sids[s], execution))

    async def _expire(self, sid: str, execution: str) -> None:
        key = self.new_key()
        mode = (await self._state(sid))["session"]["mode"]
        kind = mode if mode in CONTRACT else "plan"
        self.provider.register(key, [self._submit(key, kind, execution)])
        params = {"sessionId": sid, "text": f"[[{key}]] submit"}
        if await self._busy(sid):
            await self.fails("AGENT_BUSY", "agent.prompt", params)
            return
        config = self.host.parts.config
        self.host.parts.config = dataclasses.replace(config, approval_timeout=0.0)
        try:
            turn_id = (await self.call("agent.prompt", params))["turnId"]
            await self._settle()
        finally:
            self.host.parts.config = config
        turn = next(t for t in await self._turns(sid) if t["id"] == turn_id)
        assert (turn["state"], turn["reason"]) == ("ended", "completed"), turn
        results = [b for m, b in _blocks((await self._state(sid))["messages"], "toolResult") if m["turnId"] == turn_id]
        assert len(results) == 1
        if mode in CONTRACT:
            assert results[0]["errorCode"] == "PLAN_APPROVAL_TIMEOUT"
            rows = [a for a in (await self.call("plans.list", {"sessionId": sid}))["approvals"] if a["turnId"] == turn_id]
            assert [(a["status"], a["executionId"]) for a in rows] == [("expired", None)]
        else:
            assert results[0]["errorCode"] == "PLAN_NOT_ACTIVE"

    # ---- rules: gates, crash -----------------------------------------------------------

    @precondition(lambda self: bool(self.snapshot["gates"]))
    @rule(pick=pick_st)
    def release_gate(self, pick: int) -> None:
        gate = self.snapshot["gates"][pick % len(self.snapshot["gates"])]

        async def release() -> None:
            self.provider.release(gate)

        self.step(release())

    @precondition(lambda self: self.snapshot["in_flight"])
    @rule()
    def crash_and_restart(self) -> None:
        self.run(self._crash())

    async def _crash(self) -> None:
        before: dict[str, Any] = {"approvals": set(), "executions": set(), "turns": {}, "permissions": 0}
        for sid in self.sids:
            state = await self._state(sid)
            before["permissions"] += len(state["pendingPermissions"])
            for a in (await self.call("plans.list", {"sessionId": sid}))["approvals"]:
                if a["status"] == "pending":
                    before["approvals"].add(a["id"])
                if a["executionState"] in ("queued", "running"):
                    before["executions"].add(a["id"])
            for t in await self._turns(sid):
                if t["state"] == "running":
                    before["turns"][t["id"]] = (sid, t["origin"])
        queues = {sid: (await self._state(sid))["queue"] for sid in self.sids}

        await die(self.host)
        self.sub.close()
        self.host = Host.open(self.config, self.provider)
        self.sub = self.host.subscribe()
        self.restarts += 1
        self.focused = None
        self.restored = {sid: {e["id"] for e in q} for sid, q in queues.items() if q}

        assert self.host.recovery is not None
        assert self.host.recovery.interrupted == {
            "approvals": len(before["approvals"]), "executions": len(before["executions"]),
            "turns": len(before["turns"]), "permissions": before["permissions"],
        }
        assert not self.host.parts.live.turns
        status = await self.call("host.status", {})
        assert (status["running"], status["pendingApprovals"]) == (0, 0)
        assert (await self.call("permissions.pending", {}))["requests"] == []
        for sid in self.sids:
            state = await self._state(sid)
            assert state["session"]["status"] == "idle" and state["session"]["currentTurnId"] is None
            assert state["queue"] == queues[sid], "the queue changed across the restart"
            for a in (await self.call("plans.list", {"sessionId": sid}))["approvals"]:
                assert a["status"] != "pending" and a["executionState"] not in ("queued", "running")
                if a["id"] in before["approvals"]:
                    assert a["status"] == "interrupted"
                if a["id"] in before["executions"]:
                    assert a["executionState"] == "interrupted"
            for t in await self._turns(sid):
                assert t["state"] == "ended"
                if t["id"] in before["turns"]:
                    code = "PLAN_EXECUTION_INTERRUPTED" if t["origin"] == "execution" else "INTERRUPTED"
                    assert (t["reason"], t["errorCode"]) == ("aborted", code), t
        await self._settle()

    # ---- invariants ---------------------------------------------------------------------

    @invariant()
    def consistent(self) -> None:
        self.run(self._check())

    async def _check(self) -> None:
        notes = (await self.call("notifications.list", {}))["notifications"]
        by_turn: dict[str, list[dict[str, Any]]] = {}
        for note in notes:
            by_turn.setdefault(note["turnId"], []).append(note)
        all_requests: list[dict[str, Any]] = []
        all_pending_approvals: list[dict[str, Any]] = []
        execution_ids: list[str] = []
        running_sessions = 0
        for sid in self.sids:
            state = await self._state(sid)
            session, messages = state["session"], state["messages"]
            turns = await self._turns(sid)
            approvals = (await self.call("plans.list", {"sessionId": sid}))["approvals"]
            audit = (await self.call("audit.list", {"sessionId": sid, "limit": 10_000}))["entries"]
            live = self.host.parts.live.turns.get(sid)

            # one active turn, agreeing with status, currentTurnId and the live turn
            running = [t for t in turns if t["state"] == "running"]
            assert len(running) <= 1, running
            if running:
                running_sessions += 1
                assert session["status"] in ("running", "waiting_permission")
                assert session["currentTurnId"] == running[0]["id"]
                assert live is not None and live.turn_id == running[0]["id"] and not live.decided
            else:
                assert session["status"] == "idle" and session["currentTurnId"] is None, session
                assert live is None
                # authority hole 1: idle at rest means able to take a prompt and a configuration change
                assert not self.host.parts.is_busy(sid), f"an idle session answers AGENT_BUSY: {session}"
            for t in turns:
                assert (t["state"] == "ended") == (t["reason"] is not None), t

            # permission requests: waiting_permission exactly while one of the current turn is pending
            pending_requests = state["pendingPermissions"]
            assert [r["turnId"] for r in pending_requests] == [session["currentTurnId"]] * len(pending_requests)
            assert (session["status"] == "waiting_permission") == bool(pending_requests), (session, pending_requests)
            all_requests += pending_requests

            # approvals: one pending at most, projected into the session; approved <=> execution id
            pending = [a for a in approvals if a["status"] == "pending"]
            assert len(pending) <= 1
            assert state["pendingApproval"] == (pending[0] if pending else None)
            if pending:
                a = pending[0]
                assert session["mode"] == a["kind"] and session["planState"] == "awaiting_approval"
                assert session["status"] == "running" and session["currentTurnId"] == a["turnId"]
            else:
                assert session["planState"] == ("inactive" if session["mode"] == "agent" else "planning")
            all_pending_approvals += pending
            open_executions = []
            for a in approvals:
                if a["status"] == "approved":
                    assert a["executionId"] and a["permissionMode"] and a["executionState"] != "none", a
                    execution_ids.append(a["executionId"])
                else:
                    assert a["executionId"] is None and a["executionState"] == "none", a
                assert a["executionState"] != "queued", f"an approved execution was never dispatched: {a}"
                if a["executionState"] == "running":
                    open_executions.append(a)
                project = Path(session["projectPath"])
                data = (project / a["artifactPath"]).read_bytes()
                assert (hashlib.sha256(data).hexdigest(), len(data)) == (a["artifactSha256"], a["artifactSize"])
            for a in approvals:  # a Goal execution completes only through a ReportCriteria with every criterion met
                if a["kind"] == "goal" and a["executionState"] == "completed":
                    header = f"Approved goal: {a['artifactPath']} "
                    turn_id = next(m["turnId"] for m in messages
                                   if m["role"] == "user" and m["content"][0].get("text", "").startswith(header))
                    reports = [b for m, b in _blocks(messages, "toolResult")
                               if m["turnId"] == turn_id and b["name"] == "ReportCriteria" and b["ok"]]
                    assert reports, f"goal execution {a['executionId']} completed without a criteria report"
            assert len(open_executions) <= 1
            if open_executions:
                assert running and running[0]["origin"] == "execution", (open_executions, running)
            if session["projectPath"] is not None:
                for kind in CONTRACT:
                    files = list((Path(session["projectPath"]) / ".pi" / kind).glob("*.md"))
                    assert len(files) == len([a for a in approvals if a["kind"] == kind]), f"stray {kind} artifact"
            busy = bool(running) or bool(pending) or bool(open_executions)
            assert self.host.parts.is_busy(sid) == busy

            # modes: model == durable == transcript replay == audit chain
            replayed, enters, entered = self._replay(sid, messages, temporary=session["projectPath"] is None)
            new_enters = enters - self.enters_seen[sid]
            assert new_enters in (0, 1), f"{new_enters} mode entries in one step"
            if new_enters:
                self.expected_mode[sid] = entered
            self.enters_seen[sid] = enters
            assert session["mode"] == self.expected_mode[sid] == replayed, (session["mode"], self.expected_mode[sid], replayed)
            assert session["permissionMode"] == self.expected_permission[sid]
            self._check_audit(sid, audit, approvals, enters, session["mode"])

            # marker files exist exactly for the Writes that succeeded, in this session's own root
            calls = _calls(messages)
            wrote = {calls[b["toolCallId"]]["args"]["path"] for _m, b in _blocks(messages, "toolResult")
                     if b["name"] == "Write" and b["ok"]}
            markers = Path(session["root"]) / "markers"
            on_disk = {f"markers/{p.name}" for p in markers.glob("*")} if markers.is_dir() else set()
            assert on_disk == wrote, (on_disk, wrote)

            # the queue: FIFO, every consumed entry is one queued turn
            host_queue = [e["id"] for e in state["queue"]]
            model = self.queue_model[sid]
            consumed = len(model) - len(host_queue)
            assert consumed >= 0 and model[consumed:] == host_queue, (model, host_queue)
            queued_turns = len([t for t in turns if t["origin"] == "queued"])
            assert queued_turns - self.queued_turns_seen[sid] == consumed
            self.queue_model[sid], self.queued_turns_seen[sid] = host_queue, queued_turns
            held = self.restored.get(sid, set()) & set(host_queue)  # the hold is for the restored entries
            if sid in self.restored:
                self.restored[sid] = held
            if host_queue and not running:
                last = turns[-1] if turns else None
                assert held or (last is not None and last["reason"] == "aborted"), \
                    f"an idle session keeps a queue it should have released: {host_queue}, last turn {last}"

            # notifications: one per unseen completed/failed turn; none for aborted or visible ones
            for t in turns:
                if t["state"] == "ended" and t["id"] not in self.turn_end_visible:
                    self.turn_end_visible[t["id"]] = self.focused == sid
                if t["state"] != "ended":
                    continue
                kinds = [n["kind"] for n in by_turn.get(t["id"], [])]
                if t["reason"] == "aborted" or self.turn_end_visible[t["id"]]:
                    assert kinds == [], (t, kinds)
                else:
                    assert kinds == ["task.completed" if t["reason"] == "completed" else "task.failed"], (t, kinds)

            for r in pending_requests:
                self.seen_requests[r["id"]] = r
            for a in approvals:
                self.seen_approvals[a["id"]] = a

        assert len(execution_ids) == len(set(execution_ids))
        owners = {lt.task for lt in self.host.parts.live.turns.values()}
        assert all(t.done() or t in owners for t in self.host.turns._tasks), "a turn task runs without its turn"
        status = await self.call("host.status", {})
        assert (status["running"], status["pendingApprovals"]) == (running_sessions, len(all_pending_approvals))
        gates = [g for lt in self.host.parts.live.turns.values() if (g := self.provider.parked_gate(lt.turn_id))]
        self.snapshot = {"requests": all_requests, "approvals": all_pending_approvals, "gates": gates,
                         "in_flight": bool(running_sessions or any(self.queue_model.values()))}

    def _replay(self, sid: str, messages: list[dict[str, Any]], *, temporary: bool) -> tuple[str, int, str]:
        """The mode at every message, from the user's changes and the tool results; checks each result.

        Returns the final mode, the number of successful Enter*Mode calls and the mode the last one entered.
        """
        mode = self.initial_mode[sid]
        changes = list(self.user_changes[sid])
        enters, entered = 0, ""
        for message in messages:
            while changes and changes[0][0] < message["seq"]:
                mode = changes.pop(0)[1]
            for block in message["content"]:
                if block["type"] != "toolResult":
                    continue
                name, ok, code = block["name"], block["ok"], block.get("errorCode")
                if name == "Write" and mode in CONTRACT:
                    assert (ok, code) == (False, "WRITE_DISABLED_IN_PLAN"), (mode, block)
                elif name in ENTER and ok:
                    assert mode == "agent", (mode, block)
                    mode = entered = ENTER[name]
                    enters += 1
                elif name in ENTER and mode in CONTRACT:
                    assert code == "PLAN_ALREADY_ACTIVE", (mode, block)
                elif name in ENTER:
                    assert temporary and code == "PLAN_WORKSPACE_REQUIRED", (mode, block)
                elif name in SUBMIT and mode == "agent":
                    assert code == "PLAN_NOT_ACTIVE", (mode, block)
                elif name in SUBMIT and SUBMIT[name] != mode:
                    assert code == "PLAN_KIND_MISMATCH", (mode, block)
                elif name in SUBMIT and ok:
                    mode = "agent"
        for _after, target in changes:
            mode = target
        return mode, enters, entered

    def _check_audit(self, sid: str, audit: list[dict[str, Any]], approvals: list[dict[str, Any]],
                     enters: int, mode_now: str) -> None:
        mode = self.initial_mode[sid]
        causes = {"user": 0, "agent": 0, "approval": 0}
        approved_turns = {a["turnId"]: a["kind"] for a in approvals if a["status"] == "approved"}
        for entry in audit:
            if entry["action"] != "mode.changed":
                continue
            d = entry["detail"]
            assert d["frm"] == mode and d["to"] != mode, (mode, entry)
            causes[d["cause"]] += 1
            if d["cause"] == "agent":
                assert d["frm"] == "agent" and d["to"] in CONTRACT and entry["turnId"], entry
            elif d["cause"] == "approval":
                assert d["to"] == "agent" and approved_turns.get(entry["turnId"]) == d["frm"], entry
            else:
                assert d["cause"] == "user" and entry["turnId"] is None, entry
            mode = d["to"]
        assert mode == mode_now
        assert causes == {"user": len(self.user_changes[sid]), "agent": enters, "approval": len(approved_turns)}, causes

    # ---- teardown -----------------------------------------------------------------------

    def teardown(self) -> None:
        async def shutdown() -> None:
            try:
                await asyncio.wait_for(self.host.close(), 30)
            finally:
                rest = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
                for task in rest:
                    task.cancel()
                await asyncio.gather(*rest, return_exceptions=True)

        try:
            self.run(shutdown())
            self.run(self.loop.shutdown_asyncgens())
            self.run(self.loop.shutdown_default_executor())
        finally:
            self.loop.close()
            shutil.rmtree(self.tmp, ignore_errors=True)


HostMachine.TestCase.settings = settings(
    max_examples=50, stateful_step_count=30, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestHostMachine = HostMachine.TestCase


# ---- the bugs the machine found, each as the smallest sequence that shows it -------------------
# (each was a strict xfail until pidesk fixed it; they stay as regression tests)


@pytest.mark.asyncio
async def test_an_abort_during_turn_start_stops_the_turn(host: Host, provider: ScriptedProvider,
                                                          project: Path) -> None:
    """An abort landing while agent.prompt writes the root message was acknowledged, yet Turns.start
    created the turn task afterwards and the model was called (machine: abort_racing_prompt)."""
    s = await session(host, project)
    provider.enqueue(s["id"], {"text": "never said"})
    sending = asyncio.ensure_future(prompt(host, s["id"]))
    await asyncio.sleep(0)  # one loop pass: the prompt is suspended writing its root message
    assert (await host.call("agent.abort", {"sessionId": s["id"]}))["aborted"] is True
    turn_id = (await sending)["turnId"]
    await asyncio.gather(*host.turns._tasks)
    assert provider.calls(s["id"]) == 0, "the model was called after the abort was acknowledged"
    roles = [m["role"] for m in (await state(host, s["id"]))["messages"] if m["turnId"] == turn_id]
    assert roles in ([], ["user"])


@pytest.mark.asyncio
async def test_a_push_after_the_restored_queue_was_emptied_starts_at_once(
    make_host: Any, provider: ScriptedProvider, project: Path
) -> None:
    """The restart hold on a queue outlived the restored entries: a push on the idle session with an
    empty queue was held instead of starting at once (machine: send(queued) after crash_and_restart)."""
    host = make_host()
    sid = (await session(host, project))["id"]
    provider.enqueue(sid, {"gate": "hold"})
    await prompt(host, sid)
    restored = await host.call("agent.queue.push", {"sessionId": sid, "text": "restored"})
    await provider.wait_reached("hold")
    await die(host)  # the process dies: no graceful abort

    host = make_host()
    await host.call("agent.queue.remove", {"sessionId": sid, "entryId": restored["entryId"]})
    sub = host.subscribe()
    await host.call("agent.queue.push", {"sessionId": sid, "text": "new work"})
    assert (await state(host, sid))["queue"] == [], "the push on an idle session with an empty queue was held"
    await ended(sub)


@pytest.mark.asyncio
async def test_a_stopped_goal_execution_is_not_completed(host: Host, provider: ScriptedProvider,
                                                          project: Path) -> None:
    """agent.stop on a Goal execution recorded it 'completed' with no ReportCriteria; an unreported
    Goal end is GOAL_UNREPORTED (machine: the completed-Goal-execution invariant)."""
    sid = (await session(host, project, mode="goal"))["id"]
    provider.enqueue(sid, submit_goal(["c1"]), {"gate": "working", "text": "still working"})
    sub = host.subscribe()
    await prompt(host, sid)
    approval = (await plan_requested(sub)).approval
    await host.call("plans.resolve", {"approvalId": approval.id, "sessionId": sid, "turnId": approval.turn_id,
                                      "decision": "approve", "permissionMode": "auto"})
    await provider.wait_reached("working")
    await host.call("agent.stop", {"sessionId": sid})
    provider.release("working")
    await sub.wait_for(lambda e: isinstance(e, ev.TurnEnded) and e.turn_id != approval.turn_id)
    (row,) = (await host.call("plans.list", {"sessionId": sid}))["approvals"]
    assert row["executionState"] != "completed", "a Goal execution completed with no criterion reported"
