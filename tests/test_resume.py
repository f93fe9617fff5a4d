"""Resume: a rerun after an interrupted run takes the chunks it converted (checked) and converts only the rest.

Each test interrupts a real run after some chunks were converted (an exception in the converter, a SIGKILL of
the whole process group, a Dataflow job whose workers die), reruns the same command, and reads every record
back: the dataset is byte for byte the one a fresh run makes, every image once with its path and SHA-256, and
verify passes. Options or input that changed in between are converted again, never mixed in.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import subprocess
import sys

import pytest

from pipeline import verify
from pipeline.cli import main_of
from tests.conftest import REPO, convert
from tests.crash_helpers import Stopped, dataset_files, done_records, stop_after_chunks
from tests.datasets import read_records, write_tiny_tree
from transforms.base.dataset_format import TEMP_DIR
from transforms.output import resume, write

CLASSES = {"cat": 12, "dog": 12, "fox": 12, "owl": 12}  # 48 images
OPTIONS = ["--num_shards=train=6,validation=2", "--image_size=16", "--index_files"]
IMAGES = sum(CLASSES.values())
RESUMED_LINE = re.compile(r"^Resumed: (?P<n>\d+) images from the interrupted run (?P<run>\S+), converted "
                          r"(?P<m>\d+)\.$", re.MULTILINE)


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    root = tmp_path_factory.mktemp("resume-photos")
    write_tiny_tree(root, CLASSES)
    return root


@pytest.fixture(scope="module")
def fresh(photos, tmp_path_factory):
    """The dataset an uninterrupted run makes of `photos`."""
    out = tmp_path_factory.mktemp("resume-fresh") / "out"
    assert convert(photos, out, *OPTIONS) == 0
    return out


def _done_records(out, suffix: str = ".json") -> dict[str, dict]:
    return done_records(out, suffix)


def _interrupt(monkeypatch, photos, out, after: int, *options) -> list[dict]:
    """Run the conversion, stopped by an exception once `after` chunks are done; their done records."""
    real = resume.write_done
    stop_after_chunks(monkeypatch, after)
    with pytest.raises(Exception, match="stopped after"):
        convert(photos, out, *(options or OPTIONS))
    monkeypatch.setattr(resume, "write_done", real)
    records = list(_done_records(out).values())
    assert len(records) == after
    return records


def _count_conversions(monkeypatch) -> list[int]:
    """The images each chunk converted in this process (write_piece's outcomes), as the run goes."""
    counts = []
    real = write.write_piece

    def counted(folder, key, outcomes, *args, **kwargs):
        seen = []

        def tally(items):
            for item in items:
                seen.append(item)
                yield item

        try:
            return real(folder, key, tally(outcomes), *args, **kwargs)
        finally:
            counts.append(len(seen))

    monkeypatch.setattr(write, "write_piece", counted)
    return counts


def _records(out) -> dict[str, tuple]:
    """source_path -> (split, sha256, label) of every record; each path once."""
    found = {}
    for split, rows in read_records(out).items():
        for row in rows:
            assert row["source_path"] not in found, f"{row['source_path']} is in the dataset twice"
            found[row["source_path"]] = (split, row["sha256"], row["label"])
    return found


def _sources(out) -> list[str]:
    info = json.loads((out / "image_tfrecords.json").read_text())
    return sorted(line for name in info["sources"]["files"] for line in (out / name).read_text().splitlines())


def assert_same_dataset(out, fresh) -> None:
    """`out` is `fresh`, byte for byte (shards, index files, errors, labels, TFDS's files, the description but for
    its run's fields, the sources' lines), with nothing left of any run, and verify passes."""
    assert dataset_files(out) == dataset_files(fresh)
    assert _sources(out) == _sources(fresh)
    assert _records(out) == _records(fresh)
    assert not (out / TEMP_DIR).exists()  # the interrupted run's folder went once this run published
    assert main_of(verify.run, [str(out)]) == 0


def test_a_rerun_takes_the_converted_chunks_and_converts_only_the_rest(monkeypatch, photos, fresh, tmp_path):
    out = tmp_path / "out"
    done = _interrupt(monkeypatch, photos, out, after=3)
    kept = sum(len(record["sizes"]) for record in done)
    (interrupted,) = os.listdir(out / TEMP_DIR)
    assert 0 < kept < IMAGES and (out / TEMP_DIR / interrupted / resume.PLAN_FILE).is_file()

    converted = _count_conversions(monkeypatch)
    assert convert(photos, out, *OPTIONS) == 0

    info = json.loads((out / "image_tfrecords.json").read_text())
    assert info["resumed"] == {"images": kept, "from_runs": [interrupted], "converted": IMAGES - kept}
    assert sum(converted) == IMAGES - kept  # the images of the 3 chunks were not converted again
    assert_same_dataset(out, fresh)
    # A run with nothing to resume says nothing of it.
    assert "resumed" not in json.loads((fresh / "image_tfrecords.json").read_text())


def test_a_run_stopped_while_it_assembled_shards_takes_their_chunks_from_the_shards(monkeypatch, photos, fresh,
                                                                                     tmp_path):
    """Every chunk converted, 3 shards assembled from their pieces (the pieces are gone into them), then the run
    stops: the rerun takes every chunk, those of the assembled shards from their byte ranges in the shards' files,
    and converts none. Chunks of 2 images: each shard is 2 to 4 pieces, concatenated."""
    out = tmp_path / "out"
    cut = write.cut_chunks
    monkeypatch.setattr(write, "cut_chunks", lambda keyed, file_format, *_, **__: cut(keyed, file_format, 2))
    real, assembled = resume.Resume.assembled, []

    def stop_after_three(self, *args):
        real(self, *args)
        assembled.append(args[1])
        if len(assembled) == 3:
            raise Stopped("stopped after 3 shards")

    monkeypatch.setattr(resume.Resume, "assembled", stop_after_three)
    with pytest.raises(Exception, match="stopped after 3 shards"):
        convert(photos, out, *OPTIONS)
    monkeypatch.setattr(resume.Resume, "assembled", real)
    records, in_shards = _done_records(out), list(_done_records(out, ".at.json").values())
    assert {r["file"] for r in in_shards} == set(assembled) and not any("pieces/" in r["file"] for r in in_shards)
    assert len(in_shards) > 3 and any(r["offset"] > 0 for r in in_shards)  # pieces within the shards' files
    assert all(records[r["digest"]]["file"] == r["piece"] for r in in_shards)  # the done records are as written

    converted = _count_conversions(monkeypatch)
    assert convert(photos, out, *OPTIONS) == 0

    info = json.loads((out / "image_tfrecords.json").read_text())
    assert info["resumed"]["images"] == IMAGES and sum(converted) == 0
    assert_same_dataset(out, fresh)


def test_a_run_killed_with_sigkill_is_resumed_by_the_same_command(photos, fresh, tmp_path):
    """The whole process group (launcher and its worker processes) gets SIGKILL mid-conversion; the rerun, a
    user's command, prints what it resumed."""
    out = tmp_path / "out"
    args = [f"--input_dir={photos}", f"--output_dir={out}", *OPTIONS]
    killed = subprocess.run([sys.executable, "-m", "tests.killed_after_pieces_main", *args], cwd=REPO,
                            capture_output=True, text=True, timeout=600, start_new_session=True,
                            env=dict(os.environ, KILL_AFTER_PIECES="2"))
    assert killed.returncode == -9, killed.stderr
    assert not (out / "image_tfrecords.json").exists()
    (interrupted,) = os.listdir(out / TEMP_DIR)

    rerun = subprocess.run([sys.executable, "-m", "pipeline.main", *args], cwd=REPO, capture_output=True, text=True,
                           timeout=600)
    assert rerun.returncode == 0, rerun.stderr
    assert "Took over the lock" in rerun.stderr  # the killed run's lock: its process has ended
    assert f"Resuming the interrupted run {interrupted}" in rerun.stderr
    line = RESUMED_LINE.search(rerun.stdout)
    assert line, rerun.stdout
    assert line["run"] == interrupted and int(line["n"]) >= 2 and int(line["n"]) + int(line["m"]) == IMAGES
    assert_same_dataset(out, fresh)


def test_other_options_convert_everything_with_one_line_saying_why(monkeypatch, capsys, photos, tmp_path):
    out = tmp_path / "out"
    _interrupt(monkeypatch, photos, out, 3)
    (interrupted,) = os.listdir(out / TEMP_DIR)
    other = ["--num_shards=train=6,validation=2", "--image_size=20", "--index_files"]

    converted = _count_conversions(monkeypatch)
    capsys.readouterr()
    assert convert(photos, out, *other) == 0

    lines = [line for line in capsys.readouterr().err.splitlines() if "resum" in line.lower()]
    assert lines == [f"WARNING pipeline: Not resuming the interrupted run {interrupted} in {out}: its options "
                     "differ (image_size: '16x16' -> '20x20'); its files are removed and everything is converted"]
    info = json.loads((out / "image_tfrecords.json").read_text())
    assert "resumed" not in info and sum(converted) == IMAGES
    assert {row["height"] for rows in read_records(out).values() for row in rows} == {20}  # none of 16 px
    assert not (out / TEMP_DIR).exists()
    assert main_of(verify.run, [str(out)]) == 0


def test_every_option_is_recorded_or_only_says_how_a_run_goes():
    """Every flag of the converter is in the plan's fingerprint and image_tfrecords.json (Settings.as_dict), or one
    of RUN_OPTIONS, which decide nothing a record holds: a new option must take a side."""
    import argparse

    from pipeline.flags import add_convert_arguments
    from pipeline.options import RUN_OPTIONS
    from tests.crash_helpers import settings_for

    parser = argparse.ArgumentParser()
    add_convert_arguments(parser)
    flags = {action.dest for action in parser._actions if action.dest != "help"}
    recorded = set(settings_for(os.path.join(REPO, "out"), "--reencode", "--unlabeled").as_dict()) | set(
        settings_for(os.path.join(REPO, "out"), "--split_lists=train=a.txt").as_dict()) | set(  # --unlabeled refuses it
        settings_for(os.path.join(REPO, "out"), "--task=detection").as_dict())  # detection's own options
    assert not recorded & RUN_OPTIONS
    assert flags - recorded - RUN_OPTIONS == set()
    assert {"image_backend", "reencode", "image_size", "jpeg_quality", "chroma_subsampling"} <= recorded


def test_another_image_backend_is_not_resumed_and_skip_names_it(monkeypatch, capsys, photos, tmp_path):
    """The fast core and Pillow encode other bytes: a Pillow run's chunks are never taken by a run of the default
    backend (nor the other way), the line says why, and --if_exists=skip does not call them the same options."""
    out = tmp_path / "out"
    _interrupt(monkeypatch, photos, out, 3, *OPTIONS, "--image_backend=pillow")
    (interrupted,) = os.listdir(out / TEMP_DIR)

    converted = _count_conversions(monkeypatch)
    capsys.readouterr()
    assert convert(photos, out, *OPTIONS) == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if "resum" in line.lower()]
    assert lines == [f"WARNING pipeline: Not resuming the interrupted run {interrupted} in {out}: its options "
                     "differ (image_backend: 'pillow' -> 'auto'); its files are removed and everything is converted"]
    info = json.loads((out / "image_tfrecords.json").read_text())
    assert "resumed" not in info and sum(converted) == IMAGES
    assert info["options"]["image_backend"] == "auto"

    from pipeline.errors import UserError
    with pytest.raises(UserError, match=r"made with other options \(image_backend: 'auto' -> 'pillow'\)"):
        convert(photos, out, *OPTIONS, "--image_backend=pillow", "--if_exists=skip")


