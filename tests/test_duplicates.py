"""Duplicates caught at conversion: every record's sha256 of its source bytes, and the groups of identical files."""

from __future__ import annotations

import hashlib
import json

import pytest
from PIL import Image

from pipeline.report import format_summary
from tests.conftest import convert
from transforms.base import duplicate_kinds
from transforms.base.examples import Example, build_example
from transforms.base.tfrecord import iter_records
from transforms.inputs import duplicates as dup
from transforms.labels.layout import hash_split


def _name_in_split(folder: str, stem: str, split: str) -> str:
    """A file name in `folder` that the default split hash (seed 42, 20% validation) puts in `split`."""
    for i in range(1000):
        relpath = f"{folder}/{stem}_{i}.png"
        if hash_split(relpath, 42, 0.2, 0.0) == split:
            return relpath
    raise AssertionError("no name found")


def _records(out, key="sha256", path_key="source_path"):
    info = json.loads((out / "image_tfrecords.json").read_text())
    rows = {}
    for split in info["splits"].values():
        for shard in split["shards"]:
            for raw in iter_records(str(out / shard["file"])):
                feature = Example.FromString(raw).features.feature
                rows[feature[path_key].bytes_list.value[0].decode()] = feature[key].bytes_list.value[0].decode()
    return info, rows


@pytest.fixture(scope="module")
def tree_with_copies(tmp_path_factory):
    """cat and dog, 5 distinct images each, plus three groups of byte-identical files:
    within one split and class, across two splits under one class, and under two classes."""
    src = tmp_path_factory.mktemp("copies")
    for c, name in enumerate(("cat", "dog")):
        (src / name).mkdir()
        for i in range(5):
            Image.new("RGB", (20, 16), (60 * c, 40 * i, 90)).save(src / name / f"own_{i}.png")
    copies = {}
    for n, paths in enumerate((
        [_name_in_split("cat", "same", "train"), _name_in_split("cat", "again", "train")],
        [_name_in_split("dog", "here", "train"), _name_in_split("dog", "there", "validation")],
        ["cat/rose.png", "dog/tulip.png"],
    )):
        Image.new("RGB", (22, 18), (200, 10 * n, 30)).save(src / paths[0])
        for other in paths[1:]:
            (src / other).write_bytes((src / paths[0]).read_bytes())
        copies[n] = paths
    return src, copies


def test_every_record_stores_the_sha256_of_its_source_bytes(tree_with_copies, tmp_path):
    src, _ = tree_with_copies
    out = tmp_path / "out"
    assert convert(src, out, "--image_size=16") == 0
    info, rows = _records(out)
    assert len(rows) == info["files"]["written"] == 16
    for relpath, digest in rows.items():
        assert digest == hashlib.sha256((src / relpath).read_bytes()).hexdigest()
    assert info["features"]["sha256"] == {"dtype": "string", "shape": [], "field": "sha256"}


def test_tf_slim_records_store_it_under_image_key_sha256(tree_with_copies, tmp_path):
    src, _ = tree_with_copies
    out = tmp_path / "out"
    assert convert(src, out, "--image_size=16", "--schema=tf_slim") == 0
    _, rows = _records(out, key="image/key/sha256", path_key="image/filename")
    assert len(rows) == 16
    for relpath, digest in rows.items():
        assert digest == hashlib.sha256((src / relpath).read_bytes()).hexdigest()


