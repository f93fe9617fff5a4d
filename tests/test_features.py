"""--features: typed extra manifest columns written into each Example; --metadata: the same for class folders."""

from __future__ import annotations

import csv
import json
import re

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from pipeline.errors import UserError
from pipeline.launcher import run
from tests.conftest import FAST, doc_examples, main_in_process
from transforms.base import features as F

SPEC = "score:float,size:int[2],box:float[4],float_data:float_list,source:string,tags:string_list"
# The hand-typed spec a user writes to read them back with plain TensorFlow.
PLAIN_SPEC = {
    "source_path": tf.io.FixedLenFeature([], tf.string),
    "label": tf.io.FixedLenFeature([], tf.int64),
    "score": tf.io.FixedLenFeature([], tf.float32),
    "size": tf.io.FixedLenFeature([2], tf.int64),
    "box": tf.io.FixedLenFeature([4], tf.float32),
    "float_data": tf.io.VarLenFeature(tf.float32),
    "source": tf.io.FixedLenFeature([], tf.string),
    "tags": tf.io.VarLenFeature(tf.string),
}


def _images(folder, n, colour=(200, 30, 30)):
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        Image.new("RGB", (16, 16), (colour[0], (colour[1] + 20 * i) % 256, colour[2])).save(folder / f"{i}.png")
    return [f"{i}.png" for i in range(n)]


def _run(out, *args):
    return run([f"--output_dir={out}", "--quiet", "--image_size=16", *args, *FAST])


def _plain(out) -> dict:
    """{source_path: parsed features} of every record, read with tf.io.parse_single_example and PLAIN_SPEC."""
    got = {}
    for shard in sorted(out.glob("*.tfrecord")):
        for raw in tf.data.TFRecordDataset(str(shard)):
            parsed = tf.io.parse_single_example(raw, PLAIN_SPEC)
            got[parsed["source_path"].numpy().decode()] = {
                "score": float(parsed["score"].numpy()),
                "size": parsed["size"].numpy().tolist(),
                "box": np.round(parsed["box"].numpy(), 5).tolist(),
                "float_data": np.round(tf.sparse.to_dense(parsed["float_data"]).numpy(), 5).tolist(),
                "source": parsed["source"].numpy().decode(),
                "tags": [t.decode() for t in tf.sparse.to_dense(parsed["tags"]).numpy().tolist()],
            }
    return got


def _errors(out):
    path = out / "errors.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _info(out):
    return json.loads((out / "image_tfrecords.json").read_text())


def _expected(i):
    return {"score": i / 4, "size": [i, 100 + i], "box": [0.5, 0.25, 1.0, float(i)],
            "float_data": [float(k) / 2 for k in range(i)], "source": f"cam{i}", "tags": ["t"] * (i % 3)}


def _accounting_holds(info):
    files = info["files"]
    assert files["found"] == files["written"] + files["rejected"] + files["skipped"]


# --- parsing one value ----------------------------------------------------------------------------------------


def test_parse_spec_types_and_json_form():
    got = F.parse_spec(SPEC)
    assert [(f.name, f.dtype, f.length) for f in got] == [
        ("score", "float", 0), ("size", "int64", 2), ("box", "float", 4), ("float_data", "float", None),
        ("source", "string", 0), ("tags", "string", None)]
    assert F.format_spec(got) == SPEC
    assert F.parse_spec('{"score": "float", "box": "float[4]"}') == F.parse_spec("score:float,box:float[4]")
    for bad, says in (("x:double", "the types are int, float, string, int[N]"), ("x", "without a type"),
                      ("image:int", "key the Examples already hold"), ("label:string", "manifest column"),
                      ("x:int,x:float", "twice"), ("x:int[0]", "1 to"), ("Bad-name:int", "lower-case")):
        with pytest.raises(ValueError, match=re.escape(says)):
            F.parse_spec(bad)


@pytest.mark.parametrize("type_name, raw, values", [
    ("int", "42", (42,)), ("int", " -7 ", (-7,)), ("int", 5, (5,)), ("int", str(2 ** 63 - 1), (2 ** 63 - 1,)),
    ("float", "0.5", (0.5,)), ("float", 3, (3.0,)), ("string", "", ("",)), ("string", 12, ("12",)),
    ("string", True, ("true",)),
    ("string", None, ("",)), ("int[2]", "1;2", (1, 2)), ("int[2]", "[1, 2]", (1, 2)), ("int[2]", [3, 4], (3, 4)),
    ("float_list", "", ()), ("float_list", None, ()), ("float_list", [], ()), ("float_list", "1; 2.5", (1.0, 2.5)),
    ("string_list", "a; b", ("a", "b")), ("string_list", '["a;b", "c"]', ("a;b", "c")),
    ("string[2]", ["x", "y"], ("x", "y")),
])
def test_parse_value_accepts(type_name, raw, values):
    assert F.parse_value(F.parse_type("c", type_name), raw) == values


