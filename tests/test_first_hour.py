"""A newcomer's first hour (issue 20): defaults that fit the data, shard sizes on target, one shape for
every command, and messages that read right."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.errors import UserError
from pipeline.sample_data import generate_dataset
from tests.conftest import REPO, convert, main_in_process

MB = 1_000_000


@pytest.fixture(scope="module")
def small_photos(tmp_path_factory):
    """128 px photo-like images, as in a public flower dataset: much smaller than the default 512."""
    root = tmp_path_factory.mktemp("small_photos")
    generate_dataset(str(root), images_per_class=12, classes=("daisy", "rose", "tulip"), seed=3,
                     min_side=128, max_side=128, png_share=0.0)
    return root


# --- Defaults that fit the data -------------------------------------------------------------------


@pytest.mark.timeout(300)
def test_small_images_get_a_notice_before_converting(small_photos, tmp_path, capsys):
    code, stderr = main_in_process(capsys, f"--input_dir={small_photos}", f"--output_dir={tmp_path / 'out'}",
                                   "--direct_running_mode=in_memory", "--direct_num_workers=1", "--test_split=0.2")
    assert code == 0, stderr
    lines = stderr.splitlines()
    notice = [i for i, line in enumerate(lines) if "smaller than --image_size=512" in line]
    converting = [i for i, line in enumerate(lines) if line.startswith("INFO pipeline: Converting")]
    assert notice and converting and notice[0] < converting[0], stderr
    text = lines[notice[0]]
    assert text.startswith("WARNING")
    assert "36 of 36 sampled" in text and "typically 128x128 px" in text and "--image_size=128" in text
    # the dataset's size at each setting, both as figures in MB or kB
    assert "at --image_size=512" in text and "at --image_size=128" in text
    # the run goes on with the size it was given
    info = json.loads((tmp_path / "out" / "image_tfrecords.json").read_text())
    assert info["options"]["image_size"] == "512x512"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("args", [["--image_size=128"], ["--resize_mode=fit"], ["--quiet"]])
def test_no_notice_when_the_images_are_not_enlarged(small_photos, tmp_path, args, capsys):
    code, stderr = main_in_process(capsys, f"--input_dir={small_photos}", f"--output_dir={tmp_path / 'out'}",
                                   "--direct_running_mode=in_memory", "--direct_num_workers=1", *args)
    assert code == 0, stderr
    assert "smaller than --image_size" not in stderr


def _shard_sizes(out) -> dict[str, list[int]]:
    """Bytes of each shard file on disk, per split."""
    sizes: dict[str, list[int]] = {}
    for path in sorted(out.glob("*.tfrecord*")):
        sizes.setdefault(path.name.split("-")[0], []).append(os.path.getsize(path))
    return sizes


@pytest.mark.timeout(600)
@pytest.mark.parametrize("compression", ["none", "gzip"])
def test_shards_land_within_a_quarter_of_the_target_size(tmp_path, compression):
    """128 px photos upscaled to the default 512 come out far smaller than a generic guess for 512 px."""
    src = tmp_path / "in"
    generate_dataset(str(src), images_per_class=60, classes=("a", "b", "c"), seed=5, min_side=128, max_side=128,
                     png_share=0.0)
    out = tmp_path / "out"
    assert convert(src, out, "--shard_size_mb=1", "--validation_split=0.1", f"--compression={compression}") == 0
    sizes = _shard_sizes(out)
    assert len(sizes["train"]) >= 3, sizes
    assert all(0.75 * MB <= size <= 1.25 * MB for size in sizes["train"]), sizes


# --- --num_shards per split -----------------------------------------------------------------------


def test_num_shards_forms():
    from pipeline.options import format_num_shards, parse_num_shards

    assert parse_num_shards("0") == {}
    assert parse_num_shards("8") == {"train": 8}
    assert parse_num_shards("train=64,validation=8") == {"train": 64, "validation": 8}
    assert parse_num_shards(" test=2 , train=0 ") == {"test": 2}
    assert format_num_shards({"train": 8}) == 8
    assert format_num_shards({"validation": 8, "train": 64}) == "train=64,validation=8"
    assert format_num_shards({}) == 0


@pytest.mark.parametrize("value, message", [
    ("-1", "is not a shard count"),
    ("eight", "is not a shard count"),
    ("train=8,val=2", "names the split 'val'"),
    ("train=8,train=2", "gives train twice"),
    ("train=", "is not a shard count"),
])
def test_bad_num_shards_is_one_line(tmp_path, value, message, capsys):
    code, stderr = main_in_process(capsys, f"--input_dir={tmp_path}", f"--output_dir={tmp_path / 'out'}",
                                   f"--num_shards={value}")
    assert code == 2
    assert stderr.count("\n") == 1 and stderr.startswith("error: --num_shards="), stderr
    assert message in stderr


def _tree(root, per_class=30):
    generate_dataset(str(root), images_per_class=per_class, classes=("a", "b"), seed=2, min_side=32, max_side=32,
                     png_share=0.0)
    return root


def test_one_number_sets_train_only_and_eval_splits_are_sized_by_bytes(tmp_path):
    src = _tree(tmp_path / "in")
    out = tmp_path / "out"
    assert convert(src, out, "--num_shards=4", "--image_size=16", "--test_split=0.2") == 0
    sizes = _shard_sizes(out)
    assert (len(sizes["train"]), len(sizes["validation"]), len(sizes["test"])) == (4, 1, 1)


def test_per_split_shard_counts(tmp_path):
    src = _tree(tmp_path / "in")
    out = tmp_path / "out"
    assert convert(src, out, "--num_shards=train=3,validation=2", "--image_size=16", "--test_split=0.2") == 0
    sizes = _shard_sizes(out)
    assert (len(sizes["train"]), len(sizes["validation"]), len(sizes["test"])) == (3, 2, 1)
    info = json.loads((out / "image_tfrecords.json").read_text())
    assert info["options"]["num_shards"] == "train=3,validation=2"


# --- One shape for every command ------------------------------------------------------------------


def test_help_is_answered_without_beam_and_marks_required_options():
    code = ("import runpy, sys, io, contextlib\n"
            "sys.argv = ['pipeline.main', '--help']\n"
            "out = io.StringIO()\n"
            "with contextlib.redirect_stdout(out):\n"
            "    try:\n"
            "        runpy.run_module('pipeline.main', run_name='__main__')\n"
            "    except SystemExit:\n"
            "        pass\n"
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'apache_beam', 'tensorflow'}))\n"
            "print(out.getvalue())\n")
    run = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    heavy, _, page = run.stdout.partition("\n")
    assert heavy == "[]", f"--help imported {heavy}"
    usage = page.split("\n\n")[0]
    assert " --input_dir INPUT_DIR" in usage and "[--input_dir" not in usage
    assert " --output_dir" in usage and "[--output_dir" not in usage
    assert "--num_shards" in page and "train=64,validation=8" in page


def test_a_mistyped_flag_prints_only_this_tools_line(tmp_path, capsys):
    code, stderr = main_in_process(capsys, f"--input_dir={tmp_path}", f"--output_dir={tmp_path / 'out'}",
                                   "--imge_size=128")
    assert code == 2
    assert stderr == "error: unknown option --imge_size; run with --help to see the options\n"


# --- Messages -------------------------------------------------------------------------------------


def test_progress_line_under_one_second():
    from pipeline.local.progress import progress_line

    line = progress_line(99, 100, 50.0)
    assert "about under" not in line and line.endswith(", under 1 s left")
    assert progress_line(50, 100, 10.0).endswith("about 5 s left")


def test_validate_rejects_a_bad_num_shards_in_process(tmp_path):
    with pytest.raises(UserError, match="--num_shards='x'"):
        convert(tmp_path, tmp_path / "out", "--num_shards=x")


# --- The README's hand-typed reader ---------------------------------------------------------------


def _readme_hand_typed_reader() -> str:
    text = (Path(REPO) / "README.md").read_text()
    after = text[text.index("keys typed by hand"):]
    return after.split("```python\n", 1)[1].split("```", 1)[0]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("schema, compression", [("tf_slim", "gzip"), ("default", "none")])
def test_readme_hand_typed_reader_reads_gzip_and_tf_slim(tmp_path, schema, compression):
    pytest.importorskip("tensorflow")
    code = _readme_hand_typed_reader()
    assert 'compression_type=compression' in code and '"GZIP"' in code and "train-*.tfrecord*" in code
    assert '"image/encoded"' in code and '"image/class/label"' in code
    src = _tree(tmp_path / "in", per_class=6)
    out = tmp_path / "out"
    assert convert(src, out, f"--schema={schema}", f"--compression={compression}", "--image_size=24",
                   "--num_shards=2") == 0
    code = (code.replace('schema = "default"', f'schema = "{schema}"').replace('"tfrecords/', f'"{out}/')
            .replace("[512, 512, 3]", "[24, 24, 3]").replace(".batch(128,", ".batch(2,"))
    scope: dict = {}
    exec(compile(code, "README.md", "exec"), scope)
    images, labels = next(iter(scope["ds"]))
    assert tuple(images.shape) == (2, 24, 24, 3) and set(labels.numpy()) <= {0, 1}
    info = json.loads((out / "image_tfrecords.json").read_text())
    assert sum(1 for _ in scope["ds"].unbatch()) == info["splits"]["train"]["records"] // 2 * 2


def test_benchmark_help_and_option_errors_need_neither_beam_nor_tensorflow():
    code = ("import sys\n"
            "from pipeline import benchmark\n"
            "from pipeline.errors import UserError\n"
            "try:\n"
            "    benchmark.validate(benchmark.build_parser().parse_args(['x', '--dataset_dir=y']))\n"
            "except UserError as e:\n"
            "    print(e)\n"
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'apache_beam', 'tensorflow'}))\n")
    run = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert run.stdout.splitlines() == ["two dataset folders: x and --dataset_dir=y; give one", "[]"], run.stderr