def test_duplicate_groups_are_told_apart_in_dataset_info_and_the_summary(tree_with_copies, tmp_path):
    src, copies = tree_with_copies
    out = tmp_path / "out"
    assert convert(src, out, "--image_size=16") == 0
    info = json.loads((out / "image_tfrecords.json").read_text())
    found = info["duplicates"]
    assert {k: v for k, v in found.items() if k != "examples"} == {
        "groups": 3, "copies": 6, "within_split": 1, "across_splits": 1, "conflicting_labels": 1}
    by_kind = {g["kind"]: g for g in found["examples"]}
    assert sorted(c["relpath"] for c in by_kind["within_split"]["copies"]) == sorted(copies[0])
    assert {(c["relpath"], c["split"]) for c in by_kind["across_splits"]["copies"]} == {
        (copies[1][0], "train"), (copies[1][1], "validation")}
    assert {(c["relpath"], c["class_name"]) for c in by_kind["conflicting_labels"]["copies"]} == {
        ("cat/rose.png", "cat"), ("dog/tulip.png", "dog")}
    assert by_kind["conflicting_labels"]["sha256"] == hashlib.sha256((src / "cat/rose.png").read_bytes()).hexdigest()
    assert ("Duplicates: 3 groups of identical source files (6 files): 1 within a split, 1 across splits "
            "(leakage), 1 with different labels (conflict)") in format_summary(info)
    # Reporting only (--duplicates=keep): every copy is written.
    assert info["files"]["written"] == 16


def test_drop_writes_one_copy_per_group_and_none_of_a_conflict(tree_with_copies, tmp_path):
    from pipeline import verify

    src, copies = tree_with_copies
    out = tmp_path / "out"
    assert convert(src, out, "--image_size=16", "--duplicates=drop") == 0
    info, rows = _records(out)
    errors = {e["relpath"]: e for e in map(json.loads, (out / "errors.jsonl").read_text().splitlines())}
    within, across = sorted(copies[0]), sorted(copies[1])
    assert {path: (e["stage"], e["reason"]) for path, e in errors.items()} == {
        within[1]: ("rejected", "duplicate"), across[1]: ("rejected", "duplicate"),
        "cat/rose.png": ("rejected", "duplicate_conflict"), "dog/tulip.png": ("rejected", "duplicate_conflict")}
    assert errors[within[1]]["detail"].startswith(f"the same bytes as {within[0]!r}, which is written")
    assert "under the classes 'cat', 'dog': no copy is written" in errors["cat/rose.png"]["detail"]
    assert set(rows) == {f"{c}/own_{i}.png" for c in ("cat", "dog") for i in range(5)} | {within[0], across[0]}
    assert len(set(rows.values())) == len(rows) == 12  # no two records of the same bytes
    assert info["files"] == {"found": 16, "written": 12, "rejected": 4, "skipped": 0, "upscaled": 0}
    assert info["rejected_by_reason"] == {"duplicate": 2, "duplicate_conflict": 2}
    # The report covers the input's groups, as with keep.
    assert {k: v for k, v in info["duplicates"].items() if k != "examples"} == {
        "groups": 3, "copies": 6, "within_split": 1, "across_splits": 1, "conflicting_labels": 1}
    assert "--duplicates=drop wrote one copy of each group" in format_summary(info)
    report = verify.verify_dataset(str(out))
    assert report.problems == [] and report.warnings == []


def test_no_duplicates_no_line(tmp_path):
    src = tmp_path / "in"
    for c, name in enumerate(("a", "b")):
        (src / name).mkdir(parents=True)
        for i in range(3):
            Image.new("RGB", (12, 12), (80 * c, 50 * i, 7)).save(src / name / f"{i}.png")
    assert convert(src, tmp_path / "out", "--image_size=8") == 0
    info = json.loads((tmp_path / "out" / "image_tfrecords.json").read_text())
    assert info["duplicates"] == {"groups": 0, "copies": 0, "within_split": 0, "across_splits": 0,
                                  "conflicting_labels": 0, "examples": []}
    assert "Duplicates" not in format_summary(info)


