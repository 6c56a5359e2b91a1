"""Configuration as a value, built from an injected environment mapping and a TOML file.

This is the only module that reads ``os.environ`` (and only as a default for
``from_environ``). Precedence: explicit argument > environment > config file > default.

The config file is ``$PIDESK_CONFIG``, else ``<platform config dir>/pidesk/config.toml``. That
directory also holds the global ``AGENTS.md`` and ``skills/`` every session's model is told
about (``HostConfig.config_dir``; pidesk.host.instructions), wherever the config file is::

    model = "openai/gpt-4.1"          # the default model (else: demo, built in and offline)
    approval_timeout = 1800           # seconds a submitted plan waits for a decision
    strict_planning = false           # true: Bash in Plan/Goal runs read-only (bubblewrap), even under auto
    http_transport = "pidesk"         # plain-http:// model servers: pidesk's lean transport; "httpx": httpx's
    max_retries = 10                  # retries of a failed model request (PIDESK_MAX_RETRIES, --max-retries)
    retry_after_cap = 60              # the longest Retry-After wait honoured, s (PIDESK_RETRY_AFTER_CAP)
    stream_idle_timeout = 120         # s without a byte that break a stream (PIDESK_STREAM_IDLE_TIMEOUT)
    data_dir = "~/pidesk-data"

    [providers.openai]                # OPENAI_API_KEY / OPENAI_BASE_URL override these
    base_url = "http://127.0.0.1:11434/v1"   # any OpenAI-compatible server (Ollama, vLLM, …)
    api_key = "…"

    [providers.anthropic]             # ANTHROPIC_API_KEY / ANTHROPIC_BASE_URL override these
    api_key = "…"

    [models."openai/gpt-4.1"]
    context_limit = 1000000           # tokens the model's view may hold before compaction

    [models."anthropic/claude-sonnet-4-5"]   # per-model settings (pidesk.cli.models reads them)
    thinking_budget = 8000            # extended thinking with this budget (>= 1024 tokens)
    effort = "high"                   # Anthropic's effort; alone: adaptive thinking
    max_tokens = 8192                 # the answer's cap (the thinking budget comes on top)
    cache = true                      # prompt caching: cache_control / prompt_cache_key (default on)

    [models."openai-responses/o4-mini"]
    reasoning_effort = "medium"       # OpenAI-compatible reasoning (Chat Completions and Responses)

    [plugins.mcp.github]              # an MCP tool server over stdio (see pidesk/plugins/mcp_tools.py)
    command = ["npx", "-y", "@modelcontextprotocol/server-github"]
    risk = "medium"                   # low: allowed; medium: like Write; high: like Bash (Agent mode only);
                                      # left out: each tool's readOnlyHint/destructiveHint decides
    [plugins.mcp.docs]                # an MCP server over Streamable HTTP
    url = "http://127.0.0.1:8000/mcp"
    headers = { Authorization = "Bearer ${DOCS_TOKEN}" }   # ${NAME}: from the environment
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pidesk.core.errors import Code, InvalidParams
from pidesk.faults import Faults
from pidesk.providers.retry import RetryPolicy
from pidesk.runtime.gate import DEFAULT_SLOTS

DEFAULT_APPROVAL_TIMEOUT = 1800.0
DEFAULT_CONTEXT_LIMIT = 128_000


@dataclass(frozen=True)
class HostConfig:
    data_dir: Path
    model: str = "demo"
    approval_timeout: float = DEFAULT_APPROVAL_TIMEOUT
    context_limit: int = DEFAULT_CONTEXT_LIMIT  # tokens the model's view may hold before compaction
    faults: Faults = field(default_factory=Faults)
    # the environment Bash runs with: the host's, less anything that looks like a secret
    tool_env: Mapping[str, str] | None = None
    # provider credentials: never logged, never shown to tools (repr hides them)
    secrets: Mapping[str, str] = field(default_factory=dict, repr=False)
    # strict planning: Bash in Plan/Goal runs in a read-only bubblewrap sandbox (off by default)
    strict_planning: bool = False
    # the config file's [plugins.mcp] value as read, <name> → table (validated by pidesk.plugins.mcp_tools:
    # a broken table disables its server only); mcp_source names the file in their errors
    mcp_servers: Any = field(default_factory=dict, repr=False)
    mcp_source: str = "config"
    # the variables that ${NAME} in those tables' headers name, from the environment (never shown)
    mcp_environ: Mapping[str, str] = field(default_factory=dict, repr=False)
    # turns doing CPU work on the event loop at once (pidesk.runtime.gate): RPCs wait behind at most this many
    step_slots: int = DEFAULT_SLOTS
    # a plain-http:// base URL gets pidesk's own HTTP transport under the SDK (providers/transport.py);
    # off with PIDESK_HTTP_TRANSPORT=httpx (or the file's http_transport) or when the environment names
    # a proxy, which httpx would take (a proxy may itself be reached over TLS)
    lean_http: bool = True
    # <platform config dir>/pidesk: the global AGENTS.md and skills/ (pidesk.host.instructions); None: none
    config_dir: Path | None = None
    # the config file's [models."<provider>/<model>"] tables (thinking, effort, caching; pidesk.cli.models)
    models: Mapping[str, Mapping[str, Any]] = field(default_factory=dict, repr=False)
    # how long a provider keeps trying: retries, Retry-After cap, stream idle time (providers/retry.py)
    retry: RetryPolicy = field(default_factory=RetryPolicy)

    def __post_init__(self) -> None:
        # absolute: git runs in a project's root, Bash in its cwd, and a relative data dir
        # (``--data-dir data``) would name a different place from each
        object.__setattr__(self, "data_dir", Path(self.data_dir).expanduser().absolute())

    def model_settings(self, model: str | None = None) -> Mapping[str, Any]:
        """The config file's table for ``model`` (default: the configured model), or an empty one."""
        settings = self.models.get(model or self.model, {})
        return settings if isinstance(settings, Mapping) else {}

    @classmethod
    def from_environ(
        cls,
        environ: Mapping[str, str] | None = None,
        *,
        data_dir: Path | None = None,
        model: str | None = None,
        approval_timeout: float | None = None,
        max_retries: int | None = None,
    ) -> HostConfig:
        env = os.environ if environ is None else environ
        path = Path(env["PIDESK_CONFIG"]) if env.get("PIDESK_CONFIG") else _default_config_file()
        file = _read_config_file(path)
        mcp_servers = _mcp_tables(file)
        providers = file.get("providers", {})
        secrets = {
            f"{name.upper()}_{key.upper()}": str(value)
            for name, settings in providers.items() if isinstance(settings, dict)
            for key, value in settings.items() if key in ("api_key", "base_url")
        }
        secrets.update({k: env[k] for k in _PROVIDER_SETTINGS if env.get(k)})
        chosen = model or env.get("PIDESK_MODEL") or str(file.get("model", "demo"))
        limits = file.get("models", {}).get(chosen, {})
        home = env.get("PIDESK_HOME") or file.get("data_dir") or _default_data_dir()
        return cls(
            data_dir=data_dir or Path(str(home)).expanduser(),
            model=chosen,
            approval_timeout=approval_timeout or float(
                env.get("PIDESK_APPROVAL_TIMEOUT") or file.get("approval_timeout", DEFAULT_APPROVAL_TIMEOUT)),
            context_limit=int(limits.get("context_limit", DEFAULT_CONTEXT_LIMIT)),
            tool_env=without_secrets(env),
            secrets=secrets,
            mcp_servers=mcp_servers,
            mcp_source=f"config file {path}",
            mcp_environ={name: env[name] for name in _header_variables(mcp_servers) if name in env},
            strict_planning=env.get("PIDESK_STRICT_PLANNING", str(file.get("strict_planning", ""))).lower()
            in ("1", "true", "yes"),
            config_dir=_default_config_dir(),
            models={k: v for k, v in file.get("models", {}).items() if isinstance(v, dict)},
            lean_http=_http_transport(env, file) == "pidesk" and not any(env.get(name) for name in _PROXY_VARIABLES),
            retry=_retry_policy(env, file, max_retries),
            faults=Faults(
                frozenset(p for p in env.get("PIDESK_FAULT", "").split(",") if p),
                env.get("PIDESK_FAULT_ACTION", "kill"),
            ),
        )


