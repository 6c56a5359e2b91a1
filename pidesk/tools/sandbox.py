"""The kernel sandbox Bash commands run in: bubblewrap, built from one policy value.

The host decides a ``SandboxPolicy`` for each kind of shell (``pidesk.host.tooling``); this
module turns it into a ``bwrap`` command line (``bwrap_argv``: a pure function of the
policy and of what the root holds now), which ``Bubblewrap`` computes afresh when asked.
Nothing here decides what a command may do: whether it runs sandboxed at all is the
host's call (an escalation the person allowed runs without one).

The sandbox, as ``bwrap_argv`` builds it:

- Every namespace bwrap can unshare (user, pid, ipc, uts, cgroup, and the network unless
  the policy allows it), no further user namespaces inside, no capabilities. A host
  running as root confines its commands too: a root bwrap otherwise keeps
  ``CAP_SYS_ADMIN``, and a command could simply remount ``/`` read-write.
- ``/`` read-only; a fresh ``/dev`` and ``/proc`` (the pid namespace shows only the
  sandbox's own processes, so no other process's environment or command line — the
  host's token among them); a private ``/tmp`` (and ``TMPDIR=/tmp``).
- Writable: the root and the policy's other writable paths, bound again on top.
- Read-only inside the root (``protected_paths``), so that a command cannot plant what
  later runs outside any sandbox: ``.pi/`` (the contracts), ``.git/hooks``,
  ``.git/config`` (and those of ``.git/modules/*``), and ``.git`` itself when it is a
  file (it names the repository git then uses). A ``.pi/`` or ``.git/hooks`` that does
  not exist yet is made, empty, before the sandbox starts: it cannot be created inside.
- Hidden: the host's data directory (an empty read-only directory in its place), the
  config file (empty), and ``/run``, wherever they are: the sockets there (a database's,
  D-Bus, Docker's) need no network to be reached. A writable path inside a hidden directory
  (a temporary session's scratch root) is bound again inside it, and so are the policy's
  ``shown`` paths, read-only (the resolver's configuration when the network is on).
- ``--die-with-parent``: it dies with the process that started it (the host). A Bash tool
  runs one sandbox for its turn and starts each shell inside it (``tools/sandbox_server.py``,
  ``tools/sandboxd.py``), as the leader of a process group the host kills when the call ends
  (``tools/bash.py``) and its watchdog kills if the host dies; what a command detached dies with
  the sandbox, at the end of the turn.

Symlinks give no way out: a link inside the root leads, wherever it points outside,
to a read-only or hidden mount.

Fails closed: no ``bwrap`` on the command's PATH, or one that cannot make its
namespaces (user namespaces disabled), refuses the call with ``SANDBOX_UNAVAILABLE``,
saying how to install it or turn the sandbox off; the command never runs unconfined.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from pidesk.core.errors import Code
from pidesk.tools.base import ToolFailure

HOW_TO_FIX: Final = (
    "install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap; Fedora: dnf install bubblewrap), "
    'or turn the sandbox off (sandbox = "off" in the config file, PIDESK_SANDBOX=off, or --no-sandbox), '
    "which lets every command read the host's token and reach the network"
)
MAX_MODULES: Final = 64  # .git/modules/* repositories whose config and hooks are kept read-only
PROBE_TIMEOUT_S: Final = 10.0
TMP: Final = Path("/tmp")  # replaced by a private one in every sandbox


@dataclass(frozen=True, slots=True)
class SandboxPolicy:
    """What one command may touch. ``root`` is its working directory and writable (unless
    ``read_only_root``: strict planning); ``writable`` more paths it may write; ``hidden`` paths it may
    not even see; ``network`` whether it reaches any network (the host's own port included)."""

    root: Path
    writable: tuple[Path, ...] = ()
    hidden: tuple[Path, ...] = ()
    shown: tuple[Path, ...] = ()  # inside hidden directories, bound again read-only where they exist
    network: bool = False
    read_only_root: bool = False


def bwrap_argv(bwrap: str, policy: SandboxPolicy, *, protected: Sequence[Path] = (),
               hidden_dirs: Sequence[Path] = (), hidden_files: Sequence[Path] = (),
               under_tmp: Sequence[Path] = (), disable_userns: bool = True) -> list[str]:
    """The bwrap command line (up to and including ``--``) that confines a command to ``policy``.

    ``protected`` are the read-only paths inside the root, ``hidden_dirs`` and ``hidden_files`` the
    policy's hidden paths by kind, ``under_tmp`` read-only paths the private /tmp would otherwise hide
    (the repository a root under /tmp lies in, the interpreter ``sandboxd`` runs on), as they exist now
    (``Bubblewrap`` looks). Later mounts win, so the order is the design: read-only everything, a
    private /tmp, what of the real /tmp stays visible, the writable paths, the hidden ones over them,
    the writable and the shown paths inside those again, then the read-only carve-outs."""
    argv = [bwrap, "--unshare-all", "--unshare-user", *(["--disable-userns"] if disable_userns else []),
            "--cap-drop", "ALL", "--die-with-parent"]
    if policy.network:
        argv.append("--share-net")
    argv += ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", str(TMP)]
    for path in under_tmp:
        argv += ["--ro-bind", str(path), str(path)]
    root_flag = "--ro-bind" if policy.read_only_root else "--bind"
    mounts = [(root_flag, policy.root), *(("--bind-try", path) for path in policy.writable)]
    for flag, path in mounts:  # (the root again even when read-only: it may lie under /tmp)
        argv += [flag, str(path), str(path)]
    for path in hidden_dirs:
        argv += ["--tmpfs", str(path)]
    for path in hidden_files:
        argv += ["--ro-bind", "/dev/null", str(path)]
    for flag, path in mounts:
        if any(path != hidden and path.is_relative_to(hidden) for hidden in hidden_dirs):
            argv += [flag, str(path), str(path)]
    for path in policy.shown:
        argv += ["--ro-bind-try", str(path), str(path)]
    for path in hidden_dirs:
        argv += ["--remount-ro", str(path)]
    for path in protected:
        argv += ["--ro-bind-try", str(path), str(path)]
    return [*argv, "--chdir", str(policy.root), "--setenv", "TMPDIR", "/tmp", "--"]


def protected_paths(root: Path) -> list[Path]:
    """What stays read-only inside ``root`` as it is now: ``.pi/``, and of the repository's ``.git``
    its ``hooks`` and ``config`` (those of ``.git/modules/*`` too), or ``.git`` itself when it is a file
    or a link. A missing ``.pi/`` or ``.git/hooks`` is made first (empty): it could be created inside."""
    found = [_made(root / ".pi")]
    git = root / ".git"
    if git.is_symlink() or git.is_file():
        found.append(git)
    elif git.is_dir():
        found += [_made(git / "hooks"), git / "config"]
        for module in _modules(git / "modules"):
            found += [module / "hooks", module / "config"]
    return found


def _interpreter_under_tmp() -> list[Path]:
    """What ``sandboxd`` runs on (this Python, its standard library, pidesk's tools) where the private
    /tmp would hide it: a checkout or a virtual environment under /tmp."""
    needed = {Path(os.path.realpath(sys.executable)).parent, Path(sys.base_prefix), Path(__file__).parent}
    return sorted(path for path in needed if path.is_relative_to(TMP))


def repository_under_tmp(root: Path) -> Path | None:
    """The git repository a root under /tmp lies in (the root a subdirectory of it), if any: the private
    /tmp would hide it, and a command's git must find it (read-only). Elsewhere it is visible anyway."""
    if not root.is_relative_to(TMP):
        return None
    for parent in root.parents:
        if parent == TMP:
            return None
        if (parent / ".git").exists():
            return parent
    return None


def _made(directory: Path) -> Path:
    if not directory.is_symlink():
        try:
            directory.mkdir(exist_ok=True)
        except OSError:  # (a file of that name, a read-only root): bound read-only as it is
            pass
    return directory


def _modules(top: Path) -> Iterator[Path]:
    """The submodule repositories under ``.git/modules`` (nested ones included), at most MAX_MODULES."""
    pending, seen = [top], 0
    while pending and seen < MAX_MODULES:
        try:
            entries = list(os.scandir(pending.pop()))
        except OSError:
            continue
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                path = Path(entry.path)
                if (path / "config").is_file():
                    seen += 1
                    yield path
                pending.append(path / "modules" if (path / "config").is_file() else path)


class Bubblewrap:
    """The sandbox of one kind of shell: ``prefix()`` is the bwrap argv to start it with, as the policy
    asks now: a ``.git`` a command made is protected from the next sandbox on (``tools/sandbox_server.py``
    starts a new one when the argv changes). ``search_path`` is the PATH bwrap is looked for on (the
    commands' own; None: the host's); once found, it is kept."""

    def __init__(self, policy: SandboxPolicy, search_path: str | None = None) -> None:
        self.policy = policy
        self.search_path = search_path
        self._bwrap: str | None = None

    def prefix(self) -> list[str]:
        bwrap = self._bwrap = self._bwrap or find_bwrap(self.search_path)
        if bwrap is None:
            raise ToolFailure(Code.SANDBOX_UNAVAILABLE,
                              f"Bash runs in a sandbox, and bubblewrap (bwrap) is not installed: {HOW_TO_FIX}")
        hidden = [path for path in self.policy.hidden if path.exists()]
        repository = repository_under_tmp(self.policy.root)
        return bwrap_argv(
            bwrap, self.policy,
            protected=() if self.policy.read_only_root else protected_paths(self.policy.root),
            hidden_dirs=[path for path in hidden if path.is_dir()],
            hidden_files=[path for path in hidden if not path.is_dir()],
            under_tmp=[*([repository] if repository is not None else []), *INTERPRETER_UNDER_TMP],
            disable_userns=_has_disable_userns(bwrap),
        )


INTERPRETER_UNDER_TMP: Final = _interpreter_under_tmp()


def find_bwrap(search_path: str | None = None) -> str | None:
    return shutil.which("bwrap", path=search_path)


_USERNS_OPTION: dict[str, bool] = {}


def _has_disable_userns(bwrap: str) -> bool:
    """Whether this bwrap takes ``--disable-userns`` (0.8 and later): asked once per binary."""
    known = _USERNS_OPTION.get(bwrap)
    if known is None:
        try:
            shown = subprocess.run([bwrap, "--help"], capture_output=True, timeout=PROBE_TIMEOUT_S).stdout
        except (OSError, subprocess.TimeoutExpired):
            return True  # (the call itself will fail and say why)
        known = _USERNS_OPTION[bwrap] = b"--disable-userns" in shown
    return known


@dataclass(frozen=True, slots=True)
class SandboxStatus:
    """Which sandbox is in force, for ``host.doctor``, ``pidesk status``, the web UI and chat."""

    enabled: bool
    available: bool
    detail: str
    network: bool = False

    def to_wire(self) -> dict[str, object]:
        return {"mode": "bwrap" if self.enabled else "off", "available": self.available,
                "network": self.network, "detail": self.detail}


def probe(enabled: bool, network: bool, search_path: str | None = None) -> SandboxStatus:
    """Start one real, empty sandbox (blocking, ~10 ms): whether commands can run in it, and if not why."""
    if not enabled:
        return SandboxStatus(False, False, "turned off in the configuration", network)
    bwrap = find_bwrap(search_path)
    if bwrap is None:
        return SandboxStatus(True, False, f"bubblewrap (bwrap) is not installed: {HOW_TO_FIX}", network)
    argv = bwrap_argv(bwrap, SandboxPolicy(Path("/"), read_only_root=True), disable_userns=_has_disable_userns(bwrap))
    try:
        done = subprocess.run([*argv, "true"], capture_output=True, timeout=PROBE_TIMEOUT_S,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return SandboxStatus(True, False, f"{bwrap} could not start: {exc}; {HOW_TO_FIX}", network)
    if done.returncode != 0:
        reason = done.stderr.decode(errors="replace").strip() or f"exit code {done.returncode}"
        return SandboxStatus(True, False, f"{bwrap} could not make its sandbox ({reason}); {HOW_TO_FIX}", network)
    return SandboxStatus(True, True, bwrap, network)
