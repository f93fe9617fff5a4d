"""Read-side tools on hostile datasets, round 3 (issue 26): FIFOs named like a dataset's files, decode bombs in
records, a hostile image_tfrecords.json for the reader and --overwrite.

Every file the read side opens is checked by type first: a FIFO would block the read for ever. A record's image
is measured from its header before it is decoded, against the decoded-size budget of the conversion that wrote
it (--max_pixels and --max_image_mb, as image_tfrecords.json records them): a 23000x23000 PNG is a problem line,
not gigabytes. The bomb cases run the tools as a user does, in a subprocess under a memory bound.
"""

from __future__ import annotations

import io
import json
import re
import threading

import pytest

from pipeline.cli import main_of
from tests import hostile_files
from tests import hostile_records as hostile
from transforms.base.examples import build_example

pytest.importorskip("tensorflow")

SHARD = "train-00000-of-00001.tfrecord"


def _run(capsys, tool: str, *argv) -> tuple[int, str, str]:
    import importlib

    module = importlib.import_module(f"pipeline.{tool}")
    code = main_of(module.run, [str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def _error_line(err: str) -> str:
    assert "Traceback" not in err, err
    lines = [line for line in err.strip().splitlines() if not line.startswith(("WARNING", "I0000", "W0000"))]
    assert lines and lines[-1].startswith("error: ") and sum(line.startswith("error: ") for line in lines) == 1, err
    return lines[-1]


@pytest.fixture
def fifos():
    """FIFOs made by a test; a hang guard lets any reader blocked on one go after 60 s (it then reads nothing)."""
    made: list[str] = []
    guard = threading.Timer(60, lambda: hostile_files.release_fifos(made))
    guard.daemon = True
    guard.start()
    yield made
    guard.cancel()
    hostile_files.release_fifos(made)


def _fifo_in_place_of(fifos: list[str], path) -> None:
    path.unlink()
    fifos.append(hostile_files.fifo(path))


NOT_OPENED = "it is a FIFO (named pipe), not a regular file: it is not opened"


# ---- a FIFO named like a shard -----------------------------------------------------------------------------------

@pytest.mark.timeout(180)
def test_verify_names_a_fifo_shard_and_reads_the_rest(tmp_path, capsys, fifos):
    root = hostile.sound(tmp_path / "ds")
    _fifo_in_place_of(fifos, root / SHARD)
    code, out, err = _run(capsys, "verify", root)
    assert "Traceback" not in err and code == 1
    problems = [line for line in out.splitlines() if line.startswith("problem: ")]
    assert f"problem: {SHARD}: {NOT_OPENED}" in problems, out
    assert f"  {'validation':<10} {2:>8} records in 1 shard(s)" in out.splitlines(), out


@pytest.mark.timeout(180)
def test_preview_skips_a_fifo_shard_with_one_line(tmp_path, capsys, fifos):
    root = hostile.sound(tmp_path / "ds")
    _fifo_in_place_of(fifos, root / SHARD)
    code, out, err = _run(capsys, "preview", root, f"--contact_sheet={tmp_path / 'sheet.png'}", "--tile_size=32")
    assert f"problem: {SHARD} {NOT_OPENED}; skipped the rest of this shard" in err.splitlines(), err
    assert code == 2 and _error_line(err).startswith("error: no image of split 'train'")
    code, out, err = _run(capsys, "preview", root, f"--contact_sheet={tmp_path / 'sheet.png'}", "--tile_size=32",
                          "--split=validation")
    assert code == 0 and "Wrote" in out and (tmp_path / "sheet.png").exists(), err


@pytest.mark.timeout(180)
def test_benchmark_and_the_reader_refuse_a_fifo_shard_with_one_line(tmp_path, capsys, fifos):
    from pipeline import reader
    from pipeline.errors import DatasetError

    root = hostile.sound(tmp_path / "ds")
    _fifo_in_place_of(fifos, root / SHARD)
    code, _, err = _run(capsys, "benchmark", f"--dataset_dir={root}", "--batch_size=2")
    assert code == 2 and _error_line(err) == f"error: {root}/{SHARD}: {NOT_OPENED}; convert again"
    with pytest.raises(DatasetError, match=f"^{re.escape(f'{root}/{SHARD}: {NOT_OPENED}; convert again')}$"):
        reader.make_dataset(str(root), "train", batch_size=2)
    pattern = str(root / "train-*")
    code, _, err = _run(capsys, "benchmark", f"--file_pattern={pattern}", "--batch_size=2", "--image_size=16")
    assert code == 2 and _error_line(err) == (f"error: {root}/{SHARD}: {NOT_OPENED}; give a --file_pattern that "
                                              "matches TFRecord files only")


@pytest.mark.timeout(180)
@pytest.mark.parametrize("name", ["image_tfrecords.json", "labels.txt", "errors.jsonl", "features.json"])
def test_a_fifo_in_place_of_a_dataset_file_is_one_error_line(tmp_path, capsys, fifos, name):
    root = hostile.sound(tmp_path / "ds")
    if name == "features.json":  # TFDS's file, which verify reads when image_tfrecords.json lists it
        info = json.loads((root / "image_tfrecords.json").read_text())
        info["tfds"] = {"files": ["features.json"], "note": None}
        (root / "image_tfrecords.json").write_text(json.dumps(info))
        (root / name).write_text("{}")
    _fifo_in_place_of(fifos, root / name)
    code, _, err = _run(capsys, "verify", root)
    assert code == 2 and _error_line(err) == f"error: {root}/{name}: {NOT_OPENED}; convert again"
    if name == "image_tfrecords.json":
        for tool, argv in (("preview", [f"--class_chart={tmp_path / 'chart.png'}"]),
                           ("benchmark", ["--batch_size=2"])):
            where = [f"--dataset_dir={root}"] if tool == "benchmark" else [root]
            code, _, err = _run(capsys, tool, *where, *argv)
            assert code == 2 and _error_line(err) == f"error: {root}/{name}: {NOT_OPENED}; convert again"


@pytest.mark.timeout(180)
def test_verify_names_a_fifo_index_file(tmp_path, capsys, fifos):
    root = hostile.sound(tmp_path / "ds")
    info = json.loads((root / "image_tfrecords.json").read_text())
    info["splits"]["train"]["shards"][0]["index"] = "train-00000-of-00001.idx"
    (root / "image_tfrecords.json").write_text(json.dumps(info))
    fifos.append(hostile_files.fifo(root / "train-00000-of-00001.idx"))
    code, _, err = _run(capsys, "verify", root)
    assert code == 2 and _error_line(err) == f"error: {root}/train-00000-of-00001.idx: {NOT_OPENED}; convert again"


# ---- decode bombs inside records ---------------------------------------------------------------------------------

BOMB_SIDE = 23000  # 529 megapixels: 1.6 GB as the uint8 RGB tensor the reader decodes


def grey_png_bomb(width: int, height: int) -> bytes:
    """A valid 8-bit greyscale PNG of width x height black pixels in a few hundred kB, made row by row."""
    return hostile_files.png_bomb(width, height, hostile_files.PNG_GREY, level=6)


BOMB_INDEX = 3


@pytest.fixture(scope="module")
def bomb_dataset(tmp_path_factory):
    """A sound dataset whose train record 3 holds a 23000x23000 PNG (the record says 20x16, as a doctored one
    would), and a second bomb in record 5 that also claims its true size."""
    root = tmp_path_factory.mktemp("bomb") / "ds"
    bomb = grey_png_bomb(BOMB_SIDE, BOMB_SIDE)
    records = [hostile.example(i) for i in range(6)]
    for index, (height, width) in ((BOMB_INDEX, hostile.SIZE[::-1]), (5, (BOMB_SIDE, BOMB_SIDE))):
        label = index % 2
        records[index] = build_example(image=bomb, image_format="png", label=label, class_name=hostile.CLASSES[label],
                                       height=height, width=width, source_path=f"{hostile.CLASSES[label]}/b{index}.png")
    hostile.write_dataset(root, {"train": [records], "validation": [[hostile.example(i, "validation")
                                                                     for i in range(2)]]})
    return root


TOO_LARGE = (f"the image is {BOMB_SIDE}x{BOMB_SIDE} = {BOMB_SIDE ** 2:,} pixels, over the --max_pixels=178,956,970 "
             "of the conversion: it is not decoded")
MAX_RSS_MB = 1400  # TensorFlow itself takes about 700 MB; one decoded bomb alone is 1,587 MB


@pytest.mark.timeout(300)
def test_verify_measures_a_bomb_before_decoding_it_and_names_the_record(bomb_dataset):
    run = hostile_files.run_bounded([str(bomb_dataset)], MAX_RSS_MB, module="pipeline.verify")
    assert run.killed == "" and "Traceback" not in run.stderr, (run.killed, run.stderr[-2000:])
    assert run.returncode == 1, run.stdout
    problems = [line for line in run.stdout.splitlines() if line.startswith("problem: ")]
    assert f"problem: {SHARD} record {BOMB_INDEX}: {TOO_LARGE}" in problems, run.stdout
    assert f"problem: {SHARD} record 5: {TOO_LARGE}" in problems, run.stdout
    assert sum(line.startswith(f"problem: {SHARD} record {BOMB_INDEX}: ") for line in problems) == 2  # and not JPEG
    assert "train             6 records in 1 shard(s)" in run.stdout


@pytest.mark.timeout(300)
def test_preview_skips_a_bomb_with_one_line_and_draws_the_rest(bomb_dataset, tmp_path):
    sheet = tmp_path / "sheet.png"
    run = hostile_files.run_bounded([str(bomb_dataset), f"--contact_sheet={sheet}", "--tile_size=32"], MAX_RSS_MB,
                                    module="pipeline.preview")
    assert run.killed == "" and "Traceback" not in run.stderr, (run.killed, run.stderr[-2000:])
    assert run.returncode == 1
    assert f"problem: {SHARD} record {BOMB_INDEX}: cannot be shown ({TOO_LARGE}); skipped" in run.stderr.splitlines()
    assert f"Wrote {sheet}: 4 images of 2 classes" in run.stdout and sheet.exists()


def test_the_budget_is_the_conversions_and_a_header_it_cannot_read_is_left_to_the_decoder():
    from pipeline import reader

    budget = reader.decode_budget({"options": {"max_pixels": 1000, "max_image_mb": 1}})
    assert budget == (1000, 1_000_000)
    assert reader.decode_budget({}) == (178_956_970, 512_000_000)  # the converter's defaults
    assert reader.image_too_large(grey_png_bomb(40, 25), budget) is None  # 1,000 pixels: within
    assert reader.image_too_large(grey_png_bomb(41, 25), budget) == (
        "the image is 41x25 = 1,025 pixels, over the --max_pixels=1,000 of the conversion: it is not decoded")
    assert reader.image_too_large(grey_png_bomb(600, 600), (10 ** 9, 1_000_000)) == (
        "the image is 600x600 = 360,000 pixels, 1.1 MB decoded, over the --max_image_mb=1 of the conversion: it is "
        "not decoded")
    assert reader.image_too_large(b"\xff\xd8\xff not the rest of a JPEG", budget) is None
    out = io.BytesIO()
    from PIL import Image

    Image.new("RGB", (64, 64)).save(out, "JPEG")
    assert "64x64 = 4,096 pixels" in reader.image_too_large(out.getvalue(), budget)


# ---- a hostile image_tfrecords.json: the reader helper, and --overwrite over it (issue 26 #7) ---------------------

HOSTILE_JSON = [case for case in hostile.MALFORMED_INFO
                if case[0] in ("nested_10000_deep", "int_of_5000_digits", "int_beyond_a_double",
                               "number_beyond_a_double")]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case, change, fragment", HOSTILE_JSON, ids=[c[0] for c in HOSTILE_JSON])
def test_the_reader_refuses_a_hostile_description_with_one_message(tmp_path, case, change, fragment):
    from pipeline import reader
    from pipeline.errors import DatasetError

    root = hostile.malformed_info(tmp_path / "ds", change)
    with pytest.raises(DatasetError) as raised:
        reader.make_dataset(str(root), "train", batch_size=2)
    assert str(raised.value) == f"{root}/image_tfrecords.json {fragment}; convert again"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case, change, fragment", HOSTILE_JSON[:2], ids=[c[0] for c in HOSTILE_JSON[:2]])
def test_overwrite_replaces_a_hostile_description(tmp_path, case, change, fragment):
    from PIL import Image

    from pipeline.verify import verify_dataset
    from tests.conftest import cli, convert

    src, out = tmp_path / "in", tmp_path / "out"
    for n, name in enumerate(("cat/a.png", "cat/b.png", "dog/c.png")):
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (8, 8), (n * 90, 0, 0)).save(src / name)
    args = [f"--input_dir={src}", f"--output_dir={out}", "--image_size=8", "--validation_split=0", "--quiet"]
    assert convert(src, out, *args[2:]) == 0
    description = out / "image_tfrecords.json"
    description.write_text(change(json.loads(description.read_text())))
    # A fresh interpreter reads the hostile description (this process's recursion limit is raised: conftest.py).
    result = cli("pipeline.main", *args, "--overwrite", timeout=280)
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert result.returncode == 0  # the unreadable description is replaced by the new run's
    assert verify_dataset(str(out)).problems == []
    assert json.loads(description.read_text())["files"]["written"] == 3


@pytest.mark.timeout(120)
def test_verify_names_shard_names_of_5000_digits_as_problems(tmp_path, capsys):
    """Digits in a listed shard name are read as a number only when one can be: int() refuses 4,300 digits."""
    root = hostile.sound(tmp_path / "ds")
    info = json.loads((root / "image_tfrecords.json").read_text())
    standard, kaggle = "train-" + "0" * 5000 + "-of-00001.tfrecord", "validation" + "0" * 5000 + "-2.tfrec"
    info["splits"]["train"]["shards"][0]["file"] = standard
    info["splits"]["validation"]["shards"][0]["file"] = kaggle
    (root / "image_tfrecords.json").write_text(json.dumps(info))
    code, out, err = _run(capsys, "verify", root, "--no_decode")
    assert "Traceback" not in err and code == 1
    problems = [line for line in out.splitlines() if line.startswith("problem: ")]
    for name, split in ((standard, "train"), (kaggle, "validation")):
        assert (f"problem: {name}: listed as shard 0 of 1 of split {split!r} in image_tfrecords.json, but its name "
                "does not say so") in problems
        assert f"problem: {name}: listed in image_tfrecords.json but missing" in problems


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind, why", [
    (5, "the type of 'x' is 5, not a type name"),
    ("float[" + "9" * 5000 + "]", "N in float[N] must be 1 to 1000000"),
])
def test_a_hostile_extra_feature_type_is_one_error_line(tmp_path, capsys, kind, why):
    root = hostile.sound(tmp_path / "ds")
    info = json.loads((root / "image_tfrecords.json").read_text())
    info["features"]["x"] = {"extra": True, "type": kind, "dtype": "float32", "shape": [1]}
    (root / "image_tfrecords.json").write_text(json.dumps(info))
    code, _, err = _run(capsys, "verify", root)
    line = _error_line(err)
    assert code == 2 and line.startswith("error: image_tfrecords.json describes an extra feature this reader cannot "
                                         "read (") and why in line, line
