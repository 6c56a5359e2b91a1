"""``--model PROVIDER/MODEL`` to a Provider. Only the scripted provider exists so far."""

from __future__ import annotations

from pathlib import Path

from pidesk.core.errors import Code, InvalidParams
from pidesk.providers.base import Provider
from pidesk.providers.scripted import ScriptedProvider, ScriptError


def make_provider(model: str) -> Provider:
    name, _, rest = model.partition("/")
    if name == "scripted":
        if not rest:
            return ScriptedProvider()
        try:
            return ScriptedProvider.from_file(Path(rest).expanduser())
        except ScriptError as exc:
            raise InvalidParams(str(exc), Code.MODEL_NOT_CONFIGURED) from None
    raise InvalidParams(
        f"unknown model {model!r}; this version knows scripted[/<script.json>]", Code.MODEL_NOT_CONFIGURED
    )
