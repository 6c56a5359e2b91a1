"""``--model PROVIDER/MODEL`` to a Provider.

``demo`` (built in, offline; the default), ``scripted/<file.json>`` (replays a
script), ``openai/<model>`` (any OpenAI-compatible Chat Completions server:
``OPENAI_API_KEY``, ``OPENAI_BASE_URL``), ``openai-responses/<model>`` (the
Responses API, same key and base URL) and ``anthropic/<model>``
(``ANTHROPIC_API_KEY``, ``ANTHROPIC_BASE_URL``). A missing key is
``PROVIDER_SECRET_MISSING`` with what to set.

``settings`` is the model's table of the config file (``HostConfig.model_settings``):
``thinking_budget`` / ``effort`` / ``max_tokens`` (Anthropic), ``reasoning_effort``
(OpenAI-compatible), ``reasoning_content`` (Chat Completions: send a tool-calling answer's
reasoning back, as DeepSeek's and Kimi's thinking models require), ``cache`` (all three;
default on). A bad value is
``MODEL_NOT_CONFIGURED`` naming the key and what it takes.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pidesk.core.errors import Code, InvalidParams
from pidesk.providers.base import Provider
from pidesk.providers.retry import RetryPolicy
from pidesk.providers.scripted import ScriptedProvider, ScriptError

KNOWN = "demo, scripted[/<script.json>], openai/<model>, openai-responses/<model>, anthropic/<model>"
_EFFORTS = ("low", "medium", "high", "xhigh", "max")
_REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")


def make_provider(model: str, secrets: Mapping[str, str] | None = None, *, lean_http: bool = True,
                  settings: Mapping[str, Any] | None = None, retry: RetryPolicy | None = None) -> Provider:
    """``retry``: the host's retry budget, Retry-After cap and stream idle time (``HostConfig.retry``)."""
    provider = _make_provider(model, secrets, lean_http=lean_http, settings=settings)
    configure = getattr(provider, "configure", None)  # the vendor providers (providers/sdk.py)
    if retry is not None and callable(configure):
        configure(retry)
    return provider


def _make_provider(model: str, secrets: Mapping[str, str] | None = None, *, lean_http: bool = True,
                   settings: Mapping[str, Any] | None = None) -> Provider:
    """``lean_http``: a plain-http:// base URL may use pidesk's own transport (``HostConfig.lean_http``)."""
    name, _, rest = model.partition("/")
    secrets = secrets or {}
    settings = settings or {}
    if name == "demo":
        from pidesk.providers.demo import DemoProvider

        return DemoProvider()
    if name == "scripted":
        if not rest:
            return ScriptedProvider()
        try:
            return ScriptedProvider.from_file(Path(rest).expanduser())
        except ScriptError as exc:
            raise InvalidParams(str(exc), Code.MODEL_NOT_CONFIGURED) from None
    if name in ("openai", "openai-responses", "anthropic") and rest:
        prefix = "ANTHROPIC" if name == "anthropic" else "OPENAI"
        key = secrets.get(f"{prefix}_API_KEY")
        base_url = secrets.get(f"{prefix}_BASE_URL")
        if not key and not (prefix == "OPENAI" and base_url):  # local OpenAI-compatible servers need no key
            raise InvalidParams(f"{model} needs an API key: set {prefix}_API_KEY (or use --model demo)",
                                Code.PROVIDER_SECRET_MISSING)
        cache = _setting(model, settings, "cache", bool, "true or false", True)
        if prefix == "OPENAI":
            effort = _setting(model, settings, "reasoning_effort", str, " or ".join(_REASONING_EFFORTS), None,
                              _REASONING_EFFORTS)
            if name == "openai":
                from pidesk.providers.openai import OpenAIProvider

                back = _setting(model, settings, "reasoning_content", bool, "true or false", False)
                return OpenAIProvider(rest, api_key=key or "not-needed", base_url=base_url, lean_http=lean_http,
                                      reasoning_effort=effort, cache=cache, reasoning_content=back)
            from pidesk.providers.openai_responses import OpenAIResponsesProvider

            return OpenAIResponsesProvider(rest, api_key=key or "not-needed", base_url=base_url, lean_http=lean_http,
                                           reasoning_effort=effort, cache=cache)
        from pidesk.providers.anthropic import DEFAULT_MAX_TOKENS, AnthropicProvider

        budget = _setting(model, settings, "thinking_budget", int, "a number of tokens, at least 1024", None)
        if budget is not None and budget < 1024:
            raise InvalidParams(f'[models."{model}"] thinking_budget must be at least 1024 tokens '
                                "(Anthropic's minimum)", Code.MODEL_NOT_CONFIGURED)
        max_tokens = _setting(model, settings, "max_tokens", int, "a number of tokens", DEFAULT_MAX_TOKENS)
        return AnthropicProvider(
            rest, api_key=key or "", base_url=base_url, lean_http=lean_http, max_tokens=max_tokens,
            thinking_budget=budget, effort=_setting(model, settings, "effort", str, " or ".join(_EFFORTS), None,
                                                     _EFFORTS),
            cache=cache,
        )
    raise InvalidParams(f"unknown model {model!r}; this version knows {KNOWN}", Code.MODEL_NOT_CONFIGURED)


def _setting(model: str, settings: Mapping[str, Any], key: str, kind: type, takes: str, default: Any,
             choices: tuple[str, ...] = ()) -> Any:
    """``settings[key]`` checked against ``kind`` (and ``choices``), else ``default`` when absent."""
    value = settings.get(key, default)
    if value is None or value is default:
        return value
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)) or (choices and value not in choices):
        raise InvalidParams(f'[models."{model}"] {key} = {value!r} in the config file: it takes {takes}',
                            Code.MODEL_NOT_CONFIGURED)
    return value
