from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from pidesk.core.errors import Code
from pidesk.tools import (
    make_edit_tool,
    make_glob_tool,
    make_grep_tool,
    make_read_tool,
    make_write_tool,
    run_tool,
)
from pidesk.tools.search import compile_glob


def _lines(count: int) -> str:
    return "".join(f"line {n}\n" for n in range(1, count + 1))


# ---------------------------------------------------------------- Read


@pytest.mark.asyncio
async def test_read_numbers_lines(root: Path) -> None:
    (root / "a.txt").write_text("alpha\r\nbeta\n\ngamma")
    result = await run_tool(make_read_tool(root), {"path": "a.txt"})
    assert result.ok
    assert result.output == "     1\talpha\n     2\tbeta\n     3\t\n     4\tgamma"


@pytest.mark.asyncio
async def test_read_offset_and_limit_window(root: Path) -> None:
    (root / "a.txt").write_text(_lines(10))
    result = await run_tool(make_read_tool(root), {"path": "a.txt", "offset": 3, "limit": 2})
    assert result.ok
    assert result.output == "     3\tline 3\n     4\tline 4\n\n[lines 3-4 of 10 in a.txt; continue with offset=5]"
    tail = await run_tool(make_read_tool(root), {"path": "a.txt", "offset": 9})
    assert tail.output == "     9\tline 9\n    10\tline 10\n\n[lines 9-10 of 10 in a.txt]"


@pytest.mark.asyncio
async def test_read_default_limit_is_2000_lines(root: Path) -> None:
    (root / "big.txt").write_text(_lines(2500))
    result = await run_tool(make_read_tool(root), {"path": "big.txt"})
    shown = [line for line in result.output.splitlines() if "\tline " in line]
    assert len(shown) == 2000 and shown[-1].endswith("line 2000")
    assert result.output.endswith("[lines 1-2000 of 2500 in big.txt; continue with offset=2001]")


@pytest.mark.asyncio
async def test_read_offset_past_the_end_and_empty_file(root: Path) -> None:
    (root / "a.txt").write_text(_lines(3))
    (root / "empty.txt").write_text("")
    past = await run_tool(make_read_tool(root), {"path": "a.txt", "offset": 4})
    assert (past.ok, past.error_code) == (False, None)
    assert "3 lines" in past.output
    empty = await run_tool(make_read_tool(root), {"path": "empty.txt"})
    assert empty.ok and "empty" in empty.output


@pytest.mark.asyncio
async def test_read_clips_very_long_lines(root: Path) -> None:
    (root / "min.js").write_text("x" * 5000 + "\n")
    result = await run_tool(make_read_tool(root), {"path": "min.js"})
    assert result.ok and result.output.endswith("… [line truncated: 5000 bytes]")
    assert len(result.output) < 2100


@pytest.mark.asyncio
async def test_read_errors(root: Path) -> None:
    (root / "dir").mkdir()
    (root / "img.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
    (root / "late.bin").write_bytes(b"a\n" * 10_000 + b"\x00tail\n")
    os.mkfifo(root / "fifo")
    read = make_read_tool(root)
    missing = await run_tool(read, {"path": "nope.txt"})
    assert missing.error_code == Code.FILE_NOT_FOUND
    directory = await run_tool(read, {"path": "dir"})
    assert (directory.ok, directory.error_code) == (False, None)
    assert "directory" in directory.output
    assert (await run_tool(read, {"path": "img.png"})).error_code == Code.TOOL_BINARY_CONTENT
    assert (await run_tool(read, {"path": "late.bin", "offset": 10_000})).error_code == (
        Code.TOOL_BINARY_CONTENT
    )
    fifo = await run_tool(read, {"path": "fifo"})
    assert (fifo.ok, fifo.error_code) == (False, None)


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "args",
    [{}, {"path": 3}, {"path": "a.txt", "offset": 0}, {"path": "a.txt", "limit": True}, {"path": "a.txt", "offset": "2"}],
)
async def test_read_rejects_malformed_arguments(root: Path, args: dict[str, object]) -> None:
    (root / "a.txt").write_text("a\n")
    result = await run_tool(make_read_tool(root), dict(args))
    assert result.error_code == Code.INVALID_ARGUMENTS
    assert result.output.startswith("Read: `")


