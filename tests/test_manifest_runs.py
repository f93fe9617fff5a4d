"""Issue 48's manifest runs: a run that writes no record publishes nothing, and the corrected command then runs
in the same folder; paths with Windows '\\' separators say so; a manifest that gives every row's split is said to
have made the splits; the notice about images smaller than --image_size comes for a manifest as for folders."""

from __future__ import annotations

import csv
import json
import os
import shutil

from tests.conftest import FAST, run_tool
from tests.datasets import error_rows, read_records, write_tiny_tree
from transforms.base.dataset_format import INFO_FILE

HINT = "the path holds '\\' separators (Windows); write paths with '/'"


def _manifest(path, rows, header=("path", "label")) -> None:
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows([header, *rows])


def _run(manifest, out, *args):
    return run_tool("pipeline.main", f"--manifest={manifest}", f"--output_dir={out}", "--image_size=16", *args,
                    *FAST)


def _published(out) -> list[str]:
    """The files the folder shows (its temporary folder left out)."""
    return sorted(name for name in os.listdir(out) if not name.startswith(".")) if out.exists() else []


def test_a_windows_manifest_publishes_nothing_says_why_and_the_corrected_one_runs_in_the_same_folder(tmp_path):
    data = tmp_path / "data"
    paths = write_tiny_tree(data, {"cat": 3, "dog": 2})
    manifest, out = data / "m.csv", tmp_path / "out"
    _manifest(manifest, [(p.replace("/", "\\"), p.split("/")[0]) for p in paths])  # written on Windows

    failed = _run(manifest, out)
    assert failed.returncode == 1
    assert "error: no image could be converted: every one of the 5 files found was rejected or skipped " \
           "(read_error 5), so nothing was published" in failed.stderr
    assert f"5 of the first 5 rows name files that are not found, e.g. row 1 'cat\\img_00000.jpg': {HINT}" \
        in failed.stderr  # once, before the run
    assert _published(out) == []  # no dataset, no errors.jsonl in the folder itself
    unpublished = list(out.glob(".image-tfrecords-tmp/*/unpublished/errors.jsonl"))
    assert len(unpublished) == 1
    rows = [json.loads(line) for line in unpublished[0].read_text().splitlines()]
    assert len(rows) == 5 and {r["reason"] for r in rows} == {"read_error"}
    assert all(r["detail"].endswith(f"; {HINT}") for r in rows)  # and in each file's detail

    _manifest(manifest, [(p, p.split("/")[0]) for p in paths])  # the same command, the paths corrected
    fixed = _run(manifest, out)
    assert fixed.returncode == 0, fixed.stderr
    assert "already holds a dataset" not in fixed.stderr + fixed.stdout
    assert "not found" not in fixed.stderr
    records = [r for rows in read_records(out).values() for r in rows]
    assert sorted(r["source_path"] for r in records) == sorted(paths)
    assert error_rows(out) == []
    assert not list(out.glob(".image-tfrecords-tmp/*/unpublished"))  # the failed run's report is gone


def test_a_folder_run_of_unreadable_images_publishes_nothing_and_the_fixed_folder_converts(tmp_path):
    src, out = tmp_path / "in", tmp_path / "out"
    for name in ("cat", "dog"):
        (src / name).mkdir(parents=True)
        for i in range(2):
            (src / name / f"img_{i:05d}.jpg").write_bytes(b"not a JPEG at all")
    failed = run_tool("pipeline.main", f"--input_dir={src}", f"--output_dir={out}", "--image_size=16", *FAST)
    assert failed.returncode == 1
    assert "no image could be converted" in failed.stderr and "nothing was published" in failed.stderr
    assert _published(out) == []
    shutil.rmtree(src)
    write_tiny_tree(src, {"cat": 2, "dog": 2})
    fixed = run_tool("pipeline.main", f"--input_dir={src}", f"--output_dir={out}", "--image_size=16", *FAST)
    assert fixed.returncode == 0, fixed.stderr
    assert "already holds a dataset" not in fixed.stderr
    assert sum(len(rows) for rows in read_records(out).values()) == 4


