"""``tools/sandbox.py``: the policy value, the bwrap command line it becomes, and Bash inside it.

The command line is a pure function of the policy and of what the root holds, so its order — which
decides what wins where mounts overlap — is checked without starting anything; then real shells
(a cold one and the spare the first call starts) show that each runs inside it.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
import pytest_asyncio

from pidesk.tools import make_bash_tool, run_tool
from pidesk.tools.bash import Bash
from pidesk.tools import sandbox_server
from pidesk.tools.sandbox_server import Sandbox, SandboxServer
from pidesk.tools.sandbox import Bubblewrap, SandboxPolicy, bwrap_argv, probe, protected_paths, repository_under_tmp
from tests.sandboxing import require_sandbox


def mounts(argv: list[str]) -> list[tuple[str, ...]]:
    """The mount operations of a bwrap command line, in order: (flag, *its paths)."""
    takes = {"--bind": 2, "--bind-try": 2, "--ro-bind": 2, "--ro-bind-try": 2, "--tmpfs": 1, "--remount-ro": 1,
             "--dev": 1, "--proc": 1}
    found, i = [], 0
    while i < len(argv):
        n = takes.get(argv[i])
        if n is not None:
            found.append((argv[i], *argv[i + 1 : i + 1 + n]))
            i += n
        i += 1
    return found


def test_the_command_line_confines_everything_and_ends_before_the_command(tmp_path: Path) -> None:
    root = tmp_path / "project"
    argv = bwrap_argv("/usr/bin/bwrap", SandboxPolicy(root))
    assert argv[0] == "/usr/bin/bwrap" and argv[-1] == "--"
    for flag in ("--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent"):
        assert flag in argv
    assert argv[argv.index("--cap-drop") + 1] == "ALL" and "--share-net" not in argv
    assert "--new-session" not in argv  # (the command stays in the process group the host kills)
    assert mounts(argv)[:4] == [("--ro-bind", "/", "/"), ("--dev", "/dev"), ("--proc", "/proc"), ("--tmpfs", "/tmp")]
    assert ("--bind", str(root), str(root)) in mounts(argv)
    assert argv[argv.index("--chdir") + 1] == str(root)
    assert argv[argv.index("--setenv") + 1 : argv.index("--setenv") + 3] == ["TMPDIR", "/tmp"]
    assert "--share-net" in bwrap_argv("bwrap", SandboxPolicy(root, network=True))
    assert "--disable-userns" not in bwrap_argv("bwrap", SandboxPolicy(root), disable_userns=False)


def test_hidden_paths_cover_the_writable_ones_and_a_root_inside_them_comes_back(tmp_path: Path) -> None:
    data = tmp_path / "data"
    root = data / "scratch" / "s1"  # a temporary session's root, inside the data dir
    config = tmp_path / "config.toml"
    home = tmp_path / "home"  # a writable path that holds the data dir
    argv = bwrap_argv("bwrap", SandboxPolicy(root, writable=(home,), hidden=(data, config)),
                      hidden_dirs=[data], hidden_files=[config], protected=[root / ".pi"])
    order = mounts(argv)
    hide, blank = order.index(("--tmpfs", str(data))), order.index(("--ro-bind", "/dev/null", str(config)))
    first_root = order.index(("--bind", str(root), str(root)))
    again = len(order) - 1 - order[::-1].index(("--bind", str(root), str(root)))
    assert first_root < hide < again < order.index(("--remount-ro", str(data)))  # hidden, then the root again
    assert order.index(("--bind-try", str(home), str(home))) < hide < blank
    assert order.count(("--bind-try", str(home), str(home))) == 1  # (home holds the data dir: not bound again)
    assert order[-1] == ("--ro-bind-try", str(root / ".pi"), str(root / ".pi"))  # carve-outs win over all


def test_strict_planning_binds_the_root_read_only(tmp_path: Path) -> None:
    argv = bwrap_argv("bwrap", SandboxPolicy(tmp_path, read_only_root=True))
    assert ("--ro-bind", str(tmp_path), str(tmp_path)) in mounts(argv)
    assert ("--bind", str(tmp_path), str(tmp_path)) not in mounts(argv)


def test_what_stays_read_only_in_a_root_follows_its_git(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    assert protected_paths(plain) == [plain / ".pi"] and (plain / ".pi").is_dir()  # made: none could be created

    repo = tmp_path / "repo"
    (repo / ".git" / "modules" / "lib" / "modules" / "inner").mkdir(parents=True)
    (repo / ".git" / "config").write_text("[core]\n")
    for module in ("lib", "lib/modules/inner"):
        (repo / ".git" / "modules" / module / "config").write_text("[core]\n")
    found = protected_paths(repo)
    git = repo / ".git"
    assert found[:3] == [repo / ".pi", git / "hooks", git / "config"] and (git / "hooks").is_dir()
    assert set(found[3:]) == {git / "modules" / m / part for m in ("lib", "lib/modules/inner") for part in ("hooks", "config")}

    worktree = tmp_path / "worktree"
    worktree.mkdir()
    (worktree / ".git").write_text("gitdir: /elsewhere\n")
    assert protected_paths(worktree) == [worktree / ".pi", worktree / ".git"]


def test_no_bwrap_on_the_path_is_unavailable_and_says_how_to_fix_it(tmp_path: Path) -> None:
    status = probe(True, False, str(tmp_path))
    assert (status.enabled, status.available) == (True, False)
    assert "apt-get install bubblewrap" in status.detail and 'sandbox = "off"' in status.detail
    assert probe(False, False).to_wire() == {"mode": "off", "available": False, "network": False,
                                             "detail": "turned off in the configuration"}


# ---- Bash inside it --------------------------------------------------------------------------------

MakeBash = Callable[..., Bash]


@pytest_asyncio.fixture
async def sandboxed_bash(tmp_path: Path) -> AsyncIterator[MakeBash]:
    require_sandbox()
    made: list[Bash] = []

    def make(root: Path, **policy: object) -> Bash:
        tool = make_bash_tool(root, sandbox=Sandbox(Bubblewrap(SandboxPolicy(root, **policy))))  # type: ignore[arg-type]
        made.append(tool)
        return tool

    yield make
    for tool in made:
        await tool.aclose()


@pytest.mark.asyncio
async def test_the_first_call_and_the_spare_it_starts_both_run_sandboxed(sandboxed_bash: MakeBash, tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    tool = sandboxed_bash(root)
    outside = Path("/var/tmp") / f"pidesk-sandbox-test-{os.getpid()}-{tmp_path.name}"
    try:
        for call in ("cold", "spare"):
            result = await run_tool(tool, {"command": f"echo {call} > {call}.txt; echo {call} > {outside}; echo $$"})
            assert (root / f"{call}.txt").read_text() == f"{call}\n" and not outside.exists()
            assert "Read-only file system" in result.output and result.output.splitlines()[-2] != str(os.getpid())
            assert tool.next_spare is not None  # (the next call's shell, started after this one)
    finally:
        outside.unlink(missing_ok=True)


@pytest.mark.asyncio
async def test_a_command_sees_only_its_own_processes(sandboxed_bash: MakeBash, tmp_path: Path) -> None:
    """A fresh /proc in a pid namespace: no other process's environment or command line is readable."""
    result = await run_tool(sandboxed_bash(tmp_path), {"command": "ls /proc | grep -c '^[0-9]'; cat /proc/1/cmdline"})
    count = int(result.output.splitlines()[0])
    assert count < 10 and "bwrap" in result.output  # bwrap's init, bash, and what bash started


