"""Issue 28: the authority reaches into Bash — every command runs in the host's kernel sandbox.

Before: a Bash command under ``auto`` read the data dir's ``token`` and ``host.json``, wrote
outside the root, deleted ``.pi/plan/*.md``, and could reach the host's port. Each test here runs
real commands through a real Host (scripted model, permission mode ``auto`` unless it says
otherwise) in a real bubblewrap sandbox, and judges what is left on disk and what the command saw.
"""

from __future__ import annotations

import os
import shutil
import socket
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pidesk.config import HostConfig, SandboxSettings
from pidesk.core.errors import PideskError
from tests.sandboxing import require_sandbox
from tests.scenario import ended, permission_requested, prompt, running_with, session, state, tool, tool_results

pytestmark = pytest.mark.asyncio

PATH = os.environ["PATH"]


@pytest.fixture(autouse=True)
def _bubblewrap() -> None:
    require_sandbox()


@pytest.fixture
def outside() -> Iterator[Path]:
    """A directory outside the project that no sandboxed command may change: under /var/tmp, where a command
    sees it (read-only), not under /tmp, which the sandbox replaces with a private one."""
    path = Path(tempfile.mkdtemp(prefix="pidesk-outside-", dir="/var/tmp"))
    (path / "kept.txt").write_text("kept\n")
    yield path
    shutil.rmtree(path)


async def bash(host: Any, provider: Any, session_id: str, command: str, **args: Any) -> dict[str, Any]:
    """One turn whose model runs one Bash command; that command's tool result."""
    sub = host.subscribe()
    provider.enqueue(session_id, tool("Bash", command=command, **args), {"text": "done"})
    await ended(sub, (await prompt(host, session_id))["turnId"])
    result: dict[str, Any] = tool_results((await state(host, session_id))["messages"], "Bash")[-1]
    return result


def tree(root: Path) -> dict[str, bytes | str]:
    """Every path under ``root`` and its bytes (a link: where it points)."""
    found: dict[str, bytes | str] = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if path.is_symlink():
            found[rel] = f"-> {os.readlink(path)}"
        elif path.is_file():
            found[rel] = path.read_bytes()
        else:
            found[rel] = "dir"
    return found


# ---- the file system -------------------------------------------------------------------------------


async def test_writes_land_in_the_root_and_a_private_tmp_and_nowhere_else(make_host, provider, project, outside):
    home = outside / "home"
    home.mkdir()
    host = make_host(tool_env={"PATH": PATH, "HOME": str(home)})
    s = await session(host, project, permissionMode="auto")
    private = f"pidesk-sandbox-{s['id']}"
    result = await bash(host, provider, s["id"], (
        f"echo in > inside.txt; echo x > {outside}/leak.txt; echo x >> {outside}/kept.txt; rm -f {outside}/kept.txt; "
        f"echo x > $HOME/leak.txt; touch /etc/pidesk-leak; echo tmp > /tmp/{private} && cat /tmp/{private}; "
        "echo TMPDIR=$TMPDIR"))
    assert (project / "inside.txt").read_text() == "in\n"
    assert tree(outside) == {"kept.txt": b"kept\n", "home": "dir"}
    assert not Path("/etc/pidesk-leak").exists()
    assert "Read-only file system" in result["output"]
    assert "tmp\n" in result["output"] and "TMPDIR=/tmp" in result["output"]
    assert not (Path("/tmp") / private).exists()  # the command's /tmp was its own


