"""gs:// input, output and labels file against a real GCS-compatible server on loopback (gcp-storage-emulator)."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions

from pipeline.errors import UserError
from pipeline.options import validate
from pipeline.output_folder import prepare_output
from tests.conftest import cli, convert
from tests.gcs_fixtures import NO_AUTH
from transforms.base.tfrecord import iter_records

BUCKET = "gcs-e2e"


@pytest.fixture(scope="module")
def gcs_input(gcs_emulator, sample_tree, sample_output):
    """The sample tree in gs://gcs-e2e/photos, and the local run's labels as gs://gcs-e2e/labels.txt."""
    bucket = gcs_emulator.create_bucket(BUCKET)
    assert gcs_emulator.upload_tree(sample_tree, f"{bucket}/photos") == 161
    gcs_emulator.write(f"{bucket}/labels.txt", (sample_output / "labels.txt").read_bytes())
    return bucket


@pytest.fixture(scope="module")
def gcs_output(gcs_input):
    """The sample tree converted gs:// to gs:// with the same options as `sample_output`."""
    output = f"{gcs_input}/tfrecords"
    assert convert(f"{gcs_input}/photos", output, NO_AUTH, f"--labels_file={gcs_input}/labels.txt") == 0
    return output


def _records_by_split(info: dict, directory: str) -> dict[str, Counter]:
    """Every record of every shard, read back through Beam's file systems (local or gs://)."""
    return {
        split: Counter(
            record
            for shard in split_info["shards"]
            for record in iter_records(FileSystems.join(directory, shard["file"]))
        )
        for split, split_info in info["splits"].items()
    }


def test_gcs_conversion_gives_the_same_dataset_as_local_folders(gcs_emulator, gcs_output, sample_output):
    names = gcs_emulator.list_names(gcs_output)
    sources = json.loads(gcs_emulator.read(f"{gcs_output}/image_tfrecords.json"))["sources"]["files"]
    local_sources = json.loads((sample_output / "image_tfrecords.json").read_text())["sources"]["files"]
    # no temporary objects left behind: the same files, but for each run's sources list (named after its run id)
    assert len(sources) >= 1 and [n for n in names if n not in sources] == sorted(
        p.name for p in sample_output.iterdir() if p.name not in local_sources)
    for name in ("labels.txt", "errors.jsonl", "features.json"):
        assert gcs_emulator.read(f"{gcs_output}/{name}") == (sample_output / name).read_bytes(), name

    remote = json.loads(gcs_emulator.read(f"{gcs_output}/image_tfrecords.json"))
    local = json.loads((sample_output / "image_tfrecords.json").read_text())
    assert remote["class_names"] == local["class_names"]
    assert remote["files"] == local["files"]
    assert remote["rejected_by_reason"] == local["rejected_by_reason"]
    assert remote["skipped_by_reason"] == {"not_an_image_extension": 1} == local["skipped_by_reason"]
    assert remote["splits"].keys() == local["splits"].keys() == {"train", "validation"}
    for split, split_info in local["splits"].items():
        assert remote["splits"][split]["records"] == split_info["records"] > 0
        assert remote["splits"][split]["class_counts"] == split_info["class_counts"]
        # Beam deals records to shards round-robin from a random start, so compare counts, not order.
        assert sorted(s["records"] for s in remote["splits"][split]["shards"]) == sorted(
            s["records"] for s in split_info["shards"])
    assert {k: v for k, v in remote["options"].items() if k not in ("input_dir", "labels_file")} == {
        k: v for k, v in local["options"].items() if k not in ("input_dir", "labels_file")}
    assert remote["options"]["labels_file"] == f"gs://{BUCKET}/labels.txt"

    # The very same serialized Examples (pixels, labels, paths), read back from the emulator.
    remote_records = _records_by_split(remote, gcs_output)
    assert remote_records == _records_by_split(local, str(sample_output))
    assert sum(remote_records["train"].values()) == remote["splits"]["train"]["records"]


def test_gcs_error_report_names_the_skipped_file(gcs_emulator, gcs_output):
    lines = gcs_emulator.read(f"{gcs_output}/errors.jsonl").decode().splitlines()
    assert [json.loads(line)["relpath"] for line in lines] == ["README.txt"]
    assert json.loads(lines[0])["reason"] == "not_an_image_extension"


def test_existing_gcs_dataset_is_not_replaced_without_overwrite(gcs_emulator, gcs_input, gcs_output):
    before = gcs_emulator.read(f"{gcs_output}/image_tfrecords.json")
    with pytest.raises(UserError, match="already holds a dataset"):
        convert(f"{gcs_input}/photos", gcs_output, NO_AUTH)
    assert gcs_emulator.read(f"{gcs_output}/image_tfrecords.json") == before


