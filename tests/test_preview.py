"""Contact sheet and class chart: right records in the right rows, right captions, valid PNGs, clear refusals."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from pipeline.cli import main_of
from tests.conftest import REPO

PER_CLASS = 3
TILE = 64


@pytest.fixture(scope="module")
def written(sample_output, tmp_path_factory):
    """The contact sheet and chart written by the CLI, run as a user would, without TF_CPP_MIN_LOG_LEVEL set."""
    out = tmp_path_factory.mktemp("preview")
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    result = subprocess.run(
        [sys.executable, "-m", "pipeline.preview", str(sample_output), f"--contact_sheet={out / 'sheet.png'}",
         f"--class_chart={out / 'chart.png'}", f"--per_class={PER_CLASS}", f"--tile_size={TILE}"],
        cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
    return result, out


@pytest.fixture(scope="module")
def records(sample_output):
    """Every train record, decoded independently of the preview code: source_path -> (label, class, pixels)."""
    from pipeline import reader

    by_path = {}
    for ex in reader.make_dataset(str(sample_output), "train", batch_size=None):
        by_path[ex["source_path"].numpy().decode()] = (
            int(ex["label"]), ex["class_name"].numpy().decode(), ex["image"].numpy())
    return by_path


def test_cli_writes_png_files_quietly(written):
    result, out = written
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""  # no TensorFlow start-up chatter
    assert f"Wrote {out / 'sheet.png'}: {4 * PER_CLASS} images of 4 classes" in result.stdout
    for name in ("sheet.png", "chart.png"):
        with Image.open(out / name) as image:
            assert image.format == "PNG"
            image.verify()


def test_every_tile_shows_its_record_and_its_label(written, records, sample_output):
    from pipeline.preview import caption_image, caption_text, fit_tile, make_contact_sheet

    _, out = written
    names = (sample_output / "labels.txt").read_text().splitlines()
    sheet = np.asarray(Image.open(out / "sheet.png").convert("RGB"))
    # The same call in-process says which record went where; the CLI's PNG must match it pixel for pixel.
    drawn, tiles = make_contact_sheet(str(sample_output), "train", PER_CLASS, TILE)
    assert np.array_equal(np.asarray(drawn), sheet)
    assert len(tiles) == len(names) * PER_CLASS
    assert {(t.row, t.column) for t in tiles} == {(r, c) for r in range(len(names)) for c in range(PER_CLASS)}
    for tile in tiles:
        label, class_name, pixels = records[tile.source_path]
        assert tile.row == label == tile.label  # row i holds class i only
        assert names[label] == class_name == tile.class_name
        left, top, right, bottom = tile.box
        shown = sheet[top:bottom, left:right].astype(int)
        expected = np.asarray(fit_tile(pixels, TILE)).astype(int)
        assert shown.shape == expected.shape and max(shown.shape[:2]) == TILE
        assert np.abs(shown - expected).mean() < 1.0
        left, top, right, bottom = tile.caption_box
        caption = sheet[top:bottom, left:right]
        assert np.array_equal(caption, np.asarray(caption_image(caption_text(label, names[label]), TILE)))
        other = (label + 1) % len(names)  # the check can tell labels apart
        assert not np.array_equal(caption, np.asarray(caption_image(caption_text(other, names[other]), TILE)))
    for row in range(len(names)):
        order = [t.record_index for t in sorted(tiles, key=lambda t: t.column) if t.row == row]
        assert order == sorted(order)


def test_rows_end_early_when_a_class_has_fewer_images(sample_output):
    from pipeline.preview import make_contact_sheet

    info = json.loads((sample_output / "image_tfrecords.json").read_text())
    counts = info["splits"]["validation"]["class_counts"]
    many = max(counts.values()) + 2
    _, tiles = make_contact_sheet(str(sample_output), "validation", many, 32)
    for label, name in enumerate(info["class_names"]):
        assert sum(t.row == label for t in tiles) == counts.get(name, 0)


def test_class_chart_bars_are_the_class_counts(sample_output):
    from pipeline.preview import class_chart

    info = json.loads((sample_output / "image_tfrecords.json").read_text())
    ax = class_chart(info).axes[0]
    assert [c.get_label() for c in ax.containers] == list(info["splits"])
    for container, (split, split_info) in zip(ax.containers, info["splits"].items(), strict=True):
        heights = [round(bar.get_height()) for bar in container]
        assert heights == [split_info["class_counts"].get(n, 0) for n in info["class_names"]], split


def test_refuses_a_folder_that_is_not_a_dataset(tmp_path, capsys):
    from pipeline.preview import run

    (tmp_path / "train-00000-of-00001.tfrecord").write_bytes(b"")
    code = main_of(run, [str(tmp_path), f"--contact_sheet={tmp_path / 'sheet.png'}"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("error: ") and err.count("\n") == 1
    assert "image_tfrecords.json" in err and "convert" in err
    assert not (tmp_path / "sheet.png").exists()


@pytest.mark.parametrize("args, message", [
    ([], "nothing to draw: give --contact_sheet"),
    (["--contact_sheet=sheet.gif"], "ending in .png, .jpg or .webp"),
    (["--contact_sheet=s.png", "--per_class=0"], "--per_class=0 is out of range"),
    (["--contact_sheet=s.png", "--split=test"], "has no 'test' split; it has: train, validation"),
])
def test_bad_arguments_are_one_line_errors(sample_output, tmp_path, capsys, monkeypatch, args, message):
    from pipeline.preview import run

    monkeypatch.chdir(tmp_path)
    assert main_of(run, [str(sample_output), *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1


def test_a_short_scan_shows_what_it_found_and_says_so(sample_output, caplog):
    from pipeline.preview import make_contact_sheet

    _, tiles = make_contact_sheet(str(sample_output), "train", PER_CLASS, 32, max_records=5)
    assert tiles and all(t.record_index < 5 for t in tiles)  # only the first five records were read
    assert "Not every image to show was found in the first 5 records of train" in caplog.text
    assert "raise --max_records" in caplog.text


def test_multi_label_captions_show_every_label_or_count_those_left_out(tmp_path):
    """A record of many long class names: its caption in each row begins with that row's class, and the names that
    do not fit the tile are counted ('+N'), never cut off unsaid (issue 48)."""
    import csv

    from pipeline.preview import caption_image, make_contact_sheet, multi_label_caption
    from tests.datasets import convert_manifest, write_tiny_tree

    names = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse"]
    data = tmp_path / "data"
    paths = write_tiny_tree(data, {"img": 4})
    with open(data / "m.csv", "w", newline="") as f:
        csv.writer(f).writerows([("path", "labels"), (paths[0], ";".join(names)), (paths[1], "cat;dog"),
                                 (paths[2], "frog"), (paths[3], ";".join(names[:5]))])
    out = tmp_path / "out"
    assert convert_manifest(data / "m.csv", out, "--multi_label", "--image_size=16", "--validation_split=0") == 0
    wide = 160  # room for a few names
    _, tiles = make_contact_sheet(str(out), "train", per_class=4, tile_size=wide)
    held = {paths[0]: names, paths[1]: ["cat", "dog"], paths[2]: ["frog"], paths[3]: names[:5]}
    assert {(t.source_path, t.row) for t in tiles} == {(p, names.index(n)) for p, ns in held.items() for n in ns}
    cut = 0
    for tile in tiles:
        record = held[tile.source_path]
        row_class = names[tile.row]
        label_id, _, rest = tile.caption.partition("  ")
        assert label_id == str(tile.row)
        shown, more = ("", rest[1:]) if rest.startswith("+") else rest.partition(" +")[::2]
        listed = shown.split(";") if shown else []
        assert listed[:1] in ([row_class], [])  # the row's own class first
        assert set(listed) <= set(record)
        assert len(listed) + (int(more) if more else 0) == len(record)  # every label shown or counted
        assert caption_image(tile.caption, wide).size == (wide, 22)
        cut += bool(more)
        if record is names:
            assert 0 < len(listed) < len(names)  # some names, and the count of the others
        if len(record) <= 2:
            assert not more and listed == [row_class, *(n for n in record if n != row_class)]
    assert cut >= 8  # the record of 8 names is cut in each of its 8 rows, and said so

    assert multi_label_caption(3, ["cat", "dog", "owl"], lambda text: len(text) <= 13) == "3  cat;dog +1"
    assert multi_label_caption(3, ["cat", "dog"], lambda text: True) == "3  cat;dog"
    assert multi_label_caption(3, ["hippopotamus"], lambda text: len(text) <= 8) == "3  +1"
    assert multi_label_caption(0, [], lambda text: True) == "0  (no class)"