def test_a_plan_of_other_library_versions_is_not_resumed_and_the_line_names_them():
    """The versions of the libraries that convert are in the plan and in each chunk's digest; the reason names
    the one that differs, never 'the input changed'."""
    from transforms.images.imaging import converter_libraries

    record = {"options": {"image_size": "16x16"}, "plan": {"sizing": [{}, 150, 900.0, None, 0]},
              "code": {"version": "0.1.0", "code": "abc", "format_version": 2, "libraries": converter_libraries()}}
    older = json.loads(json.dumps(record))
    older["code"]["libraries"]["pillow"] = "11.0.0"
    older["plan"]["sizing"][2] = 950.0  # which the other Pillow's sample measured, too
    assert resume.fingerprint(older) != resume.fingerprint(record)
    assert resume.plan_differences(older, record) == (
        f"it ran another version of the code (pillow: '11.0.0' -> {converter_libraries()['pillow']!r})")
    moved = json.loads(json.dumps(record))
    moved["plan"]["sizing"][2] = 950.0
    assert resume.plan_differences(moved, record) == (
        "what the launcher found in the input differs: the record size measured from a sample of the input's "
        "images, which sizes the shards")


def test_changed_input_is_converted_again_and_nothing_stale_is_published(monkeypatch, photos, tmp_path):
    """A file rewritten in place (same name, same size, other bytes) and a file added after the interruption: the
    chunks they are in are converted again, and the dataset is the one a fresh run makes of the new input."""
    source = tmp_path / "photos"
    write_tiny_tree(source, CLASSES)
    out = tmp_path / "out"
    done = _interrupt(monkeypatch, source, out, 4)
    # An image of a chunk that is done gets other bytes of the same size (another image of its class).
    members = [path for record in done for _, _, _, path in record["hashes"]]
    changed = next(p for p in members if any((source / p).stat().st_size == (source / q).stat().st_size
                                             and (source / p).read_bytes() != (source / q).read_bytes()
                                             for q in members if q != p))
    donor = next(q for q in members if q != changed and (source / q).stat().st_size == (source / changed).stat().st_size
                 and (source / q).read_bytes() != (source / changed).read_bytes())
    (source / changed).write_bytes((source / donor).read_bytes())
    write_tiny_tree(source, {"cat": 1}, start=50)  # and one image more

    converted = _count_conversions(monkeypatch)
    assert convert(source, out, *OPTIONS) == 0
    converted = sum(converted)

    fresh = tmp_path / "fresh"
    assert convert(source, fresh, *OPTIONS) == 0
    assert_same_dataset(out, fresh)
    records = _records(out)
    assert len(records) == IMAGES + 1
    assert records[changed][1] == hashlib.sha256((source / changed).read_bytes()).hexdigest()  # its new bytes
    info = json.loads((out / "image_tfrecords.json").read_text())
    resumed = info.get("resumed", {}).get("images", 0)
    assert converted == IMAGES + 1 - resumed
    # at least the changed image's chunk was converted again
    assert resumed <= sum(len(r["sizes"]) for r in done if changed not in [h[3] for h in r["hashes"]])


