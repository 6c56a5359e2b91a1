"""Issue 16 §1: what the model is told — instruction files, skills, environment — through a real Host.

Every assertion reads the system prompt of a real model request (the scripted
provider records them) or ``session.context``, the method that promises to list
exactly what the next request includes.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from datetime import datetime, timezone
from pathlib import Path

import pytest

from pidesk.host.instructions import FILE_CAP, TOTAL_CAP
from tests.scenario import ended, prompt, session, tool

CLOCK = datetime(2025, 3, 14, 12, 0, tzinfo=timezone.utc)


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def git(root: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True, timeout=30,
                   env={"PATH": os.environ["PATH"], "HOME": str(root), "GIT_CONFIG_NOSYSTEM": "1"})


def skill(directory: Path, front_matter: str, body: str = "Do the thing.\n") -> Path:
    return write(directory / "SKILL.md", f"{front_matter}\n{body}")


def headings(system: str) -> list[str]:
    """The instruction files' paths, in the order the prompt includes them."""
    return [line[3:] for line in system.splitlines() if line.startswith("## ")]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


async def one_turn(host, provider, session_id: str, text: str = "go") -> str:
    """Run a turn to its end; the system prompt of its first model request."""
    sub = host.subscribe()
    before = len(provider.requests)
    turn = await prompt(host, session_id, text)
    assert (await ended(sub, turn["turnId"])).reason == "completed"
    return provider.requests[before].system


@pytest.fixture
def nested(tmp_path: Path) -> dict[str, Path]:
    """A repository whose session root is two levels down, with instructions at several levels."""
    above = tmp_path / "outside"
    repo = above / "repo"
    middle = repo / "packages"
    root = middle / "app"
    root.mkdir(parents=True)
    (repo / ".git").mkdir()  # the nearest .git marks the repository root
    config = tmp_path / "config"
    return {
        "above": write(above / "AGENTS.md", "ABOVE THE REPOSITORY: never included\n"),
        "repo": write(repo / "AGENTS.md", "Repository rule: run make check.\n"),
        "repo_claude": write(repo / "CLAUDE.md", "SHADOWED: the directory has an AGENTS.md\n"),
        "middle": write(middle / "CLAUDE.md", "Packages rule: no new dependencies.\n"),
        "root": write(root / "AGENTS.md", "App rule: tabs, not spaces.\n"),
        "global": write(config / "AGENTS.md", "Global rule: answer in English.\n"),
        "config": config,
        "root_dir": root,
    }


@pytest.mark.asyncio
async def test_instruction_files_from_the_root_up_to_the_repository_root_global_first(make_host, provider, nested):
    """Issue 16 §1: AGENTS.md (CLAUDE.md where a directory has none) from the session root up to the
    nearest .git, the global file first, each under its path; nothing above the repository."""
    host = make_host(config_dir=nested["config"])
    s = await session(host, nested["root_dir"])
    system = await one_turn(host, provider, s["id"])
    assert headings(system) == [str(nested["global"]), "../../AGENTS.md", "../CLAUDE.md", "AGENTS.md"]
    for key in ("global", "repo", "middle", "root"):
        assert nested[key].read_text().strip() in system
    assert "SHADOWED" not in system and "ABOVE THE REPOSITORY" not in system
    # precedence: the nearer the file, the later it comes
    assert system.index("Global rule") < system.index("Repository rule") < system.index("Packages rule") \
        < system.index("App rule")


@pytest.mark.asyncio
async def test_without_a_repository_only_the_session_roots_file_is_read(make_host, provider, tmp_path):
    """Issue 16 §1: no .git above the root: the root alone, never its parents."""
    write(tmp_path / "AGENTS.md", "PARENT: not a repository, so never included\n")
    root = tmp_path / "proj"
    write(root / "CLAUDE.md", "Only CLAUDE.md here.\n")
    host = make_host()
    s = await session(host, root)
    system = await one_turn(host, provider, s["id"])
    assert headings(system) == ["CLAUDE.md"]
    assert "Only CLAUDE.md here." in system and "PARENT" not in system


