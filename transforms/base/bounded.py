"""Bounded parsing of untrusted text: JSON with a depth limit and number-size limits, and int cells.

Every JSON text the tool reads from a user or from a dataset folder (manifest and metadata rows, CSV list
cells, `@schema.json`, `image_tfrecords.json`, a lock file) goes through `loads`, so that one hostile cell
(JSON nested thousands of levels deep, an int of thousands of digits, a number beyond a double) is one
`BoundedJSONError` (a ValueError) with a reason, never a RecursionError or a crash further on.
Imports nothing but the standard library.
"""

from __future__ import annotations

import json
import math
from typing import Any

MAX_JSON_DEPTH = 64  # an image_tfrecords.json nests 5 levels; a manifest row 2
MAX_INT_DIGITS = 40  # int64 has 19 digits; anything longer is no number this tool stores
MAX_NUMBER_CHARS = 400  # a float written in full ("0.000…1") is still far shorter


class BoundedJSONError(ValueError):
    """A JSON text that is not JSON, or is beyond the bounds above; str() says which, in a few words."""


def _parse_int(text: str) -> int:
    digits = len(text.lstrip("-"))
    if digits > MAX_INT_DIGITS:
        raise BoundedJSONError(f"an integer of {digits} digits (at most {MAX_INT_DIGITS})")
    return int(text)


def _parse_float(text: str) -> float:
    if len(text) > MAX_NUMBER_CHARS:
        raise BoundedJSONError(f"a number of {len(text)} characters (at most {MAX_NUMBER_CHARS})")
    value = float(text)
    if not math.isfinite(value):
        raise BoundedJSONError(f"the number {text[:40]} is beyond a double's range")
    return value


def _parse_constant(name: str) -> float:
    raise BoundedJSONError(f"{name} is not a JSON number")


def depth(value: Any) -> int:
    """How deeply `value` nests lists and dicts (a scalar is 0), found without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, level)
        stack.extend((child, level + 1) for child in children)
    return deepest


def loads(text: str | bytes, *, max_depth: int = MAX_JSON_DEPTH, object_pairs_hook=None) -> Any:
    """json.loads within bounds. Raises BoundedJSONError (a ValueError) for bad JSON and for JSON that nests
    deeper than `max_depth`, holds an int of over MAX_INT_DIGITS digits, a non-finite number or NaN.
    `object_pairs_hook`: as json.loads's (each object's (key, value) pairs, in order, repeats kept)."""
    if isinstance(text, (bytes, bytearray)):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as e:
            raise BoundedJSONError(f"not UTF-8 text (byte {e.start})") from None
    try:
        value = json.loads(text, parse_int=_parse_int, parse_float=_parse_float, parse_constant=_parse_constant,
                           object_pairs_hook=object_pairs_hook)
    except BoundedJSONError:
        raise
    except RecursionError:
        raise BoundedJSONError(f"nested more than {max_depth} levels deep") from None
    except ValueError as e:  # json.JSONDecodeError and int()'s own limits
        raise BoundedJSONError(str(e)) from None
    if depth(value) > max_depth:
        raise BoundedJSONError(f"nested more than {max_depth} levels deep")
    return value


def bounded_int(text: str) -> int:
    """int(text) for a CSV cell, refusing (ValueError) a number of over MAX_INT_DIGITS digits before Python's
    own 4,300-digit limit turns it into a different error."""
    stripped = text.strip().lstrip("+-").replace("_", "")
    if len(stripped) > MAX_INT_DIGITS:
        raise ValueError(f"an integer of {len(stripped)} digits (at most {MAX_INT_DIGITS})")
    return int(text)
