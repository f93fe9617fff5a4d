"""transforms/base/bounded.py: JSON and int cells within bounds, every excess one ValueError with its reason."""

import pytest

from transforms.base import bounded


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


# --- end to end: one hostile cell is one counted rejection (or one error line), never a crash (issue 26 #7) -------

DEEP = "[" * 5000 + "]" * 5000
DIGITS = "7" * 5000  # over Python's own 4,300-digit limit of int()
HUGE = "9" * 400  # an int no double holds


def _images(src, names) -> None:
    from PIL import Image

    src.mkdir(parents=True, exist_ok=True)
    for n, name in enumerate(names):
        Image.new("RGB", (8, 8), (n * 20, 0, 0)).save(src / name)


def _convert(*argv) -> int:
    from pipeline.launcher import run
    from tests.conftest import FAST

    return run([*map(str, argv), "--quiet", "--image_size=8", "--validation_split=0", *FAST])


def _outcome(out) -> tuple[dict, dict]:
    import json

    info = json.loads((out / "image_tfrecords.json").read_text())
    errors = {e["relpath"]: e for e in map(json.loads, (out / "errors.jsonl").read_text().splitlines())}
    return info, errors


@pytest.mark.timeout(300)
def test_hostile_csv_cells_are_rejected_rows(tmp_path):
    src = tmp_path / "in"
    _images(src, [f"{i}.png" for i in range(6)])
    rows = [("0.png", "1", "1;2", "0.5"), ("1.png", DIGITS, "", "0.5"), ("2.png", "1", DEEP, "0.5"),
            ("3.png", "1", f"[{HUGE}]", "0.5"), ("4.png", HUGE, "", "0.5"), ("5.png", "1", "", "1" + "0" * 400)]
    (src / "list.csv").write_text("path,label,score,tags,weight\n"
                                  + "".join(f"{p},cat,{s},{t},{w}\n" for p, s, t, w in rows))
    out = tmp_path / "out"
    assert _convert(f"--manifest={src / 'list.csv'}", f"--output_dir={out}",
                    "--features=score:int,tags:int_list,weight:float") == 0
    info, errors = _outcome(out)
    assert info["files"] == {"found": 6, "written": 1, "rejected": 5, "skipped": 0, "upscaled": 0}
    assert {path: e["reason"] for path, e in errors.items()} == {f"{i}.png": "manifest_bad_value" for i in range(1, 6)}
    assert "column 'score'" in errors["1.png"]["detail"] and "out of the int64 range" in errors["1.png"]["detail"]
    assert "nested more than 64 levels deep" in errors["2.png"]["detail"]
    assert "an integer of 400 digits (at most 40)" in errors["3.png"]["detail"]
    assert "column 'score'" in errors["4.png"]["detail"] and "out of the int64 range" in errors["4.png"]["detail"]
    assert "column 'weight'" in errors["5.png"]["detail"]
    assert all(len(e["detail"]) < 400 for e in errors.values())  # the cell is quoted in part only


@pytest.mark.timeout(300)
def test_hostile_json_lines_rows_are_rejected_rows(tmp_path):
    src = tmp_path / "in"
    _images(src, [f"{i}.png" for i in range(5)])
    lines = ['{"path": "0.png", "label": "cat", "score": 1}',
             '{"path": "1.png", "label": "cat", "score": 1, "x": ' + DEEP + '}',
             '{"path": "2.png", "label": "cat", "score": ' + DIGITS + '}',
             '{"path": "3.png", "label": "cat", "score": ' + HUGE + '}',
             '{"path": "4.png", "label": "cat", "score": 1e999}']
    (src / "list.jsonl").write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    assert _convert(f"--manifest={src / 'list.jsonl'}", f"--output_dir={out}", "--features=score:float") == 0
    info, errors = _outcome(out)
    assert info["files"]["found"] == 5 and info["files"]["written"] == 1 and info["files"]["rejected"] == 4
    assert sum(info["rejected_by_reason"].values()) == 4 and len(errors) == 4
    reasons = " | ".join(e["detail"] for e in errors.values())
    for why in ("nested more than 64 levels deep", "an integer of 5000 digits", "an integer of 400 digits",
                "beyond a double's range"):
        assert why in reasons, reasons


@pytest.mark.timeout(300)
def test_hostile_metadata_rows_are_rejected_images(tmp_path):
    src = tmp_path / "in"
    _images(src / "cat", [f"{i}.png" for i in range(4)])
    lines = ['{"path": "cat/0.png", "score": 1}',
             '{"path": "cat/1.png", "score": 1, "x": ' + DEEP + '}',
             '{"path": "cat/2.png", "score": ' + DIGITS + '}',
             '{"path": "cat/3.png", "score": ' + HUGE + '}']
    (tmp_path / "meta.jsonl").write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    assert _convert(f"--input_dir={src}", f"--output_dir={out}", f"--metadata={tmp_path / 'meta.jsonl'}",
                    "--features=score:float") == 0
    info, errors = _outcome(out)
    assert info["files"]["found"] == 4 and info["files"]["written"] == 1
    assert info["files"]["rejected"] + info["files"]["skipped"] == 3 and len(errors) == 3, errors
    assert set(errors) == {"cat/1.png", "cat/2.png", "cat/3.png"}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("schema, why", [
    ('{"score": ' + DEEP + '}', "nested more than 64 levels deep"),
    ('{"score": "float", "n": ' + DIGITS + '}', "an integer of 5000 digits"),
])
def test_a_hostile_schema_file_is_one_error_line(tmp_path, schema, why, capsys):
    from tests.conftest import main_in_process

    src = tmp_path / "in"
    _images(src, ["0.png"])
    (src / "list.csv").write_text("path,label,score\n0.png,cat,1\n")
    (tmp_path / "schema.json").write_text(schema)
    code, stderr = main_in_process(capsys, f"--manifest={src / 'list.csv'}", f"--output_dir={tmp_path / 'out'}",
                                   f"--features=@{tmp_path / 'schema.json'}", "--quiet")
    lines = stderr.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: --features"), lines
    assert why in lines[0], lines