@pytest.mark.asyncio
async def test_session_context_lists_exactly_what_the_next_request_includes(make_host, provider, nested):
    """Issue 16 §1 / PROTOCOL Additions: session.context names the files (path, size, sha256) and skills
    of the next request, in its order — before a turn, and while one runs."""
    root = nested["root_dir"]
    skill(root / ".pi/skills/release", "---\nname: release\ndescription: Cut a release.\n---")
    host = make_host(config_dir=nested["config"])
    s = await session(host, root)
    before = await host.call("session.context", {"sessionId": s["id"]})
    assert before["files"] == [
        {"path": str(nested["global"]), "size": nested["global"].stat().st_size, "sha256": digest(nested["global"])},
        {"path": "../../AGENTS.md", "size": nested["repo"].stat().st_size, "sha256": digest(nested["repo"])},
        {"path": "../CLAUDE.md", "size": nested["middle"].stat().st_size, "sha256": digest(nested["middle"])},
        {"path": "AGENTS.md", "size": nested["root"].stat().st_size, "sha256": digest(nested["root"])},
    ]
    assert before["skills"] == [{"name": "release", "description": "Cut a release.",
                                 "path": ".pi/skills/release/SKILL.md"}]
    assert before["warnings"] == []

    provider.enqueue(s["id"], {"gate": "held", "text": "thinking"})
    sub = host.subscribe()
    turn = await prompt(host, s["id"])
    await provider.wait_reached("held")
    nested["root"].write_text("Changed while the turn runs: for the next turn.\n")
    during = await host.call("session.context", {"sessionId": s["id"]})
    provider.release("held")
    assert (await ended(sub, turn["turnId"])).reason == "completed"
    system = provider.requests[-1].system
    files = ("files", "skills", "warnings")
    assert {k: during[k] for k in files} == {k: before[k] for k in files}  # the running turn's, not the file now
    assert headings(system) == [f["path"] for f in during["files"]]
    assert "- release: Cut a release. (.pi/skills/release/SKILL.md)" in system

    after = await host.call("session.context", {"sessionId": s["id"]})
    assert after["files"][-1]["sha256"] == digest(nested["root"])
    system = await one_turn(host, provider, s["id"])
    assert "Changed while the turn runs: for the next turn." in system


@pytest.mark.asyncio
async def test_a_file_changed_between_turns_is_re_read_but_not_within_a_turn(make_host, provider, project):
    """Issue 16 §1: files are re-read when they change between turns, not on every request: the
    agent's own edit of AGENTS.md reaches the next turn's prompt, and its turn keeps one prompt."""
    write(project / "AGENTS.md", "Version one.\n")
    host = make_host()
    s = await session(host, project, permissionMode="accept-edits")
    provider.enqueue(s["id"], tool("Write", path="AGENTS.md", content="Version two, same size.\n"),
                     {"text": "Written."})
    sub = host.subscribe()
    first = len(provider.requests)
    turn = await prompt(host, s["id"])
    assert (await ended(sub, turn["turnId"])).reason == "completed"
    requests = provider.requests[first:]
    assert len(requests) == 2 and requests[0].system == requests[1].system
    assert "Version one." in requests[1].system
    system = await one_turn(host, provider, s["id"])
    assert "Version two, same size." in system and "Version one." not in system