def test_a_root_under_tmp_keeps_its_repository_in_sight(tmp_path: Path) -> None:
    """The private /tmp would hide the repository a root under /tmp lies in (tests', scratch clones'):
    it is bound back read-only, before the root itself is bound writable."""
    repo, root = tmp_path / "repo", tmp_path / "repo" / "pkg" / "src"
    (repo / ".git").mkdir(parents=True)
    root.mkdir(parents=True)
    assert repository_under_tmp(root) == repo and repository_under_tmp(repo) is None
    assert repository_under_tmp(Path("/usr/lib")) is None  # (outside /tmp nothing is hidden)
    order = mounts(bwrap_argv("bwrap", SandboxPolicy(root), under_tmp=[repo]))
    assert order.index(("--tmpfs", "/tmp")) < order.index(("--ro-bind", str(repo), str(repo))) \
        < order.index(("--bind", str(root), str(root)))


# ---- the sandbox's own server (tools/sandbox_server.py) -------------------------------------------------


@pytest_asyncio.fixture
async def server(tmp_path: Path) -> AsyncIterator[SandboxServer]:
    require_sandbox()
    started = await SandboxServer.start(Bubblewrap(SandboxPolicy(tmp_path)).prefix())
    yield started
    started.close()
    await started.wait_closed()


