"""Typed extra features: `--features=score:float,size:int[2],tags:string_list` and the values of a row.

A feature is a manifest (or --metadata) column written into every Example under its own name:

    int, float, string              one value           tf.io.FixedLenFeature([])
    int[N], float[N], string[N]     exactly N values    tf.io.FixedLenFeature([N])
    int_list, float_list,           any number (0 too)  tf.io.VarLenFeature (or tf.io.RaggedFeature)
    string_list

int is int64, float is float32 (as a tf.train.Example stores them), string is UTF-8 bytes.

`parse_value` turns one cell (CSV text, or a JSON Lines value) into the tuple of values to write, or raises
BadValue naming what is wrong. The typed values travel with the ImageRef as `extras`: a tuple of
(key, dtype, values) triples, self-describing, so that the writer needs no schema of its own.
"""

from __future__ import annotations

import json
import math
import re
import struct
from typing import NamedTuple

from transforms.base import bounded
from transforms.base.dataset_format import SCHEMAS

BAD_VALUE = "manifest_bad_value"
METADATA_BAD_VALUE = "metadata_bad_value"

BASE_TYPES = {"int": "int64", "float": "float", "string": "string"}
TYPE_NAMES = ("int", "float", "string", "int[N]", "float[N]", "string[N]", "int_list", "float_list", "string_list")
ACCEPTED_TYPES = ", ".join(TYPE_NAMES)
NAME = re.compile(r"[a-z][a-z0-9_]*")
MAX_FIXED_LENGTH = 1_000_000

# Columns the manifest itself reads (path, label, split; labels with --multi_label; group, a split group):
# never features.
RESERVED_COLUMNS = ("path", "label", "split", "labels", "group")
# Every key and field name of every schema, and each first part of a nested key ('image' of 'image/encoded'):
# a feature by such a name would overwrite a stored key, or be both a leaf and a parent in TFDS's features.
SCHEMA_NAMES = frozenset(
    {field for keys in SCHEMAS.values() for field in keys}
    | {key for keys in SCHEMAS.values() for key, _ in keys.values()}
    | {key.split("/")[0] for keys in SCHEMAS.values() for key, _ in keys.values()}
)
INT64_MIN, INT64_MAX = -(2 ** 63), 2 ** 63 - 1
FLOAT32_MAX = struct.unpack("<f", struct.pack("<I", 0x7F7FFFFF))[0]


class FeatureType(NamedTuple):
    """One extra feature: its key (the column's name), its dtype (int64, float, string) and its shape:
    length 0 = one value (shape []), N > 0 = exactly N values (shape [N]), None = a list of any length."""

    name: str
    dtype: str
    length: int | None = 0
    declared: bool = True  # False: a column without a --features type, stored as string

    @property
    def type_name(self) -> str:
        base = {"int64": "int", "float": "float", "string": "string"}[self.dtype]
        if self.length is None:
            return f"{base}_list"
        return f"{base}[{self.length}]" if self.length else base

    @property
    def var_len(self) -> bool:
        return self.length is None

    def describe(self) -> dict:
        """As image_tfrecords.json's "features" lists it: dtype (int64, float32, string), shape ([] or [N],
        [-1] for a list of any length), and var_len."""
        return {
            "dtype": {"int64": "int64", "float": "float32", "string": "string"}[self.dtype],
            "shape": [-1] if self.length is None else ([self.length] if self.length else []),
            "field": self.name,
            "extra": True,
            "type": self.type_name,
            "var_len": self.length is None,
        }


class BadValue(ValueError):
    """A cell that is not of its column's declared type."""


def parse_type(name: str, text: str) -> FeatureType:
    """A FeatureType from a type name (int, float[4], string_list, ...); ValueError naming the accepted types."""
    kind = text.strip().lower()
    match = re.fullmatch(r"(int|float|string)(?:\[\s*(\d+)\s*\]|(_list))?", kind)
    if not match:
        raise ValueError(f"gives {name!r} the type {text.strip()!r}, which is not a type: the types are "
                         f"{ACCEPTED_TYPES} (N a positive length, e.g. float[4])")
    dtype = BASE_TYPES[match.group(1)]
    if match.group(3):
        return FeatureType(name, dtype, None)
    if match.group(2) is not None:
        digits = match.group(2)  # int() refuses 4,300 digits; any length of over 7 is out of range anyway
        length = int(digits) if len(digits) <= len(str(MAX_FIXED_LENGTH)) else MAX_FIXED_LENGTH + 1
        if not 1 <= length <= MAX_FIXED_LENGTH:
            raise ValueError(f"gives {name!r} the type {text.strip()!r}: N in {match.group(1)}[N] must be 1 to "
                             f"{MAX_FIXED_LENGTH} (use {match.group(1)} for one value, {match.group(1)}_list "
                             "for any number)")
        return FeatureType(name, dtype, length)
    return FeatureType(name, dtype, 0)