_SECRET_MARKS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "CREDENTIAL")
_PROVIDER_SETTINGS = ("OPENAI_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL")
_PROXY_VARIABLES = ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY")  # what httpx would proxy http:// by


def _http_transport(env: Mapping[str, str], file: Mapping[str, Any]) -> str:
    """``PIDESK_HTTP_TRANSPORT`` > the file's ``http_transport`` > "pidesk": what plain-http:// model
    servers are spoken to over ("httpx": the SDK's own transport). Anything else is refused, naming its source."""
    source, raw = (("PIDESK_HTTP_TRANSPORT", env["PIDESK_HTTP_TRANSPORT"]) if env.get("PIDESK_HTTP_TRANSPORT")
                   else ("http_transport in the config file", file.get("http_transport", "pidesk")))
    if not isinstance(raw, str) or raw.lower() not in ("pidesk", "httpx"):
        raise InvalidParams(f'{source} = {raw!r}: it takes "pidesk" or "httpx"', Code.INVALID_PARAMS)
    return raw.lower()


def _retry_policy(env: Mapping[str, str], file: Mapping[str, Any], max_retries: int | None) -> RetryPolicy:
    """``--max-retries`` > ``PIDESK_MAX_RETRIES`` > the file's ``max_retries`` > 10; likewise the
    Retry-After cap and the stream idle time (without a flag). A bad value is refused, naming its source."""
    def number(variable: str, key: str, default: float, kind: type, least: float) -> Any:
        source, raw = (variable, env[variable]) if env.get(variable) else (f"{key} in the config file", file.get(key))
        if raw is None:
            return default
        try:
            value = kind(raw) if not isinstance(raw, bool) else None
        except (TypeError, ValueError):
            value = None
        if value is None or not value >= least or value == float("inf"):
            raise InvalidParams(f"{source} = {raw!r}: it takes a number of at least {least:g}", Code.INVALID_PARAMS)
        return value

    defaults = RetryPolicy()
    return RetryPolicy(
        max_retries=max_retries if max_retries is not None else
        number("PIDESK_MAX_RETRIES", "max_retries", defaults.max_retries, int, 0),
        retry_after_cap=number("PIDESK_RETRY_AFTER_CAP", "retry_after_cap", defaults.retry_after_cap, float, 0),
        idle_timeout=number("PIDESK_STREAM_IDLE_TIMEOUT", "stream_idle_timeout", defaults.idle_timeout, float, 0.001),
    )


