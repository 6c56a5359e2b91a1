"""The child of ``test_crash_tool_groups.py``: a real Host whose agent runs one Bash command, until killed.

Run as ``python bash_crash_child.py DATA_DIR PROJECT COMMAND on|off`` (its sandbox). It opens a Host
on the data dir (a scripted model answers the prompt with one Bash call of
COMMAND, permission mode auto), prompts, and waits for the turn to end. The
test kills it (SIGKILL) while the command runs; a child that outlives its turn
prints ``survived`` and exits 0, which the test reports as a failure.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parents[1]), str(HERE.parent)]  # the repo (pidesk) and tests/ (scenario)

import scenario as sc  # noqa: E402

from pidesk.config import HostConfig, SandboxSettings  # noqa: E402
from pidesk.host import Host  # noqa: E402
from pidesk.providers.scripted import ScriptedProvider  # noqa: E402


async def main(data_dir: str, project: str, command: str, sandbox: str) -> None:
    provider = ScriptedProvider()
    host = Host.open(HostConfig(data_dir=Path(data_dir), sandbox=SandboxSettings(enabled=sandbox == "on")), provider)
    session = await sc.session(host, project, permissionMode="auto")
    provider.enqueue(session["id"], sc.tool("Bash", command=command), {"text": "Ran it."})
    sub = host.subscribe()
    started = await sc.prompt(host, session["id"], "run it")
    await sc.ended(sub, started["turnId"], timeout=30)
    print("survived", flush=True)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:]))
