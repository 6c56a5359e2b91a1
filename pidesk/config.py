"""Configuration as a value, built from an injected environment mapping.

This is the only module that reads ``os.environ`` (and only as a default for
``from_environ``). Precedence: explicit argument > environment > default.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from pidesk.faults import Faults

DEFAULT_APPROVAL_TIMEOUT = 1800.0


@dataclass(frozen=True)
class HostConfig:
    data_dir: Path
    model: str = "demo"
    approval_timeout: float = DEFAULT_APPROVAL_TIMEOUT
    context_limit: int = 128_000  # tokens the model's view may hold before compaction
    faults: Faults = field(default_factory=Faults)
    # the environment Bash runs with: the host's, less anything that looks like a secret
    tool_env: Mapping[str, str] | None = None
    # provider credentials: never logged, never shown to tools (repr hides them)
    secrets: Mapping[str, str] = field(default_factory=dict, repr=False)

    @classmethod
    def from_environ(
        cls,
        environ: Mapping[str, str] | None = None,
        *,
        data_dir: Path | None = None,
        model: str | None = None,
        approval_timeout: float | None = None,
    ) -> HostConfig:
        env = os.environ if environ is None else environ
        return cls(
            data_dir=data_dir or Path(env.get("PIDESK_HOME") or _default_data_dir()),
            model=model or env.get("PIDESK_MODEL", "demo"),
            approval_timeout=approval_timeout or float(env.get("PIDESK_APPROVAL_TIMEOUT", DEFAULT_APPROVAL_TIMEOUT)),
            tool_env=without_secrets(env),
            secrets={k: env[k] for k in _PROVIDER_SETTINGS if env.get(k)},
            faults=Faults(
                frozenset(p for p in env.get("PIDESK_FAULT", "").split(",") if p),
                env.get("PIDESK_FAULT_ACTION", "kill"),
            ),
        )


_SECRET_MARKS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "CREDENTIAL")
_PROVIDER_SETTINGS = ("OPENAI_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL")


def without_secrets(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment minus provider keys and anything named like a secret (never shown to tools)."""
    return {k: v for k, v in environ.items() if not any(mark in k.upper() for mark in _SECRET_MARKS)}


def _default_data_dir() -> str:
    from platformdirs import user_data_dir

    return user_data_dir("pidesk", appauthor=False)