@pytest.mark.parametrize("type_name, raw, says", [
    ("int", "abc", "is not an int"), ("int", "1.5", "is not an int"), ("int", 1.5, "is not an int"),
    ("int", "", "no value"), ("int", None, "no value"), ("int", str(2 ** 63), "out of the int64 range"),
    ("int", True, "is not an int"), ("string", [1], "is a list"),
    ("float", "nan", "not a finite number"), ("float", "inf", "not a finite"),
    ("float", "1e39", "out of the float32 range"), ("float", "x", "is not a float"), ("float", [1.0], "is a list"),
    ("int[2]", "1", "1 value(s), not 2"), ("int[2]", "", "0 value(s), not 2"), ("float[4]", "[1, 2", "JSON array"),
    ("string", {"a": 1}, "is not a string"), ("string", "a\ud800", "not UTF-8 text"),
    ("string_list", ["ok", "\udcff"], "not UTF-8 text"), ("int_list", "1;;2", "an empty value is not an int"),
])
def test_parse_value_refuses(type_name, raw, says):
    with pytest.raises(F.BadValue, match=re.escape(says)):
        F.parse_value(F.parse_type("c", type_name), raw)


# --- end to end ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def csv_dataset(tmp_path_factory):
    """A CSV manifest (written with the csv module) of 6 images with every kind of feature, converted as
    tfrecords/."""
    root = tmp_path_factory.mktemp("csvfeat")
    names = _images(root / "data" / "a", 6)
    rows = [("path", "label", "score", "size", "box", "float_data", "source", "tags", "note")]
    for i, name in enumerate(names):
        e = _expected(i)
        rows.append((f"a/{name}", "ab"[i % 2], str(e["score"]), f"{i};{100 + i}", f"[0.5, 0.25, 1.0, {i}]",
                     ";".join(str(v) for v in e["float_data"]), e["source"], ";".join(e["tags"]), f"note {i}"))
    with open(root / "data" / "list.csv", "w", newline="") as f:
        csv.writer(f).writerows(rows)
    out = root / "tfrecords"
    assert _run(out, f"--manifest={root / 'data' / 'list.csv'}", f"--features={SPEC}", "--validation_split=0") == 0
    return out


@pytest.mark.timeout(300)
def test_csv_manifest_features_read_back_with_plain_tensorflow(csv_dataset):
    got = _plain(csv_dataset)
    assert got == {f"a/{i}.png": _expected(i) for i in range(6)}
    # The column without a type is kept, as a string.
    raw = next(iter(tf.data.TFRecordDataset(str(next(csv_dataset.glob("*.tfrecord"))))))
    note = tf.io.parse_single_example(raw, {"note": tf.io.FixedLenFeature([], tf.string)})["note"].numpy()
    assert re.fullmatch(rb"note \d", note)


@pytest.mark.timeout(300)
def test_dataset_description_lists_each_feature_type(csv_dataset):
    info = _info(csv_dataset)
    features = info["features"]
    assert features["score"] | {} == {"dtype": "float32", "shape": [], "field": "score", "extra": True,
                                      "type": "float", "var_len": False}
    assert (features["size"]["dtype"], features["size"]["shape"]) == ("int64", [2])
    assert (features["box"]["dtype"], features["box"]["shape"]) == ("float32", [4])
    assert (features["float_data"]["shape"], features["float_data"]["var_len"]) == ([-1], True)
    assert (features["tags"]["dtype"], features["tags"]["shape"]) == ("string", [-1])
    assert (features["note"]["type"], features["source"]["type"]) == ("string", "string")
    assert features["image"]["dtype"] == "string" and "extra" not in features["image"]
    assert info["options"]["features"] == SPEC