# ---------------------------------------------------------------- Glob


def _tree(root: Path, *files: str) -> None:
    for name in files:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{name}\n")


@pytest.mark.parametrize(
    ("pattern", "matching", "not_matching"),
    [
        ("*.py", ["a.py", ".hidden.py"], ["src/a.py", "a.pyc"]),
        ("**/*.py", ["a.py", "src/a.py", "src/x/y/b.py"], ["a.txt"]),
        ("src/**", ["src/a", "src/x/y"], ["srcx/a", "a"]),
        ("src/*/t?.{ts,tsx}", ["src/x/t1.ts", "src/y/t2.tsx"], ["src/t1.ts", "src/x/y/t1.ts"]),
        ("[!a]*.md", ["b.md"], ["a.md"]),
        ("a+b(1).txt", ["a+b(1).txt"], ["aab1.txt"]),
    ],
)
def test_glob_matcher(pattern: str, matching: list[str], not_matching: list[str]) -> None:
    matcher = compile_glob(pattern)
    assert [p for p in matching if matcher.match(p)] == matching
    assert [p for p in not_matching if matcher.match(p)] == []


@pytest.mark.asyncio
async def test_glob_lists_sorted_root_relative_files_and_skips_git(root: Path, outside: Path) -> None:
    _tree(root, "b.py", "a.py", "src/z.py", "src/deep/m.py", "notes.md", ".git/hooks/x.py", "sub/.git/y.py")
    (root / "linked").symlink_to(outside, target_is_directory=True)
    (root / "escape.py").symlink_to(outside / "secret.txt")
    glob = make_glob_tool(root)
    result = await run_tool(glob, {"pattern": "**/*.py"})
    assert result.ok
    assert result.output.splitlines() == ["a.py", "b.py", "src/deep/m.py", "src/z.py"]
    scoped = await run_tool(glob, {"pattern": "*.py", "path": "src"})
    assert scoped.output.splitlines() == ["src/z.py"]
    none = await run_tool(glob, {"pattern": "*.rs"})
    assert none.ok and none.output == "No files match *.rs"


@pytest.mark.asyncio
async def test_glob_caps_results_and_says_how_many_were_left_out(root: Path) -> None:
    _tree(root, *(f"f{n:02}.txt" for n in range(12)))
    result = await run_tool(make_glob_tool(root, max_results=5), {"pattern": "*.txt"})
    lines = result.output.splitlines()
    assert lines[:5] == [f"f{n:02}.txt" for n in range(5)]
    assert lines[5] == "[7 more of 12 matches not shown; narrow the pattern or path]"


@pytest.mark.asyncio
async def test_glob_errors(root: Path) -> None:
    _tree(root, "a.txt")
    glob = make_glob_tool(root)
    assert (await run_tool(glob, {"pattern": "*", "path": "nope"})).error_code == Code.FILE_NOT_FOUND
    assert (await run_tool(glob, {"pattern": "/etc/*"})).error_code == Code.INVALID_ARGUMENTS
    assert (await run_tool(glob, {"pattern": ""})).error_code == Code.INVALID_ARGUMENTS
    not_dir = await run_tool(glob, {"pattern": "*", "path": "a.txt"})
    assert (not_dir.ok, not_dir.error_code) == (False, None)


# ---------------------------------------------------------------- Grep


@pytest.mark.asyncio
async def test_grep_prints_path_line_text(root: Path) -> None:
    (root / "src").mkdir()
    (root / "src" / "a.py").write_text("import os\ndef main():\n    return os.getcwd()\n")
    (root / "b.txt").write_text("no match\nOS upper\n")
    grep = make_grep_tool(root)
    result = await run_tool(grep, {"pattern": r"\bos\b"})
    assert result.ok
    assert result.output.splitlines() == ["src/a.py:1:import os", "src/a.py:3:    return os.getcwd()"]
    folded = await run_tool(grep, {"pattern": r"\bos\b", "ignoreCase": True, "path": "b.txt"})
    assert folded.output == "b.txt:2:OS upper"
    none = await run_tool(grep, {"pattern": "zebra"})
    assert none.ok and none.output == "No matches for zebra"


