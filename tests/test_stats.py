"""Statistics of the converted dataset (issue 18): pixel mean and std per channel and split, source-size
histograms, the share of upscaled images, and a smaller --image_size suggested when most were upscaled."""

from __future__ import annotations

import io
import json
import random

import numpy as np
import pytest
from PIL import Image

from pipeline.report import format_summary, human_bytes
from tests.conftest import convert, run_tool
from transforms.base.examples import Example
from transforms.base.tfrecord import iter_records
from transforms.images.stats import (
    SIZE_EDGES,
    ImageStats,
    SplitStats,
    StatsTally,
    bucket,
    describe,
    merge,
    quantile_side,
    suggest_image_size,
)

RED, BLUE, GREEN = (255, 0, 0), (0, 128, 255), (10, 200, 30)


def _info(out) -> dict:
    return json.loads((out / "image_tfrecords.json").read_text())


def _stored_pixels(out, info) -> dict[str, np.ndarray]:
    """Per split, every stored pixel (N x 3), decoded from the records with Pillow."""
    pixels = {}
    for split, split_info in info["splits"].items():
        rows = []
        for shard in split_info["shards"]:
            for raw in iter_records(str(out / shard["file"])):
                data = Example.FromString(raw).features.feature["image"].bytes_list.value[0]
                rows.append(np.asarray(Image.open(io.BytesIO(data)).convert("RGB"), np.float64).reshape(-1, 3))
        pixels[split] = np.concatenate(rows)
    return pixels


def _save(path, image: Image.Image, **kwargs) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path, **kwargs)


def _noise(rng: np.random.Generator, width: int, height: int, mode: str = "RGB") -> Image.Image:
    shape = (height, width) if mode == "L" else (height, width, len(mode))
    array = rng.integers(0, 256, shape, dtype=np.uint8)
    if mode == "RGBA":
        array[..., 3] = 255  # opaque: the stored RGB is the source's RGB exactly
    return Image.fromarray(array, mode)