@pytest.mark.timeout(300)
def test_reader_make_dataset_parses_the_extra_features(csv_dataset):
    from pipeline import reader

    batches = list(reader.make_dataset(str(csv_dataset), "train", batch_size=3, decode=False))
    assert len(batches) == 2
    got = {}
    for batch in batches:
        assert batch["size"].shape == (3, 2) and batch["box"].shape == (3, 4) and batch["score"].shape == (3,)
        assert isinstance(batch["float_data"], tf.RaggedTensor) and isinstance(batch["tags"], tf.RaggedTensor)
        for j in range(3):
            got[batch["source_path"][j].numpy().decode()] = (
                batch["size"][j].numpy().tolist(), np.round(batch["float_data"][j].numpy(), 5).tolist(),
                [t.decode() for t in batch["tags"][j].numpy().tolist()])
    assert got == {f"a/{i}.png": (_expected(i)["size"], _expected(i)["float_data"], _expected(i)["tags"])
                   for i in range(6)}
    one = next(iter(reader.make_dataset(str(csv_dataset), "train", decode=False)))
    assert one["float_data"].dtype == tf.float32 and one["float_data"].shape.rank == 1
    info = reader.load_info(str(csv_dataset))
    spec = reader.feature_spec(info["schema"], extras=reader.extra_features(info))
    assert spec["size"] == tf.io.FixedLenFeature([2], tf.int64) and spec["score"] == tf.io.FixedLenFeature(
        [], tf.float32)
    raw = next(iter(tf.data.TFRecordDataset(str(next(csv_dataset.glob("*.tfrecord"))))))
    parsed = tf.io.parse_single_example(raw, spec)
    i = round(float(parsed["score"].numpy()) * 4)
    assert parsed["tags"].numpy().tolist() == [b"t"] * (i % 3) and parsed["note"].numpy() == f"note {i}".encode()


@pytest.mark.timeout(300)
def test_tfds_loads_the_extra_features(csv_dataset):
    tfds = pytest.importorskip("tensorflow_datasets")
    builder = tfds.builder_from_directory(str(csv_dataset))
    for key in ("score", "size", "box", "float_data", "source", "tags", "note"):
        assert key in builder.info.features
    got = {}
    for ex in builder.as_dataset(split="train"):
        got[ex["source_path"].numpy().decode()] = (ex["size"].numpy().tolist(),
                                                   np.round(ex["float_data"].numpy(), 5).tolist(),
                                                   ex["source"].numpy().decode())
    assert got == {f"a/{i}.png": (_expected(i)["size"], _expected(i)["float_data"], f"cam{i}") for i in range(6)}


@pytest.mark.timeout(300)
def test_doc_examples_read_the_features(csv_dataset, monkeypatch):
    blocks = doc_examples("docs/manifest.md", section="## Typed extra features")
    assert len(blocks) == 2
    monkeypatch.chdir(csv_dataset.parent)  # the examples read tfrecords/
    namespace: dict = {}
    exec(compile(blocks[0], "docs/manifest.md", "exec"), namespace)
    batch = namespace["batch"]
    assert batch["score"].shape == (2,) and batch["size"].shape == (2, 2)
    assert isinstance(batch["float_data"], tf.RaggedTensor)
    namespace = {}
    exec(compile(blocks[1], "docs/manifest.md", "exec"), namespace)
    example, float_data = namespace["example"], namespace["float_data"]
    i = round(float(example["score"].numpy()) * 4)  # score = i / 4
    assert example["size"].numpy().tolist() == _expected(i)["size"]
    assert np.round(float_data.numpy(), 5).tolist() == _expected(i)["float_data"]


@pytest.mark.timeout(300)
def test_pandas_csv_and_json_lines_manifests(tmp_path):
    pd = pytest.importorskip("pandas")
    names = _images(tmp_path / "data" / "a", 4)
    frame = pd.DataFrame({
        "path": [f"a/{n}" for n in names], "label": ["x", "y", "x", "y"],
        "score": [_expected(i)["score"] for i in range(4)],
        "size": [_expected(i)["size"] for i in range(4)],
        "box": [_expected(i)["box"] for i in range(4)],
        "float_data": [_expected(i)["float_data"] for i in range(4)],
        "source": [f"cam{i}" for i in range(4)],
        "tags": [_expected(i)["tags"] for i in range(4)],
    })
    as_csv = frame.copy()  # a list column as a;b;c text
    for column in ("size", "box", "float_data", "tags"):
        as_csv[column] = as_csv[column].map(lambda v: ";".join(str(x) for x in v))
    as_csv.to_csv(tmp_path / "data" / "list.csv", index=False)
    frame.to_json(tmp_path / "data" / "list.jsonl", orient="records", lines=True)
    expected = {f"a/{i}.png": _expected(i) for i in range(4)}
    for name in ("list.csv", "list.jsonl"):
        out = tmp_path / f"out-{name}"
        assert _run(out, f"--manifest={tmp_path / 'data' / name}", f"--features={SPEC}", "--validation_split=0") == 0
        assert _plain(out) == expected, name
    # The same JSON Lines written with the json module, the spec from a schema file.
    with open(tmp_path / "data" / "plain.jsonl", "w") as f:
        for i, n in enumerate(names):
            f.write(json.dumps({"path": f"a/{n}", "label": "xy"[i % 2], **_expected(i)}) + "\n")
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps(dict(part.split(":") for part in SPEC.split(","))))
    out = tmp_path / "out-plain"
    assert _run(out, f"--manifest={tmp_path / 'data' / 'plain.jsonl'}", f"--features=@{schema}",
                "--validation_split=0") == 0
    assert _plain(out) == expected
    assert _info(out)["options"]["features"] == SPEC