def test_the_summary_lists_the_first_groups_by_path_and_counts_them_all():
    combine = dup._Summarise()
    pairs = {f"{i:064x}": [("train", 0, f"c/{i:02d}b.png"), ("train", 0, f"c/{i:02d}a.png")] for i in range(30)}
    groups = [g for sha256, copies in pairs.items() for g in duplicate_kinds.duplicate_groups(sha256, copies)]
    assert duplicate_kinds.duplicate_groups("f" * 64, [("train", 0, "c/alone.png")]) == []
    half = [combine.add_input(combine.create_accumulator(), g) for g in groups[:1]]
    acc = combine.create_accumulator()
    for g in reversed(groups[1:]):
        acc = combine.add_input(acc, g)
    merged = combine.merge_accumulators([*half, acc])
    described = dup.describe(merged, ["c"])
    assert described["groups"] == 30 and described["copies"] == 60 and described["within_split"] == 30
    assert [g["copies"][0]["relpath"] for g in described["examples"]] == [f"c/{i:02d}a.png" for i in range(20)]


def test_the_report_stays_bounded_with_100000_copies_of_one_image():
    """A placeholder repeated 100,000 times (the elements built directly): one group, counted whole, with its
    first copies only; the report is as small as for 2 copies."""
    sha = "e" * 64
    copies = ((("train", "validation")[i % 5 == 0], 0, f"c/{i:06d}.png") for i in range(100_000))
    [group] = duplicate_kinds.duplicate_groups(sha, copies)  # a generator: streamed once, never held
    assert group.size == 100_000 and duplicate_kinds.kind(group) == duplicate_kinds.ACROSS_SPLITS
    assert [c[2] for c in group.copies] == [f"c/{i:06d}.png" for i in range(duplicate_kinds.EXAMPLE_COPIES)]
    small = duplicate_kinds.duplicate_groups("d" * 64, [("train", 0, "c/x.png"), ("train", 1, "c/y.png")])
    combine = dup._Summarise()
    acc = combine.create_accumulator()
    for g in [*small, group]:
        acc = combine.add_input(acc, g)
    described = dup.describe(combine.merge_accumulators([acc, combine.create_accumulator()]), ["c", "d"])
    assert {k: v for k, v in described.items() if k != "examples"} == {
        "groups": 2, "copies": 100_002, "within_split": 0, "across_splits": 1, "conflicting_labels": 1}
    largest, other = described["examples"]  # the largest group first
    assert (largest["sha256"], largest["count"], largest["kind"]) == (sha, 100_000, duplicate_kinds.ACROSS_SPLITS)
    assert [c["relpath"] for c in largest["copies"]] == [f"c/{i:06d}.png" for i in range(5)]
    assert (other["count"], other["kind"], len(other["copies"])) == (2, duplicate_kinds.CONFLICTING_LABELS, 2)
    assert len(json.dumps(described)) < 2_000


def test_the_reader_reads_records_written_before_sha256_was_stored():
    tf = pytest.importorskip("tensorflow")
    from pipeline import reader

    record = Example.FromString(build_example(image=b"x", image_format="jpeg", label=1, class_name="c", height=1,
                                              width=1, source_path="c/x.jpg", sha256="ab" * 32))
    assert tf.io.parse_single_example(record.SerializeToString(), reader.feature_spec())["sha256"] == b"ab" * 32
    del record.features.feature["sha256"]  # as a dataset written before the key was added
    parsed = tf.io.parse_single_example(record.SerializeToString(), reader.feature_spec())
    assert parsed["sha256"] == b"" and parsed["label"] == 1


@pytest.mark.timeout(60)
def test_the_hashing_pass_of_drop_leaves_odd_files_to_the_conversion(tmp_path):
    """Bounded reads: a FIFO is not opened, a file over the limit is not hashed, a missing one is left to the
    conversion (which rejects each with its reason); a file is hashed piece by piece to the same digest."""
    import os

    data = os.urandom(3 * dup.HASH_CHUNK + 5)
    (tmp_path / "big.bin").write_bytes(data)
    assert dup.hash_file(str(tmp_path / "big.bin"), len(data)) == hashlib.sha256(data).hexdigest()
    assert dup.hash_file(str(tmp_path / "big.bin"), len(data) - 1) == ""
    assert dup.hash_file(str(tmp_path / "big.bin"), len(data) - 1, size=None) == ""
    os.mkfifo(tmp_path / "fifo.jpg")
    assert dup.hash_file(str(tmp_path / "fifo.jpg"), 1 << 20) == ""
    assert dup.hash_file(str(tmp_path / "gone.jpg"), 1 << 20) == ""


