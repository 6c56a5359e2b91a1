"""Workspace path rules, from PROTOCOL.md's "Paths" bullet.

    Read/Write/Edit of secrets (`.env` and `.env.*` at any depth, `*.pem`, `*.key`,
    `id_rsa*`, `id_ed25519*`) and Write/Edit under `.pi/` or any `.git/` are
    WORKSPACE_PATH_DENIED, decided before any Ask. Read of `.pi/` is allowed.

Inputs are root-relative POSIX paths, as the tools hand them over after resolving.
Note the wording: `.pi/` (the root's) but *any* `.git/` (submodules, nested repos).
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pidesk.core.paths import is_host_owned, is_secret, read_denied, write_denied

SECRETS = [
    ".env",
    ".env.local",
    ".env.production",
    ".env.example",  # `.env.*` says so, template or not
    "a/b/.env",
    "services/api/.env.local",
    "cert.pem",
    "deploy/tls/cert.pem",
    "server.key",
    "a/server.key",
    "id_rsa",
    "id_rsa.pub",
    "home/.ssh/id_rsa",
    "id_ed25519",
    "id_ed25519.pub",
    "keys/id_ed25519_work",
    # issue 29: names without case, as a case-insensitive file system reads them
    ".Env",
    ".ENV.local",
    "Cert.PEM",
    "ID_RSA",
]

HOST_OWNED = [
    ".pi/plan/x.md",
    ".pi/goal/20250101T000000Z-fix-abc.md",
    ".pi/settings.json",
    ".git/config",
    ".git/hooks/pre-commit",
    "sub/.git/HEAD",
    "vendor/lib/.git/refs/heads/main",
    ".git",  # a worktree's .git file
    "sub/.git",
    # issue 29: names without case
    ".GIT/config",
    ".Git/hooks/pre-commit",
    ".PI/plan/x.md",
    "sub/.GiT/HEAD",
]

# Must stay allowed for Read *and* Write/Edit.
ORDINARY = [
    ".envrc",
    "env.txt",
    "my.env",
    "config/env.py",
    ".environment",
    "src/pi/x",
    "pi/plan/x.md",
    ".pillow",
    ".pirate/x",
    "gitignore",
    ".gitignore",
    ".gitattributes",
    ".gitmodules",
    ".github/workflows/x.yml",
    "repo.git/HEAD",
    "pem.txt",
    "keys.txt",
    "src/key.py",
    "id_rs",
    "docs/rsa_howto.md",
    "README.md",
    "src/app/main.py",
]


@pytest.mark.parametrize("path", SECRETS)
def test_secrets_at_any_depth_are_denied_to_read_and_write(path: str) -> None:
    assert is_secret(path)
    assert read_denied(path)
    assert write_denied(path)


@pytest.mark.parametrize("path", HOST_OWNED)
def test_host_owned_paths_are_denied_to_write_but_readable(path: str) -> None:
    assert is_host_owned(path)
    assert write_denied(path)
    assert not read_denied(path)  # "Read of .pi/ is allowed"; .git/ is not a secret either


@pytest.mark.parametrize("path", ORDINARY)
def test_ordinary_paths_stay_allowed(path: str) -> None:
    assert not is_secret(path)
    assert not is_host_owned(path)
    assert not read_denied(path)
    assert not write_denied(path)


def test_pi_is_host_owned_only_at_the_root() -> None:
    # `.pi/` is the project's artifact tree; a nested directory that happens to be
    # called .pi is ordinary (contrast: "any .git/").
    assert not write_denied("sub/.pi/plan/x.md")
    assert write_denied(".pi/plan/x.md")


def test_secret_inside_host_owned_tree_is_denied_to_read() -> None:
    assert read_denied(".pi/.env")
    assert read_denied(".git/id_rsa")


_segment = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_-", min_size=1, max_size=8)
_dirs = st.lists(_segment, max_size=4)
_secret_names = st.one_of(
    st.just(".env"),
    _segment.map(lambda s: f".env.{s}"),
    _segment.map(lambda s: f"{s}.pem"),
    _segment.map(lambda s: f"{s}.key"),
    st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_.-", max_size=8).map(lambda s: f"id_rsa{s}"),
    st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_.-", max_size=8).map(lambda s: f"id_ed25519{s}"),
)


@given(dirs=_dirs, name=_secret_names)
def test_property_secret_names_are_denied_at_any_depth(dirs: list[str], name: str) -> None:
    path = "/".join([*dirs, name])
    assert read_denied(path)
    assert write_denied(path)


@given(before=_dirs, after=st.lists(_segment, min_size=1, max_size=4))
def test_property_anything_under_any_git_dir_is_write_denied(before: list[str], after: list[str]) -> None:
    assert write_denied("/".join([*before, ".git", *after]))


@given(after=st.lists(_segment, min_size=1, max_size=4))
def test_property_anything_under_root_pi_is_write_denied_and_readable(after: list[str]) -> None:
    path = "/".join([".pi", *after])
    assert write_denied(path)
    assert not read_denied(path)


_plain_names = _segment.filter(lambda s: not s.startswith(("id_rsa", "id_ed25519"))).map(lambda s: f"{s}.py")


@given(dirs=_dirs, name=_plain_names)
def test_property_plain_source_files_are_allowed(dirs: list[str], name: str) -> None:
    path = "/".join([*dirs, name])
    assert not read_denied(path)
    assert not write_denied(path)
