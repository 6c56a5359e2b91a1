from __future__ import annotations

import os
from pathlib import Path

import pytest

from pidesk.core.errors import Code
from pidesk.tools import check_paths, make_workspace_tools, resolve, run_tool
from pidesk.tools.base import ToolFailure

OUTSIDE = Code.PATH_OUTSIDE_WORKSPACE
DENIED = Code.WORKSPACE_PATH_DENIED
SECRETS = [".env", ".env.local", "a/b/.env", "x.pem", "id_rsa", "id_ed25519.pub"]


def test_resolve_gives_absolute_path_and_posix_relative(root: Path) -> None:
    (root / "src").mkdir()
    assert resolve(root, "src/new.py") == (root / "src" / "new.py", "src/new.py")
    assert resolve(root, str(root / "src")) == (root / "src", "src")
    assert resolve(root, "src/../a.txt") == (root / "a.txt", "a.txt")


@pytest.mark.parametrize("path", ["../outside/secret.txt", "a/../../x", "/etc/passwd"])
def test_resolve_refuses_escapes(root: Path, outside: Path, path: str) -> None:
    with pytest.raises(ToolFailure) as raised:
        resolve(root, path)
    assert raised.value.code is OUTSIDE


def test_resolve_follows_symlinks_also_for_files_not_yet_there(root: Path, outside: Path) -> None:
    (root / "link").symlink_to(outside, target_is_directory=True)
    (root / "dangling").symlink_to(outside / "nothing-yet.txt")
    for path in ("link/secret.txt", "link/new/deeper.txt", "dangling"):
        with pytest.raises(ToolFailure) as raised:
            resolve(root, path)
        assert raised.value.code is OUTSIDE


def test_resolve_works_through_a_symlinked_root(tmp_path: Path, root: Path) -> None:
    alias = tmp_path / "alias"
    alias.symlink_to(root, target_is_directory=True)
    assert resolve(alias, str(alias / "a.txt")) == (root / "a.txt", "a.txt")


@pytest.mark.asyncio
async def test_escapes_are_refused_by_read_and_write(root: Path, outside: Path) -> None:
    tools = make_workspace_tools(root)
    (root / "file-link").symlink_to(outside / "secret.txt")
    (root / "dir-link").symlink_to(outside, target_is_directory=True)
    for path in ("../outside/secret.txt", str(outside / "secret.txt"), "file-link", "dir-link/secret.txt"):
        read = await run_tool(tools["Read"], {"path": path})
        assert (read.ok, read.error_code) == (False, OUTSIDE), path
        write = await run_tool(tools["Write"], {"path": path, "content": "pwned"})
        assert (write.ok, write.error_code) == (False, OUTSIDE), path
        edit = await run_tool(tools["Edit"], {"path": path, "oldText": "outside", "newText": "x"})
        assert edit.error_code == OUTSIDE, path
    created = await run_tool(tools["Write"], {"path": "dir-link/new/file.txt", "content": "x"})
    assert created.error_code == OUTSIDE
    assert (outside / "secret.txt").read_text() == "outside data\n"
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]


@pytest.mark.asyncio
async def test_absolute_path_inside_root_is_fine(root: Path) -> None:
    tools = make_workspace_tools(root)
    target = root / "notes.txt"
    written = await run_tool(tools["Write"], {"path": str(target), "content": "hello\n"})
    assert written.ok, written.output
    read = await run_tool(tools["Read"], {"path": str(target)})
    assert read.ok and "hello" in read.output
    assert check_paths("Read", {"path": str(target)}, root) is None


@pytest.mark.asyncio
@pytest.mark.parametrize("secret", SECRETS)
async def test_secrets_are_denied_to_read_write_and_edit(root: Path, secret: str) -> None:
    target = root / secret
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text("TOKEN=hunter2\n")
    for tool in ("Read", "Write", "Edit"):
        assert check_paths(tool, {"path": secret}, root) is DENIED
    tools = make_workspace_tools(root)
    results = [
        await run_tool(tools["Read"], {"path": secret}),
        await run_tool(tools["Write"], {"path": secret, "content": "x"}),
        await run_tool(tools["Edit"], {"path": secret, "oldText": "TOKEN", "newText": "X"}),
    ]
    assert [(r.ok, r.error_code) for r in results] == [(False, DENIED)] * 3
    assert all("hunter2" not in r.output for r in results)
    assert target.read_text() == "TOKEN=hunter2\n"


@pytest.mark.asyncio
async def test_a_symlink_cannot_disguise_a_secret(root: Path) -> None:
    (root / ".env").write_text("TOKEN=hunter2\n")
    (root / "harmless.txt").symlink_to(root / ".env")
    (root / "plain.txt").write_text("plain\n")
    (root / "id_rsa").symlink_to(root / "plain.txt")
    tools = make_workspace_tools(root)
    assert (await run_tool(tools["Read"], {"path": "harmless.txt"})).error_code == DENIED
    assert (await run_tool(tools["Read"], {"path": "id_rsa"})).error_code == DENIED
    assert check_paths("Read", {"path": "harmless.txt"}, root) is DENIED