async def test_pi_and_the_repositorys_hooks_and_config_survive_every_command(make_host, provider, project):
    """Nothing a command does to .pi/ (the contracts) or .git/hooks and .git/config (which would run later,
    outside any sandbox: a hook, core.fsmonitor) lands; the rest of .git does, so commits still work."""
    git = project / ".git"
    (project / ".pi" / "plan").mkdir(parents=True)
    (project / ".pi" / "plan" / "approved.md").write_text("# Plan\n")
    host = make_host()
    s = await session(host, project, permissionMode="auto")
    await bash(host, provider, s["id"], "git init -q . && git add -A && git -c user.name=t -c user.email=t@t "
                                        "commit -qm first")  # (made by this first command: .git was not there yet)
    (git / "hooks" / "pre-commit").write_text("#!/bin/sh\nexit 0\n")
    protected = {name: tree(project / name) for name in (".pi", ".git/hooks")} | {
        ".git/config": (git / "config").read_bytes()}
    result = await bash(host, provider, s["id"], (
        "echo evil >> .pi/plan/approved.md; rm -f .pi/plan/approved.md; mkdir .pi/goal; "
        "echo evil >> .git/hooks/pre-commit; rm -f .git/hooks/pre-commit; "
        "printf '#!/bin/sh\\ntouch /tmp/pwned\\n' > .git/hooks/post-checkout; "
        "git config core.fsmonitor 'touch /tmp/pwned'; echo '[core] hooksPath = /tmp' >> .git/config; "
        "echo second > second.txt && git add second.txt && git -c user.name=t -c user.email=t@t commit -qm second "
        "&& git log --oneline | wc -l"))
    after = {name: tree(project / name) for name in (".pi", ".git/hooks")} | {".git/config": (git / "config").read_bytes()}
    assert after == protected
    assert result["output"].splitlines()[-2] == "2"  # the commit landed: objects, refs and the index are writable


async def test_a_missing_pi_cannot_be_created_by_a_command(make_host, provider, project):
    host = make_host()
    s = await session(host, project, permissionMode="auto")
    result = await bash(host, provider, s["id"], "mkdir -p .pi/plan && echo fake > .pi/plan/fake.md")
    assert "Read-only file system" in result["output"]
    assert (project / ".pi").is_dir() and tree(project / ".pi") == {}  # made empty by the host, read-only inside


async def test_a_git_file_naming_the_repository_stays_as_it_was(make_host, provider, project, tmp_path):
    """A worktree's or submodule's ``.git`` is a file naming the repository git uses: rewritten, it would send
    the user's next git command to a repository (config, hooks) the agent made."""
    (project / ".git").write_text(f"gitdir: {tmp_path / 'real.git'}\n")
    host = make_host()
    s = await session(host, project, permissionMode="auto")
    await bash(host, provider, s["id"], "mkdir -p evil && echo 'gitdir: evil' > .git")
    assert (project / ".git").read_text() == f"gitdir: {tmp_path / 'real.git'}\n"


async def test_links_in_the_root_lead_nowhere_writable(make_host, provider, project, outside, data_dir):
    """Symlinks give no way out: through them, outside stays read-only and the data dir stays hidden."""
    (project / "out").symlink_to(outside)
    host = make_host()
    (project / "data").symlink_to(host.store.data_dir)
    s = await session(host, project, permissionMode="auto")
    result = await bash(host, provider, s["id"], "echo x > out/via-link.txt; rm -f out/kept.txt; ls -A data; "
                                                 "echo listed")
    assert tree(outside) == {"kept.txt": b"kept\n"}
    assert "listed" in result["output"]
    assert "index.db" not in result["output"] and "transcripts" not in result["output"]