@pytest.mark.timeout(300)
def test_bad_values_reject_their_rows_with_row_number_column_value_and_type(tmp_path):
    names = _images(tmp_path / "data" / "a", 9)
    rows = [("path", "label", "score", "size")]
    values = [("0.5", "1;2"), ("abc", "1;2"), ("nan", "1;2"), ("1", str(2 ** 63) + ";1"), ("1", "1.5;2"),
              ("", "1;2"), ("1", "1;2;3"), ("1", "[1, 2"), ("2.5", "[3, 4]")]
    for name, (score, size) in zip(names, values, strict=True):
        rows.append((f"a/{name}", "c", score, size))
    with open(tmp_path / "data" / "list.csv", "w", newline="") as f:
        csv.writer(f).writerows(rows)
    out = tmp_path / "out"
    assert _run(out, f"--manifest={tmp_path / 'data' / 'list.csv'}", "--features=score:float,size:int[2]",
                "--validation_split=0") == 0
    errors = {e["relpath"]: e for e in _errors(out)}
    assert set(errors) == {f"a/{i}.png" for i in range(1, 8)}
    assert {e["reason"] for e in errors.values()} == {"manifest_bad_value"}
    assert {e["stage"] for e in errors.values()} == {"rejected"}
    details = {path: e["detail"] for path, e in errors.items()}
    assert details["a/1.png"] == "row 2: column 'score' = 'abc': 'abc' is not a float; expected float"
    assert details["a/2.png"].startswith("row 3: column 'score' = 'nan'") and "finite" in details["a/2.png"]
    assert details["a/3.png"].startswith("row 4: column 'size'") and "int64 range" in details["a/3.png"]
    assert details["a/4.png"] == "row 5: column 'size' = '1.5;2': '1.5' is not an int; expected int[2]"
    assert details["a/5.png"] == "row 6: column 'score' = '': no value; expected float"
    assert details["a/6.png"] == "row 7: column 'size' = '1;2;3': 3 value(s), not 2; expected int[2]"
    assert details["a/7.png"].startswith("row 8: column 'size' = '[1, 2'")
    info = _info(out)
    assert info["files"] == {**info["files"], "found": 9, "written": 2, "rejected": 7, "skipped": 0}
    assert info["rejected_by_reason"] == {"manifest_bad_value": 7}
    _accounting_holds(info)
    got = {}
    for shard in out.glob("*.tfrecord"):
        for raw in tf.data.TFRecordDataset(str(shard)):
            p = tf.io.parse_single_example(raw, {k: PLAIN_SPEC[k] for k in ("source_path", "score", "size")})
            got[p["source_path"].numpy().decode()] = (float(p["score"].numpy()), p["size"].numpy().tolist())
    assert got == {"a/0.png": (0.5, [1, 2]), "a/8.png": (2.5, [3, 4])}


# --- --metadata on class folders --------------------------------------------------------------------------------


