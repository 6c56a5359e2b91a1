"""``core.text.scrub``: what a model sent, fit to be written as UTF-8 (issue 29: a lone surrogate in
a tool call's arguments ended the turn INTERNAL and lost the model's answer)."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from pidesk.core.text import REPLACEMENT, scrub

# st.text() draws lone surrogates too. Keys without them: two keys that differ only in a surrogate become
# one key (the last wins), which the unit test below shows; the shape property would see a key fewer.
KEYS = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=8)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS, inner, max_size=4),
    max_leaves=20,
)


def shape(value: object) -> object:
    """The value with every string as its length: a lone surrogate's replacement is one character too."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, list):
        return [shape(item) for item in value]
    if isinstance(value, dict):
        return sorted((len(k), repr(shape(v))) for k, v in value.items())
    return value


@given(json_values)
def test_property_a_scrubbed_value_always_encodes_and_keeps_its_shape(value: object) -> None:
    scrubbed = scrub(value)
    json.dumps(scrubbed, ensure_ascii=False).encode("utf-8")  # (raises on a lone surrogate)
    assert shape(scrubbed) == shape(value)


@given(json_values)
def test_property_a_value_without_surrogates_comes_back_as_it_was(value: object) -> None:
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return
    assert scrub(value) is value  # not even copied


def test_a_lone_surrogate_becomes_the_replacement_character_in_keys_values_and_deep_nesting() -> None:
    deep: object = "x\udcff"
    for _ in range(5000):  # deeper than the recursion limit
        deep = [deep]
    value = {"path": "a\udcffb", "k\ud800": [1, "ok", deep]}
    scrubbed = scrub(value)
    assert scrubbed["path"] == f"a{REPLACEMENT}b" and f"k{REPLACEMENT}" in scrubbed
    inner = scrubbed[f"k{REPLACEMENT}"][2]
    while isinstance(inner, list):
        inner = inner[0]
    assert inner == f"x{REPLACEMENT}"
    assert value["path"] == "a\udcffb"  # the original is untouched