@pytest.mark.asyncio
async def test_a_file_rewritten_with_the_same_size_and_mtime_is_still_re_read(make_host, provider, project):
    """Issue 16 §1: change detection is not fooled by an editor that keeps size and mtime (the
    inode/ctime stamp changes with the content's replacement)."""
    agents = write(project / "AGENTS.md", "AAAA\n")
    host = make_host()
    s = await session(host, project)
    assert "AAAA" in await one_turn(host, provider, s["id"])
    stamp = agents.stat()
    replacement = write(project / "AGENTS.tmp", "BBBB\n")
    os.utime(replacement, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    os.replace(replacement, agents)
    system = await one_turn(host, provider, s["id"])
    assert "BBBB" in system and "AAAA" not in system


@pytest.mark.asyncio
async def test_a_file_over_the_cap_is_cut_with_a_visible_note(make_host, provider, project):
    """Issue 16 §1: a size cap per file, with a truncation note the model (and the user) can see;
    session.context still names the whole file's size and digest."""
    big = write(project / "AGENTS.md", "Rule line.\n" * (FILE_CAP // 11 + 500) + "THE LAST LINE\n")
    host = make_host()
    s = await session(host, project)
    system = await one_turn(host, provider, s["id"])
    size = big.stat().st_size
    assert f"[pidesk: AGENTS.md is {size:,} bytes; only its first {FILE_CAP:,} are included here]" in system
    assert "THE LAST LINE" not in system
    listed = await host.call("session.context", {"sessionId": s["id"]})
    assert listed["files"] == [{"path": "AGENTS.md", "size": size, "sha256": digest(big)}]


@pytest.mark.asyncio
async def test_the_total_cap_cuts_the_farthest_files_first(make_host, provider, tmp_path):
    """Issue 16 §1: all files together are capped; the nearest file (the session root's) keeps its text
    and a file past the total is left out with a warning in session.context."""
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    root = repo / "a" / "b"
    write(root / "AGENTS.md", "NEAREST " * (FILE_CAP // 8))  # exactly the cap: whole
    write(repo / "a" / "AGENTS.md", "MIDDLE " * (FILE_CAP // 7 + 10))  # over it: cut
    write(repo / "AGENTS.md", "FARTHEST\n")
    host = make_host()
    s = await session(host, root)
    system = await one_turn(host, provider, s["id"])
    assert headings(system) == ["../AGENTS.md", "AGENTS.md"]
    assert "FARTHEST" not in system and "NEAREST " * (FILE_CAP // 8 - 1) in system
    assert "[pidesk: ../AGENTS.md is" in system
    assert sum(len(f.encode()) for f in system.split("## ")[1:]) < TOTAL_CAP + 1024
    listed = await host.call("session.context", {"sessionId": s["id"]})
    assert [f["path"] for f in listed["files"]] == ["../AGENTS.md", "AGENTS.md"]
    assert any("../../AGENTS.md not included" in w for w in listed["warnings"])


@pytest.mark.asyncio
async def test_skills_list_names_descriptions_and_paths_and_a_bad_one_is_a_warning(make_host, provider, project,
                                                                                     tmp_path):
    """Issue 16 §1: skills from .pi/, .agents/, .claude/ and the global dir — only name, description
    and path in the prompt; bad front matter skips the skill with a warning, and the turn runs."""
    config = tmp_path / "config"
    skill(project / ".pi/skills/deploy", "---\nname: deploy\ndescription: 'Ship it: the ''safe'' way.'\n---",
          body="SECRET BODY never in the prompt\n")
    skill(project / ".agents/skills/review",
          "---\nname: review\ndescription: Review a diff\nlicense: MIT\nmetadata:\n  author: someone\n---")
    skill(project / ".claude/skills/broken", "---\nname: broken\ndescription: |\n  folded text\n---")
    skill(project / ".claude/skills/nameless", "---\ndescription: no name\n---")
    skill(project / ".claude/skills/unclosed", "---\nname: unclosed\ndescription: never ends", body="")
    skill(project / ".claude/skills/dup", "---\nname: deploy\ndescription: a second deploy\n---")
    skill(config / "skills/notes", '---\nname: notes\ndescription: "Take notes \\"well\\""\n---')
    host = make_host(config_dir=config)
    s = await session(host, project)
    system = await one_turn(host, provider, s["id"])
    assert "- deploy: Ship it: the 'safe' way. (.pi/skills/deploy/SKILL.md)" in system
    assert "- review: Review a diff (.agents/skills/review/SKILL.md)" in system
    assert f'- notes: Take notes "well" ({config / "skills/notes/SKILL.md"})' in system
    assert "SECRET BODY" not in system and "broken" not in system and "a second deploy" not in system
    listed = await host.call("session.context", {"sessionId": s["id"]})
    assert [k["name"] for k in listed["skills"]] == ["deploy", "review", "notes"]
    warnings = "\n".join(listed["warnings"])
    for bad in ("broken", "nameless", "unclosed", "dup"):
        assert f".claude/skills/{bad}/SKILL.md skipped" in warnings
    assert "block values" in warnings and "no name" in warnings and "no closing '---'" in warnings
    assert "the name 'deploy' is taken by .pi/skills/deploy/SKILL.md" in warnings


@pytest.mark.asyncio
async def test_a_project_file_may_not_point_the_prompt_at_a_file_outside_it(make_host, provider, tmp_path):
    """Issue 16 §1, secrets: a cloned repository's AGENTS.md symlinked to ~/.aws/credentials (or to a
    key) must not put that file into the request sent to the provider."""
    secret = write(tmp_path / "home/.aws/credentials", "aws_secret_access_key = AKIAEXAMPLE\n")
    key = write(tmp_path / "repo/deploy.pem", "-----BEGIN PRIVATE KEY-----\n")
    root = tmp_path / "repo"
    (root / ".git").mkdir()
    (root / "AGENTS.md").symlink_to(secret)
    (root / "sub").mkdir()
    (root / "sub/AGENTS.md").symlink_to(key)
    host = make_host()
    s = await session(host, root / "sub")
    system = await one_turn(host, provider, s["id"])
    assert "AKIAEXAMPLE" not in system and "PRIVATE KEY" not in system
    listed = await host.call("session.context", {"sessionId": s["id"]})
    assert listed["files"] == []
    assert any("../AGENTS.md not included: it leads outside" in w for w in listed["warnings"])
    assert any("AGENTS.md not included: it leads to a secret file" in w for w in listed["warnings"])


@pytest.mark.asyncio
async def test_the_environment_names_date_platform_shell_root_and_git_state(make_host, provider, project):
    """Issue 16 §1: the date (the host's clock), platform, shell, root, and in a repository the
    branch and the count of changed files."""
    git(project, "init", "-q", "-b", "trunk")
    host = make_host(clock=lambda: CLOCK)
    s = await session(host, project)
    system = await one_turn(host, provider, s["id"])
    assert f"Date: {CLOCK.astimezone().date().isoformat()}" in system
    assert f"Root: {project}" in system and "Shell: bash" in system and "Platform: " in system
    assert "Git: branch trunk, 2 changed files" in system  # README.md and src/, both untracked
    nested = await session(host, project / "src")  # a root inside the repository: git answers for it too
    assert "Git: branch trunk, 2 changed files" in await one_turn(host, provider, nested["id"])


@pytest.mark.asyncio
async def test_a_temporary_session_gets_only_the_global_file(make_host, provider, nested):
    """Issue 16 §1: a session without a project has no project tree to read (its scratch root lives
    in the data dir); the global file still applies."""
    host = make_host(config_dir=nested["config"])
    s = await session(host)
    system = await one_turn(host, provider, s["id"])
    assert headings(system) == [str(nested["global"])]
    assert "Git:" not in system


@pytest.mark.asyncio
async def test_a_delegate_is_told_what_its_parent_is_told(make_host, provider, project):
    """Issue 16 §1: a Task's child agent works in the same project under the same instructions."""
    write(project / "AGENTS.md", "Delegates too: never touch vendor/.\n")
    host = make_host()
    s = await session(host, project)
    provider.enqueue(s["id"], tool("Task", description="look", prompt="look around"),
                     tool("TaskWait", taskIds=["task_1"]), {"text": "ok"})
    await one_turn(host, provider, s["id"])
    child = [r for r in provider.requests if r.agent == "task_1"]
    assert child and "Delegates too: never touch vendor/." in child[0].system
    assert "You are a delegate working on one task: look." in child[0].system


@pytest.mark.asyncio
async def test_a_session_in_a_subfolder_sees_the_repositorys_skills_nearest_first(make_host, provider, tmp_path):
    """Issue 31 §5: skills were looked for only in the session's own folder, while AGENTS.md is found up to
    the repository root: a session in `repo/service` missed `repo/.pi/skills`. Now both are found, the
    nearest winning a name, and nothing above the repository root is read."""
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    skill(repo / ".pi/skills/deploy", "---\nname: deploy\ndescription: the repository's deploy\n---")
    skill(repo / ".pi/skills/lint", "---\nname: lint\ndescription: lint it\n---")
    skill(repo / "service/.agents/skills/deploy", "---\nname: deploy\ndescription: the service's own deploy\n---")
    skill(tmp_path / ".pi/skills/outside", "---\nname: outside\ndescription: above the repository\n---")
    host = make_host()
    s = await session(host, repo / "service")
    listed = await host.call("session.context", {"sessionId": s["id"]})
    assert [(k["name"], k["description"], k["path"]) for k in listed["skills"]] == [
        ("deploy", "the service's own deploy", ".agents/skills/deploy/SKILL.md"),
        ("lint", "lint it", "../.pi/skills/lint/SKILL.md")]
    assert any("the name 'deploy' is taken by .agents/skills/deploy/SKILL.md" in w for w in listed["warnings"])