def without_secrets(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment minus provider keys and anything named like a secret (never shown to tools)."""
    return {k: v for k, v in environ.items() if not any(mark in k.upper() for mark in _SECRET_MARKS)}


def _mcp_tables(file: Mapping[str, Any]) -> Any:
    """[plugins.mcp] as read; a [plugins] that is not a table is passed on for the plugins to report."""
    plugins = file.get("plugins", {})
    return plugins.get("mcp", {}) if isinstance(plugins, Mapping) else plugins


def _header_variables(tables: Any) -> set[str]:
    """The names ${NAME} in the header values of [plugins.mcp.<name>] tables (broken ones included)."""
    if not isinstance(tables, Mapping):
        return set()
    return {
        name for table in tables.values() if isinstance(table, Mapping)
        and isinstance(headers := table.get("headers"), Mapping)
        for value in headers.values() if isinstance(value, str)
        for name in re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", value)
    }


def _read_config_file(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        return {}
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise InvalidParams(f"cannot read the config file {path}: {exc}", Code.MODEL_NOT_CONFIGURED) from None


def _default_config_dir() -> Path:
    from platformdirs import user_config_dir

    return Path(user_config_dir("pidesk", appauthor=False))


def _default_config_file() -> Path:
    return _default_config_dir() / "config.toml"


def _default_data_dir() -> str:
    from platformdirs import user_data_dir

    return user_data_dir("pidesk", appauthor=False)