@pytest.mark.timeout(300)
def test_multi_label_copies_report_and_drop_agree_on_one_label_set(tmp_path):
    """["a;b"] (one class named 'a;b') and ["a", "b"] (two classes) are different label sets, though both read
    'a;b' joined: the report calls the copies a conflict, so --duplicates=drop writes neither."""
    from pipeline.launcher import run
    from tests.conftest import FAST

    src = tmp_path / "in"
    src.mkdir()
    Image.new("RGB", (16, 16), (10, 20, 30)).save(src / "one.png")
    (src / "two.png").write_bytes((src / "one.png").read_bytes())
    Image.new("RGB", (16, 16), (200, 20, 30)).save(src / "other.png")
    rows = [{"path": "one.png", "labels": ["a;b"]}, {"path": "two.png", "labels": ["a", "b"]},
            {"path": "other.png", "labels": ["a"]}]
    (src / "list.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    reports = {}
    for mode in ("keep", "drop"):
        out = tmp_path / mode
        assert run([f"--manifest={src / 'list.jsonl'}", f"--output_dir={out}", "--quiet", "--image_size=16",
                    "--multi_label", f"--duplicates={mode}", "--validation_split=0", *FAST]) == 0
        info, rows_written = _records(out)
        reports[mode] = info["duplicates"]
        errors = [json.loads(line) for line in (out / "errors.jsonl").read_text().splitlines()]
        if mode == "keep":
            assert set(rows_written) == {"one.png", "two.png", "other.png"} and errors == []
            from pipeline.verify import verify_dataset

            warnings = verify_dataset(str(out)).warnings  # as the converter counts it: one conflict
            assert warnings[0].startswith("Duplicates: 1 groups of identical source files (2 files): 0 within a "
                                          "split, 0 across splits (leakage), 1 with different labels (conflict)")
            assert warnings[1:] == ["identical source files with different labels (conflict): 'one.png' (train, "
                                    "['a;b']), 'two.png' (train, ['a', 'b'])"]
        else:
            assert set(rows_written) == {"other.png"}
            assert {e["relpath"]: e["reason"] for e in errors} == {"one.png": dup.DUPLICATE_CONFLICT,
                                                                    "two.png": dup.DUPLICATE_CONFLICT}
            assert "under the classes ['a', 'b'], ['a;b']" in errors[0]["detail"], errors[0]["detail"]
            assert info["files"]["rejected"] == 2 and info["rejected_by_reason"] == {dup.DUPLICATE_CONFLICT: 2}
    for mode in ("keep", "drop"):
        assert reports[mode][duplicate_kinds.CONFLICTING_LABELS] == 1 and reports[mode]["groups"] == 1, reports[mode]


def test_resolve_compares_label_sets_not_their_joined_names():
    from transforms.base.records import ImageRef, Rejection

    joined = ImageRef("/x/1.png", "1.png", 9, "train", "a;b", -1, 1, labels=(0,), label_names=("a;b",))
    pair = ImageRef("/x/2.png", "2.png", 9, "train", "a;b", -1, 2, labels=(1, 2), label_names=("a", "b"))
    again = ImageRef("/x/3.png", "3.png", 9, "train", "a;b", -1, 3, labels=(1, 2), label_names=("a", "b"))
    out = list(dup.resolve("f" * 64, [joined, pair]))
    assert [(o.value.relpath, o.value.reason) for o in out] == [("1.png", dup.DUPLICATE_CONFLICT),
                                                                ("2.png", dup.DUPLICATE_CONFLICT)]
    out = list(dup.resolve("f" * 64, [again, pair]))
    assert out[0] == pair and isinstance(out[1].value, Rejection) and out[1].value.reason == dup.DUPLICATE