async def test_the_configured_writable_paths_are_writable(make_host, provider, project, tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    host = make_host(sandbox=SandboxSettings(writable=(cache,)))
    s = await session(host, project, permissionMode="auto")
    await bash(host, provider, s["id"], f"echo cached > {cache}/pip.txt")
    assert (cache / "pip.txt").read_text() == "cached\n"


# ---- what the host keeps to itself -----------------------------------------------------------------


async def test_the_data_dir_and_the_config_file_are_not_visible(make_host, provider, project, tmp_path):
    """Not even readable: the token, host.json, the index, every session's transcript, and the config file
    that may hold provider keys."""
    config_file = tmp_path / "config.toml"
    config_file.write_text('[providers.openai]\napi_key = "sk-from-the-config-file"\n')
    host = make_host(config_file=config_file)
    data = host.store.data_dir
    (data / "token").write_text("SECRET-HOST-TOKEN\n")
    (data / "host.json").write_text('{"token": "SECRET-HOST-TOKEN", "port": 1}\n')
    s = await session(host, project, permissionMode="auto")
    result = await bash(host, provider, s["id"], (
        f"cat {data}/token {data}/host.json; ls -A {data}; ls {data}/transcripts; cat {config_file}; "
        f"grep -r SECRET {data} /proc/*/environ /proc/*/cmdline 2>/dev/null; echo end"))
    assert "SECRET" not in result["output"] and "sk-from" not in result["output"]
    assert "index.db" not in result["output"] and s["id"] not in result["output"]
    assert (data / "token").read_text() == "SECRET-HOST-TOKEN\n"  # and nothing changed behind the veil


@pytest.mark.parametrize("where", ["the data dir", "inside it", "holding it"])
async def test_a_project_in_or_around_the_data_dir_is_refused(make_host, where):
    """PROTOCOL.md turn-3 limits: a session there could rewrite the store (a revert) or see past the veil."""
    host = make_host()
    data = host.store.data_dir
    path = {"the data dir": data, "inside it": data / "transcripts", "holding it": data.parent}[where]
    with pytest.raises(PideskError) as refused:
        await session(host, path)
    assert refused.value.code == "WORKSPACE_PATH_DENIED"
    assert (await host.call("projects.check", {"path": str(path)}))["ok"] is False


async def test_a_temporary_sessions_scratch_root_works_inside_the_hidden_data_dir(make_host, provider):
    host = make_host()
    s = await session(host, permissionMode="auto")  # no project: its root is <data dir>/scratch/<id>
    data = host.store.data_dir
    result = await bash(host, provider, s["id"], f"echo hi > note.txt && cat note.txt && ls -A {data}")
    assert "hi" in result["output"] and (Path(s["root"]) / "note.txt").read_text() == "hi\n"
    assert "index.db" not in result["output"] and "transcripts" not in result["output"]


async def test_the_environment_carries_no_key_and_no_token(make_host, provider, project, tmp_path):
    environ = {"PATH": PATH, "HOME": str(tmp_path), "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
               "OPENAI_API_KEY": "sk-openai-secret", "ANTHROPIC_API_KEY": "sk-ant-secret",
               "GITHUB_TOKEN": "ghp-secret", "PIDESK_TOKEN": "host-secret", "MY_TOOL_HOME": "/opt/tool",
               "PIDESK_CONFIG": str(tmp_path / "missing.toml")}
    (tmp_path / "config.toml").write_text('[sandbox]\nenv = ["MY_TOOL_HOME", "OPENAI_API_KEY"]\n')
    environ["PIDESK_CONFIG"] = str(tmp_path / "config.toml")
    config = HostConfig.from_environ(environ, data_dir=tmp_path / "data")
    host = make_host(tool_env=config.tool_env, sandbox=config.sandbox)
    s = await session(host, project, permissionMode="auto")
    shown = (await bash(host, provider, s["id"], "env"))["output"]
    assert "secret" not in shown
    names = {line.split("=", 1)[0] for line in shown.splitlines() if "=" in line}
    assert {"PATH", "HOME", "LANG", "LC_ALL", "MY_TOOL_HOME", "TMPDIR"} <= names
    assert not names & {"OPENAI_API_KEY", "ANTHROPIC_API_KEY", "GITHUB_TOKEN", "PIDESK_TOKEN", "PIDESK_CONFIG"}


# ---- the network -----------------------------------------------------------------------------------


@pytest.fixture
def listener() -> Iterator[int]:
    """A TCP port on 127.0.0.1 that accepts connections (the host's own port, for a command)."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        yield server.getsockname()[1]


@pytest.mark.parametrize("network", [False, True], ids=["no-network", "network-on"])
async def test_no_network_unless_the_config_says_so(make_host, provider, project, listener, network):
    host = make_host(sandbox=SandboxSettings(network=network))
    s = await session(host, project, permissionMode="auto")
    result = await bash(host, provider, s["id"], f"exec 3<>/dev/tcp/127.0.0.1/{listener} && echo connected")
    assert ("connected" in result["output"]) is network


@pytest.fixture
def run_socket() -> Iterator[Path]:
    """A Unix socket listening in /run, as a local database's or Docker's does (no network needed)."""
    path = Path("/run") / f"pidesk-test-{os.getpid()}.sock"
    with socket.socket(socket.AF_UNIX) as server:
        try:
            server.bind(str(path))
        except PermissionError:
            pytest.skip("this test binds a socket in /run, which needs root")
        server.listen(4)
        try:
            yield path
        finally:
            path.unlink(missing_ok=True)


@pytest.mark.parametrize("network", [False, True], ids=["no-network", "network-on"])
async def test_the_sockets_in_run_are_out_of_reach(make_host, provider, project, run_socket, network):
    """Hiding the network is not enough: a socket in /run (postgres, D-Bus, docker.sock) is reached through
    the file system. /run is hidden either way (with the network on, the resolver's files come back)."""
    host = make_host(sandbox=SandboxSettings(network=network))
    s = await session(host, project, permissionMode="auto")
    probe = (f"python3 -c 'import socket; s = socket.socket(socket.AF_UNIX); s.connect(\"{run_socket}\"); "
             "print(\"connected\")'")
    result = await bash(host, provider, s["id"], probe)
    assert "connected" not in result["output"] and "No such file" in result["output"]


# ---- processes -------------------------------------------------------------------------------------


async def test_nothing_a_command_starts_outlives_its_turn_not_even_what_detaches(make_host, provider, project):
    """Outside a sandbox, ``setsid cmd &`` escaped the call's process group on purpose and ran on; inside
    one, it dies with the sandbox, which ends with the turn."""
    host = make_host()
    s = await session(host, project, permissionMode="auto")
    result = await bash(host, provider, s["id"], "setsid sleep 91.0371 >/dev/null 2>&1 </dev/null & echo started")
    assert "started" in result["output"]
    assert running_with(b"sleep\x0091.0371") == set()


async def test_a_delegates_commands_run_in_the_sandbox_too(make_host, provider, project, outside):
    host = make_host()
    s = await session(host, project, permissionMode="auto")
    sub = host.subscribe()
    provider.enqueue(s["id"], tool("Task", description="write", prompt="write it"), {"text": "done"})
    provider.enqueue(f"{s['id']}/task_1", tool("Bash", command=f"echo x > {outside}/from-delegate.txt"),
                     {"text": "tried"})
    await ended(sub, (await prompt(host, s["id"]))["turnId"])
    assert tree(outside) == {"kept.txt": b"kept\n"}


# ---- escalation ------------------------------------------------------------------------------------


async def test_an_escalation_under_auto_asks_and_a_denial_runs_nothing(make_host, provider, project, outside):
    host = make_host()
    s = await session(host, project, permissionMode="auto")
    sub = host.subscribe()
    provider.enqueue(s["id"], tool("Bash", command=f"echo out > {outside}/escalated.txt", escalate=True,
                                   justification="write the report outside the project"), {"text": "done"})
    turn = await prompt(host, s["id"])
    request = (await permission_requested(sub)).request
    assert request.escalated and request.args["justification"] == "write the report outside the project"
    await host.call("permissions.resolve", {"requestId": request.id, "sessionId": s["id"],
                                            "turnId": turn["turnId"], "decision": "deny"})
    await ended(sub, turn["turnId"])
    assert tool_results((await state(host, s["id"]))["messages"], "Bash")[-1]["errorCode"] == "TOOL_DENIED"
    assert tree(outside) == {"kept.txt": b"kept\n"}


async def test_an_allowed_escalation_runs_that_one_command_outside_the_sandbox(make_host, provider, project,
                                                                               outside, listener):
    host = make_host()
    s = await session(host, project, permissionMode="auto")
    sub = host.subscribe()
    provider.enqueue(s["id"], tool("Bash", command=(f"echo out > {outside}/escalated.txt; "
                                                    f"exec 3<>/dev/tcp/127.0.0.1/{listener} && echo connected"),
                                   escalate=True, justification="needs the network"),
                     tool("Bash", command=f"echo again > {outside}/sandboxed.txt"), {"text": "done"})
    turn = await prompt(host, s["id"])
    request = (await permission_requested(sub)).request
    await host.call("permissions.resolve", {"requestId": request.id, "sessionId": s["id"],
                                            "turnId": turn["turnId"], "decision": "allow"})
    await ended(sub, turn["turnId"])
    first, second = tool_results((await state(host, s["id"]))["messages"], "Bash")[-2:]
    assert "connected" in first["output"] and (outside / "escalated.txt").read_text() == "out\n"
    assert not (outside / "sandboxed.txt").exists()  # the next command is back in the sandbox
    assert "Read-only file system" in second["output"]


async def test_a_grant_of_bash_never_covers_an_escalation_and_an_escalation_grant_covers_the_session(
        make_host, provider, project, outside):
    host = make_host()
    s = await session(host, project, permissionMode="ask")
    sub = host.subscribe()
    provider.enqueue(s["id"], tool("Bash", command="true"),
                     tool("Bash", command=f"echo 1 > {outside}/one.txt", escalate=True, justification="one"),
                     tool("Bash", command=f"echo 2 > {outside}/two.txt", escalate=True, justification="two"),
                     {"text": "done"})
    turn = await prompt(host, s["id"])
    for expected_escalated in (False, True):  # the plain grant, then the escalation's own
        request = (await permission_requested(sub)).request
        assert request.escalated is expected_escalated
        await host.call("permissions.resolve", {"requestId": request.id, "sessionId": s["id"],
                                                "turnId": turn["turnId"], "decision": "allow", "remember": "session"})
    await ended(sub, turn["turnId"])  # (a third question would have held the turn: nobody answers it)
    assert (outside / "one.txt").read_text() == "1\n" and (outside / "two.txt").read_text() == "2\n"


@pytest.mark.parametrize("mode", ["plan", "goal"])
async def test_plan_and_goal_refuse_an_escalation_whatever_the_permission_mode(make_host, provider, project,
                                                                                outside, mode):
    host = make_host()
    s = await session(host, project, mode=mode, permissionMode="auto")
    result = await bash(host, provider, s["id"], f"echo x > {outside}/planned.txt", escalate=True,
                        justification="just this once")
    assert result["errorCode"] == "BASH_ESCALATION_DENIED_IN_PLAN"
    assert tree(outside) == {"kept.txt": b"kept\n"}


async def test_an_unattended_turn_cannot_escalate(make_host, provider, project, outside):
    host = make_host()
    s = await session(host, project, permissionMode="auto")
    sub = host.subscribe()
    provider.enqueue(s["id"], tool("Bash", command=f"echo x > {outside}/unattended.txt", escalate=True,
                                   justification="nobody is here"), {"text": "done"})
    started = await host.agent_prompt(s["id"], "go", unattended=True)
    end = await ended(sub, started["turnId"])
    assert (end.reason, end.error_code) == ("error", "PERMISSION_REQUIRED")
    assert tool_results((await state(host, s["id"]))["messages"], "Bash")[-1]["errorCode"] == "PERMISSION_REQUIRED"
    assert tree(outside) == {"kept.txt": b"kept\n"}


# ---- failing closed --------------------------------------------------------------------------------


@pytest.fixture
def fake_bwrap(tmp_path: Path) -> Path:
    """A PATH whose ``bwrap`` fails as one does where user namespaces are disabled."""
    bin_dir = tmp_path / "bin-broken-bwrap"
    bin_dir.mkdir()
    script = bin_dir / "bwrap"
    script.write_text("#!/bin/sh\necho 'bwrap: No permissions to creating new namespace' >&2\nexit 1\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return bin_dir


@pytest.mark.parametrize("why", ["missing", "no user namespaces"])
async def test_a_sandbox_that_cannot_start_fails_the_call_and_runs_nothing(make_host, provider, project, tmp_path,
                                                                           fake_bwrap, why):
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    path = str(empty) if why == "missing" else f"{fake_bwrap}:{PATH}"
    host = make_host(tool_env={"PATH": path})
    s = await session(host, project, permissionMode="auto")
    result = await bash(host, provider, s["id"], "echo ran > ran.txt")
    assert result["errorCode"] == "SANDBOX_UNAVAILABLE"
    assert "apt-get install bubblewrap" in result["output"] and 'sandbox = "off"' in result["output"]
    if why == "no user namespaces":
        assert "No permissions to creating new namespace" in result["output"]
    assert not (project / "ran.txt").exists()
    hello = await host.call("host.hello", {"protocolVersion": 1})
    assert hello["sandbox"]["mode"] == "bwrap" and hello["sandbox"]["available"] is False


async def test_with_the_sandbox_off_commands_run_as_before(make_host, provider, project, outside):
    host = make_host(sandbox=SandboxSettings(enabled=False))
    s = await session(host, project, permissionMode="auto")
    await bash(host, provider, s["id"], f"echo x > {outside}/unconfined.txt")
    assert (outside / "unconfined.txt").read_text() == "x\n"
    hello = await host.call("host.hello", {"protocolVersion": 1})
    assert hello["sandbox"] == {"mode": "off", "available": False, "network": False,
                                "detail": "turned off in the configuration"}
