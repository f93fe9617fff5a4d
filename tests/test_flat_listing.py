"""A flat folder of many images (labels in the file names, an unlabeled set) is listed by every worker, not by one:
on gs:// its level is cut into parts listed a level deep (transforms/inputs/listing.py), and the launcher looks at a
bounded number of its entries (pipeline/plan.py)."""

from __future__ import annotations

import pytest

from tests.fake_gcs_listing import BUCKET, serve
from transforms.inputs import folder_parts as fp
from transforms.inputs import listing


def _use_fake(server, monkeypatch, tmp_path):
    from pipeline.cloud import skip_credential_lookup

    for name, value in server.client_env(str(tmp_path)).items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    skip_credential_lookup()


def _flat_names(classes, per_class, folder_classes=()):
    return [f"class_{c:04d}{'/' if c in folder_classes else '_'}img_{i:08d}.jpg"
            for c in range(classes) for i in range(per_class)]


@pytest.mark.timeout(300)
def test_a_flat_gcs_folder_is_listed_in_parts_each_name_once_and_its_subfolders_once(monkeypatch, tmp_path):
    """gs://b/in/ holds 16,000 files directly and one folder of 4,000 among them (class_0001/): the input level's
    first page where it is, the rest in parts listed a level deep (delimiter '/') by any worker; the subfolder,
    whose names straddle the parts' bounds, is listed once, as a class folder, and every image is found once."""
    import apache_beam as beam
    from apache_beam.testing.util import assert_that, equal_to

    from tests.pipelines import TestPipeline
    from transforms.inputs.listing import ListImages

    monkeypatch.setattr(fp, "PART_NAMES", 1500)
    monkeypatch.setattr(listing, "SMALL_FOLDER_PAGES", 1)
    with serve(5, 4000, flat=True, folder_classes=(1,)) as server:
        _use_fake(server, monkeypatch, tmp_path)
        expected = _flat_names(5, 4000, folder_classes=(1,))
        with TestPipeline(options=beam.options.pipeline_options.PipelineOptions(
                ["--direct_running_mode=in_memory", "--direct_num_workers=1"])) as p:
            listed = p | ListImages(f"gs://{BUCKET}/in")
            assert_that(listed["images"] | beam.Map(lambda ref: ref.relpath), equal_to(expected))
            assert_that(listed[listing.FOUND] | beam.CombineGlobally(sum), equal_to([len(expected)]),
                        label="EveryEntryCounted")
        stats = server.stats()
        assert stats["unknown"] == []
    parts = p.result.metrics().query(beam.metrics.MetricsFilter().with_name("folder_parts"))["counters"]
    assert sum(c.committed for c in parts) >= 6  # 19,000 names after the first page, at 1,500 a part


def test_a_subfolder_is_reported_by_the_part_that_holds_its_first_name():
    names = sorted(["in/a.jpg", "in/m/1.jpg", "in/m/2.jpg", "in/m/3.jpg", "in/z.jpg"])

    def names_before(subfolder, start):
        return any(n.startswith(subfolder) and n < start for n in names)

    bounds = ["in/a.jpg", "in/m/2.jpg", "in/m/3.jpg", ""]  # the subfolder m/ straddles two bounds
    parts = [fp.FolderPart("b", "in/", start, end, "in/a.jpg" if i == 0 else "", "/")
             for i, (start, end) in enumerate(zip(bounds, bounds[1:], strict=False))]
    reporting = [part for part in parts if fp.reports_subfolder(part, "in/m/", names_before)]
    assert reporting == [parts[0]]
    # the first pages' last name is a subfolder: they reported it, the part that starts there does not
    first = fp.FolderPart("b", "in/", "in/m/", "", "in/m/", "/")
    assert not fp.reports_subfolder(first, "in/m/", names_before)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("flag", ["--label_from=(?P<label>class_\\d+)_img", "--unlabeled"])
