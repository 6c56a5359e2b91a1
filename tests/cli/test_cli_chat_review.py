"""``pidesk chat`` on a real pseudo-terminal: what the agent reads and thinks (issue 16), and reviewing and
undoing its changes (issue 17). Styles are checked on the byte stream (rich's SGR codes: 2 dim, 31 red,
32 green), everything else on the screen as a terminal draws it."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from tests.cli.test_cli_chat import Terminal, chat, scripted
from tests.providers.mock_vendors import MockVendor, Reply, openai_error

DIM, RED, GREEN = "\x1b[2m", "\x1b[31m", "\x1b[32m"
UNDO_QUESTION = "revert? [y] yes [n] no, + Enter · Esc cancels ›"
WRITE_NOTES = {"toolCalls": [{"name": "Write", "args": {"path": "NOTES.md", "content": "notes\n"}}]}


@pytest.fixture(autouse=True)
def own_config_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No global AGENTS.md or skills of the machine's user in these chats."""
    config = tmp_path / "config"
    config.mkdir()
    monkeypatch.setenv("XDG_CONFIG_HOME", str(config))
    return config


def styled(term: Terminal, style: str, text: str) -> bool:
    """``text`` was drawn with ``style`` (the SGR code right before it, possibly combined with others)."""
    return any(text in chunk.split("\x1b[0m", 1)[0] for chunk in term.raw.split(style)[1:])


def test_chat_prints_the_context_at_start(project: Path, data_dir: Path, tmp_path: Path) -> None:
    """Issue 16 §1: `pidesk chat` did not say which instruction files and skills the agent reads. Now it
    prints, dimmed, "Context: ../AGENTS.md, AGENTS.md · skills: deploy" (the order the request includes
    them) and one dim line per thing left out."""
    (project.parent / ".git").mkdir()
    (project.parent / "AGENTS.md").write_text("Repository rules.\n")
    (project / "AGENTS.md").write_text("Project rules.\n")
    for where in (".pi", ".claude"):  # the same name twice: the second is left out, with a warning
        skill = project / where / "skills" / "deploy"
        skill.mkdir(parents=True)
        skill.joinpath("SKILL.md").write_text("---\nname: deploy\ndescription: Ship a release.\n---\n")
    term = chat(project, data_dir, "demo")
    term.expect("Context: ../AGENTS.md, AGENTS.md · skills: deploy")
    term.expect("⚠ skill .claude/skills/deploy/SKILL.md")
    term.expect_status("agent · ask · idle ›")
    assert styled(term, DIM, "Context: ../AGENTS.md, AGENTS.md · skills: deploy")
    assert styled(term, DIM, "⚠ skill .claude/skills/deploy/SKILL.md")
    term.type("\x03")
    assert term.close() == 0


def test_chat_says_when_there_is_no_agents_md(project: Path, data_dir: Path) -> None:
    """Issue 16 §1: a project without instruction files says so, rather than nothing."""
    term = chat(project, data_dir, "demo")
    term.expect("Context: no AGENTS.md")
    term.expect_status("agent · ask · idle ›")
    term.type("\x03")
    assert term.close() == 0


def test_thinking_is_printed_dimmed_before_the_answer(project: Path, data_dir: Path, tmp_path: Path) -> None:
    """Issue 16 §2: an assistant message's thinking blocks were dropped by `pidesk chat`. Now each is
    printed dimmed before the text it came before; a redacted one reads "(thinking redacted)"."""
    term = chat(project, data_dir, scripted(tmp_path, {"thinking": "The user greets me; greet back.", "text": "Hello!"},
                                            {"thinkingRedacted": True, "text": "Hello again!"}))
    term.expect_status("agent · ask · idle ›")
    term.type("hi\r")
    term.expect("The user greets me; greet back.")
    term.expect("Hello!")
    term.expect("[turn completed]")
    term.type("hi again\r")
    term.expect("(thinking redacted)")
    term.expect("Hello again!")
    term.expect("[turn completed]")
    assert styled(term, DIM, "The user greets me; greet back.") and styled(term, DIM, "(thinking redacted)")
    assert not styled(term, DIM, "Hello!")
    term.type("\x03")
    assert term.close() == 0


def test_a_write_permission_prompt_shows_the_diff_and_the_overwrite(project: Path, data_dir: Path,
                                                                    tmp_path: Path) -> None:
    """Issue 17: a permission prompt for Write showed only the arguments (cut at 200 characters), so
    replacing a file looked like creating one. Now the diff the call would make is shown above the
    question, coloured, with "overwrites an existing file"."""
    term = chat(project, data_dir, scripted(tmp_path, {"toolCalls": [
        {"name": "Write", "args": {"path": "README.md", "content": "replaced\n"}}]}))
    term.expect_status("agent · ask · idle ›")
    term.type("rewrite the readme\r")
    term.expect("permission: Write")
    term.expect("-# demo project")
    term.expect("+replaced")
    term.expect("Write overwrites an existing file")
    term.expect_status("allow? [y] once")
    assert styled(term, RED, "-# demo project") and styled(term, GREEN, "+replaced")
    term.type("n")
    term.expect_status("deny? Enter confirms")
    term.type("\r")
    term.expect("[turn completed]")
    assert (project / "README.md").read_text() == "# demo project\n"
    term.type("\x03")
    assert term.close() == 0