@pytest.mark.asyncio
async def test_grep_glob_filters_by_name_or_path(root: Path) -> None:
    _tree(root, "a.ts", "web/b.tsx", "web/c.js", "lib/d.ts")
    grep = make_grep_tool(root)
    by_name = await run_tool(grep, {"pattern": ".", "glob": "*.{ts,tsx}"})
    assert [line.split(":")[0] for line in by_name.output.splitlines()] == ["a.ts", "lib/d.ts", "web/b.tsx"]
    by_path = await run_tool(grep, {"pattern": ".", "glob": "web/*"})
    assert [line.split(":")[0] for line in by_path.output.splitlines()] == ["web/b.tsx", "web/c.js"]


@pytest.mark.asyncio
async def test_grep_skips_binary_git_secrets_and_escaping_links(root: Path, outside: Path) -> None:
    (root / "text.txt").write_text("needle\n")
    (root / "blob.bin").write_bytes(b"needle\x00\x01")
    _tree(root, ".git/config", "pkg/.git/objects/needle")
    (root / ".git" / "config").write_text("needle\n")
    (root / "pkg" / ".git" / "objects" / "needle").write_text("needle\n")
    (root / ".env").write_text("needle=secret\n")
    (root / "alias.txt").symlink_to(root / ".env")
    (outside / "secret.txt").write_text("needle outside\n")
    (root / "out.txt").symlink_to(outside / "secret.txt")
    (root / "outdir").symlink_to(outside, target_is_directory=True)
    os.mkfifo(root / "fifo")
    result = await run_tool(make_grep_tool(root), {"pattern": "needle"})
    assert result.output == "text.txt:1:needle"


@pytest.mark.asyncio
async def test_grep_caps_matches(root: Path) -> None:
    (root / "a.txt").write_text("hit\n" * 30)
    result = await run_tool(make_grep_tool(root, max_matches=10), {"pattern": "hit"})
    lines = result.output.splitlines()
    assert lines[:10] == [f"a.txt:{n}:hit" for n in range(1, 11)]
    assert lines[10] == "[20 more of 30 matching lines not shown; narrow the pattern, path or glob]"
    assert len(lines) == 11


@pytest.mark.asyncio
async def test_grep_errors(root: Path) -> None:
    grep = make_grep_tool(root)
    bad = await run_tool(grep, {"pattern": "(unclosed"})
    assert bad.error_code == Code.INVALID_ARGUMENTS and "regular expression" in bad.output
    assert (await run_tool(grep, {"pattern": "x", "path": "nope"})).error_code == Code.FILE_NOT_FOUND
    assert (await run_tool(grep, {"pattern": "x", "ignoreCase": "yes"})).error_code == Code.INVALID_ARGUMENTS


# ---------------------------------------------------------------- Write


@pytest.mark.asyncio
async def test_write_creates_parents_and_reports_bytes(root: Path) -> None:
    result = await run_tool(make_write_tool(root), {"path": "a/b/c.txt", "content": "héllo\n"})
    assert result.ok
    assert result.output == "Wrote 7 bytes to a/b/c.txt"
    assert (root / "a" / "b" / "c.txt").read_text() == "héllo\n"


@pytest.mark.asyncio
async def test_write_replaces_atomically(root: Path) -> None:
    target = root / "run.sh"
    target.write_text("old\n")
    target.chmod(0o755)
    before = target.stat().st_ino
    with target.open() as reader:
        result = await run_tool(make_write_tool(root), {"path": "run.sh", "content": "new\n"})
        assert reader.read() == "old\n"
    assert result.ok
    assert target.read_text() == "new\n"
    assert target.stat().st_ino != before
    assert stat.S_IMODE(target.stat().st_mode) == 0o755
    assert sorted(p.name for p in root.iterdir()) == ["run.sh"]


