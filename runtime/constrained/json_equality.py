"""JSON Schema's equality of values (`const`, `enum`, `uniqueItems`), as one hashable key per value."""
from __future__ import annotations

from typing import Hashable


def json_key(value: object) -> Hashable:
    """A key equal for two JSON values exactly where JSON Schema calls them equal: numbers by value (1, 1.0 and
    Decimal("1") alike: Python's numbers compare and hash so), true / false / null apart from numbers (Python's
    True == 1), objects whatever their keys' order, arrays item by item."""
    if isinstance(value, bool) or value is None:
        return ("k", value)
    if isinstance(value, dict):
        return ("o", frozenset((k, json_key(v)) for k, v in value.items()))
    if isinstance(value, list):
        return ("l", tuple(json_key(v) for v in value))
    return value  # a str or a number


def same_json(x: object, y: object) -> bool:
    return json_key(x) == json_key(y)