def test_the_launcher_looks_at_a_bounded_number_of_a_flat_folders_names(monkeypatch, tmp_path, flag):
    """gs://b/in/ holds 60,000 images directly: the plan reads its first TOP_FILES names and a few pages more at
    most, never the whole level, and says what it could not count ("at least")."""
    from apache_beam.options.pipeline_options import PipelineOptions

    from pipeline import plan
    from pipeline.options import validate

    with serve(3, 20_000, flat=True) as server:
        _use_fake(server, monkeypatch, tmp_path)
        settings = validate(PipelineOptions([f"--input_dir=gs://{BUCKET}/in", f"--output_dir={tmp_path / 'out'}",
                                             flag, "--no_auth"]))
        result = plan.plan_dataset(settings)
        stats = server.stats()
    assert stats["unknown"] == []
    assert stats["objects_listed"] <= plan.TOP_FILES + 2 * plan.TOP_PAGE  # of 60,000
    assert stats["list_requests"] <= plan.TOP_FILES // plan.TOP_PAGE + 2
    if flag == "--unlabeled":
        assert f"(at least {plan.TOP_FILES}) go into one split" in " ".join(result.notes)
    else:
        assert "class_0000_img_00000000.jpg -> class_0000" in " ".join(result.notes)
        assert not result.split_folders


def test_the_launcher_looks_at_a_bounded_number_of_a_local_flat_folders_names(monkeypatch, tmp_path):
    """A local flat folder of 3 x TOP_FILES names: the look stops at TOP_FILES files (counted through the
    listing), and the error on a folder of images without labels says "at least"."""
    from apache_beam.options.pipeline_options import PipelineOptions

    from pipeline import plan
    from pipeline.errors import UserError
    from pipeline.options import validate

    monkeypatch.setattr(plan, "TOP_FILES", 300)
    flat = tmp_path / "flat"
    flat.mkdir()
    for i in range(900):
        (flat / f"img_{i:04d}.jpg").write_bytes(b"")  # never read: the error comes before any sample
    looked = []
    real = plan.list_level

    def counting(*args, **kwargs):
        for item in real(*args, **kwargs):
            looked.append(item)
            yield item

    monkeypatch.setattr(plan, "list_level", counting)
    settings = validate(PipelineOptions([f"--input_dir={flat}", f"--output_dir={tmp_path / 'out'}"]))
    with pytest.raises(UserError) as raised:
        plan.plan_dataset(settings)
    assert len(looked) == 301  # TOP_FILES files, and the one that says there are more
    assert f"found at least 300 images directly in {flat} but no class folders" in str(raised.value)


@pytest.mark.timeout(600)
def test_a_long_flat_gcs_folder_is_converted_with_every_image_once(monkeypatch, tmp_path):
    """A whole --label_from run on gs://b/in/: 1,500 images named by their labels directly in it and a folder
    of 500 among them, on pages of 100 names (the fake's), so the level is listed in several parts: every image is
    written once, with the label its name gives."""
    import json

    import tests.fake_gcs_listing as fake
    from pipeline.reader import load_info
    from tests.conftest import convert

    monkeypatch.setattr(fake, "MAX_RESULTS", 100)
    monkeypatch.setattr(fp, "PAGE", 100)
    monkeypatch.setattr(fp, "PART_NAMES", 200)
    monkeypatch.setattr(listing, "SMALL_FOLDER_PAGES", 2)
    out = tmp_path / "out"
    with serve(4, 500, flat=True, folder_classes=(2,)) as server:
        _use_fake(server, monkeypatch, tmp_path)
        code = convert(f"gs://{BUCKET}/in", out, r"--label_from=(?P<label>class_\d+)[_/]img", "--no_auth",
                       "--image_size=16", "--validation_split=0", "--test_split=0")
        stats = server.stats()
    assert code == 0
    assert stats["unknown"] == []
    info = load_info(str(out))
    assert info["splits"]["train"]["records"] == 2000
    assert info["splits"]["train"]["class_counts"] == {f"class_{c:04d}": 500 for c in range(4)}
    # the level's parts, listed a level deep from their starts: 1,800 names after its first 2 pages, ~200 a part
    assert len(stats["level_range_starts"]) >= 3
    # each sources line: [relpath, sha256, split, label]
    sources = [json.loads(line) for path in out.glob("sources-*.jsonl") for line in path.read_text().splitlines()]
    paths = [relpath for relpath, _, _, _ in sources]
    assert sorted(paths) == sorted(_flat_names(4, 500, folder_classes=(2,)))  # every image once
    names = (out / "labels.txt").read_text().split()
    assert {(relpath[:10], names[label]) for relpath, _, _, label in sources} == {
        (f"class_{c:04d}", f"class_{c:04d}") for c in range(4)}  # each image's label is its name's
    assert stats["downloads"] >= 2000