@pytest.mark.timeout(300)
@pytest.mark.parametrize("range_bytes", [0, 16], ids=["one-range", "16-byte-ranges"])
def test_metadata_joined_to_folder_images_with_missing_extra_and_bad_rows(tmp_path, monkeypatch, range_bytes):
    """The file is read in byte ranges (cut finely here: rows span ranges), every row keeping its number."""
    import transforms.inputs.rows as m

    if range_bytes:
        monkeypatch.setattr(m, "RANGE_BYTES", range_bytes)
    data = tmp_path / "photos"
    for cls, colour in (("cat", (200, 30, 30)), ("dog", (30, 30, 200))):
        _images(data / cls, 4, colour)
    rows = [("path", "score", "box", "tags")]
    for cls in ("cat", "dog"):
        for i in range(4):
            if (cls, i) == ("cat", 3):
                continue  # no row: metadata_missing
            rows.append((f"{cls}/{i}.png" if cls == "cat" else f"./{cls}/{i}.png", str(i + 0.5),
                         "1;2;3;4" if (cls, i) != ("dog", 2) else "1;2", f"{cls};{i}"))
    rows.append(("cat/none.png", "1", "1;2;3;4", ""))  # no such image
    rows.append(("cat/0.png", "9", "9;9;9;9", ""))  # a second row for cat/0.png: the first is used
    rows.append(("cat/1.png", "1"))  # too few fields
    meta = tmp_path / "meta.csv"
    with open(meta, "w", newline="") as f:
        csv.writer(f).writerows(rows)
    out = tmp_path / "out"
    assert _run(out, f"--input_dir={data}", f"--metadata={meta}", "--features=score:float,box:float[4]",
                "--validation_split=0") == 0
    errors = {e["relpath"]: e for e in _errors(out)}
    assert errors["cat/3.png"]["reason"] == "metadata_missing" and errors["cat/3.png"]["stage"] == "skipped"
    assert errors["dog/2.png"]["reason"] == "metadata_bad_value"
    assert errors["dog/2.png"]["detail"] == ("metadata row 6: column 'box' = '1;2': 2 value(s), not 4; "
                                             "expected float[4]")
    assert set(errors) == {"cat/3.png", "dog/2.png"}
    info = _info(out)
    assert info["files"]["found"] == 8 and info["files"]["written"] == 6
    _accounting_holds(info)
    assert info["metadata"] == {
        "rows": 10, "joined": 6, "bad_rows": 1, "duplicate_rows": 1, "unmatched_rows": 1, "spanning_rows": 0,
        "examples": {"bad_rows": [{"row": 10, "detail": "2 fields, the header has 4"}],
                     "duplicate_rows": [{"row": 9, "detail": "cat/0.png (first in row 1)"}],
                     "unmatched_rows": [{"row": 8, "detail": "cat/none.png"}]}}
    assert info["features"]["box"]["shape"] == [4] and info["features"]["tags"]["type"] == "string"
    got = {}
    for shard in out.glob("*.tfrecord"):
        for raw in tf.data.TFRecordDataset(str(shard)):
            p = tf.io.parse_single_example(raw, {"source_path": tf.io.FixedLenFeature([], tf.string),
                                                 "score": tf.io.FixedLenFeature([], tf.float32),
                                                 "box": tf.io.FixedLenFeature([4], tf.float32),
                                                 "tags": tf.io.FixedLenFeature([], tf.string)})
            got[p["source_path"].numpy().decode()] = (float(p["score"].numpy()), p["box"].numpy().tolist(),
                                                      p["tags"].numpy().decode())
    assert got == {f"{c}/{i}.png": (i + 0.5, [1.0, 2.0, 3.0, 4.0], f"{c};{i}")
                   for c in ("cat", "dog") for i in range(4) if (c, i) not in (("cat", 3), ("dog", 2))}


@pytest.mark.timeout(300)
def test_metadata_summary_line_names_rows_not_joined(tmp_path, capsys):
    data = tmp_path / "photos"
    _images(data / "cat", 2)
    _images(data / "dog", 2, (30, 30, 200))
    meta = tmp_path / "meta.jsonl"
    meta.write_text("".join(json.dumps({"path": p, "n": [1, 2]}) + "\n"
                            for p in ("cat/0.png", "cat/1.png", "dog/0.png", "dog/1.png", "dog/9.png")))
    out = tmp_path / "out"
    assert run([f"--input_dir={data}", f"--output_dir={out}", "--image_size=16", f"--metadata={meta}",
                "--features=n:int_list", *FAST]) == 0
    printed = capsys.readouterr().out
    assert "Metadata: 4 of 5 rows joined to an image; 1 row names no image to convert" in printed
    assert _info(out)["files"]["written"] == 4


# --- one-line user errors --------------------------------------------------------------------------------------