def ask(server: SandboxServer, argv: list[str], cwd: Path, exits: list[int]) -> asyncio.Future[int]:
    """``server.spawn(argv)``, its stdin and output /dev/null."""
    stdin, output = os.open(os.devnull, os.O_RDONLY), os.open(os.devnull, os.O_WRONLY)
    try:
        return server.spawn(argv, {"PATH": os.environ["PATH"]}, cwd, stdin, output, exits.append)
    finally:
        os.close(stdin)
        os.close(output)


def command_line(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]


@pytest.mark.asyncio
async def test_a_spawn_whose_caller_gave_up_is_killed_and_the_answers_stay_in_order(server: SandboxServer,
                                                                                 tmp_path: Path) -> None:
    """Answers come in the order asked; one nobody waits for any more (a call cancelled while its shell
    started) kills its shell, and the next answer is still the next shell's."""
    dropped: list[int] = []
    kept: list[int] = []
    ask(server, ["/bin/sleep", "301"], tmp_path, dropped).cancel()  # (sleep ignores stdin: only a kill ends it)
    pid = await asyncio.wait_for(ask(server, ["/bin/sleep", "302"], tmp_path, kept), 10)
    assert command_line(pid) == ["/bin/sleep", "302"]  # (the host's view of the second shell)
    async with asyncio.timeout(10):
        while not dropped:  # (its exit, reported by the sandbox: bounded by the timeout)
            await asyncio.sleep(0.01)
    assert dropped == [-signal.SIGKILL] and not kept and server.shells == 1


@pytest.mark.asyncio
async def test_the_loop_runs_while_the_sandbox_forks_and_one_that_never_answers_is_ended(
        server: SandboxServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A sandbox slow to answer (stopped here) holds nothing but its own caller; one that does not answer
    within the bound is ended, and its callers are told."""
    monkeypatch.setattr(sandbox_server, "SPAWN_TIMEOUT_S", 1.0)
    group = server._proc.pid  # type: ignore[union-attr]  # (bwrap and sandboxd: a session of their own)
    os.killpg(group, signal.SIGSTOP)
    try:
        answer = ask(server, ["/bin/true"], tmp_path, [])
        ticks = 0
        while not answer.done():  # the loop goes on: each tick is a turn of it (bounded by the timeout)
            await asyncio.sleep(0.01)
            ticks += 1
        assert ticks > 1  # (the loop turned while the answer was owed: a waiting spawn once held it throughout)
        with pytest.raises(ConnectionError):
            answer.result()
        assert not server.alive
    finally:
        os.killpg(group, signal.SIGCONT)


@pytest.mark.asyncio
async def test_a_sandbox_that_ends_fails_the_spawns_it_had_not_answered(server: SandboxServer, tmp_path: Path) -> None:
    group = server._proc.pid  # type: ignore[union-attr]
    os.killpg(group, signal.SIGSTOP)
    answer = ask(server, ["/bin/true"], tmp_path, [])
    server.close()
    os.killpg(group, signal.SIGCONT)
    with pytest.raises(ConnectionError):
        await answer
    with pytest.raises(ConnectionError):
        ask(server, ["/bin/true"], tmp_path, [])


@pytest.mark.asyncio
async def test_sandboxes_sharing_a_limit_start_one_at_a_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A host's sandboxes share a limit on how many start at once (``Parts.sandbox_starts``): a start is CPU work,
    and 64 together left the host's own loop waiting for the CPU."""
    require_sandbox()
    starting: list[None] = []
    most = 0
    real = SandboxServer.start.__func__  # type: ignore[attr-defined]

    async def start(cls: type[SandboxServer], prefix: list[str]) -> SandboxServer:
        nonlocal most
        starting.append(None)
        most = max(most, len(starting))
        try:
            return await real(cls, prefix)  # type: ignore[no-any-return]
        finally:
            starting.pop()

    monkeypatch.setattr(SandboxServer, "start", classmethod(start))
    limit = asyncio.Semaphore(1)
    sandboxes = [Sandbox(Bubblewrap(SandboxPolicy(tmp_path)), limit) for _ in range(3)]
    try:
        servers = await asyncio.gather(*(sandbox.ready() for sandbox in sandboxes))
        assert len({id(server) for server in servers}) == 3 and all(server.alive for server in servers)
        assert most == 1
    finally:
        for sandbox in sandboxes:
            await sandbox.aclose()