def check_name(name: str) -> str | None:
    """Why `name` cannot be a feature's name, or None."""
    if not NAME.fullmatch(name):
        return "a feature name is lower-case letters, digits and _, starting with a letter"
    if name in RESERVED_COLUMNS:
        return f"{name!r} is a manifest column of its own ({', '.join(RESERVED_COLUMNS)})"
    if name in SCHEMA_NAMES:
        return (f"{name!r} is a key the Examples already hold ({', '.join(sorted(SCHEMA_NAMES))}); rename the "
                "column")
    return None


def parse_spec(text: str) -> tuple[FeatureType, ...]:
    """--features 'name:type,name:type' (or a JSON object {name: type}) -> FeatureTypes, in the order given.

    Raises:
        ValueError: naming the bad entry and what is accepted.
    """
    text = text.strip()
    if text.startswith("{"):
        try:
            pairs = bounded.loads(text)
        except ValueError as e:
            raise ValueError(f"is not a JSON object of name: type ({e})") from None
        if not isinstance(pairs, dict) or not all(isinstance(v, str) for v in pairs.values()):
            raise ValueError('is not a JSON object of name: type, such as {"score": "float", "box": "float[4]"}')
        entries = list(pairs.items())
    else:
        entries = []
        for part in text.split(","):
            if not part.strip():
                continue
            name, colon, kind = part.partition(":")
            if not colon:
                raise ValueError(f"has {part.strip()!r} without a type: give name:type, such as score:float "
                                 f"(types: {ACCEPTED_TYPES})")
            entries.append((name, kind))
    if not entries:
        raise ValueError("names no feature: give name:type,..., such as score:float,box:float[4]")
    out, seen = [], set()
    for name, kind in entries:
        name = name.strip().lower()
        problem = check_name(name)
        if problem:
            raise ValueError(f"names the feature {name!r}: {problem}")
        if name in seen:
            raise ValueError(f"names the feature {name!r} twice: give each once")
        seen.add(name)
        out.append(parse_type(name, kind))
    return tuple(out)


def format_spec(features) -> str:
    """The --features text of `features` (as image_tfrecords.json records it)."""
    return ",".join(f"{f.name}:{f.type_name}" for f in features)


def with_columns(declared: tuple[FeatureType, ...], columns: list[str]) -> tuple[tuple[FeatureType, ...], list[str],
                                                                                list[str]]:
    """The features of a file whose columns are `columns`: the declared ones, then every other column that can be
    a feature, as string. Returns (features, undeclared columns stored as string, columns left out with why)."""
    names = {f.name for f in declared}
    stored, left_out, features = [], [], list(declared)
    for column in columns:
        if column in names or column in RESERVED_COLUMNS:
            continue
        problem = check_name(column)
        if problem:
            left_out.append(column)
            continue
        names.add(column)
        stored.append(column)
        features.append(FeatureType(column, "string", 0, declared=False))
    return tuple(features), stored, left_out


def _shown(raw) -> str:
    text = raw if isinstance(raw, str) else json.dumps(raw)
    return repr(text if len(text) <= 80 else text[:77] + "...")


def _items(feature: FeatureType, raw) -> list:
    """The cell as a list of raw items: a JSON list as it is, CSV text split on ';' (or read as a JSON array)."""
    if isinstance(raw, list):
        return raw
    if isinstance(raw, str):
        text = raw.strip()
        if text.startswith("["):
            try:
                value = bounded.loads(text)
            except ValueError as e:  # not JSON, or beyond its bounds (nested too deep, an int of 5,000 digits)
                raise BadValue(f"starts with '[' but is not a JSON array within bounds ({str(e)[:80]})") from None
            if not isinstance(value, list):
                raise BadValue("is not a JSON array")
            return value
        if not text:
            return []
        return [item.strip() for item in text.split(";")]
    return [raw]