@pytest.mark.timeout(300)
def test_flat_split_folders_on_gcs_are_listed_in_parts(monkeypatch, tmp_path):
    """gs://b/in/{train,validation}/ each hold 3,000 images directly (labels in their names): each split folder, a
    level of its own, is listed in parts (ListSplitsParts), and every image is found once."""
    import apache_beam as beam
    from apache_beam.testing.util import assert_that, equal_to

    from tests.pipelines import TestPipeline
    from transforms.inputs.listing import ListImages

    monkeypatch.setattr(fp, "PART_NAMES", 500)
    monkeypatch.setattr(listing, "SMALL_FOLDER_PAGES", 1)
    with serve(2, 1500, splits=("train", "validation"), flat=True) as server:
        _use_fake(server, monkeypatch, tmp_path)
        expected = [f"{split}/{name}" for split in ("train", "validation") for name in _flat_names(2, 1500)]
        with TestPipeline(options=beam.options.pipeline_options.PipelineOptions(
                ["--direct_running_mode=in_memory", "--direct_num_workers=1"])) as p:
            listed = p | ListImages(f"gs://{BUCKET}/in", split_folders=True)
            assert_that(listed["images"] | beam.Map(lambda ref: ref.relpath), equal_to(expected))
        stats = server.stats()
    assert stats["unknown"] == []
    starts = stats["level_range_starts"]
    for split in ("train", "validation"):  # 2,000 names after each first page, at about 500 a part
        assert len([start for start in starts if start.startswith(f"in/{split}/")]) >= 3


def test_class_folders_beside_more_loose_files_than_the_look_are_refused(monkeypatch, tmp_path, capsys):
    """Class folders (cats/, dogs/) beside more loose files than TOP_FILES: the launcher cannot find every class
    folder without listing every file, so it stops with one line that says what to do; --label_from, where the
    folders are not the classes, goes on."""
    import shutil

    from pipeline import plan
    from tests.conftest import main_in_process
    from tests.fake_gcs_listing import make_jpeg

    monkeypatch.setattr(plan, "TOP_FILES", 40)
    photo = make_jpeg(64, 48)
    tree = tmp_path / "in"
    for name in ("cats", "dogs"):
        (tree / name).mkdir(parents=True)
        (tree / name / "1.jpg").write_bytes(photo)
    for i in range(60):
        (tree / f"loose_{i:03d}.jpg").write_bytes(photo)
    code, err = main_in_process(capsys, f"--input_dir={tree}", f"--output_dir={tmp_path / 'out'}")
    assert code == 2
    assert err.strip().count("\n") == 0
    assert f"{tree} holds more than 40 files directly beside its folders (cats/, dogs/)" in err
    assert "move the loose files into a folder of their own" in err
    shutil.rmtree(tmp_path / "out", ignore_errors=True)
    from apache_beam.options.pipeline_options import PipelineOptions

    from pipeline.options import validate

    settings = validate(PipelineOptions([f"--input_dir={tree}", f"--output_dir={tmp_path / 'out'}",
                                         r"--label_from=(?P<label>[a-z]+)_\d+"]))
    assert not plan.plan_dataset(settings).split_folders  # the look stops, the plan goes on


def test_a_local_flat_folder_is_streamed_not_held(monkeypatch, tmp_path):
    """A local folder of more names than SORTED_NAMES is read from os.scandir as it is listed (in the file
    system's order), never as one list of all its names; a small one keeps the name order. Every name once."""
    import itertools
    import os

    from transforms.inputs.listing import Entry, Folder, list_level

    monkeypatch.setattr(listing, "SORTED_NAMES", 10)
    flat = tmp_path / "flat"
    (flat / "sub").mkdir(parents=True)
    for i in range(40):
        (flat / f"{i:02d}.jpg").write_bytes(b"x")
    read = []
    real_scandir = os.scandir

    class Counted:
        def __init__(self, path):
            self._listing = real_scandir(path)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self._listing.close()

        def __iter__(self):
            for entry in self._listing:
                read.append(entry.name)
                yield entry

    monkeypatch.setattr(os, "scandir", Counted)
    first = list(itertools.islice(list_level(Folder(str(flat)), str(flat)), 12))
    assert len(first) == 12 and len(read) <= 13  # 11 names read for the first 11 and one more: not 41
    items = list(list_level(Folder(str(flat)), str(flat)))
    assert sorted(os.path.basename(item.path) for item in items if isinstance(item, Entry)) == [
        f"{i:02d}.jpg" for i in range(40)]
    assert [os.path.basename(item.path) for item in items if isinstance(item, Folder)] == ["sub"]
    monkeypatch.setattr(listing, "SORTED_NAMES", 100)
    names = [os.path.basename(item.path) for item in list_level(Folder(str(flat)), str(flat))]
    assert names == sorted(names)  # a small folder: in name order, as before