def test_user_errors_in_process(tmp_path):
    _images(tmp_path / "data" / "a", 1)
    (tmp_path / "data" / "list.csv").write_text("path,label,score\na/0.png,x,1\n")
    manifest = f"--manifest={tmp_path / 'data' / 'list.csv'}"
    meta = tmp_path / "meta.csv"
    meta.write_text("file,score\na/0.png,1\n")
    cases = [
        ([manifest, "--features=score:double"], "--features=score:double gives 'score' the type 'double', which "
                                                "is not a type: the types are int, float, string, int[N]"),
        ([manifest, "--features=height:int"], "names the feature 'height': 'height' is a key the Examples"),
        ([manifest, "--features=score:float,missing:int"], "--features types the column 'missing', which "
                                                           "--manifest"),
        ([f"--input_dir={tmp_path / 'data'}", "--features=score:float"], "--features types the extra columns of "
                                                                          "--manifest or --metadata"),
        ([manifest, f"--metadata={meta}"], "--metadata is for class folders"),
        ([f"--input_dir={tmp_path / 'data'}", f"--metadata={meta}"], "has no 'path' column"),
        ([manifest, f"--features=@{tmp_path / 'nope.json'}"], "--features file"),
    ]
    for args, says in cases:
        with pytest.raises(UserError) as e:
            _run(tmp_path / "out", *args)
        assert says in str(e.value), (args, str(e.value))
        assert "\n" not in str(e.value)
    assert not (tmp_path / "out").exists()


@pytest.mark.timeout(120)
def test_user_errors_from_the_command_line(tmp_path, capsys):
    _images(tmp_path / "data" / "a", 1)
    (tmp_path / "data" / "list.csv").write_text("path,label,score\na/0.png,x,1\n")
    code, stderr = main_in_process(capsys, f"--manifest={tmp_path / 'data' / 'list.csv'}",
                                   f"--output_dir={tmp_path / 'o'}", "--features=score:decimal")
    assert code == 2
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert lines == ["error: --features=score:decimal gives 'score' the type 'decimal', which is not a type: the "
                     "types are int, float, string, int[N], float[N], string[N], int_list, float_list, string_list "
                     "(N a positive length, e.g. float[4])"]


@pytest.mark.timeout(300)
def test_gcs_folder_metadata_and_schema_file(gcs_emulator, tmp_path):
    from tests.gcs_fixtures import NO_AUTH

    for cls, colour in (("cat", (200, 30, 30)), ("dog", (30, 30, 200))):
        _images(tmp_path / "src" / cls, 2, colour)
    bucket = gcs_emulator.create_bucket("features-e2e")
    assert gcs_emulator.upload_tree(tmp_path / "src", f"{bucket}/photos") == 4
    meta = gcs_emulator.write(f"{bucket}/meta.jsonl", "".join(
        json.dumps({"path": f"{c}/{i}.png", "size": [i, 7], "float_data": [0.5] * i}) + "\n"
        for c in ("cat", "dog") for i in range(2)))
    schema = gcs_emulator.write(f"{bucket}/schema.json", '{"size": "int[2]", "float_data": "float_list"}')
    out = tmp_path / "out"
    assert _run(out, f"--input_dir={bucket}/photos", f"--metadata={meta}", f"--features=@{schema}", NO_AUTH,
                "--validation_split=0") == 0
    info = _info(out)
    assert info["files"]["written"] == 4 and info["metadata"]["joined"] == 4
    got = {}
    for raw in tf.data.TFRecordDataset([str(p) for p in out.glob("*.tfrecord")]):
        p = tf.io.parse_single_example(raw, {k: PLAIN_SPEC[k] for k in ("source_path", "size", "float_data")})
        got[p["source_path"].numpy().decode()] = (p["size"].numpy().tolist(),
                                                  tf.sparse.to_dense(p["float_data"]).numpy().tolist())
    assert got == {f"{c}/{i}.png": ([i, 7], [0.5] * i) for c in ("cat", "dog") for i in range(2)}


@pytest.mark.timeout(300)
def test_verify_reads_the_features_with_their_recorded_types(csv_dataset, tmp_path):
    from pipeline import verify
    from tests.crafted_datasets import craft_dataset, rec, save_info

    assert verify.verify_dataset(str(csv_dataset), decode=False).problems == []
    extras = lambda box: (("box", "float", box),)  # noqa: E731
    root = craft_dataset(tmp_path / "ds", {"train": [[{**rec(0, "cat/a.jpg"), "extras": extras((1.0, 2, 3, 4))},
                                                      {**rec(1, "dog/b.jpg"), "extras": extras((1.0, 2, 3))}]]})
    info = json.loads((root / "image_tfrecords.json").read_text())
    info["features"]["box"] = F.parse_type("box", "float[4]").describe()
    save_info(root, info)
    problems = verify.verify_dataset(str(root), decode=False).problems
    assert len(problems) == 1 and problems[0].startswith("train-00000-of-00001.tfrecord record 1: "), problems
    assert "box" in problems[0]