def _one(dtype: str, item):
    """One value of `dtype` from a raw item (text, or a JSON number/string); BadValue when it is not one."""
    if dtype == "string":
        if item is None or isinstance(item, list | dict):
            raise BadValue(f"{_shown(item)} is not a string")
        text = item if isinstance(item, str) else json.dumps(item)  # a JSON number or boolean as its JSON text
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise BadValue(f"{ascii(text)[:80]} is not UTF-8 text (it holds a lone surrogate)") from None
        return text
    if isinstance(item, bool) or item is None or isinstance(item, list | dict):
        raise BadValue(f"{_shown(item)} is not {'an int' if dtype == 'int64' else 'a float'}")
    if dtype == "int64":
        if isinstance(item, float):
            raise BadValue(f"{item!r} is not an int")
        if isinstance(item, str):
            text = item.strip()
            if not re.fullmatch(r"[+-]?\d+", text):
                raise BadValue(f"{_shown(item)} is not an int" if text else "an empty value is not an int")
            try:
                item = bounded.bounded_int(text)
            except ValueError:
                raise BadValue(f"{_shown(item)} is out of the int64 range") from None
        if not INT64_MIN <= item <= INT64_MAX:
            raise BadValue(f"{item} is out of the int64 range")
        return item
    if isinstance(item, str):
        text = item.strip()
        try:
            value = float(text)
        except ValueError:
            raise BadValue(f"{_shown(item)} is not a float" if text else "an empty value is not a float") from None
    else:
        try:
            value = float(item)
        except OverflowError:  # a JSON int beyond a double
            raise BadValue(f"{_shown(item)} is out of the float32 range") from None
    if not math.isfinite(value):
        raise BadValue(f"{_shown(item)} is not a finite number (NaN and infinity are refused)")
    if abs(value) > FLOAT32_MAX:
        raise BadValue(f"{_shown(item)} is out of the float32 range")
    return value


def parse_value(feature: FeatureType, raw) -> tuple:
    """The values to write for `feature` from a cell: CSV text, or a JSON Lines value (None when absent).

    Raises:
        BadValue: naming what is wrong (the caller adds the row and the column).
    """
    if feature.length == 0:  # one value
        if raw is None or (isinstance(raw, str) and not raw.strip() and feature.dtype != "string"):
            if feature.dtype == "string":
                return ("",)
            raise BadValue("no value")
        if isinstance(raw, list):
            raise BadValue(f"{_shown(raw)} is a list, not one {feature.type_name}")
        return (_one(feature.dtype, raw),)
    if raw is None:
        items = []
    else:
        items = _items(feature, raw)
    values = tuple(_one(feature.dtype, item) for item in items)
    if feature.length is not None and len(values) != feature.length:
        raise BadValue(f"{len(values)} value(s), not {feature.length}")
    return values


def row_extras(features: tuple[FeatureType, ...], fields: dict) -> tuple:
    """The extras of a row's {column: value}: ((key, dtype, values), ...) in `features`' order.

    Raises:
        BadValue: naming the column, the value and the expected type.
    """
    out = []
    for feature in features:
        raw = fields.get(feature.name)
        if not feature.declared and raw is not None and not isinstance(raw, str):
            raw = json.dumps(raw, ensure_ascii=False)  # a column without a type keeps any JSON value, as its text
        try:
            out.append((feature.name, feature.dtype, parse_value(feature, raw)))
        except BadValue as e:
            shown = "no value" if raw is None else _shown(raw)
            raise BadValue(f"column {feature.name!r} = {shown}: {e}; expected {feature.type_name}") from None
    return tuple(out)


def extras_bytes(extras: tuple) -> int:
    """The bytes that `extras` add to a serialized Example (its map entries)."""
    from transforms.base.examples import build_example

    empty = dict(image=b"", image_format="", label=0, class_name="", height=0, width=0, source_path="")
    return len(build_example(**empty, extras=extras)) - len(build_example(**empty))


def mean_extras_bytes(features: tuple, rows) -> float:
    """The mean bytes the features add to a record, over sample rows ({column: value} each); 0 without any."""
    sizes = []
    for fields in rows:
        try:
            sizes.append(extras_bytes(row_extras(features, fields)))
        except BadValue:
            continue  # the job rejects that row
    return sum(sizes) / len(sizes) if sizes else 0.0


def describe(features) -> dict:
    """{key: description} of the extra features, for image_tfrecords.json's "features"."""
    return {f.name: f.describe() for f in features}


def from_description(features: dict) -> tuple[FeatureType, ...]:
    """The extra features that image_tfrecords.json's "features" describes (those marked extra)."""
    out = []
    for key, entry in (features or {}).items():
        if not isinstance(entry, dict) or not entry.get("extra"):
            continue
        if not isinstance(entry.get("type"), str):
            raise ValueError(f"the type of {key!r} is {json.dumps(entry.get('type'))[:40]}, not a type name")
        out.append(parse_type(key, entry["type"]))
    return tuple(out)