def test_mean_and_std_are_those_of_the_stored_pixels_exactly_per_split(tmp_path):
    """Lossless output kept at the source size: the statistics equal numpy's over the decoded records, to the
    rounding of the description (4 decimals), split by split, over several shards merged."""
    rng = np.random.default_rng(7)
    src = tmp_path / "in"
    expected = {"train": [], "validation": []}
    for split, count in (("train", 9), ("validation", 4)):
        for i in range(count):
            width, height = int(rng.integers(5, 90)), int(rng.integers(5, 90))
            mode = ("RGB", "L", "RGBA")[i % 3]
            image = _noise(rng, width, height, mode)
            if i == 0:  # a horizontal gradient
                ramp = np.tile(np.linspace(0, 255, width).astype(np.uint8), (height, 1))
                image = Image.fromarray(np.stack([ramp, 255 - ramp, ramp // 2], axis=-1), "RGB")
            _save(src / split / ("cat" if i % 2 else "dog") / f"{i}.png", image)
            expected[split].append(np.asarray(image.convert("RGB"), np.float64).reshape(-1, 3))
    out = tmp_path / "out"
    assert convert(src, out, "--resize_mode=none", "--image_format=png", "--num_shards=train=3,validation=2") == 0
    info = _info(out)
    assert [len(s["shards"]) for s in info["splits"].values()] == [3, 2]
    stats = info["statistics"]
    decoded = _stored_pixels(out, info)
    for split, arrays in expected.items():
        pixels = np.concatenate(arrays)
        np.testing.assert_array_equal(np.sort(decoded[split], axis=0), np.sort(pixels, axis=0))
        got = stats["splits"][split]
        assert got["images"] == len(arrays)
        assert got["pixels"] == len(pixels)
        assert got["mean"] == pytest.approx(pixels.mean(axis=0).tolist(), abs=5e-5)
        assert got["std"] == pytest.approx(pixels.std(axis=0).tolist(), abs=5e-5)
        assert got["upscaled"] == 0 and got["upscaled_share"] == 0.0


def test_jpegs_stored_as_they_are_have_the_statistics_of_their_decoded_pixels(tmp_path):
    """--resize_mode=none keeps an upright baseline JPEG's bytes: the statistics are of its decoded pixels,
    exactly those a reader decodes from the record (Pillow here)."""
    rng = np.random.default_rng(11)
    src = tmp_path / "in"
    for i in range(5):
        _save(src / "cls" / f"{i}.jpg", _noise(rng, int(rng.integers(20, 70)), int(rng.integers(20, 70))),
              quality=85)
    out = tmp_path / "out"
    assert convert(src, out, "--resize_mode=none", "--validation_split=0") == 0
    info = _info(out)
    stored = _stored_pixels(out, info)["train"]
    originals = {p.read_bytes() for p in (src / "cls").iterdir()}
    records = [Example.FromString(raw).features.feature["image"].bytes_list.value[0]
               for raw in iter_records(str(out / info["splits"]["train"]["shards"][0]["file"]))]
    assert set(records) == originals  # passed through: the stored bytes are the files' own
    got = info["statistics"]["splits"]["train"]
    assert got["pixels"] == len(stored)
    assert got["mean"] == pytest.approx(stored.mean(axis=0).tolist(), abs=5e-5)
    assert got["std"] == pytest.approx(stored.std(axis=0).tolist(), abs=5e-5)


def test_solid_colours_resized_give_exact_means_histograms_and_upscaled_shares(tmp_path):
    """Stretched to 64x64 PNG: solid colours stay solid, so each split's mean and std are known exactly; the
    histograms count the sources' upright sizes before resizing (an EXIF-rotated JPEG by its upright size)."""
    src = tmp_path / "in"
    _save(src / "train" / "a" / "red.png", Image.new("RGB", (20, 20), RED))  # upscaled
    _save(src / "train" / "a" / "blue.png", Image.new("RGB", (200, 100), BLUE))  # both sides shrink: not upscaled
    _save(src / "train" / "b" / "green.png", Image.new("RGB", (40, 300), GREEN))  # width enlarged: upscaled
    exif = Image.Exif()
    exif[0x0112] = 6  # stored 90 x 300, shown turned: 300 wide, 90 high
    _save(src / "validation" / "a" / "turned.jpg", Image.new("RGB", (90, 300), (128, 128, 128)), exif=exif,
          quality=100)
    out = tmp_path / "out"
    assert convert(src, out, "--image_size=64", "--image_format=png", "--resize_mode=stretch") == 0
    stats = _info(out)["statistics"]
    assert stats["channels"] == ["R", "G", "B"]
    assert stats["size_edges"] == list(SIZE_EDGES)
    train, validation = stats["splits"]["train"], stats["splits"]["validation"]
    colours = np.array([RED, BLUE, GREEN], np.float64)  # each 64 x 64 pixels
    assert train["mean"] == pytest.approx(colours.mean(axis=0).tolist(), abs=5e-5)
    assert train["std"] == pytest.approx(colours.std(axis=0).tolist(), abs=5e-5)
    assert train["pixels"] == 3 * 64 * 64
    assert (train["upscaled"], train["upscaled_share"]) == (2, pytest.approx(0.6667))
    # widths 20, 200, 40 -> <=32, 193-224, 33-64; heights 20, 100, 300 -> <=32, 97-128, 257-320
    assert _nonzero(train["source_width"]) == {0: 1, 6: 1, 1: 1}
    assert _nonzero(train["source_height"]) == {0: 1, 3: 1, 8: 1}
    # the turned JPEG: upright 300 x 90 (257-320 wide, 65-96 high), shrunk on both sides
    assert _nonzero(validation["source_width"]) == {8: 1}
    assert _nonzero(validation["source_height"]) == {2: 1}
    assert (validation["upscaled"], validation["upscaled_share"]) == (0, 0.0)
    assert validation["std"] == pytest.approx([0, 0, 0], abs=1.0)  # a grey JPEG: nearly flat
    assert validation["mean"] == pytest.approx([128, 128, 128], abs=1.0)
    # most images were upscaled, but the sources are not mostly smaller than 64: no smaller size suggested
    assert stats["suggested_image_size"] is None


def _nonzero(counts: list[int]) -> dict[int, int]:
    assert len(counts) == len(SIZE_EDGES) + 1
    return {i: n for i, n in enumerate(counts) if n}


def test_jpeg_statistics_are_of_the_pixels_before_encoding_within_what_decoders_differ_by(tmp_path):
    """JPEG output: the statistics are of the pixels before encoding. TensorFlow's accurate decoding of the
    stored records (what Pillow decodes too) gives means within 0.1 and standard deviations within one unit of
    them (0-255; 4:2:0 chroma subsampling of these sharp-edged shapes takes most of that from the std);
    tf.io.decode_jpeg's default (fast) decoding gives red and blue means about 1.2 lower: within 2."""
    tf = pytest.importorskip("tensorflow")
    from pipeline.sample_data import generate_dataset

    generate_dataset(str(tmp_path / "in"), images_per_class=8, seed=3, min_side=48, max_side=200)
    out = tmp_path / "out"
    assert convert(tmp_path / "in", out, "--image_size=96") == 0
    info = _info(out)
    for split, split_info in info["splits"].items():
        accurate, fast = [], []
        for shard in split_info["shards"]:
            for raw in tf.data.TFRecordDataset(str(out / shard["file"])):
                data = tf.io.parse_single_example(raw, {"image": tf.io.FixedLenFeature([], tf.string)})["image"]
                for rows, how in ((accurate, "INTEGER_ACCURATE"), (fast, "")):
                    image = tf.io.decode_jpeg(data, channels=3, dct_method=how).numpy()
                    rows.append(image.reshape(-1, 3).astype(np.float64))
        got = info["statistics"]["splits"][split]
        for rows, mean_within, std_within in ((accurate, 0.1, 1.0), (fast, 2.0, 1.5)):
            pixels = np.concatenate(rows)
            assert got["pixels"] == len(pixels)
            assert np.abs(np.array(got["mean"]) - pixels.mean(axis=0)).max() < mean_within
            assert np.abs(np.array(got["std"]) - pixels.std(axis=0)).max() < std_within


def _small_sources(root, count=12, side=128):
    for i in range(count):
        colour = (20 * i % 256, 255 - 15 * i, 90)
        _save(root / ("a" if i % 2 else "b") / f"{i}.png", Image.new("RGB", (side, side - (i % 3) * 8), colour))


def test_small_sources_get_a_smaller_image_size_suggested_in_the_printed_report(tmp_path):
    """128 px sources at the default --image_size=512: the run's report names --image_size=128 and the bytes."""
    _small_sources(tmp_path / "in")
    result = run_tool("pipeline.main", f"--input_dir={tmp_path / 'in'}", f"--output_dir={tmp_path / 'out'}",
                      "--direct_running_mode=in_memory", "--direct_num_workers=1")
    assert result.returncode == 0, result.stderr
    found = _info(tmp_path / "out")["statistics"]["suggested_image_size"]
    assert found == {
        "image_size": "128", "width": 128, "height": 128, "upscaled_share": 1.0,
        "sources_within": {"width": 1.0, "height": 1.0}, "pixel_ratio": 0.0625,
        "bytes": _info(tmp_path / "out")["total_bytes"], "estimated_bytes": found["estimated_bytes"],
    }
    low, high = found["estimated_bytes"]
    assert (low, high) == (int(found["bytes"] * 0.0625 ** 0.8), int(found["bytes"] * 0.0625 ** 0.55))
    line = next(line for line in result.stdout.splitlines() if line.startswith("Suggestion:"))
    assert "100.0 % of the images were smaller than --image_size=512" in line
    assert "--image_size=128" in line and "6.2 % of the pixels" in line
    assert f"roughly {human_bytes(low)} to {human_bytes(high)} instead of {human_bytes(found['bytes'])}" in line
    assert "Upscaled (smaller than the output size): 12 (100.0 % of the images; train " in result.stdout
    assert "Pixel mean / std per channel (R G B" in result.stdout
    assert "Source widths before resizing (px): 97-128 12" in result.stdout


@pytest.mark.parametrize("args", [["--image_size=64"], ["--resize_mode=fit"]])
def test_no_suggestion_when_the_sources_are_not_mostly_smaller(tmp_path, args):
    """Sources larger than the output size, or a resize mode that never enlarges: nothing suggested."""
    _small_sources(tmp_path / "in", count=6)
    assert convert(tmp_path / "in", tmp_path / "out", *args) == 0
    info = _info(tmp_path / "out")
    assert info["statistics"]["suggested_image_size"] is None
    assert "Suggestion:" not in format_summary(info)
    assert "Pixel mean / std per channel" in format_summary(info)


def test_the_description_fields_are_present_and_typed(sample_output):
    info = _info(sample_output)
    stats = info["statistics"]
    assert set(stats) == {"channels", "size_edges", "splits", "suggested_image_size"}
    assert list(stats["splits"]) == list(info["splits"])
    for split, s in stats["splits"].items():
        assert set(s) == {"images", "pixels", "mean", "std", "upscaled", "upscaled_share", "kept", "source_width",
                          "source_height", "sums", "squares"}
        # the exact integer sums the mean comes from (an append adds its images' to them)
        assert all(isinstance(v, int) for v in s["sums"] + s["squares"]) and len(s["sums"]) == 3
        assert [round(v / s["pixels"], 4) for v in s["sums"]] == s["mean"]
        assert s["images"] == info["splits"][split]["records"]
        assert s["pixels"] == s["images"] * 512 * 512
        assert all(isinstance(v, float) and 0 <= v <= 255 for v in s["mean"] + s["std"]) and len(s["mean"]) == 3
        assert all(isinstance(v, int) for v in s["source_width"] + s["source_height"])
        assert sum(s["source_width"]) == sum(s["source_height"]) == s["images"]
        assert isinstance(s["upscaled_share"], float) and s["upscaled_share"] == round(s["upscaled"] / s["images"], 4)
    assert sum(s["upscaled"] for s in stats["splits"].values()) == info["files"]["upscaled"]


# Plain functions.


def _stats(width, height, value=0, pixels=1) -> ImageStats:
    return ImageStats(width, height, pixels, (value * pixels,) * 3, (value * value * pixels,) * 3)


def test_merge_is_exact_and_the_same_in_any_order():
    tallies = []
    for seed in range(5):
        tally, rng = StatsTally(), random.Random(seed)
        for _ in range(20):
            size, value = (rng.randint(1, 9000), rng.randint(1, 9000)), rng.randint(0, 255)
            tally.add(_stats(*size, value, 10 ** 6), rng.random() < 0.3)
        tallies.append(tally.result())
    forward, backward = merge(tallies), merge(reversed(tallies))
    assert forward == backward
    assert merge([merge(tallies[:2]), merge(tallies[2:])]) == forward
    assert forward.images == 100 and sum(forward.source_width) == 100
    assert merge([]) == SplitStats()


def test_buckets_and_quantiles_read_off_the_edges():
    assert [bucket(s) for s in (1, 32, 33, 128, 129, 8192, 8193)] == [0, 0, 1, 3, 4, len(SIZE_EDGES) - 1,
                                                                     len(SIZE_EDGES)]
    counts = [0] * (len(SIZE_EDGES) + 1)
    counts[bucket(100)] = 3  # 97-128
    counts[bucket(1000)] = 1  # 769-1024
    assert quantile_side(counts, 0.75) == 128
    assert quantile_side(counts, 0.8) == 1024
    counts[-1] = 10  # over the last edge
    assert quantile_side(counts, 0.75) is None
    assert quantile_side([0] * len(counts), 0.5) is None


def test_suggestion_needs_most_images_upscaled_and_half_the_pixels_or_fewer():
    def split(sides, upscaled):
        tally = StatsTally()
        for i, (w, h) in enumerate(sides):
            tally.add(_stats(w, h), i < upscaled)
        return tally.result()

    small = split([(120, 90)] * 8 + [(600, 600)] * 2, upscaled=8)
    assert suggest_image_size(small, 512, 512, "stretch", 1000)["image_size"] == "128"
    assert suggest_image_size(small, 512, 384, "crop", 1000)["image_size"] == "128x96"
    assert suggest_image_size(small, 512, 512, "fit", 1000) is None
    assert suggest_image_size(split([(120, 90)] * 10, upscaled=5), 512, 512, "stretch", 1000) is None  # half
    assert suggest_image_size(split([(200, 200)] * 10, upscaled=10), 256, 256, "stretch", 1000) is None  # 224: small
    described = describe({"train": small}, 512, 512, "stretch", 1000)
    assert described["suggested_image_size"]["estimated_bytes"] == [int(1000 * 0.0625 ** 0.8),
                                                                    int(1000 * 0.0625 ** 0.55)]
    assert describe({"train": small}, None, None, "fit", 1000)["suggested_image_size"] is None
