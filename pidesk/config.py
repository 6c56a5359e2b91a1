"""Configuration as a value, built from an injected environment mapping and a TOML file.

This is the only module that reads ``os.environ`` (and only as a default for
``from_environ``). Precedence: explicit argument > environment > config file > default.

The config file is ``$PIDESK_CONFIG``, else ``<platform config dir>/pidesk/config.toml``. That
directory also holds the global ``AGENTS.md`` and ``skills/`` every session's model is told
about (``HostConfig.config_dir``; pidesk.host.instructions), wherever the config file is::

    model = "openai/gpt-4.1"          # the default model (else: demo, built in and offline)
    approval_timeout = 1800           # seconds a submitted plan waits for a decision
    notification_retention_days = 30  # notifications older than this are deleted, seen or not
    checkpoint_keep_turns = 200       # checkpoints kept: each session's last 200 turns (0: no count limit)
    checkpoint_keep_days = 30         # … made in the last 30 days (0: no age limit); older ones are pruned
    strict_planning = false           # true: Bash in Plan/Goal cannot write even the root, even under auto
    http_transport = "pidesk"         # plain-http:// model servers: pidesk's lean transport; "httpx": httpx's
    max_retries = 10                  # retries of a failed model request (PIDESK_MAX_RETRIES, --max-retries)
    retry_after_cap = 60              # the longest Retry-After wait honoured, s (PIDESK_RETRY_AFTER_CAP)
    stream_idle_timeout = 120         # s without a byte that break a stream (PIDESK_STREAM_IDLE_TIMEOUT)
    data_dir = "~/pidesk-data"

    [sandbox]                         # every Bash command runs in a bubblewrap sandbox (tools/sandbox.py)
    writable = ["~/.cache/pip"]       # paths a command may write besides the session's root and a private /tmp
    network = false                   # true: commands reach the network (and the host's port: not its token)
    env = ["VIRTUAL_ENV"]             # variables passed on besides PATH HOME LANG LC_* TERM USER SHELL TMPDIR
    # or, instead of the table: sandbox = "off" (PIDESK_SANDBOX=off, --no-sandbox) — commands then run
    # with your full power: they can read the host's token and call its RPC, and reach the network

    [providers.openai]                # OPENAI_API_KEY / OPENAI_BASE_URL override these
    base_url = "http://127.0.0.1:11434/v1"   # any OpenAI-compatible server (Ollama, vLLM, …)
    api_key = "…"

    [providers.anthropic]             # ANTHROPIC_API_KEY / ANTHROPIC_BASE_URL override these
    api_key = "…"

    compact_at = 0.85                 # compact the model's view before a request would fill this much of the window

    [models."openai/local"]
    context_limit = 32768             # the model's window in tokens (--context-limit wins; else the catalogue's
                                      # figure for common models, pidesk/providers/windows.py; else 128000)

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
from pidesk.providers.windows import DEFAULT_WINDOW, window_of
from pidesk.runtime.gate import DEFAULT_SLOTS

DEFAULT_APPROVAL_TIMEOUT = 1800.0
DEFAULT_NOTIFICATION_RETENTION_DAYS = 30.0
DEFAULT_CHECKPOINT_KEEP_TURNS = 200
DEFAULT_CHECKPOINT_KEEP_DAYS = 30.0
DEFAULT_CONTEXT_LIMIT = DEFAULT_WINDOW
DEFAULT_COMPACT_AT = 0.85
# What a HostConfig built without from_environ gets: the sandbox on. A test run on a machine without
# bubblewrap turns it off here (tests/conftest.py), and says so; nothing else should.
DEFAULT_SANDBOX_ENABLED = True


@dataclass(frozen=True)
class SandboxSettings:
    """The config file's ``[sandbox]`` (or ``sandbox = "off"``): what Bash commands are confined to.

    The host turns these into one ``tools.sandbox.SandboxPolicy`` per command (pidesk.host.tooling)."""

    enabled: bool = field(default_factory=lambda: DEFAULT_SANDBOX_ENABLED)
    writable: tuple[Path, ...] = ()  # besides the session's root and a private /tmp
    network: bool = False
    env: tuple[str, ...] = ()  # variable names passed on besides COMMAND_ENV_NAMES


@dataclass(frozen=True)
class HostConfig:
    data_dir: Path
    model: str = "demo"
    approval_timeout: float = DEFAULT_APPROVAL_TIMEOUT
    context_limit: int = DEFAULT_CONTEXT_LIMIT  # the model's window in tokens
    compact_at: float = DEFAULT_COMPACT_AT  # compact before a request would fill this fraction of the window
    faults: Faults = field(default_factory=Faults)
    # the environment Bash runs with: an allowlist of the host's (command_environment); None: the host's own
    tool_env: Mapping[str, str] | None = None
    # provider credentials: never logged, never shown to tools (repr hides them)
    secrets: Mapping[str, str] = field(default_factory=dict, repr=False)
    # strict planning: Bash in Plan/Goal runs in a sandbox where even the root is read-only (off by default)
    strict_planning: bool = False
    # the sandbox every Bash command runs in (on by default: config [sandbox], PIDESK_SANDBOX, --no-sandbox)
    sandbox: SandboxSettings = field(default_factory=SandboxSettings)
    # the config file read, if any: hidden from commands (it may hold provider keys)
    config_file: Path | None = None
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
    # notifications older than this many days are deleted, seen or not (pidesk.host.notifications)
    notification_retention_days: float = DEFAULT_NOTIFICATION_RETENTION_DAYS
    # checkpoints kept per session: its last this many turns (0: any number) made in the last this many days
    # (0: any age); the rest are pruned from the shadow repositories (pidesk.host.checkpoints)
    checkpoint_keep_turns: int = DEFAULT_CHECKPOINT_KEEP_TURNS
    checkpoint_keep_days: float = DEFAULT_CHECKPOINT_KEEP_DAYS

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
        no_sandbox: bool = False,
        context_limit: int | None = None,
    ) -> HostConfig:
        env = os.environ if environ is None else environ
        path = Path(env["PIDESK_CONFIG"]) if env.get("PIDESK_CONFIG") else _default_config_file()
        file = _read_config_file(path)
        sandbox = _sandbox_settings(env, file, no_sandbox)
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
            context_limit=context_limit or _positive(limits.get("context_limit"), "context_limit", path)
            or window_of(chosen),
            compact_at=_fraction(file.get("compact_at", DEFAULT_COMPACT_AT), path),
            tool_env=command_environment(env, sandbox.env),
            sandbox=sandbox,
            config_file=path,
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
            notification_retention_days=_retention_days(env, file),
            checkpoint_keep_turns=int(_zero_or_more(env, file, "PIDESK_CHECKPOINT_KEEP_TURNS", "checkpoint_keep_turns",
                                                    DEFAULT_CHECKPOINT_KEEP_TURNS, whole=True)),
            checkpoint_keep_days=_zero_or_more(env, file, "PIDESK_CHECKPOINT_KEEP_DAYS", "checkpoint_keep_days",
                                               DEFAULT_CHECKPOINT_KEEP_DAYS, whole=False),
            faults=Faults(
                frozenset(p for p in env.get("PIDESK_FAULT", "").split(",") if p),
                env.get("PIDESK_FAULT_ACTION", "kill"),
            ),
        )


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


def _positive(raw: Any, key: str, path: Path) -> int | None:
    """A count of tokens from the config file (None when absent); anything else is refused."""
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 1000:
        raise InvalidParams(f"{key} = {raw!r} in {path}: it takes a number of tokens of at least 1000")
    return raw


def _fraction(raw: Any, path: Path) -> float:
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not 0.1 <= raw <= 0.98:
        raise InvalidParams(f"compact_at = {raw!r} in {path}: it takes a fraction of the window from 0.1 to 0.98")
    return float(raw)


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


def _retention_days(env: Mapping[str, str], file: Mapping[str, Any]) -> float:
    """``PIDESK_NOTIFICATION_RETENTION_DAYS`` > the file's ``notification_retention_days`` > 30: a number
    of days of at least 1 (a fraction allowed); anything else is refused, naming its source."""
    variable, key = "PIDESK_NOTIFICATION_RETENTION_DAYS", "notification_retention_days"
    source, raw = (variable, env[variable]) if env.get(variable) else (f"{key} in the config file", file.get(key))
    if raw is None:
        return DEFAULT_NOTIFICATION_RETENTION_DAYS
    try:
        days = float(raw) if not isinstance(raw, bool) else None
    except (TypeError, ValueError):
        days = None
    if days is None or not 1 <= days < 1e6:
        raise InvalidParams(f"{source} = {raw!r}: it takes a number of days of at least 1", Code.INVALID_PARAMS)
    return days


def _zero_or_more(env: Mapping[str, str], file: Mapping[str, Any], variable: str, key: str, default: float, *,
                  whole: bool) -> float:
    """The variable > the file's key > ``default``: a number of at least 0 (a whole one when ``whole``; 0: no
    limit); anything else is refused, naming its source."""
    source, raw = (variable, env[variable]) if env.get(variable) else (f"{key} in the config file", file.get(key))
    if raw is None:
        return default
    try:
        value = (int(raw) if whole else float(raw)) if not isinstance(raw, bool) else None
    except (TypeError, ValueError):
        value = None
    if value is None or not 0 <= value < 1e9:
        kind = "a whole number" if whole else "a number"
        raise InvalidParams(f"{source} = {raw!r}: it takes {kind} of at least 0 (0: no limit)", Code.INVALID_PARAMS)
    return value


# What every command's environment may carry (issue 28): a command needs these to behave as in a
# terminal, and none of them holds a credential of the host's.
COMMAND_ENV_NAMES = ("PATH", "HOME", "LANG", "TERM", "USER", "SHELL", "TMPDIR")


def command_environment(environ: Mapping[str, str], extra: tuple[str, ...] = ()) -> dict[str, str]:
    """The environment Bash commands (sandboxed or escalated) run with: an allowlist — the names in
    ``COMMAND_ENV_NAMES``, every ``LC_*``, and the config's ``sandbox.env`` — never a provider's
    setting, whatever the config lists."""
    wanted = set(COMMAND_ENV_NAMES) | set(extra)
    return {k: v for k, v in environ.items()
            if (k in wanted or k.startswith("LC_")) and k not in _PROVIDER_SETTINGS}


def _sandbox_settings(env: Mapping[str, str], file: Mapping[str, Any], no_sandbox: bool) -> SandboxSettings:
    """``--no-sandbox`` > ``PIDESK_SANDBOX`` (on/off) > the file's ``sandbox = "off"`` or ``[sandbox]``
    table > on. A value that is not one of these is refused, naming where it was set."""
    raw = file.get("sandbox", {})
    table: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
    if not isinstance(raw, Mapping) and raw not in ("on", "off", "bwrap"):
        raise InvalidParams(f'sandbox = {raw!r} in the config file: it takes "on", "off" or a [sandbox] table',
                            Code.INVALID_PARAMS)
    enabled = raw != "off"
    if env.get("PIDESK_SANDBOX"):
        if env["PIDESK_SANDBOX"].lower() not in ("on", "off", "bwrap"):
            raise InvalidParams(f"PIDESK_SANDBOX = {env['PIDESK_SANDBOX']!r}: it takes on or off", Code.INVALID_PARAMS)
        enabled = env["PIDESK_SANDBOX"].lower() != "off"
    unknown = set(table) - {"writable", "network", "env"}
    if unknown:
        raise InvalidParams(f"[sandbox] in the config file: unknown key {sorted(unknown)[0]!r} "
                            "(it takes writable, network and env)", Code.INVALID_PARAMS)
    writable, names, network = table.get("writable", []), table.get("env", []), table.get("network", False)
    if not isinstance(writable, list) or not all(isinstance(p, str) and p for p in writable):
        raise InvalidParams("sandbox.writable in the config file: a list of paths", Code.INVALID_PARAMS)
    if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
        raise InvalidParams("sandbox.env in the config file: a list of variable names", Code.INVALID_PARAMS)
    if not isinstance(network, bool):
        raise InvalidParams("sandbox.network in the config file: true or false", Code.INVALID_PARAMS)
    return SandboxSettings(
        enabled=enabled and not no_sandbox,
        writable=tuple(Path(p).expanduser().absolute() for p in writable),
        network=network,
        env=tuple(names),
    )


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