def test_join_counts_every_image_it_does_not_pass_on_as_done_for_the_progress(tmp_path):
    import apache_beam as beam
    from apache_beam.metrics.metric import MetricsFilter
    from apache_beam.testing.util import assert_that, equal_to

    from tests.pipelines import TestPipeline
    from transforms.base.records import ImageRef
    from transforms.inputs.metadata import SKIPPED, STATS, JoinMetadata

    meta = tmp_path / "m.csv"
    meta.write_text("path,n\nc/0.png,1\nc/1.png,x\nc/9.png,3\n")
    refs = [ImageRef(f"/in/c/{i}.png", f"c/{i}.png", 1, "train", "c", 0, i) for i in range(3)]
    features = F.parse_spec("n:int")
    p = TestPipeline()  # run below, not in a `with`: the test reads the run's counters
    out = p | beam.Create(refs) | JoinMetadata(str(meta), "csv", "/in", features)
    assert_that(out["images"], equal_to([refs[0]._replace(extras=(("n", "int64", (1,)),))]), label="images")
    assert_that(out[SKIPPED] | beam.Map(lambda r: (r.relpath, r.stage, r.reason)),
                equal_to([("c/1.png", "rejected", "metadata_bad_value"), ("c/2.png", "skipped", "metadata_missing")]),
                label="skipped")
    assert_that(out[STATS] | beam.Map(lambda s: (s["rows"], s["joined"], s["unmatched_rows"])),
                equal_to([(3, 1, 1)]), label="stats")
    result = p.run()
    result.wait_until_finish()
    counters = {c.key.metric.name: c.committed for c in result.metrics().query(MetricsFilter())["counters"]}
    # The local progress counts images_converted + rejected_* against images_to_convert (AssignLabels'):
    # the two images the join does not pass on count as done.
    assert counters["rejected_metadata_missing"] == 1 and counters["rejected_metadata_bad_value"] == 1


def test_columns_without_a_type_are_strings_and_names_that_cannot_be_keys_are_left_out():
    declared = F.parse_spec("score:float")
    found, stored, left_out = F.with_columns(declared, ["path", "label", "score", "note", "width", "photo id",
                                                        "labels", "group", "split"])
    assert [(f.name, f.type_name, f.declared) for f in found] == [("score", "float", True),
                                                                  ("note", "string", False)]
    assert stored == ["note"] and left_out == ["width", "photo id"]


def test_metadata_reader_goes_on_after_a_row_csv_cannot_read():
    import io

    from transforms.inputs.metadata import MetadataRow, read_metadata

    text = "path,n\ncat/a.png,1\ncat/b.png," + "x" * 200_000 + "\n./cat/c.png,3\n\n/in/cat/d.png,4,5\n/in/cat/e.png,5\n"
    got = list(read_metadata(io.StringIO(text, newline=""), "csv", "/in"))
    assert got[0] == ("cat/a.png", MetadataRow(1, (("n", "1"),)))
    assert got[1][0] is None and got[1][1][0] == 2 and "field larger than field limit" in got[1][1][1]
    assert got[2:] == [("cat/c.png", MetadataRow(3, (("n", "3"),))), (None, (4, "an empty row")),
                       (None, (5, "3 fields, the header has 2")), ("cat/e.png", MetadataRow(6, (("n", "5"),)))]
    jsonl = '{"path": "a.png", "n": [1]}\n[1]\n{"n": 2}\nnot json\n'
    assert list(read_metadata(io.StringIO(jsonl), "jsonl", "/in")) == [
        ("a.png", MetadataRow(1, (("n", [1]),))), (None, (2, "not a JSON object")), (None, (3, "no path")),
        (None, (4, "not JSON (Expecting value: line 1 column 1 (char 0))"))]


