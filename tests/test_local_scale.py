"""Local runs at any worker count, on Beam's public API (issue 46): many workers on 2 cores convert exactly what two
do, a Beam without the private names the tool once used still converts, and the plain-Beam switch runs for real."""

from __future__ import annotations

import json

import pytest

from pipeline.sample_data import generate_dataset
from tests.conftest import cli
from transforms.base.records import ImageRef
from transforms.output.write import MIN_CHUNK_IMAGES, chunk_limit

IMAGES_PER_CLASS = 40  # 160 images: every one of 32 workers gets chunks


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    root = tmp_path_factory.mktemp("scale_in")
    generate_dataset(str(root), images_per_class=IMAGES_PER_CLASS, seed=46, min_side=24, max_side=72)
    return root


def _shards(folder) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(folder.glob("*.tfrecord"))}


def _convert(photos, out, *extra, env=None):
    result = cli("pipeline.main", f"--input_dir={photos}", f"--output_dir={out}", "--image_size=16", "--quiet",
                 *extra, timeout=600, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


@pytest.fixture(scope="module")
def two_workers(photos, tmp_path_factory):
    out = tmp_path_factory.mktemp("two") / "out"
    _convert(photos, out, "--direct_num_workers=2")
    return out


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("workers", [16, 32])
def test_many_workers_on_two_cores_write_the_same_dataset_as_two(photos, two_workers, tmp_path, workers):
    out = tmp_path / "out"
    result = _convert(photos, out, f"--direct_num_workers={workers}")
    assert result.stderr == ""  # no traceback, no warning
    assert result.stdout.startswith(f"Found {4 * IMAGES_PER_CLASS} files: {4 * IMAGES_PER_CLASS} written, 0 rejected")
    info = json.loads((out / "image_tfrecords.json").read_text())
    assert info["files"]["written"] == 4 * IMAGES_PER_CLASS
    assert _shards(out) == _shards(two_workers)  # byte for byte: the chunking never reaches the records
    assert (out / "labels.txt").read_text() == (two_workers / "labels.txt").read_text()


@pytest.mark.timeout(600)
def test_a_beam_without_the_private_names_the_tool_once_used_still_converts(photos, two_workers, tmp_path):
    out = tmp_path / "out"
    result = cli("tests.hostile_beam_main", f"--input_dir={photos}", f"--output_dir={out}", "--image_size=16",
                 "--quiet", "--direct_num_workers=3", timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    # One line says the hook that found Beam changed stays out; nothing else is said.
    assert result.stderr.splitlines() == [
        "WARNING pipeline: Beam's core.get_function_arguments is not as this tool knows it: DoFn signatures are "
        "read as Beam reads them (a slower graph build)"]
    assert _shards(out) == _shards(two_workers)


@pytest.mark.timeout(600)
def test_the_plain_beam_switch_runs_beams_own_multi_processing_mode(photos, two_workers, tmp_path):
    """IMAGE_TFRECORDS_PLAIN_BEAM=1: no hook at all (no lean import, no memoizing, no started workers)."""
    out = tmp_path / "out"
    code = ("import sys, runpy\n"
            "sys.argv = ['pipeline.main', *sys.argv[1:]]\n"
            "try:\n    runpy.run_module('pipeline.main', run_name='__main__')\n"
            "finally:\n"
            "    from apache_beam.transforms import core\n"
            "    print('memoized' if getattr(core.get_function_arguments, 'memoized', False) else 'plain',\n"
            "          'pool' if 'pipeline.local.warm_workers' in sys.modules else 'no pool',\n"
            "          'pandas' if 'pandas' in sys.modules else 'no pandas', file=sys.stderr)\n")
    import os
    import subprocess
    import sys

    from tests.conftest import REPO

    result = subprocess.run([sys.executable, "-c", code, f"--input_dir={photos}", f"--output_dir={out}",
                             "--image_size=16", "--quiet", "--direct_num_workers=2"], cwd=REPO, capture_output=True,
                            text=True, timeout=600, env=dict(os.environ, IMAGE_TFRECORDS_PLAIN_BEAM="1"))
    assert result.returncode == 0, result.stderr[-3000:]
    # Beam imported whole (its pandas integration too), DoFn signatures read as Beam reads them, Beam's own workers.
    assert result.stderr.splitlines()[-1] == "plain no pool pandas"
    assert _shards(out) == _shards(two_workers)


def test_chunks_are_sized_so_that_every_worker_gets_several():
    assert chunk_limit(4000, 2) == 64  # two workers: the largest chunks, 63 of them
    assert chunk_limit(4000, None) == 64
    assert chunk_limit(4000, 96) == MIN_CHUNK_IMAGES  # 500 chunks for 96 workers, not 63
    assert chunk_limit(20_000, 96) == 27  # 741 chunks: 7.7 a worker
    assert chunk_limit(1_000_000, 96) == 64
    assert chunk_limit(10, 32, max_images=4) == 4  # never above the format's own limit


def test_every_split_is_cut_into_chunks_of_one_size_from_the_total():
    """With the layouts, a small validation split's chunks are as large as the training split's (mixed sizes
    left workers idle: 20,000 photos on 96 workers, 78 % busy with chunks of 24 and 8 images, 96 % with 27)."""
    from array import array

    from transforms.labels.sharding import SplitLayout
    from transforms.output.write import cut_chunks

    def refs(split, n):
        return [ImageRef(f"/in/{split}/{i}.jpg", f"{split}/{i}.jpg", 1000, split, "x", 0, i) for i in range(n)]

    layouts = {"train": SplitLayout(18_000, 18, array("q")), "validation": SplitLayout(2_000, 2, array("q"))}
    for split in ("train", "validation"):
        chunks = list(cut_chunks(((split, 0, layouts[split].shards), refs(split, 1000)), workers=96, layouts=layouts))
        assert {len(part) for _, part in chunks} == {26, 27}  # 1,000 images in 38 chunks of at most 27
    # without them, from the split alone: the validation split's chunks were the smallest allowed
    chunks = list(cut_chunks((("validation", 0, 2), refs("validation", 1000)), workers=96))
    assert {len(part) for _, part in chunks} == {MIN_CHUNK_IMAGES}
