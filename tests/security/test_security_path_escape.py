"""Path-escape corpus (issue 7 item 4): no tool reads or writes outside the session root.

Every case runs through the real Host (Agent mode, permission ``auto``, the
scripted provider making the calls), so the gate's ``check_paths`` and each
tool's own re-check both stand in the way. The world around the project holds
an ``outside`` directory, a sibling-prefix directory ``project2`` and a fake
``$HOME``, each with a secret token; after every case their snapshots are
unchanged, no new file appears outside the root, and no token appears in any
tool output or anywhere in the session's messages.

Host-owned (``.pi/``, ``.git/``) and secret (``.env``, ``id_rsa``, ``*.pem``…)
paths inside the root are refused with ``WORKSPACE_PATH_DENIED``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from tests.scenario import ended, permission_requested, prompt, session, state, tool, tool_results

pytestmark = pytest.mark.asyncio
OUT = "PATH_OUTSIDE_WORKSPACE"
DENIED = "WORKSPACE_PATH_DENIED"
TOKENS = ("OUTSIDE-TOKEN-7f3a", "SIBLING-TOKEN-91c2", "HOME-TOKEN-5d0e", "DOTENV-TOKEN-c44b", "RSA-TOKEN-e1a9")


@dataclass
class World:
    tmp: Path
    root: Path
    outside: Path
    sibling: Path
    home: Path

    def snapshot(self) -> dict[str, tuple[int, str]]:
        """Every file and directory of the tmp dir except the project (and pidesk's data dir)."""
        found: dict[str, tuple[int, str]] = {}
        for dirpath, dirnames, filenames in os.walk(self.tmp):
            here = Path(dirpath)
            if here == self.tmp:
                dirnames[:] = [d for d in dirnames if d not in ("project", "data")]
            if here == self.home:  # Chromium (BrowserPreview) writes $HOME/.cache/dconf and
                # $HOME/.config/chromium/Crash Reports whatever its --user-data-dir (host, not agent, bytes)
                dirnames[:] = [d for d in dirnames if d not in (".cache", ".config")]
            for name in dirnames + filenames:
                path = here / name
                rel = path.relative_to(self.tmp).as_posix()
                if path.is_symlink() or path.is_dir():
                    found[rel] = (0, os.readlink(path) if path.is_symlink() else "dir")
                else:
                    data = path.read_bytes()
                    found[rel] = (len(data), hashlib.sha256(data).hexdigest())
        return found


@pytest.fixture
def world(tmp_path: Path, project: Path, monkeypatch: pytest.MonkeyPatch) -> World:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text(f"{TOKENS[0]}\n")
    (outside / "shared.txt").write_text("shared outside content\n")
    sibling = tmp_path / "project2"  # shares the root's name as a prefix
    sibling.mkdir()
    (sibling / "file.txt").write_text(f"{TOKENS[1]}\n")
    home = tmp_path / "home"
    home.mkdir()
    (home / "secret.txt").write_text(f"{TOKENS[2]}\n")
    (home / ".bashrc").write_text(f"{TOKENS[2]}\n")
    monkeypatch.setenv("HOME", str(home))
    (project / ".env").write_text(f"API_KEY={TOKENS[3]}\n")
    (project / "config").mkdir()
    (project / "config" / ".env.local").write_text(f"{TOKENS[3]}\n")
    (project / "id_rsa").write_text(f"{TOKENS[4]}\n")
    (project / "keys").mkdir()
    (project / "keys" / "server.pem").write_text(f"{TOKENS[4]}\n")
    (project / "sub").mkdir()
    (project / "sub" / "inside.txt").write_text("inside\n")
    (project / ".git").mkdir()
    (project / ".git" / "config").write_text("[core]\n")
    (project / ".pi").mkdir()
    (project / ".pi" / "note.md").write_text("host note\n")
    os.symlink(outside / "secret.txt", project / "link_file")
    os.symlink(outside, project / "link_dir")
    os.symlink("../outside/secret.txt", project / "link_relative")
    os.symlink(outside / "later.txt", project / "dangling")
    os.symlink(project / ".env", project / "innocent.txt")  # a secret disguised by a symlink
    os.symlink(project / ".git" / "config", project / "gitconfig.txt")  # a host-owned file disguised
    return World(tmp_path, project, outside, sibling, home)


async def run(host: Any, provider: Any, root: Path, *calls: dict[str, Any], permission_mode: str = "auto"
              ) -> tuple[str, list[dict[str, Any]]]:
    """One Agent-mode turn making ``calls``; the session id and its messages."""
    s = await session(host, root, permissionMode=permission_mode)
    sub = host.subscribe()
    provider.enqueue(s["id"], *calls, {"text": "done"})
    await ended(sub, (await prompt(host, s["id"]))["turnId"], timeout=45)  # BrowserPreview starts Chromium twice
    return s["id"], (await state(host, s["id"]))["messages"]


def assert_no_leak(messages: list[dict[str, Any]]) -> None:
    text = json.dumps(messages)
    for token in TOKENS:
        assert token not in text, f"{token} leaked into the session's messages"


def results(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return tool_results(messages)


def code_of(result: dict[str, Any]) -> str | None:
    return result.get("errorCode")


# ---- one call, one verdict -----------------------------------------------------------------


def cases(w_root: str, w_tmp: str) -> list[tuple[str, str, dict[str, Any], str | None]]:
    """(id, tool, args, expected error code); None means "must not escape" judged by the world alone."""
    outside = f"{w_tmp}/outside"
    return [
        ("read-dotdot", "Read", {"path": "../outside/secret.txt"}, OUT),
        ("read-dotdot-deep", "Read", {"path": "src/../../outside/secret.txt"}, OUT),
        ("read-absolute", "Read", {"path": f"{outside}/secret.txt"}, OUT),
        ("read-etc-passwd", "Read", {"path": "/etc/passwd"}, OUT),
        ("read-sibling-prefix", "Read", {"path": f"{w_tmp}/project2/file.txt"}, OUT),
        ("read-sibling-prefix-rel", "Read", {"path": "../project2/file.txt"}, OUT),
        ("read-root-slash-dotdot", "Read", {"path": f"{w_root}/../project2/file.txt"}, OUT),
        ("read-link-file", "Read", {"path": "link_file"}, OUT),
        ("read-link-relative", "Read", {"path": "link_relative"}, OUT),
        ("read-link-dir", "Read", {"path": "link_dir/secret.txt"}, OUT),
        ("read-tilde", "Read", {"path": "~/secret.txt"}, None),
        ("read-tilde-user", "Read", {"path": "~root/.bashrc"}, None),
        ("write-dotdot", "Write", {"path": "../outside/new.txt", "content": "x"}, OUT),
        ("write-dotdot-overwrite", "Write", {"path": "../outside/shared.txt", "content": "x"}, OUT),
        ("write-absolute", "Write", {"path": f"{outside}/new.txt", "content": "x"}, OUT),
        ("write-sibling-prefix", "Write", {"path": f"{w_tmp}/project2/file.txt", "content": "x"}, OUT),
        ("write-sibling-prefix-new", "Write", {"path": f"{w_tmp}/project2/new.txt", "content": "x"}, OUT),
        ("write-link-file", "Write", {"path": "link_file", "content": "x"}, OUT),
        ("write-link-dir", "Write", {"path": "link_dir/new.txt", "content": "x"}, OUT),
        ("write-link-dir-nested", "Write", {"path": "link_dir/a/b/new.txt", "content": "x"}, OUT),
        ("write-dangling", "Write", {"path": "dangling", "content": "x"}, OUT),
        ("write-tilde", "Write", {"path": "~/new.txt", "content": "x"}, None),
        ("write-tilde-user", "Write", {"path": "~root/new.txt", "content": "x"}, None),
        ("edit-dotdot", "Edit", {"path": "../outside/shared.txt", "oldText": "shared", "newText": "x"}, OUT),
        ("edit-absolute", "Edit", {"path": f"{outside}/shared.txt", "oldText": "shared", "newText": "x"}, OUT),
        ("edit-link-file", "Edit", {"path": "link_file", "oldText": "TOKEN", "newText": "x"}, OUT),
        ("edit-sibling-prefix", "Edit", {"path": f"{w_tmp}/project2/file.txt", "oldText": "TOKEN",
                                         "newText": "x"}, OUT),
        ("glob-dotdot", "Glob", {"pattern": "*", "path": ".."}, OUT),
        ("glob-absolute", "Glob", {"pattern": "**", "path": outside}, OUT),
        ("glob-link-dir", "Glob", {"pattern": "*", "path": "link_dir"}, OUT),
        ("glob-sibling-prefix", "Glob", {"pattern": "*", "path": f"{w_tmp}/project2"}, OUT),
        ("grep-dotdot", "Grep", {"pattern": "TOKEN", "path": "../outside"}, OUT),
        ("grep-absolute-file", "Grep", {"pattern": "TOKEN", "path": f"{outside}/secret.txt"}, OUT),
        ("grep-link-dir", "Grep", {"pattern": "TOKEN", "path": "link_dir"}, OUT),
        ("grep-link-file", "Grep", {"pattern": "TOKEN", "path": "link_file"}, OUT),
        ("grep-sibling-prefix", "Grep", {"pattern": "TOKEN", "path": "../project2"}, OUT),
        ("grep-whole-root", "Grep", {"pattern": "TOKEN"}, None),  # walks the root: links out skipped
        ("glob-whole-root", "Glob", {"pattern": "**"}, None),
        ("preview-file-outside", "BrowserPreview", {"url": f"file://{outside}/secret.txt"}, OUT),
        ("preview-file-dotdot", "BrowserPreview", {"url": f"file://{w_root}/../outside/secret.txt"}, OUT),
        ("preview-file-encoded", "BrowserPreview",
         {"url": "file://" + quote(f"{w_root}/") + "%2e%2e/outside/secret.txt"}, OUT),
        ("preview-file-localhost", "BrowserPreview", {"url": f"file://localhost{outside}/secret.txt"}, OUT),
        ("preview-plain-path", "BrowserPreview", {"url": "../outside/secret.txt"}, OUT),
        ("preview-link", "BrowserPreview", {"url": f"file://{w_root}/link_file"}, OUT),
        ("preview-sibling-prefix", "BrowserPreview", {"url": f"file://{w_tmp}/project2/file.txt"}, OUT),
        # host-owned and secret paths inside the root
        ("read-dotenv", "Read", {"path": ".env"}, DENIED),
        ("read-dotenv-dotted", "Read", {"path": "./src/../.env"}, DENIED),
        ("read-dotenv-absolute", "Read", {"path": f"{w_root}/.env"}, DENIED),
        ("read-dotenv-nested", "Read", {"path": "config/.env.local"}, DENIED),
        ("read-id-rsa", "Read", {"path": "id_rsa"}, DENIED),
        ("read-pem", "Read", {"path": "keys/server.pem"}, DENIED),
        ("read-secret-via-symlink", "Read", {"path": "innocent.txt"}, DENIED),
        ("grep-dotenv", "Grep", {"pattern": "TOKEN", "path": ".env"}, DENIED),
        ("grep-secret-via-symlink", "Grep", {"pattern": "TOKEN", "path": "innocent.txt"}, DENIED),
        ("preview-dotenv", "BrowserPreview", {"url": f"file://{w_root}/.env"}, DENIED),
        ("write-dotenv", "Write", {"path": ".env", "content": "x"}, DENIED),
        ("write-new-dotenv", "Write", {"path": "sub/.env.production", "content": "x"}, DENIED),
        ("write-id-rsa", "Write", {"path": "id_rsa", "content": "x"}, DENIED),
        ("write-id-ed25519-pub", "Write", {"path": "id_ed25519.pub", "content": "x"}, DENIED),
        ("write-pem", "Write", {"path": "keys/server.pem", "content": "x"}, DENIED),
        ("write-key", "Write", {"path": "tls/a.key", "content": "x"}, DENIED),
        ("write-secret-via-symlink", "Write", {"path": "innocent.txt", "content": "x"}, DENIED),
        ("edit-dotenv", "Edit", {"path": ".env", "oldText": "API_KEY", "newText": "x"}, DENIED),
        ("write-pi", "Write", {"path": ".pi/plan/forged.md", "content": "x"}, DENIED),
        ("write-pi-absolute", "Write", {"path": f"{w_root}/.pi/note.md", "content": "x"}, DENIED),
        ("edit-pi", "Edit", {"path": ".pi/note.md", "oldText": "host", "newText": "x"}, DENIED),
        ("write-git", "Write", {"path": ".git/config", "content": "x"}, DENIED),
        ("write-git-hook", "Write", {"path": ".git/hooks/pre-commit", "content": "x"}, DENIED),
        ("write-nested-git", "Write", {"path": "vendor/lib/.git/config", "content": "x"}, DENIED),
        ("write-git-via-symlink", "Write", {"path": "gitconfig.txt", "content": "x"}, DENIED),
        ("edit-git", "Edit", {"path": ".git/config", "oldText": "core", "newText": "x"}, DENIED),
    ]


CASE_IDS = [c[0] for c in cases("/r", "/t")]


@pytest.mark.parametrize("case_id", CASE_IDS)
async def test_a_single_call_never_reaches_outside_the_root(make_host, provider, world, case_id):
    host = make_host()
    by_id = {c[0]: c for c in cases(str(world.root), str(world.tmp))}
    _, name, args, expected = by_id[case_id]
    inside_before = {p: p.read_bytes() for p in world.root.rglob("*") if p.is_file() and not p.is_symlink()}
    before = world.snapshot()
    _, messages = await run(host, provider, world.root, tool(name, **args))
    [result] = results(messages)
    assert world.snapshot() == before
    assert_no_leak(messages)
    if expected is not None:
        assert code_of(result) == expected, result
        for path, data in inside_before.items():  # a refused call changes nothing inside either
            assert path.read_bytes() == data
    if expected == OUT:
        audit = (await host.call("audit.list", {"limit": 1000}))["entries"]
        assert any(e["action"] == "tool.denied" and e["detail"]["code"] == OUT for e in audit) or \
            name == "BrowserPreview", "an outside path is decided by the gate, before the tool"


async def test_tilde_paths_are_literal_names_inside_the_root(make_host, provider, world):
    host = make_host()
    _, messages = await run(host, provider, world.root, tool("Write", path="~/new.txt", content="t\n"),
                            tool("Read", path="~/secret.txt"))
    write, read = results(messages)
    assert write["ok"] is True and (world.root / "~" / "new.txt").read_text() == "t\n"
    assert code_of(read) == "FILE_NOT_FOUND"
    assert not (world.home / "new.txt").exists()


async def test_a_dangling_symlink_stays_refused_after_its_target_appears(make_host, provider, world):
    host = make_host()
    sid, messages = await run(host, provider, world.root, tool("Write", path="dangling", content="x"))
    assert code_of(results(messages)[0]) == OUT and not (world.outside / "later.txt").exists()
    (world.outside / "later.txt").write_text(f"{TOKENS[0]}\n")
    before = world.snapshot()
    _, messages = await run(host, provider, world.root, tool("Read", path="dangling"),
                            tool("Edit", path="dangling", oldText="TOKEN", newText="x"),
                            tool("Write", path="dangling", content="x"), tool("Grep", pattern="TOKEN"))
    assert [code_of(r) for r in results(messages)[:3]] == [OUT, OUT, OUT]
    assert world.snapshot() == before
    assert_no_leak(messages)


async def test_symlinks_created_by_bash_mid_turn_do_not_lead_writes_out(make_host, provider, world):
    host = make_host()
    before = world.snapshot()
    _, messages = await run(
        host, provider, world.root,
        tool("Bash", command=f"ln -s {world.outside}/shared.txt mid_file && ln -s {world.outside} mid_dir "
                             f"&& ln -s {world.outside}/made-by-write.txt mid_dangling"),
        tool("Write", path="mid_file", content="x"),
        tool("Edit", path="mid_file", oldText="shared", newText="x"),
        tool("Write", path="mid_dir/new.txt", content="x"),
        tool("Write", path="mid_dangling", content="x"),
        tool("Read", path="mid_dir/secret.txt"),
        tool("Grep", pattern="TOKEN", path="mid_dir"),
    )
    bash, *rest = results(messages)
    assert bash["ok"] is True
    assert [code_of(r) for r in rest] == [OUT] * 6
    assert world.snapshot() == before
    assert_no_leak(messages)


async def test_a_directory_swapped_for_a_symlink_between_calls(make_host, provider, world):
    """First a real directory (writes land inside), then Bash swaps it for a link out, then more calls."""
    host = make_host()
    before = world.snapshot()
    _, messages = await run(
        host, provider, world.root,
        tool("Write", path="sub/a.txt", content="a\n"),
        tool("Bash", command=f"rm -rf sub && ln -s {world.outside} sub"),
        tool("Write", path="sub/b.txt", content="b\n"),
        tool("Edit", path="sub/shared.txt", oldText="shared", newText="x"),
        tool("Read", path="sub/secret.txt"),
        tool("Glob", pattern="*", path="sub"),
    )
    write_a, bash, *rest = results(messages)
    assert write_a["ok"] is True and bash["ok"] is True
    assert [code_of(r) for r in rest] == [OUT] * 4
    assert world.snapshot() == before
    assert_no_leak(messages)


async def test_a_directory_swapped_while_an_ask_is_pending_is_refused_by_the_tools_own_check(
        make_host, provider, world):
    """The gate checked the path before asking; the swap happens while the user decides; the tool re-checks."""
    host = make_host()
    s = await session(host, world.root)  # permission mode ask: Write asks
    sub = host.subscribe()
    provider.enqueue(s["id"], tool("Write", path="sub/new.txt", content="x"), {"text": "done"})
    before = world.snapshot()
    turn = await prompt(host, s["id"])
    request = (await permission_requested(sub)).request
    shutil.rmtree(world.root / "sub")
    os.symlink(world.outside, world.root / "sub")  # checked inside, now pointing out
    await host.call("permissions.resolve", {"requestId": request.id, "sessionId": s["id"], "turnId": turn["turnId"],
                                            "decision": "allow"})
    await ended(sub, turn["turnId"])
    [result] = tool_results((await state(host, s["id"]))["messages"])
    assert code_of(result) == OUT
    assert world.snapshot() == before


async def test_a_hardlink_inside_the_root_is_replaced_not_written_through(make_host, provider, world):
    """A hardlink is the same inode as the outside file, so Read shows its content (it is a file of the
    root by every path check; only its link count betrays it). Write and Edit replace the file
    atomically (temp file + rename), which breaks the link: the outside file keeps its bytes."""
    host = make_host()
    outside_file = world.outside / "shared.txt"
    os.link(outside_file, world.root / "hard.txt")
    os.link(outside_file, world.root / "hard2.txt")
    original = outside_file.read_bytes()
    _, messages = await run(host, provider, world.root,
                            tool("Read", path="hard.txt"),
                            tool("Write", path="hard.txt", content="written\n"),
                            tool("Edit", path="hard2.txt", oldText="shared", newText="edited"))
    read, write, edit = results(messages)
    assert "shared outside content" in json.dumps(read)  # documented: same inode, same bytes
    assert write["ok"] is True and edit["ok"] is True
    assert outside_file.read_bytes() == original
    assert (world.root / "hard.txt").read_text() == "written\n"
    assert (world.root / "hard2.txt").read_text() == "edited outside content\n"
    assert os.stat(outside_file).st_nlink == 1  # both links inside were replaced, not written through


async def test_read_of_host_owned_pi_is_allowed_and_walks_hide_secrets(make_host, provider, world):
    host = make_host()
    _, messages = await run(host, provider, world.root, tool("Read", path=".pi/note.md"),
                            tool("Grep", pattern="TOKEN|host note"), tool("Glob", pattern="**"))
    read, grep, glob = results(messages)
    assert read["ok"] is True and "host note" in json.dumps(read)
    assert_no_leak(messages)
    listed = json.dumps(glob)
    assert "link_dir/" not in listed and "secret.txt" not in listed  # the walk does not follow links out


async def test_browser_preview_of_a_workspace_page_does_not_load_files_from_outside(make_host, provider, world):
    if shutil.which("chromium") is None and shutil.which("chromium-browser") is None:
        pytest.skip("needs Chromium: without it BrowserPreview only reads the page's own text")
    (world.outside / "config.js").write_text(f'var LEAK = "{TOKENS[0]}";\n')
    (world.root / "page.html").write_text(
        f'<html><head><title>p</title><script src="file://{world.outside}/config.js"></script></head><body>'
        "<p>page</p><script>document.body.append('GOT:' + (typeof LEAK === 'undefined' ? 'none' : LEAK));"
        "</script></body></html>")
    before = world.snapshot()
    _, messages = await run(make_host(), provider, world.root, tool("BrowserPreview", url="page.html"))
    assert world.snapshot() == before
    [result] = results(messages)
    assert result["ok"] is True and "GOT:" in result["output"]
    assert_no_leak(messages)
