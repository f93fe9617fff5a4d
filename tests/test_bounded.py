"""transforms/bounded.py: JSON and int cells within bounds, every excess one ValueError with its reason."""

import pytest

from transforms import bounded


def test_loads_reads_ordinary_json():
    assert bounded.loads('{"a": [1, 2.5, "x", null, true]}') == {"a": [1, 2.5, "x", None, True]}
    assert bounded.loads(b'{"k": -9223372036854775808}') == {"k": -(2 ** 63)}


@pytest.mark.parametrize("text, reason", [
    ("[" * 100_000 + "]" * 100_000, "nested more than 64 levels"),
    ("[" * 65 + "]" * 65, "nested more than 64 levels"),
    ('{"a": ' * 70 + "1" + "}" * 70, "nested more than 64 levels"),
    ("1" * 5000, "an integer of 5000 digits"),
    ('{"score": ' + "9" * 41 + "}", "an integer of 41 digits"),
    ("1e400", "beyond a double's range"),
    ("-1e999", "beyond a double's range"),
    ("NaN", "NaN is not a JSON number"),
    ('[Infinity]', "Infinity is not a JSON number"),
    ("{", "Expecting property name"),
    (b"\xff{}", "not UTF-8"),
])
def test_loads_refuses_beyond_bounds(text, reason):
    with pytest.raises(ValueError, match=reason):
        bounded.loads(text)


def test_depth_is_exact():
    assert bounded.depth(1) == 0
    assert bounded.depth([]) == 1
    assert bounded.depth({"a": [[1], {"b": 2}]}) == 3
    assert bounded.loads("[" * 64 + "]" * 64) is not None


def test_bounded_int():
    assert bounded.bounded_int(" 42 ") == 42
    assert bounded.bounded_int("-9223372036854775808") == -(2 ** 63)
    with pytest.raises(ValueError, match="an integer of 4301 digits"):
        bounded.bounded_int("7" * 4301)
    with pytest.raises(ValueError):
        bounded.bounded_int("4x")