def test_a_found_path_with_a_backslash_gets_no_hint(tmp_path):
    """A Linux file name may hold a backslash: found, it is converted, and nothing is said about Windows."""
    data = tmp_path / "data"
    write_tiny_tree(data, {"cat": 1})
    (data / "cat" / "img_00000.jpg").rename(data / "cat" / "a\\b.jpg")
    _manifest(data / "m.csv", [("cat/a\\b.jpg", "cat")])
    result = _run(data / "m.csv", tmp_path / "out")
    assert result.returncode == 0, result.stderr
    assert "Windows" not in result.stderr + result.stdout


def test_when_every_row_gives_its_split_the_summary_says_the_manifest_made_the_splits(tmp_path):
    data = tmp_path / "data"
    paths = write_tiny_tree(data, {"cat": 4, "dog": 4})
    _manifest(data / "m.csv", [(p, p.split("/")[0], "test" if i % 4 == 0 else "train")
                               for i, p in enumerate(paths)], header=("path", "label", "split"))
    out = tmp_path / "out"
    result = _run(data / "m.csv", out)
    assert result.returncode == 0, result.stderr
    assert ("Splits from the manifest's split column (every row gives one), of the images written: train 75.0 %, "
            "test 25.0 %.") in result.stdout
    assert "asked" not in result.stdout
    info = json.loads((out / INFO_FILE).read_text())
    assert info["manifest"]["rows_with_split"] == 8 and info["manifest"]["rows_split_by_hash"] == 0

    # one row without a split: the hash split it, and the shares asked are shown again
    _manifest(data / "m.csv", [(p, p.split("/")[0], "" if i == 0 else "train") for i, p in enumerate(paths)],
              header=("path", "label", "split"))
    result = _run(data / "m.csv", tmp_path / "out2")
    assert result.returncode == 0, result.stderr
    assert "Split shares of the images written:" in result.stdout and "(asked 80 %)" in result.stdout
    assert "Splits from the manifest's split column" not in result.stdout


def test_images_smaller_than_image_size_get_the_notice_with_a_manifest_too(tmp_path):
    data = tmp_path / "data"
    paths = write_tiny_tree(data, {"cat": 3, "dog": 3})  # 24x24
    _manifest(data / "m.csv", [(p, p.split("/")[0]) for p in paths])
    result = run_tool("pipeline.main", f"--manifest={data / 'm.csv'}", f"--output_dir={tmp_path / 'out'}",
                      "--image_size=64", *FAST)
    assert result.returncode == 0, result.stderr
    assert ("most input images are smaller than --image_size=64: 6 of 6 sampled, typically 24x24 px, will be "
            "upscaled about 2.7x") in result.stderr
    assert "run again with --image_size=24" in result.stderr


def test_the_manifest_split_line_is_for_this_runs_rows_only():
    from pipeline.report import split_shares_line

    info = {"split_by": "path_hash", "options": {"validation_split": 0.2, "test_split": 0.0},
            "splits": {"train": {"records": 6}, "validation": {"records": 2}},
            "manifest": {"rows_with_split": 8, "rows_split_by_hash": 0}}
    assert split_shares_line(info) == ("Splits from the manifest's split column (every row gives one), of the images "
                                       "written: train 75.0 %, validation 25.0 %.")
    # an append: the dataset's older records may have been split by the hash
    grown = {**info, "appends": [{"run_id": "r"}]}
    assert split_shares_line(grown).startswith("Split shares of the images written: train 75.0 % (asked 80 %)")
    mixed = {**info, "manifest": {"rows_with_split": 7, "rows_split_by_hash": 1}}
    assert "(asked 20 %)" in split_shares_line(mixed)