@pytest.mark.asyncio
async def test_write_new_file_gets_default_permissions(root: Path) -> None:
    await run_tool(make_write_tool(root), {"path": "new.txt", "content": ""})
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE((root / "new.txt").stat().st_mode) == 0o666 & ~umask
    assert (root / "new.txt").read_text() == ""


@pytest.mark.asyncio
async def test_write_errors(root: Path) -> None:
    (root / "dir").mkdir()
    (root / "file").write_text("x")
    write = make_write_tool(root)
    directory = await run_tool(write, {"path": "dir", "content": "x"})
    assert (directory.ok, directory.error_code) == (False, None)
    under_file = await run_tool(write, {"path": "file/child.txt", "content": "x"})
    assert (under_file.ok, under_file.error_code) == (False, None)
    assert (await run_tool(write, {"path": "a.txt"})).error_code == Code.INVALID_ARGUMENTS
    assert (await run_tool(write, {"path": "a.txt", "content": 5})).error_code == Code.INVALID_ARGUMENTS


# ---------------------------------------------------------------- Edit


@pytest.mark.asyncio
async def test_edit_replaces_a_unique_occurrence(root: Path) -> None:
    target = root / "a.py"
    target.write_text("x = 1\ny = 2\n")
    target.chmod(0o750)
    result = await run_tool(make_edit_tool(root), {"path": "a.py", "oldText": "y = 2", "newText": "y = 3"})
    assert result.ok and result.output == "Replaced 1 occurrence in a.py"
    assert target.read_text() == "x = 1\ny = 3\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o750
    assert sorted(p.name for p in root.iterdir()) == ["a.py"]


@pytest.mark.asyncio
async def test_edit_requires_presence_and_uniqueness(root: Path) -> None:
    target = root / "a.txt"
    target.write_text("foo bar foo\n")
    edit = make_edit_tool(root)
    missing = await run_tool(edit, {"path": "a.txt", "oldText": "baz", "newText": "x"})
    assert (missing.ok, missing.error_code) == (False, None) and "not found" in missing.output
    twice = await run_tool(edit, {"path": "a.txt", "oldText": "foo", "newText": "x"})
    assert (twice.ok, twice.error_code) == (False, None) and "2 times" in twice.output
    assert target.read_text() == "foo bar foo\n"
    every = await run_tool(edit, {"path": "a.txt", "oldText": "foo", "newText": "x", "replaceAll": True})
    assert every.ok and every.output == "Replaced 2 occurrences in a.txt"
    assert target.read_text() == "x bar x\n"
    same = await run_tool(edit, {"path": "a.txt", "oldText": "bar", "newText": "bar"})
    assert (same.ok, same.error_code) == (False, None)


@pytest.mark.asyncio
async def test_edit_matches_lf_text_in_a_crlf_file(root: Path) -> None:
    target = root / "win.txt"
    target.write_bytes(b"one\r\ntwo\r\nthree\r\n")
    result = await run_tool(make_edit_tool(root), {"path": "win.txt", "oldText": "one\ntwo", "newText": "1\n2"})
    assert result.ok
    assert target.read_bytes() == b"1\r\n2\r\nthree\r\n"


@pytest.mark.asyncio
async def test_edit_errors(root: Path) -> None:
    (root / "blob.bin").write_bytes(b"abc\x00def")
    (root / "latin1.txt").write_bytes(b"caf\xe9\n")
    (root / "a.txt").write_text("abc\n")
    edit = make_edit_tool(root)
    assert (await run_tool(edit, {"path": "nope", "oldText": "a", "newText": "b"})).error_code == Code.FILE_NOT_FOUND
    for binary in ("blob.bin", "latin1.txt"):
        result = await run_tool(edit, {"path": binary, "oldText": "a", "newText": "b"})
        assert result.error_code == Code.TOOL_BINARY_CONTENT
    for args in ({"path": "a.txt", "oldText": "", "newText": "x"}, {"path": "a.txt", "oldText": "a"}):
        assert (await run_tool(edit, args)).error_code == Code.INVALID_ARGUMENTS
    assert (root / "blob.bin").read_bytes() == b"abc\x00def"