@pytest.mark.asyncio
async def test_pi_dir_is_readable_but_not_writable(root: Path) -> None:
    plan = root / ".pi" / "plan" / "x.md"
    plan.parent.mkdir(parents=True)
    plan.write_text("# Plan\n")
    tools = make_workspace_tools(root)
    assert check_paths("Read", {"path": ".pi/plan/x.md"}, root) is None
    assert (await run_tool(tools["Read"], {"path": ".pi/plan/x.md"})).ok
    for tool in ("Write", "Edit"):
        assert check_paths(tool, {"path": ".pi/plan/x.md"}, root) is DENIED
    write = await run_tool(tools["Write"], {"path": ".pi/plan/x.md", "content": "evil"})
    edit = await run_tool(tools["Edit"], {"path": ".pi/plan/x.md", "oldText": "Plan", "newText": "X"})
    new = await run_tool(tools["Write"], {"path": ".pi/plan/new.md", "content": "evil"})
    assert [write.error_code, edit.error_code, new.error_code] == [DENIED] * 3
    assert plan.read_text() == "# Plan\n"
    assert not (root / ".pi" / "plan" / "new.md").exists()


@pytest.mark.asyncio
@pytest.mark.parametrize("path", [".git/config", "sub/.git/HEAD"])
async def test_git_dirs_are_not_writable(root: Path, path: str) -> None:
    target = root / path
    target.parent.mkdir(parents=True)
    target.write_text("[core]\n")
    tools = make_workspace_tools(root)
    assert check_paths("Read", {"path": path}, root) is None
    assert check_paths("Write", {"path": path}, root) is DENIED
    assert check_paths("Edit", {"path": path}, root) is DENIED
    write = await run_tool(tools["Write"], {"path": path, "content": "x"})
    edit = await run_tool(tools["Edit"], {"path": path, "oldText": "core", "newText": "x"})
    assert [write.error_code, edit.error_code] == [DENIED, DENIED]
    assert target.read_text() == "[core]\n"


@pytest.mark.asyncio
async def test_a_symlink_cannot_lead_writes_into_host_owned_paths(root: Path) -> None:
    (root / ".git").mkdir()
    (root / ".git" / "config").write_text("[core]\n")
    (root / "innocent").symlink_to(root / ".git" / "config")
    tools = make_workspace_tools(root)
    write = await run_tool(tools["Write"], {"path": "innocent", "content": "x"})
    assert write.error_code == DENIED
    assert (root / ".git" / "config").read_text() == "[core]\n"


def test_check_paths_for_searches_and_pathless_tools(root: Path, outside: Path) -> None:
    (root / ".env").write_text("x")
    assert check_paths("Glob", {"pattern": "*"}, root) is None
    assert check_paths("Glob", {"pattern": "*", "path": "../outside"}, root) is OUTSIDE
    assert check_paths("Grep", {"pattern": "x", "path": str(outside)}, root) is OUTSIDE
    assert check_paths("Grep", {"pattern": "x", "path": ".env"}, root) is DENIED
    assert check_paths("Glob", {"pattern": "*", "path": ".env"}, root) is None
    assert check_paths("Bash", {"command": "cat ../outside/secret.txt"}, root) is None
    assert check_paths("Task", {"description": "d", "prompt": "p"}, root) is None
    assert check_paths("BrowserPreview", {"url": "http://127.0.0.1:3000/"}, root) is None
    assert check_paths("BrowserPreview", {"url": f"file://{outside}/secret.txt"}, root) is OUTSIDE
    assert check_paths("BrowserPreview", {"url": f"file://{root}/index.html"}, root) is None


def test_check_paths_leaves_malformed_arguments_to_the_tool(root: Path) -> None:
    assert check_paths("Read", {"path": 42}, root) is None
    assert check_paths("Write", {}, root) is None
    assert check_paths("Read", {"path": "a\0b"}, root) is None


@pytest.mark.asyncio
async def test_tools_report_malformed_paths_as_invalid_arguments(root: Path) -> None:
    tools = make_workspace_tools(root)
    assert (await run_tool(tools["Read"], {"path": 42})).error_code == Code.INVALID_ARGUMENTS
    assert (await run_tool(tools["Read"], {"path": "a\0b"})).error_code == Code.INVALID_ARGUMENTS
    assert (await run_tool(tools["Write"], {"path": "", "content": ""})).error_code == Code.INVALID_ARGUMENTS


@pytest.mark.asyncio
async def test_symlink_loops_stay_inside_and_fail_cleanly(root: Path) -> None:
    os.symlink("b", root / "a")
    os.symlink("a", root / "b")
    target, _ = resolve(root, "a")
    assert target.is_relative_to(root)
    read = await run_tool(make_workspace_tools(root)["Read"], {"path": "a"})
    assert (read.ok, read.error_code) == (False, None)
    assert "cannot open a" in read.output
