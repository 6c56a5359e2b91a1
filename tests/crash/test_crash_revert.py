"""Crash test (issue 17): a kill -9 in the middle of a revert.

The child (this file run as a script) builds a session whose one turn rewrote
six files, closes that host cleanly, then opens one armed to SIGKILL itself at
a revert fault point on its ``nth`` hit (after a file's rename, or
between writing a file's temporary and renaming it) and reverts the turn. The parent then
checks that every file is whole — either as the turn left it or as before the
turn — that no temporary file is left, that the next boot audits the
interrupted revert with its files, and that reverting again finishes the job.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

FILES = [f"f{n}.txt" for n in range(6)]


def OLD(n: int) -> str:
    return f"before the turn {n}\n"


def NEW(n: int) -> str:
    return f"written by the turn {n}\n" * 50


async def _child(spec: dict[str, Any]) -> None:
    from pidesk.config import HostConfig
    from pidesk.faults import NO_FAULTS
    from pidesk.host import Host
    from pidesk.providers.scripted import ScriptedProvider
    from tests.crash.crash_driver import KillOnNthHit
    from tests.scenario import ended, prompt, session, tool

    data_dir, project = Path(spec["dataDir"]), Path(spec["project"])
    provider = ScriptedProvider()
    host = Host.open(HostConfig(data_dir=data_dir, faults=NO_FAULTS), provider)
    s = await session(host, project, permissionMode="auto")
    script = " && ".join(f"printf %s '{NEW(n)}' > {name}" for n, name in enumerate(FILES))
    provider.enqueue(s["id"], tool("Bash", command=script), {"text": "Done."})
    sub = host.subscribe()
    turn = await prompt(host, s["id"])
    await ended(sub, turn["turnId"])
    await host.close()
    print(json.dumps({"session": s["id"], "turn": turn["turnId"]}), flush=True)
    armed = Host.open(HostConfig(data_dir=data_dir, faults=KillOnNthHit(frozenset({spec["point"]}), "kill",
                                                                        nth=spec["nth"])), ScriptedProvider())
    await armed.call("session.revert", {"sessionId": s["id"], "turnId": turn["turnId"]})
    print(json.dumps({"survived": True}), flush=True)


def _run_child(data_dir: Path, project: Path, point: str, nth: int) -> dict[str, Any]:
    spec = {"dataDir": str(data_dir), "project": str(project), "point": point, "nth": nth}
    return crash_script(Path(__file__).resolve(), spec)


if __name__ == "__main__":
    sys.path[:0] = [str(HERE.parents[1])]
    asyncio.run(_child(json.loads(sys.argv[1])))
else:
    import pytest
    from crash_harness import crash_script

    @pytest.mark.asyncio
    @pytest.mark.parametrize(("point", "nth", "restored"), [
        ("revert.after_file", 1, 1), ("revert.after_file", 3, 3),
        ("revert.before_rename", 2, 1),  # the second file's temporary is written, not yet renamed
    ])
    async def test_issue17_kill_during_a_revert_leaves_each_file_old_or_new_and_boot_reports_it(
        data_dir: Path, project: Path, make_host: Any, point: str, nth: int, restored: int
    ) -> None:
        """Issue 17 (crash safety of revert): a kill -9 after the nth file of a revert leaves every file
        whole (as the turn left it, or as before the turn: temp + rename), no temporary behind, the next
        boot audits workspace.revert_interrupted with the files, and reverting again completes."""
        for n, name in enumerate(FILES):
            (project / name).write_text(OLD(n))
        acks = _run_child(data_dir, project, point, nth)
        states = []
        for n, name in enumerate(FILES):
            text = (project / name).read_text()
            assert text in (OLD(n), NEW(n)), name
            states.append(text == OLD(n))
        assert sum(states) == restored  # exactly the files restored before the kill
        leftovers = [p for p in project.rglob("*.pidesk-revert")]
        assert len(leftovers) == (1 if point == "revert.before_rename" else 0)
        host = make_host()
        assert not [p for p in project.rglob("*.pidesk-revert")]
        entries = (await host.call("audit.list", {"sessionId": acks["session"]}))["entries"]
        interrupted = [e for e in entries if e["action"] == "workspace.revert_interrupted"]
        assert len(interrupted) == 1 and sorted(interrupted[0]["detail"]["files"]) == FILES
        assert not list((data_dir / "checkpoints").glob("*.revert"))
        done = await host.call("session.revert", {"sessionId": acks["session"], "turnId": acks["turn"]})
        assert len(done["files"]) == len(FILES) - restored
        for n, name in enumerate(FILES):
            assert (project / name).read_text() == OLD(n)