@pytest.mark.timeout(300)
def test_shards_are_sized_with_the_features_bytes(tmp_path):
    names = _images(tmp_path / "data" / "a", 40)
    with open(tmp_path / "data" / "list.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(("path", "label", "emb"))
        for name in names:
            writer.writerow((f"a/{name}", "x", ";".join(["0.25"] * 20_000)))  # 80 kB of float32 per record
    out = tmp_path / "out"
    assert _run(out, f"--manifest={tmp_path / 'data' / 'list.csv'}", "--features=emb:float[20000]",
                "--validation_split=0", "--shard_size_mb=1") == 0
    info = _info(out)
    shards = info["splits"]["train"]["shards"]
    # 40 records of about 80 kB: 3.2 MB, three shards of about 1 MB (the images alone would make one).
    assert len(shards) == 3, [s["bytes"] for s in shards]
    assert 3_200_000 <= sum(s["bytes"] for s in shards) < 3_400_000


def test_columns_without_a_type_keep_any_json_value_as_text():
    found, _, _ = F.with_columns((), ["path", "label", "flag", "meta", "ids", "n", "gone"])
    fields = {"flag": True, "meta": {"a": "é"}, "ids": [1, 2], "n": 3.5, "gone": None}
    assert F.row_extras(found, fields) == (("flag", "string", ("true",)), ("meta", "string", ('{"a": "é"}',)),
                                           ("ids", "string", ("[1, 2]",)), ("n", "string", ("3.5",)),
                                           ("gone", "string", ("",)))
    declared = F.parse_spec("meta:string")
    with pytest.raises(F.BadValue, match=re.escape("""column 'meta' = '{"a": 1}': '{"a": 1}' is not a string; """
                                                   "expected string")):
        F.row_extras(declared, {"meta": {"a": 1}})


@pytest.mark.timeout(300)
def test_jsonl_untyped_columns_kept_as_text_and_a_lone_surrogate_rejects_its_row(tmp_path):
    names = _images(tmp_path / "data", 3)
    lines = [json.dumps({"path": names[0], "label": "x", "flag": True, "meta": {"k": [1, 2]}, "who": "ana"}),
             json.dumps({"path": names[1], "label": "x", "flag": False, "who": "b\ud800"}),  # JSON "\\ud800"
             json.dumps({"path": names[2], "label": "x", "flag": None, "meta": "m", "who": "cy"})]
    (tmp_path / "data" / "m.jsonl").write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    assert _run(out, f"--manifest={tmp_path / 'data' / 'm.jsonl'}", "--features=who:string",
                "--validation_split=0") == 0
    errors = _errors(out)
    assert [(e["relpath"], e["reason"]) for e in errors] == [(names[1], "manifest_bad_value")]
    assert errors[0]["detail"].startswith("row 2: column 'who'") and "lone surrogate" in errors[0]["detail"]
    spec = {k: tf.io.FixedLenFeature([], tf.string) for k in ("source_path", "flag", "meta", "who")}
    got = {}
    for raw in tf.data.TFRecordDataset([str(p) for p in out.glob("*.tfrecord")]):
        p = tf.io.parse_single_example(raw, spec)
        got[p["source_path"].numpy().decode()] = tuple(p[k].numpy().decode() for k in ("flag", "meta", "who"))
    assert got == {names[0]: ("true", '{"k": [1, 2]}', "ana"), names[2]: ("", "m", "cy")}
    _accounting_holds(_info(out))


def test_metadata_paths_as_the_listing_names_them():
    from transforms.inputs.metadata import key_of

    assert key_of("roses/1.jpg", "/data/photos") == "roses/1.jpg"
    assert key_of("./roses/1.jpg", "/data/photos") == "roses/1.jpg"
    assert key_of("/data/photos/roses/1.jpg", "/data/photos/") == "roses/1.jpg"
    assert key_of("gs://b/photos/roses/1.jpg", "gs://b/photos") == "roses/1.jpg"
    assert key_of("roses\\1.jpg", "/data") == "roses/1.jpg"
    assert key_of("/elsewhere/1.jpg", "/data/photos") == "/elsewhere/1.jpg"  # never matches: an unmatched row


def test_metadata_line_counts_each_kind_of_row_not_joined_in_words():
    from pipeline.report import metadata_line

    assert metadata_line({"metadata": {"rows": 10, "joined": 10}}) == ""
    line = metadata_line({"metadata": {"rows": 10, "joined": 5, "unmatched_rows": 2, "duplicate_rows": 1,
                                       "bad_rows": 2}})
    assert line == ("Metadata: 5 of 10 rows joined to an image; 2 rows name no image to convert (not found, or "
                    "skipped); 1 row repeats a path (the first row is used); 2 rows cannot be read (no path, "
                    "another number of fields than the header, not CSV or JSON): see \"metadata\" in "
                    "image_tfrecords.json for the first of each.")