def test_a_damaged_piece_or_done_record_is_converted_again_not_published(monkeypatch, photos, fresh, tmp_path):
    out = tmp_path / "out"
    done = _interrupt(monkeypatch, photos, out, 4)
    (interrupted,) = os.listdir(out / TEMP_DIR)
    shards = out / TEMP_DIR / interrupted / "shards"
    cut, flipped, garbled, whole = done
    (out / TEMP_DIR / interrupted / resume.DONE_DIR / f"{garbled['digest']}.json").write_text('{"digest": 1')
    (shards / cut["file"]).write_bytes((shards / cut["file"]).read_bytes()[:-5])  # cut short
    data = bytearray((shards / flipped["file"]).read_bytes())
    data[len(data) // 2] ^= 0xFF  # the same size, one byte changed
    (shards / flipped["file"]).write_bytes(bytes(data))

    converted = _count_conversions(monkeypatch)
    assert convert(photos, out, *OPTIONS) == 0

    info = json.loads((out / "image_tfrecords.json").read_text())
    assert info["resumed"]["images"] == len(whole["sizes"])  # only the intact piece was taken
    assert sum(converted) == IMAGES - len(whole["sizes"])
    assert_same_dataset(out, fresh)


@pytest.mark.timeout(400)
def test_a_failed_dataflow_job_is_resumed_by_the_next_launch(gcs_emulator, dataflow_api, tmp_path):
    """On gs:// through the Dataflow stand-in: the first job's workers die after 2 chunks (the job FAILS), and
    the same launch again resumes that job's run folder, converts the rest and leaves nothing behind."""
    from google.api_core import exceptions

    from tests.dataflow_jobs import BUCKET, assert_complete_dataset, dataflow_args, launch

    write_tiny_tree(tmp_path / "photos", {"cat": 4, "dog": 4, "fox": 4})
    photos, output = f"gs://{BUCKET}/resume-photos", f"gs://{BUCKET}/resumed"
    with contextlib.suppress(exceptions.Conflict):
        gcs_emulator.create_bucket(BUCKET)
    assert gcs_emulator.upload_tree(tmp_path / "photos", photos) == 12
    args = dataflow_args(dataflow_api, photos, output, "--num_shards=train=4,validation=2")

    dataflow_api.worker_env = {"KILL_AFTER_PIECES": "2"}
    failed = launch(gcs_emulator, *args)
    assert failed.returncode == 1 and "ended in state FAILED" in failed.stderr, failed.stderr
    left = gcs_emulator.list_names(output)
    runs = {name.split("/")[1] for name in left if name.startswith(TEMP_DIR + "/")}
    assert len(runs) == 1 and "image_tfrecords.json" not in left
    (interrupted,) = runs
    assert f"{TEMP_DIR}/{interrupted}/{resume.PLAN_FILE}" in left
    assert len([n for n in left if n.startswith(f"{TEMP_DIR}/{interrupted}/{resume.DONE_DIR}/")]) >= 2

    dataflow_api.worker_env = {}
    again = launch(gcs_emulator, *args)
    assert again.returncode == 0, again.stderr
    line = RESUMED_LINE.search(again.stdout)
    assert line and line["run"] == interrupted, again.stdout
    assert int(line["n"]) >= 2 and int(line["n"]) + int(line["m"]) == 12
    info = assert_complete_dataset(gcs_emulator, output)  # nothing of either run is left
    assert info["resumed"]["images"] == int(line["n"])
    from transforms.base.examples import Example
    from transforms.base.tfrecord import iter_records

    paths = {}  # every record read back: its path once, with its source's SHA-256
    for split in info["splits"].values():
        for shard in split["shards"]:
            local = tmp_path / shard["file"]
            local.write_bytes(gcs_emulator.read(f"{output}/{shard['file']}"))
            for raw in iter_records(str(local)):
                feature = Example.FromString(raw).features.feature
                path = feature["source_path"].bytes_list.value[0].decode()
                assert path not in paths
                paths[path] = feature["sha256"].bytes_list.value[0].decode()
    assert paths == {f"{c}/img_{i:05d}.jpg": hashlib.sha256((tmp_path / "photos" / c / f"img_{i:05d}.jpg")
                                                            .read_bytes()).hexdigest()
                     for c in ("cat", "dog", "fox") for i in range(4)}


def _multi_label_manifest(root) -> list[str]:
    """16 images of several classes each in a --multi_label manifest, and a damaged file it lists (rejected)."""
    from PIL import Image

    labels = ["cat;dog", "dog", "cat; cat ;bird", "bird", "dog;cat", "bird;cat;dog", "cat", "bird;dog"]
    lines = ["path,labels,split"]
    for i in range(16):
        Image.new("RGB", (20, 20), (i * 15, 100, 200 - i * 10)).save(root / f"{i:02d}.png")
        lines.append(f'{i:02d}.png,"{labels[i % 8]}",{"train" if i < 12 else "validation"}')
    (root / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n not really")
    lines.append('broken.png,"cat",train')
    (root / "list.csv").write_text("\n".join(lines) + "\n")
    return [f"--manifest={root / 'list.csv'}", "--multi_label", "--num_shards=train=4,validation=1",
            "--image_size=16"]


@pytest.mark.parametrize("kind", ["gzip", "array_record", "multi_label"])
def test_other_formats_and_labels_resume_byte_for_byte(monkeypatch, tmp_path, kind):
    """Pieces whose SHA-256 is read back (gzip, ArrayRecord), label lists and rejected files in the done records:
    the resumed dataset is still the fresh one, byte for byte."""
    source = tmp_path / "in"
    source.mkdir()
    if kind == "multi_label":
        options = _multi_label_manifest(source)
    else:
        write_tiny_tree(source, {"cat": 6, "dog": 6, "fox": 6})
        options = ["--num_shards=train=4,validation=1", "--image_size=16",
                   "--compression=gzip" if kind == "gzip" else "--file_format=array_record"]
    fresh = tmp_path / "fresh"
    assert convert(source, fresh, *options) == 0
    out = tmp_path / "out"
    done = _interrupt(monkeypatch, source, out, 2, *options)
    kept = sum(len(record["sizes"]) for record in done)

    converted = _count_conversions(monkeypatch)
    assert convert(source, out, *options) == 0

    info = json.loads((out / "image_tfrecords.json").read_text())
    assert info["resumed"]["images"] == kept > 0
    assert sum(converted) + kept + sum(len(r["rejections"]) for r in done) == (17 if kind == "multi_label" else 18)
    assert dataset_files(out) == dataset_files(fresh) and _sources(out) == _sources(fresh)
    if kind == "multi_label":
        assert info["files"]["rejected"] == 1 and info["rejected_by_reason"]
    assert not (out / TEMP_DIR).exists()
    assert main_of(verify.run, [str(out)]) == 0


def test_a_done_record_that_names_another_path_is_converted_again(monkeypatch, photos, fresh, tmp_path):
    """A done record whose hash entry names a path that is not its image's (edited by hand, or damaged to a valid
    record) would put that path into the sources files, and the next append would write the image twice: the
    chunk is converted again, the dataset is the fresh one, and an append of the same input changes nothing."""
    out = tmp_path / "out"
    done = _interrupt(monkeypatch, photos, out, 3)
    (interrupted,) = os.listdir(out / TEMP_DIR)
    edited, *whole = done
    real_path = edited["hashes"][0][3]
    edited["hashes"][0][3] = real_path.rsplit("/", 1)[0] + "/NOT-THIS-FILE.jpg"
    (out / TEMP_DIR / interrupted / resume.DONE_DIR / f"{edited['digest']}.json").write_text(json.dumps(edited))

    converted = _count_conversions(monkeypatch)
    assert convert(photos, out, *OPTIONS) == 0
    info = json.loads((out / "image_tfrecords.json").read_text())
    assert info["resumed"]["images"] == sum(len(r["sizes"]) for r in whole)  # the edited chunk was not taken
    assert sum(converted) == IMAGES - info["resumed"]["images"]
    assert not any("NOT-THIS-FILE" in line for line in _sources(out))
    assert_same_dataset(out, fresh)
    files = dataset_files(out)
    assert convert(photos, out, *OPTIONS, "--if_exists=append") == 0
    assert dataset_files(out) == files and len(_records(out)) == IMAGES
