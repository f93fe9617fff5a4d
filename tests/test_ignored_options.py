"""No silent options (issue 30): every option given that has no effect in the run is one warning line saying why."""

from __future__ import annotations

import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from pipeline.options import given_flags, ignored_options, validate


def warnings(*args, dataflow=False, split_folders=False, input_dir="/data/in", output_dir="/data/out"):
    argv = [f"--input_dir={input_dir}", f"--output_dir={output_dir}", *args]
    options = PipelineOptions(argv)
    return ignored_options(argv, options, validate(options), dataflow=dataflow, split_folders=split_folders)


def test_given_flags_reads_both_forms():
    assert given_flags(["--jpeg_quality=90", "--seed", "3", "x", "-v"]) == {"jpeg_quality", "seed"}


def test_an_ordinary_run_has_no_warning():
    assert warnings() == []
    assert warnings("--jpeg_quality=90", "--image_size=224", "--validation_split=0.1", "--seed=3") == []
    assert warnings("--run_date=2026-01-02", output_dir="/data/{date}") == []
    assert warnings("--no_wait", dataflow=True) == []


@pytest.mark.parametrize("args, kwargs, expected", [
    (["--validation_split=0.3"], {"split_folders": True},
     "--validation_split has no effect: the input's split folders decide every image's split; drop "
     "--validation_split, or put the images in class folders at the top to let it split them"),
    (["--test_split=0.1"], {"split_folders": True}, "--test_split has no effect: the input's split folders"),
    (["--run_date=2026-01-02"], {},
     "--run_date has no effect: --output_dir holds no {date} placeholder for it to fill; put {date} in "
     "--output_dir (e.g. gs://bucket/datasets/{date}) or drop --run_date"),
    (["--image_format=png", "--jpeg_quality=80"], {},
     "--jpeg_quality has no effect: --image_format=png stores lossless PNG; drop --jpeg_quality, or store JPEG"),
    (["--image_format=png", "--chroma_subsampling=4:4:4"], {}, "--chroma_subsampling has no effect"),
    (["--resize_mode=none", "--image_size=224"], {},
     "--image_size has no effect: --resize_mode=none keeps every image at its own size"),
    (["--resize_mode=none", "--resample=lanczos"], {}, "--resample has no effect"),
    (["--no_wait"], {}, "--no_wait has no effect: it only stops the launcher waiting for a Dataflow job"),
    (["--follow_symlinks"], {"input_dir": "gs://bucket/photos"},
     "--follow_symlinks has no effect: Cloud Storage has no symbolic links; drop it"),
    (["--num_shards=train=4,validation=2,test=1", "--shard_size_mb=50"], {},
     "--shard_size_mb has no effect: --num_shards sets the shard count of every split"),
])
def test_an_option_without_effect_is_one_warning(args, kwargs, expected):
    found = warnings(*args, **kwargs)
    assert len(found) == 1 and found[0].startswith(expected), found
    assert "\n" not in found[0]
