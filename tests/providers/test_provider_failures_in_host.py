"""What a person sees of a failed model request (issue 16 §4): the turn's ``errorMessage`` through a
real Host (stored on the Turn, published on ``turn.ended``, kept across a reopen), on ``pidesk run``'s
stderr, and ``--max-retries`` / ``PIDESK_MAX_RETRIES`` / ``max_retries`` deciding the budget."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest

from pidesk.config import HostConfig
from pidesk.core.errors import InvalidParams
from pidesk.providers.openai import OpenAIProvider
from pidesk.providers.retry import RetryPolicy
from tests.providers.mock_vendors import Echo, MockVendor, RecordedSleep, Reply, openai_error
from tests.scenario import ended, prompt, session

KEY = "sk-test-secret-0123456789abcdef"


@pytest.mark.asyncio
async def test_a_failed_turn_carries_the_providers_words_on_the_turn_and_its_end_event(
    make_host, project: Path
) -> None:
    """Issue 16 §4: pidesk built 'openai answered HTTP 401: … — check the API key' and dropped it:
    the turn said only PROVIDER_UNAUTHORIZED. Now Turn.errorMessage and turn.ended carry it
    (the echoed key blanked out), and it survives a restart of the host."""
    async with MockVendor() as vendor:
        vendor.script(Echo(lambda r: openai_error(401, f"Incorrect API key provided: {r.headers['authorization']}")))
        provider = OpenAIProvider("gpt-test", api_key=KEY, base_url=f"{vendor.url}/v1", sleep=RecordedSleep())
        host = make_host(provider=provider)
        s = await session(host, project)
        sub = host.subscribe()
        turn = await prompt(host, s["id"], "hi")
        end = await ended(sub, turn["turnId"])
        expected = ("openai answered HTTP 401: Incorrect API key provided: Bearer [redacted] — check the API key "
                    "and its permissions")
        assert (end.reason, end.error_code, end.error_message) == ("error", "PROVIDER_UNAUTHORIZED", expected)
        row = (await host.call("session.turns", {"sessionId": s["id"]}))["turns"][-1]
        assert (row["errorCode"], row["errorMessage"]) == ("PROVIDER_UNAUTHORIZED", expected)
        await host.close()
        again = make_host(provider=provider)
        row = (await again.call("session.turns", {"sessionId": s["id"]}))["turns"][-1]
        assert row["errorMessage"] == expected


@pytest.mark.asyncio
async def test_a_completed_turn_has_no_error_message(host, provider, project: Path) -> None:
    """PROTOCOL.md "Additions": errorMessage is null unless the outcome is error."""
    s = await session(host, project)
    sub = host.subscribe()
    provider.enqueue(s["id"], {"text": "fine"})
    end = await ended(sub, (await prompt(host, s["id"]))["turnId"])
    assert (end.reason, end.error_message) == ("completed", None)
    row = (await host.call("session.turns", {"sessionId": s["id"]}))["turns"][-1]
    assert row["errorMessage"] is None


def test_max_retries_flag_beats_the_environment_beats_the_config_file(tmp_path: Path) -> None:
    """Issue 16 §4: --max-retries N, PIDESK_MAX_RETRIES and the config file's max_retries, in that
    order (PROTOCOL.md has always listed the flag); so do the Retry-After cap and the idle time."""
    config = tmp_path / "config.toml"
    config.write_text("max_retries = 4\nretry_after_cap = 7\nstream_idle_timeout = 30\n")
    env = {"PIDESK_CONFIG": str(config), "PIDESK_HOME": str(tmp_path / "data")}
    assert HostConfig.from_environ(env).retry == RetryPolicy(4, retry_after_cap=7.0, idle_timeout=30.0)
    assert HostConfig.from_environ({**env, "PIDESK_MAX_RETRIES": "2"}).retry.max_retries == 2
    assert HostConfig.from_environ({**env, "PIDESK_MAX_RETRIES": "2"}, max_retries=0).retry.max_retries == 0
    assert HostConfig.from_environ({**env, "PIDESK_RETRY_AFTER_CAP": "1.5"}).retry.retry_after_cap == 1.5
    assert HostConfig.from_environ({"PIDESK_CONFIG": str(tmp_path / "none.toml")}).retry == RetryPolicy(
        10, retry_after_cap=60.0, idle_timeout=120.0)
    with pytest.raises(InvalidParams, match="PIDESK_MAX_RETRIES = 'many'"):
        HostConfig.from_environ({**env, "PIDESK_MAX_RETRIES": "many"})
    config.write_text("stream_idle_timeout = -1\n")
    with pytest.raises(InvalidParams, match="stream_idle_timeout in the config file = -1"):
        HostConfig.from_environ(env)


async def _pidesk_run(project: Path, data_dir: Path, url: str, *extra: str,
                      env: dict[str, str] | None = None) -> tuple[int, str]:
    environ = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(data_dir),
               "XDG_CONFIG_HOME": str(data_dir / "xdg"), "OPENAI_BASE_URL": f"{url}/v1", "OPENAI_API_KEY": KEY,
               "PIDESK_EMBEDDED": "1", **(env or {})}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pidesk", "run", str(project), "hi", "--model", "openai/gpt-test",
        "--data-dir", str(data_dir), *extra, env=environ,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode or 0, err.decode()


@pytest.mark.asyncio
async def test_pidesk_run_prints_the_error_message_and_spends_the_max_retries_it_is_given(
    project: Path, data_dir: Path
) -> None:
    """Issue 16 §4: `pidesk run` said only 'turn error: PROVIDER_ERROR'; its stderr now says what the
    provider answered and the retries spent, and --max-retries / PIDESK_MAX_RETRIES set the budget."""
    overloaded = Reply(503, openai_error(503, "The server is overloaded").body, {"retry-after-ms": "10"})
    async with MockVendor() as vendor:
        vendor.script(*[overloaded] * 3)
        code, err = await _pidesk_run(project, data_dir, vendor.url, "--max-retries", "2")
        assert code == 1 and len(vendor.requests) == 3
        assert ("pidesk: turn error: PROVIDER_ERROR: openai answered HTTP 503: The server is overloaded "
                "(gave up after 2 retries)") in err
        assert KEY not in err
        vendor.script(overloaded)
        code, err = await _pidesk_run(project, data_dir, vendor.url, env={"PIDESK_MAX_RETRIES": "0"})
        assert code == 1 and len(vendor.requests) == 4 and "(gave up after 0 retries)" in err


class _Sink:
    """A stand-in for stderr that tells a waiting test when a line arrives."""

    def __init__(self) -> None:
        self.text = ""
        self.wrote = asyncio.Event()

    def write(self, text: str) -> int:
        self.text += text
        self.wrote.set()
        return len(text)

    def flush(self) -> None:
        pass


@pytest.mark.asyncio
async def test_serves_log_names_each_failed_turn_with_its_error_message(host, provider, project: Path) -> None:
    """Issue 16 §4: serve's log said nothing of a failed turn; it now gets a line with the code and
    the provider's words (a completed turn writes nothing)."""
    from pidesk.server.serve import _log_failed_turns

    sink = _Sink()
    task = asyncio.create_task(_log_failed_turns(host, sink))  # type: ignore[arg-type]
    try:
        s = await session(host, project)
        sub = host.subscribe()
        provider.enqueue(s["id"], {"text": "fine"}, {"error": "PROVIDER_ERROR",
                                                     "detail": "could not reach openai at http://127.0.0.1:9/v1"})
        await ended(sub, (await prompt(host, s["id"]))["turnId"])
        failed = (await prompt(host, s["id"]))["turnId"]
        await asyncio.wait_for(sink.wrote.wait(), 10)
        assert sink.text == (f"pidesk: turn {failed} in session {s['id']} failed: PROVIDER_ERROR: "
                             "could not reach openai at http://127.0.0.1:9/v1\n")
    finally:
        task.cancel()
