"""How large a value's JSON is, about, without encoding it: cheap enough to ask of every event and tool call.

Strings count their length (a non-ASCII one four bytes a character, the most UTF-8
takes) plus quotes; containers and scalars a few bytes each. It walks iteratively:
arguments a model sent may nest deeper than the recursion limit.
"""

from __future__ import annotations

import msgspec


def json_size(value: object) -> int:
    total = 0
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            total += len(item) + 2 if item.isascii() else 4 * len(item) + 2
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
            total += 2
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
            total += 2
        elif isinstance(item, msgspec.Struct):
            stack.extend(getattr(item, name) for name in item.__struct_fields__)
            total += 2 + 16 * len(item.__struct_fields__)
        else:
            total += 8
    return total
