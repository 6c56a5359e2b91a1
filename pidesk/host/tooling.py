"""The built-in tools of one turn (or delegate), and the sandbox each Bash command runs in.

The host decides the sandbox, never the tool and never the model: ``sandbox_policy``
turns the configuration and the session into a ``tools.sandbox.SandboxPolicy`` —
writable: the session's root and ``sandbox.writable``; hidden: the host's data
directory, the config file and ``/run``; the network only if ``sandbox.network``. Bash comes
in three kinds, picked per call in ``TurnTools.tool``:

- sandboxed: every command, by default, in every mode, for delegates and unattended
  runs alike;
- read-only: in Plan and Goal under strict planning, even the root cannot be written
  (a sandbox even when the configuration turned it off: strict planning needs one);
- unconfined: a command whose escalation the person allowed (``core.policy``: it always
  asks, never in Plan or Goal). Its environment is the same allowlist.

Each kind is made on first use and kept for the turn, so each keeps its spare shell.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from pidesk.config import HostConfig
from pidesk.core import policy
from pidesk.core.modes import Mode
from pidesk.host.parts import Parts
from pidesk.tools import TOOL_SPECS, Bash, Tool, close_tools, make_bash_tool
from pidesk.tools.sandbox import Bubblewrap, SandboxPolicy, SandboxStatus, probe
from pidesk.tools.sandbox_server import Sandbox
from pidesk.tools.specs import bash_spec

RUN: Final = Path("/run")  # sockets a command could reach without any network: a database's, D-Bus, Docker's
RESOLVER: Final = Path("/run/systemd/resolve")  # where /etc/resolv.conf leads under systemd-resolved


def sandbox_policy(config: HostConfig, root: Path, data_dir: Path, *, read_only_root: bool = False) -> SandboxPolicy:
    hidden = (data_dir, RUN) if config.config_file is None else (data_dir, config.config_file, RUN)
    return SandboxPolicy(root=root.resolve(), writable=config.sandbox.writable, hidden=hidden,
                         shown=(RESOLVER,) if config.sandbox.network else (), network=config.sandbox.network,
                         read_only_root=read_only_root)


def tool_specs(config: HostConfig, names: list[str], mode: Mode) -> list[dict[str, Any]]:
    """The specs of the built-in tools ``names``, Bash's saying the sandbox it runs in."""
    return [bash_spec(sandboxed=config.sandbox.enabled or (mode.is_contract and config.strict_planning),
                      network=config.sandbox.network, read_only=mode.is_contract and config.strict_planning,
                      may_escalate=config.sandbox.enabled and not mode.is_contract)
            if name == "Bash" else TOOL_SPECS[name] for name in names]


def sandbox_status(config: HostConfig) -> SandboxStatus:
    """Which sandbox is in force, found by starting one (blocking, ~10 ms: call it off the loop)."""
    return probe(config.sandbox.enabled, config.sandbox.network, _search_path(config))


def sandbox_for(parts: Parts, root: Path, *, read_only_root: bool = False) -> Bubblewrap:
    config = parts.config
    return Bubblewrap(sandbox_policy(config, root, parts.store.data_dir, read_only_root=read_only_root),
                      _search_path(config))


def git_sandbox(parts: Parts) -> Callable[[Path], list[str]] | None:
    """What confines the host's own ``git status`` of a root (pidesk.host.instructions): the sandbox, the
    root read-only. The repository may be one a command made, whose config names filters git would run."""
    if not parts.config.sandbox.enabled:
        return None
    return lambda root: sandbox_for(parts, root, read_only_root=True).prefix()


def _search_path(config: HostConfig) -> str | None:
    """bwrap is looked for where the commands look for theirs: on their PATH (None: the host's)."""
    return None if config.tool_env is None else config.tool_env.get("PATH", "")


class TurnTools:
    """The built-in tools over one root, made on first use; ``aclose()`` when the turn is over."""

    def __init__(self, parts: Parts, root: Path) -> None:
        self.p = parts
        self.root = root
        self._tools: dict[str, Tool] | None = None
        self._shells: dict[str, Bash] = {}

    def tool(self, name: str, args: Any, mode: Mode) -> Tool | None:
        """The tool that runs this call. For Bash, the kind the host chose (the call was authorized
        before, from the same arguments: an escalation only runs unconfined once allowed)."""
        if name == "Bash":
            if policy.is_escalation(name, args) and self.p.config.sandbox.enabled:
                return self._shell("unconfined")
            if mode.is_contract and self.p.config.strict_planning:
                return self._shell("read-only")
        return self._workspace().get(name)

    async def aclose(self) -> None:
        """Kill what the tools keep ready (Bash's spare shells) and wait until it is gone."""
        await close_tools({**(self._tools or {}), **{f"Bash {kind}": bash for kind, bash in self._shells.items()}})

    def _workspace(self) -> dict[str, Tool]:
        if self._tools is None:
            sandbox = self._sandbox() if self.p.config.sandbox.enabled else None
            self._tools = self.p.workspace_tools(self.root, sandbox)
        return self._tools

    def _sandbox(self, *, read_only_root: bool = False) -> Sandbox:
        return Sandbox(sandbox_for(self.p, self.root, read_only_root=read_only_root), self.p.sandbox_starts)

    def _shell(self, kind: str) -> Bash:
        bash = self._shells.get(kind)
        if bash is None:
            sandbox = self._sandbox(read_only_root=True) if kind == "read-only" else None
            bash = self._shells[kind] = make_bash_tool(
                self.root, env=self.p.config.tool_env, sandbox=sandbox, process_groups=self.p.store.process_groups)
        return bash
