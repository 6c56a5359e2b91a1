"""A host on demand (issue 31 §1): a command that finds no host starts one in the background, so no
command locks another out of a data dir; `pidesk stop` stops it; one started on demand exits once idle.

Real `pidesk` subprocesses (and `pidesk chat` on a pseudo-terminal), without ``PIDESK_EMBEDDED`` (which
the rest of the suite sets to keep each command's host in its own process)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.cli.test_cli_chat import Terminal

ON_DEMAND = {k: v for k, v in os.environ.items() if k != "PIDESK_EMBEDDED"} | {"COLUMNS": "200"}


def pidesk(*args: str, data_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pidesk", *args, "--data-dir", str(data_dir)],
                          capture_output=True, text=True, timeout=90, env=ON_DEMAND)


def ok(*args: str, data_dir: Path) -> subprocess.CompletedProcess[str]:
    done = pidesk(*args, data_dir=data_dir)
    assert done.returncode == 0, done.stderr
    return done


@contextmanager
def stopped_at_the_end(data_dir: Path) -> Iterator[None]:
    """Whatever the test does, no host it started outlives it."""
    try:
        yield
    finally:
        pidesk("stop", data_dir=data_dir)


def host_pid(data_dir: Path) -> int | None:
    try:
        return int(json.loads((data_dir / "host.json").read_text())["pid"])
    except (OSError, ValueError, KeyError):
        return None


def test_with_no_host_every_command_works_at_once_and_stop_stops_the_one_they_share(project, data_dir, tmp_path):
    """Issue 31 §1: `pidesk chat` used to hold the data dir's lock, so `status`, `sessions list`, `run`
    and a second `chat` all exited 2 ("another pidesk host is already serving"). Now the chat starts a
    host in the background (and says so), and each of them works beside it through that host; the
    chats' sessions and the run's are all in it. `pidesk stop` stops it and status says so."""
    other = Path(shutil.copytree(project, tmp_path / "other"))
    with stopped_at_the_end(data_dir):
        chat = Terminal([sys.executable, "-m", "pidesk", "chat", str(project), "--data-dir", str(data_dir),
                         "--model", "demo"], env=ON_DEMAND)
        chat.expect("pidesk: started a host for")
        chat.expect_status("agent · ")
        status = ok("status", data_dir=data_dir).stdout
        assert "host: serving at http://127.0.0.1:" in status and " since " in status
        assert "started on demand, it exits after 10 min with nothing to do" in status
        second = Terminal([sys.executable, "-m", "pidesk", "chat", str(other), "--data-dir", str(data_dir),
                           "--model", "demo"], env=ON_DEMAND)
        second.expect_status("agent · ")
        ran = ok("run", str(other), "list the files", "--model", "demo", "--permission", "auto", data_dir=data_dir)
        assert "[turn completed]" in ran.stdout and "started a host" not in ran.stderr
        roots = sorted(s["projectPath"] for s in json.loads(ok("sessions", "list", "--json",
                                                                 data_dir=data_dir).stdout))
        assert roots == sorted([str(project), str(other), str(other)])
        for term in (chat, second):
            term.type("\x04")
            assert term.close() == 0
        pid = host_pid(data_dir)
        assert pid is not None  # the host outlives the chats that started it
        stopped = ok("stop", data_dir=data_dir).stdout
        assert stopped.startswith("stopped the host at http://127.0.0.1:") and f"(pid {pid})" in stopped
        assert host_pid(data_dir) is None
        assert "host: not running" in ok("status", data_dir=data_dir).stdout
        token = (data_dir / "token").read_text().strip()
        log = (data_dir / "host.log").read_text()
        assert "pidesk serving at http://127.0.0.1:" in log and token not in log  # no secret in a log
        assert ok("stop", data_dir=data_dir).stdout.startswith("no host is running for")


def test_a_host_started_on_demand_exits_once_it_has_nothing_to_do(data_dir):
    """Issue 31 §1: the host a command starts stays while clients are attached, turns run or schedules
    are enabled, and exits by itself once idle (here after 1 s, instead of 10 min), removing host.json."""
    server = subprocess.Popen([sys.executable, "-m", "pidesk", "serve", "--no-open", "--idle-exit", "1",
                               "--data-dir", str(data_dir)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=ON_DEMAND)
    try:
        assert server.stdout is not None and server.stdout.readline().startswith("pidesk serving at ")
        assert server.wait(timeout=60) == 0  # (nothing connects: idle from the start)
        assert server.stderr is not None and "nothing to do for 1 s" in server.stderr.read()
        assert not (data_dir / "host.json").exists()
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(timeout=10)


def test_a_command_that_cannot_start_a_host_says_why_without_starting_one(project, data_dir):
    """A model the host could not run is refused by the command itself (exit 2, the code and what to set),
    not left in a background host's log."""
    env = {k: v for k, v in ON_DEMAND.items() if not k.endswith("_API_KEY")}
    done = subprocess.run([sys.executable, "-m", "pidesk", "run", str(project), "hi", "--model", "anthropic/claude-x",
                           "--data-dir", str(data_dir)], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 2 and "PROVIDER_SECRET_MISSING" in done.stderr and "ANTHROPIC_API_KEY" in done.stderr
    assert host_pid(data_dir) is None and not (data_dir / "host.log").exists()


@pytest.mark.asyncio
async def test_a_host_is_idle_only_with_no_client_no_turn_and_no_enabled_schedule(host, provider, project):
    """The rule the idle exit follows (Host.idle)."""
    assert host.idle()
    host.client_opened("c_1")
    assert not host.idle()
    host.client_closed("c_1")
    assert host.idle()
    created = await host.call("schedules.create", {"name": "nightly", "cron": "0 3 * * *",
                                                   "projectPath": str(project), "prompt": "tidy"})
    assert not host.idle()
    await host.call("schedules.delete", {"scheduleId": created["id"]})
    assert host.idle()


def test_a_chat_survives_its_host_being_killed_and_restarted(project, data_dir, tmp_path):
    """Issue 31 §2: a chat attached to a host that was killed died with a websockets traceback and lost the
    line being typed. Now it says "host stopped — reconnecting…", keeps a line sent meanwhile, reconnects
    to the restarted host (its host.json), and answers the next prompt; no traceback ever shows."""
    script = tmp_path / "model.json"
    script.write_text(json.dumps({"responses": [{"text": "the first answer"}, {"text": "the answer after"}]}))

    def serve() -> subprocess.Popen[str]:
        server = subprocess.Popen([sys.executable, "-m", "pidesk", "serve", "--no-open", "--data-dir", str(data_dir),
                                   "--model", f"scripted/{script}"], stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL, text=True, env=ON_DEMAND)
        assert server.stdout is not None and server.stdout.readline().startswith("pidesk serving at ")
        return server

    server = serve()
    try:
        chat = Terminal([sys.executable, "-m", "pidesk", "chat", str(project), "--data-dir", str(data_dir)],
                        env=ON_DEMAND)
        chat.expect_status("agent · ")
        chat.type("hello\r")
        chat.expect("[turn completed]")
        server.kill()  # as a crash, or an OOM kill, would
        server.wait(timeout=10)
        chat.expect("[host stopped — reconnecting…]")
        chat.type("are you back?\r")
        chat.expect("[not sent: the host is away, reconnecting — your text is kept]")
        server = serve()
        chat.expect("[reconnected]")
        chat.expect_status("agent · ask · idle › are you back?")  # the kept line, ready to send
        chat.type("\r")
        chat.expect("[turn completed]")
        chat.type("\x04")
        assert chat.close() == 0
        assert "Traceback" not in chat.raw
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_a_host_started_on_demand_has_its_plugins_ready_and_its_config_warnings_shown(project, data_dir, tmp_path):
    """A command that starts a host must not do worse than one that embedded it: the run's first turn sees
    the MCP server's tools (the command waits for them to start), and a broken plugin table in the config
    file is named on the command's stderr, not only in host.log."""
    from tests.plugins.test_plugins_everywhere import DEMO, toml_list

    config = tmp_path / "config.toml"
    config.write_text(f'[plugins.mcp.demo]\ncommand = {toml_list([sys.executable, DEMO])}\nrisk = "low"\n'
                      '[plugins.mcp.broken]\ncommand = "uvx my-server"\n')
    marker = tmp_path / "marker.txt"
    script = tmp_path / "model.json"
    script.write_text(json.dumps({"responses": [
        {"toolCalls": [{"name": "mcp__demo__write_marker", "args": {"path": str(marker)}}]}, {"text": "Done."}]}))
    env = ON_DEMAND | {"PIDESK_CONFIG": str(config), "XDG_CONFIG_HOME": str(tmp_path / "xdg")}
    with stopped_at_the_end(data_dir):
        done = subprocess.run([sys.executable, "-m", "pidesk", "run", str(project), "mark it", "--model",
                               f"scripted/{script}", "--json", "--data-dir", str(data_dir)],
                              capture_output=True, text=True, timeout=90, env=env)
        assert done.returncode == 0, done.stderr
        finished = [json.loads(line) for line in done.stdout.splitlines() if '"tool.finished"' in line]
        assert [(e["name"], e["ok"]) for e in finished] == [("mcp__demo__write_marker", True)]
        assert marker.read_text() == "marker\n"
        assert "pidesk: started a host for" in done.stderr
        assert "[plugins.mcp.broken]: command must be a list of strings" in done.stderr


def test_a_host_started_on_demand_moves_a_full_log_aside_first(project, data_dir):
    """host.log grew with every host started on demand, forever. Past ``HOST_LOG_MAX`` the next start moves
    it to host.log.1 (replacing an older one): what earlier hosts said is kept once, then goes."""
    from pidesk.cli.connect import HOST_LOG_MAX

    data_dir.mkdir(parents=True, exist_ok=True)
    (data_dir / "host.log.1").write_text("the oldest log\n")
    earlier = "an earlier host's line\n" * (HOST_LOG_MAX // 22 + 1)
    (data_dir / "host.log").write_text(earlier)
    with stopped_at_the_end(data_dir):
        ran = ok("run", str(project), "list the files", "--model", "demo", "--permission", "auto", data_dir=data_dir)
        assert "started a host" in ran.stderr
    assert (data_dir / "host.log.1").read_text() == earlier
    log = (data_dir / "host.log").read_text()
    assert "pidesk serving at http://127.0.0.1:" in log and len(log) < 100_000
