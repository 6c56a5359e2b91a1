"""``--model PROVIDER/MODEL`` to a Provider.

``demo`` (built in, offline; the default), ``scripted/<file.json>`` (replays a
script), ``openai/<model>`` (any OpenAI-compatible server: ``OPENAI_API_KEY``,
``OPENAI_BASE_URL``) and ``anthropic/<model>`` (``ANTHROPIC_API_KEY``,
``ANTHROPIC_BASE_URL``). A missing key is ``PROVIDER_SECRET_MISSING`` with what to set.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from pidesk.core.errors import Code, InvalidParams
from pidesk.providers.base import Provider
from pidesk.providers.scripted import ScriptedProvider, ScriptError

KNOWN = "demo, scripted[/<script.json>], openai/<model>, anthropic/<model>"


def make_provider(model: str, secrets: Mapping[str, str] | None = None, *, lean_http: bool = True) -> Provider:
    """``lean_http``: a plain-http:// base URL may use pidesk's own transport (``HostConfig.lean_http``)."""
    name, _, rest = model.partition("/")
    secrets = secrets or {}
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
    if name in ("openai", "anthropic") and rest:
        prefix = name.upper()
        key = secrets.get(f"{prefix}_API_KEY")
        base_url = secrets.get(f"{prefix}_BASE_URL")
        if not key and not (name == "openai" and base_url):  # local OpenAI-compatible servers need no key
            raise InvalidParams(f"{model} needs an API key: set {prefix}_API_KEY (or use --model demo)",
                                Code.PROVIDER_SECRET_MISSING)
        if name == "openai":
            from pidesk.providers.openai import OpenAIProvider

            return OpenAIProvider(rest, api_key=key or "not-needed", base_url=base_url, lean_http=lean_http)
        from pidesk.providers.anthropic import AnthropicProvider

        return AnthropicProvider(rest, api_key=key or "", base_url=base_url, lean_http=lean_http)
    raise InvalidParams(f"unknown model {model!r}; this version knows {KNOWN}", Code.MODEL_NOT_CONFIGURED)