def test_diff_shows_the_last_turns_changes_and_undo_asks_then_reverts(project: Path, data_dir: Path,
                                                                      tmp_path: Path) -> None:
    """Issue 17: `pidesk chat` had no way to see or take back what a turn changed. Now /diff prints the
    last turn's changes coloured like `git diff`, and /undo lists the files, warns that hand edits since are
    reverted too and asks y/n under the plan prompt's rules: `y` Enter typed ahead of the prompt never
    answers it, `n` Enter keeps everything, and only `y` pressed at the prompt, then Enter, reverts."""
    term = chat(project, data_dir, scripted(tmp_path, {"toolCalls": [
        {"name": "Write", "args": {"path": "README.md", "content": "# renamed\n"}},
        {"name": "Write", "args": {"path": "NOTES.md", "content": "notes\n"}}]}, {"text": "Both written."}))
    term.expect_status("agent · ask · idle ›")
    term.type("/undo\r")
    term.expect("nothing to undo")
    term.type("/auto\r")
    term.expect_status("agent · auto · idle ›")
    term.type("write things\r")
    term.expect("Both written.")
    term.expect("[turn completed]")
    term.expect_status("agent · auto · idle ›")
    term.type("/diff\r")
    term.expect("added NOTES.md +1 -0")  # files in path order, as session.changes lists them
    term.expect("+notes")
    term.expect("modified README.md +1 -1")
    term.expect("-# demo project")
    term.expect("+# renamed")
    term.expect_status("agent · auto · idle ›")
    assert styled(term, RED, "-# demo project") and styled(term, GREEN, "+notes")
    term.type("/undo\ry\r")  # y Enter typed ahead of the prompt
    term.expect("Files restored:")
    term.expect("  NOTES.md")
    term.expect("  README.md")
    term.expect("Files changed by hand")
    term.expect_status(UNDO_QUESTION)
    assert (project / "NOTES.md").exists()
    term.type("\r")  # nothing selected: nothing happens
    term.type("n")
    term.expect_status("keep everything? Enter confirms")
    term.type("\r")
    term.expect("[undo cancelled: nothing reverted]")
    assert (project / "NOTES.md").exists()
    term.type("/undo\r")
    term.expect_status(UNDO_QUESTION)
    term.type("y")
    term.expect_status("revert these files? Enter confirms")
    term.type("\r")
    term.expect("[reverted 2 files: ")
    term.expect_status("agent · auto · idle ›")
    assert not (project / "NOTES.md").exists()
    assert (project / "README.md").read_text() == "# demo project\n"
    term.type("/undo\r")  # the only turn that changed files is undone: nothing older to offer
    term.expect("nothing to undo")
    term.type("\x03")
    assert term.close() == 0


def test_a_failed_turn_shows_its_error_message(project: Path, data_dir: Path, tmp_path: Path) -> None:
    """Issue 16 §4: a turn that failed showed only "[turn error: PROVIDER_ERROR]", never why. Now the
    host's errorMessage (the provider's status and message, the retries spent) is printed under it."""
    term = chat(project, data_dir, scripted(tmp_path, {"error": "PROVIDER_ERROR",
                                                       "detail": "HTTP 529 overloaded_error: Overloaded (3 retries)"}))
    term.expect_status("agent · ask · idle ›")
    term.type("hello\r")
    term.expect("[turn error: PROVIDER_ERROR]")
    term.expect("HTTP 529 overloaded_error: Overloaded (3 retries)")
    term.expect_status("agent · ask · idle ›")
    assert styled(term, RED, "HTTP 529 overloaded_error: Overloaded (3 retries)")
    term.type("\x03")
    assert term.close() == 0


@pytest.mark.asyncio
async def test_chat_spends_the_max_retries_it_is_given_and_says_why_it_failed(
    project: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 16 §4: `pidesk chat` had no --max-retries (its embedded host always retried 10 times) and a
    failed turn never said why. Now `--max-retries 1` makes one retry, and the provider's words and the
    retries spent are printed under the [turn error: …] line."""
    overloaded = Reply(503, openai_error(503, "The server is overloaded").body, {"retry-after-ms": "10"})
    async with MockVendor() as vendor:
        vendor.script(overloaded, overloaded, overloaded)
        monkeypatch.setenv("OPENAI_BASE_URL", f"{vendor.url}/v1")
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test-secret-0123456789abcdef")
        monkeypatch.delenv("PIDESK_MAX_RETRIES", raising=False)
        term = Terminal([sys.executable, "-m", "pidesk", "chat", str(project), "--data-dir", str(data_dir),
                         "--model", "openai/gpt-test", "--max-retries", "1"])
        await asyncio.to_thread(term.expect_status, "agent · ask · idle ›")
        term.type("hi\r")
        await asyncio.to_thread(term.expect, "[turn error: PROVIDER_ERROR]")
        await asyncio.to_thread(term.expect, "openai answered HTTP 503: The server is overloaded "
                                             "(gave up after 1 retries)")
        assert len(vendor.requests) == 2
        term.type("\x03")
        assert await asyncio.to_thread(term.close) == 0