@pytest.mark.parametrize("flag", ["input", "output", "labels"])
def test_missing_bucket_is_a_one_line_user_error(gcs_input, tmp_path, flag):
    paths = {"input": f"{gcs_input}/photos", "output": f"{gcs_input}/out-{flag}", "labels": None}
    paths[flag] = "gs://no-such-bucket-4f2a/x"
    extra = [f"--labels_file={paths['labels']}"] if paths["labels"] else []
    with pytest.raises(UserError) as error:
        convert(paths["input"], paths["output"], NO_AUTH, *extra)
    message = str(error.value)
    assert message.startswith(f"--{flag}_{'file' if flag == 'labels' else 'dir'} gs://no-such-bucket-4f2a/x: ")
    assert "the bucket gs://no-such-bucket-4f2a does not exist" in message
    assert "\n" not in message


def test_empty_gcs_folder_is_a_user_error(gcs_input):
    with pytest.raises(UserError, match=r"--input_dir gs://gcs-e2e/nothing-here is empty"):
        convert(f"{gcs_input}/nothing-here", f"{gcs_input}/out-empty", NO_AUTH)


def test_cli_reports_a_missing_bucket_in_one_line(gcs_input):
    result = cli("pipeline.main", "--input_dir=gs://no-such-bucket-4f2a/photos",
                 f"--output_dir={gcs_input}/out-cli", NO_AUTH, timeout=120)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "error: --input_dir gs://no-such-bucket-4f2a/photos: the bucket gs://no-such-bucket-4f2a does not exist: "
        "check the name, or create it with gcloud storage buckets create gs://no-such-bucket-4f2a"
    ]


def test_prepare_output_on_gcs_removes_only_this_tools_leftovers(gcs_emulator, gcs_input):
    folder = f"{gcs_input}/interrupted"
    leftovers = [".image-tfrecords-tmp/20261129-230000-89abcdef/shards/train-00000-of-00002.tfrecord",
                 ".image-tfrecords-tmp/20261129-230000-89abcdef/plan.json"]
    foreign = ["notes.txt", "train-notes.txt", "keep/train-00000-of-00001.tfrecord"]
    for name in leftovers + foreign:
        gcs_emulator.write(f"{folder}/{name}", b"x")
    settings = validate(PipelineOptions([f"--input_dir={gcs_input}/photos", f"--output_dir={folder}"]))

    assert prepare_output(settings, "run-1", dry_run=True).paths == []
    assert gcs_emulator.list_names(folder) == sorted(leftovers + foreign)

    removed = prepare_output(settings, "run-1", background=True).paths  # gs://: deleted before it returns
    assert sorted(path.split("/interrupted/", 1)[1] for path in removed) == sorted(leftovers)
    assert gcs_emulator.list_names(folder) == sorted(foreign)

    # Files under the tool's final names in a folder without a dataset: no run of it can be proven to have written
    # them, so they stop the run and stay.
    unclaimed = ["train-00000-of-00002.tfrecord", "labels.txt"]
    for name in unclaimed:
        gcs_emulator.write(f"{folder}/{name}", b"x")
    with pytest.raises(UserError, match=r"holds no dataset of this tool, but 2 file\(s\) named as this run names its "
                                        r"own \(labels.txt, train-00000-of-00002.tfrecord\)"):
        prepare_output(settings, "run-2", background=True)
    assert gcs_emulator.list_names(folder) == sorted(foreign + unclaimed)


def test_duplicates_are_hashed_and_dropped_on_gcs(gcs_emulator, gcs_input, sample_tree):
    """--duplicates=drop's hashing pass reads gs:// objects; the copy of a cat filed as a dog is a conflict."""
    import hashlib

    photos = sorted(p for p in (sample_tree / "circle").iterdir())[:3]
    folder = f"{gcs_input}/copies"
    for n, photo in enumerate(photos):
        gcs_emulator.write(f"{folder}/circle/{n}.{photo.name}", photo.read_bytes())
    gcs_emulator.write(f"{folder}/circle/again.{photos[0].name}", photos[0].read_bytes())
    gcs_emulator.write(f"{folder}/square/odd.{photos[1].name}", photos[1].read_bytes())
    output = f"{gcs_input}/copies_out"
    assert convert(folder, output, NO_AUTH, "--duplicates=drop", "--image_size=16") == 0
    info = json.loads(gcs_emulator.read(f"{output}/image_tfrecords.json"))
    assert info["files"]["written"] == 2 and info["rejected_by_reason"] == {"duplicate": 1, "duplicate_conflict": 2}
    assert info["duplicates"]["groups"] == 2 and info["duplicates"]["conflicting_labels"] == 1
    assert {g["sha256"] for g in info["duplicates"]["examples"]} == {
        hashlib.sha256(p.read_bytes()).hexdigest() for p in photos[:2]}


def test_a_bucket_made_again_in_the_session_is_empty(gcs_emulator):
    """A module's fixture set up a second time in one xdist worker (worksteal) gets its bucket back empty, not a
    409 Conflict that errors every test of the module."""
    bucket = gcs_emulator.create_bucket("made-twice")
    gcs_emulator.write(f"{bucket}/out/a.txt", "left by the module's earlier tests")
    assert gcs_emulator.list_names(bucket) == ["out/a.txt"]
    assert gcs_emulator.create_bucket("made-twice") == bucket
    assert gcs_emulator.list_names(bucket) == []
