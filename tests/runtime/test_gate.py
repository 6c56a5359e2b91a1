"""The step gate: at most ``slots`` turns work at once, and a turn that waits gives its slot up."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pidesk.runtime.gate import StepGate
from tests.scenario import all_ended, prompt, session, tool


class Workers:
    """Counts how many workers are inside their work at once."""

    def __init__(self) -> None:
        self.inside = 0
        self.most = 0

    async def work(self) -> None:
        self.inside += 1
        self.most = max(self.most, self.inside)
        for _ in range(3):
            await asyncio.sleep(0)  # instant awaits: work that yields to the loop but never waits on anything
        self.inside -= 1


@pytest.mark.asyncio
@pytest.mark.parametrize("slots", [1, 2, 4])
async def test_at_most_slots_queued_turns_work_at_once_and_every_slot_is_used(slots):
    gate, workers = StepGate(slots, patience=30.0), Workers()
    started = asyncio.Event()

    async def turn() -> None:
        await started.wait()
        async with gate.slot() as slot:
            for _ in range(5):
                await slot.wait_for(workers.work())

    holders = [gate.slot() for _ in range(slots)]
    for holder in holders:  # every slot taken, so the turns queue up and the gate is contended from the start
        await holder.__aenter__()
    turns = [asyncio.create_task(turn()) for _ in range(12)]
    started.set()
    for _ in range(100):
        if gate.queued == 12:
            break
        await asyncio.sleep(0)
    assert gate.queued == 12
    for holder in holders:
        await holder.__aexit__(None, None, None)
    await asyncio.wait_for(asyncio.gather(*turns), 10)
    assert workers.most == slots


@pytest.mark.asyncio
async def test_a_lone_turn_keeps_its_slot_and_a_newcomer_takes_it_over_only_once_the_wait_is_long():
    gate, workers = StepGate(1, patience=0.001), Workers()
    answered = asyncio.Event()
    order: list[str] = []

    async def lone() -> None:
        async with gate.slot() as slot:
            await slot.wait_for(workers.work())  # quick: back before anyone could take the slot over
            assert slot.held
            await slot.wait_for(answered.wait())  # e.g. a model still thinking
            order.append("lone resumed")

    async def newcomer() -> None:
        async with gate.slot():
            order.append("newcomer worked")
            answered.set()

    first = asyncio.create_task(lone())
    for _ in range(100):
        if workers.most:
            break
        await asyncio.sleep(0)
    await asyncio.wait_for(asyncio.gather(first, newcomer()), 10)
    assert order == ["newcomer worked", "lone resumed"]


@pytest.mark.asyncio
async def test_a_turn_waiting_on_something_slow_lets_another_turn_have_its_only_slot():
    gate = StepGate(1, patience=0.001)
    answered = asyncio.Event()
    order: list[str] = []

    async def waiting() -> None:
        async with gate.slot() as slot:
            await slot.wait_for(answered.wait())  # e.g. a model still thinking
            order.append("waiter resumed")

    async def other() -> None:
        async with gate.slot():
            order.append("other worked")
            answered.set()

    await asyncio.wait_for(asyncio.gather(waiting(), other()), 10)
    assert order == ["other worked", "waiter resumed"]


@pytest.mark.asyncio
async def test_cancelling_a_waiting_turn_cancels_its_work_and_frees_the_slot():
    gate = StepGate(1, patience=0.001)
    unwound = asyncio.Event()
    reached = asyncio.Event()

    async def tool_run() -> None:
        reached.set()
        try:
            await asyncio.Event().wait()
        finally:
            unwound.set()  # a tool's cleanup (killing its process group) runs before the turn goes on

    async def turn() -> None:
        async with gate.slot() as slot:
            await slot.wait_for(tool_run())

    task = asyncio.create_task(turn())
    await asyncio.wait_for(reached.wait(), 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert unwound.is_set()
    await asyncio.wait_for(_enter(gate), 10)  # the slot is free again


@pytest.mark.asyncio
async def test_cancelling_while_the_slot_was_given_up_does_not_release_it_twice():
    gate = StepGate(1, patience=0.001)
    reached = asyncio.Event()

    async def turn() -> None:
        async with gate.slot() as slot:
            reached.set()
            await slot.wait_for(asyncio.Event().wait())

    task = asyncio.create_task(turn())
    await asyncio.wait_for(reached.wait(), 10)
    async with gate.slot():  # the waiting turn gave its slot up, so this gets it
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        second = asyncio.create_task(_enter(gate))
        await asyncio.sleep(0)
        assert not second.done()  # still held by us: the cancelled turn did not release it again
    await asyncio.wait_for(second, 10)


async def _enter(gate: StepGate) -> None:
    async with gate.slot():
        pass


@pytest.mark.asyncio
async def test_a_host_with_one_slot_still_has_every_session_waiting_on_its_model_at_once(make_host, provider, project):
    host = make_host(step_slots=1)
    sub = host.subscribe()
    sessions = [await session(host, project) for _ in range(5)]
    for n, s in enumerate(sessions):
        provider.enqueue(s["id"], {"gate": f"model {n}", "text": "done"})
    turns = [await prompt(host, s["id"]) for s in sessions]
    for n in range(5):  # all five requests are in flight together: a thinking model holds no slot
        await provider.wait_reached(f"model {n}")
    for n in range(5):
        provider.release(f"model {n}")
    ends = await all_ended(sub, [t["turnId"] for t in turns])
    assert {e.reason for e in ends.values()} == {"completed"}


@pytest.mark.asyncio
async def test_a_host_with_one_slot_runs_tools_of_many_sessions_to_completion(make_host, provider, project):
    host = make_host(step_slots=1)
    sub = host.subscribe()
    sessions = [await session(host, project) for _ in range(8)]
    for s in sessions:
        await host.call("session.setPermissionMode", {"sessionId": s["id"], "permissionMode": "auto"})
        provider.enqueue(s["id"], tool("Bash", command="echo hi"), tool("Read", path="README.md"), {"text": "done"})
    turns = [await prompt(host, s["id"]) for s in sessions]
    ends = await all_ended(sub, [t["turnId"] for t in turns])
    assert {e.reason for e in ends.values()} == {"completed"}


@pytest.mark.asyncio
async def test_a_queued_turn_cancelled_just_before_the_slot_frees_leaves_quietly_and_frees_nothing_twice():
    gate = StepGate(1)
    holder = gate.slot()
    await holder.__aenter__()
    waiter = asyncio.create_task(_enter(gate))
    for _ in range(100):
        if gate.queued:
            break
        await asyncio.sleep(0)
    waiter.cancel()  # its place in the queue is cancelled now ...
    await holder.__aexit__(None, None, None)  # ... and the slot is given before it has left the queue
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert gate.queued == 0
    first, second = gate.slot(), gate.slot()
    await first.__aenter__()  # the one slot is free again, once
    blocked = asyncio.create_task(second.__aenter__())
    await asyncio.sleep(0)
    assert not blocked.done()
    await first.__aexit__(None, None, None)
    await asyncio.wait_for(blocked, 10)


plans = st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=6), min_size=1, max_size=12)


@settings(max_examples=150, deadline=None)
@given(slots=st.integers(1, 3), plans=plans, cancels=st.lists(st.tuples(st.integers(0, 11), st.integers(0, 20)),
                                                                max_size=4))
def test_whatever_turns_do_and_whoever_is_cancelled_every_turn_ends_and_every_slot_comes_back(slots, plans, cancels):
    async def scenario() -> None:
        gate = StepGate(slots, patience=0.0)

        async def turn(waits: list[int]) -> None:
            async with gate.slot() as slot:
                for yields in waits:
                    async def outside(n: int = yields) -> None:
                        for _ in range(n):
                            await asyncio.sleep(0)
                    await slot.wait_for(outside())

        tasks = [asyncio.create_task(turn(waits)) for waits in plans]
        loop = asyncio.get_running_loop()
        for index, after in cancels:
            if index < len(tasks):
                loop.call_soon(lambda t=tasks[index], n=after: _cancel_after(loop, t, n))
        done, pending = await asyncio.wait(tasks, timeout=10)
        assert not pending, "a turn never ended"
        for task in done:
            assert task.cancelled() or task.exception() is None
        assert (gate._free, gate.queued, len(gate._away)) == (slots, 0, 0)  # every slot back, nothing left

    asyncio.run(scenario())


def _cancel_after(loop: asyncio.AbstractEventLoop, task: asyncio.Task[None], iterations: int) -> None:
    if iterations:
        loop.call_soon(_cancel_after, loop, task, iterations - 1)
    else:
        task.cancel()
