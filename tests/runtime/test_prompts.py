"""The system prompt's composed text, pinned for a fixture project; the skill front matter parser.

The golden file is the whole prompt for a nested project with a global file,
three instruction files, two skills, a bad skill and a git repository. Should
the prompt change on purpose, regenerate it with ``PIDESK_REGOLD=1`` and read
the diff: every line of it is a line every request of every session carries.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pidesk.core.modes import Mode
from pidesk.host.instructions import FrontMatterError, Instructions, parse_front_matter, parse_status
from pidesk.runtime.prompts import Environment, system_prompt

GOLDEN = Path(__file__).parent / "golden" / "system_prompt.txt"


def _fixture(tmp_path: Path) -> tuple[Path, Path]:
    repo = tmp_path / "repo"
    root = repo / "services" / "api"
    (repo / ".git").mkdir(parents=True)
    root.mkdir(parents=True)
    (repo / "AGENTS.md").write_text("# Conventions\n\n- Run `make check` before you finish.\n- Python 3.11.\n")
    (repo / "services" / "CLAUDE.md").write_text("Services never import each other.\n")
    (root / "AGENTS.md").write_text("The API's tests: `pytest tests/api -q`.\n")
    for name, front in (("migrate", "name: migrate\ndescription: Write a database migration."),
                        ("bad", "name: Bad Name\ndescription: refused")):
        (root / ".pi" / "skills" / name).mkdir(parents=True)
        (root / ".pi" / "skills" / name / "SKILL.md").write_text(f"---\n{front}\n---\nSteps.\n")
    config = tmp_path / "config"
    (config / "skills" / "changelog").mkdir(parents=True)
    (config / "AGENTS.md").write_text("Answer briefly.\n")
    (config / "skills" / "changelog" / "SKILL.md").write_text(
        '---\nname: changelog\ndescription: "Update CHANGELOG.md for a user-visible change."\n---\n')
    return root, config


def test_the_composed_prompt_for_a_fixture_project_is_pinned(tmp_path):
    """Issue 16 §1: one module owns the prompt and a golden test pins its composed text."""
    root, config = _fixture(tmp_path)
    context = Instructions(config).gather_now(root, temporary=False)
    environment = Environment(date="2025-03-14", platform="Linux", shell="bash", root=str(root),
                              git_branch="main", git_changed=3)
    text = system_prompt(Mode.AGENT, str(root), context, environment).replace(str(tmp_path), "<tmp>")
    if os.environ.get("PIDESK_REGOLD"):
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text()
    assert [w.replace(str(tmp_path), "<tmp>") for w in context.warnings] == [
        "skill .pi/skills/bad/SKILL.md skipped: name 'Bad Name' must be lowercase letters, digits and single "
        "hyphens (at most 64 characters)"]


def test_each_mode_keeps_its_text_and_an_empty_project_adds_no_headings(tmp_path):
    """Issue 16 §1: the mode text that exists today stays; a project without files or skills gets
    no empty sections."""
    for mode, phrase in ((Mode.AGENT, "Agent mode"), (Mode.PLAN, "call SubmitPlan once"),
                         (Mode.GOAL, "call SubmitGoal once")):
        text = system_prompt(mode, "/p", Instructions(None).gather_now(tmp_path, temporary=False))
        assert phrase in text
        assert "# Project instructions" not in text and "# Skills" not in text


@pytest.mark.parametrize(("text", "expected"), [
    ("---\nname: a\ndescription: plain text # a comment\n---\n", {"name": "a", "description": "plain text"}),
    ('---\nname: "a"\ndescription: "tab\\tand \\"quotes\\""\n---', {"name": "a", "description": 'tab\tand "quotes"'}),
    ("---\nname: a\ndescription: 'it''s'\n---", {"name": "a", "description": "it's"}),
    ("---\n# comment\n\nname: a\nmetadata:\n  owner: x\n  tags:\n    - y\nallowed-tools: Read Grep\n"
     "description: d\n---", {"name": "a", "metadata": "", "allowed-tools": "Read Grep", "description": "d"}),
])
def test_the_front_matter_parser_accepts_key_value_lines(text, expected):
    assert parse_front_matter(text) == expected


@pytest.mark.parametrize(("text", "why"), [
    ("name: a\n", "must start with a '---' line"),
    ("---\nname: a\n", "no closing '---'"),
    ("---\nname: a\nname: b\n---", "appears twice"),
    ("---\nname: a\n  indented: x\n---", "an indented line must follow"),
    ("---\ndescription: >\n  folded\n---", "block values"),
    ('---\ndescription: "open\n---', "must close on its line"),
    ("---\ndescription: 'open\n---", "must close on its line"),
    ("---\ndescription: a: b\n---", "quote this value"),
    ("---\njust words\n---", "expected 'key: value'"),
])
def test_the_front_matter_parser_refuses_what_it_does_not_understand(text, why):
    with pytest.raises(FrontMatterError, match=why):
        parse_front_matter(text)


def test_git_status_parsing_counts_renames_once():
    out = "\0".join(["# branch.oid abc", "# branch.head feature/x", "1 .M N... 100644 100644 100644 a b f.py",
                     "2 R. N... 100644 100644 100644 a b R100 new.py", "old.py", "? notes.txt", ""])
    assert parse_status(out) == ("feature/x", 3)
    assert parse_status("# branch.head (detached)\0") == ("(detached HEAD)", 0)
