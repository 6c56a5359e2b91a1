"""Text a model sent, made fit to keep: ``scrub`` replaces every lone surrogate with U+FFFD.

A JSON string may hold an escaped lone surrogate (``"\\udcff"``); decoded, it is a code
point that UTF-8 cannot encode, so the transcript's write failed, the turn ended
``INTERNAL`` and the model's answer was lost (issue 29). Any surrogate in a Python string
is a lone one (a pair decodes to the one character it encodes). It walks iteratively:
arguments a model sent may nest deeper than the recursion limit.
"""

from __future__ import annotations

import re
from typing import Any, Final, TypeVar

T = TypeVar("T")
REPLACEMENT: Final = "\ufffd"
_SURROGATE: Final = re.compile("[\ud800-\udfff]")


def scrub(value: T) -> T:
    """``value`` (a string, or JSON-shaped lists and dicts of them) with its lone surrogates replaced;
    the value itself when it has none (the usual case: nothing is copied)."""
    if not _has_surrogate(value):
        return value
    box: list[Any] = [value]
    stack: list[tuple[Any, Any]] = [(box, 0)]
    while stack:
        container, key = stack.pop()
        item = container[key]
        if isinstance(item, str):
            container[key] = _SURROGATE.sub(REPLACEMENT, item)
        elif isinstance(item, dict):
            copied = {_SURROGATE.sub(REPLACEMENT, k) if isinstance(k, str) else k: v for k, v in item.items()}
            container[key] = copied
            stack.extend((copied, k) for k in copied)
        elif isinstance(item, list):
            copied_list = list(item)
            container[key] = copied_list
            stack.extend((copied_list, i) for i in range(len(copied_list)))
    result: T = box[0]
    return result


def _has_surrogate(value: object) -> bool:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if not item.isascii() and _SURROGATE.search(item):
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False
