"""``--model PROVIDER/MODEL`` to a Provider: ``demo`` (built in, offline) or ``scripted/<file>``."""

from __future__ import annotations

from pathlib import Path

from pidesk.core.errors import Code, InvalidParams
from pidesk.providers.base import Provider
from pidesk.providers.scripted import ScriptedProvider, ScriptError


def make_provider(model: str) -> Provider:
    name, _, rest = model.partition("/")
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
    raise InvalidParams(
        f"unknown model {model!r}; this version knows demo and scripted[/<script.json>]", Code.MODEL_NOT_CONFIGURED
    )
