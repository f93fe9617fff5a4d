"""--if_exists=append: a dataset grows by the images it does not hold yet, into new shards beside its own.

Each test converts a small folder, adds images, appends, and reads every record back (paths, hashes, splits,
bytes): only the new images are converted, no old record changes, and verify, the reader and TFDS read them all.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import signal
import subprocess
import sys

import pytest
from PIL import Image

from pipeline import verify
from pipeline.cli import main_of
from pipeline.errors import UserError
from tests.conftest import FAST, REPO, convert, main_in_process
from tests.datasets import error_rows, read_records, write_tiny_tree
from transforms.base.dataset_format import ERRORS_FILE, INFO_FILE, LOCK_FILE, TEMP_DIR, shard_globs
from transforms.base.examples import Example
from transforms.base.tfrecord import iter_records

CLASSES = {"cat": 10, "dog": 10, "fox": 10, "owl": 10}  # 40 images
ADDED = {"cat": 3, "dog": 3, "fox": 2, "owl": 2}  # 10 more
OPTIONS = ["--num_shards=train=2", "--image_size=16"]


def _info(out) -> dict:
    return json.loads((out / "image_tfrecords.json").read_text())


def _records(out) -> dict[str, tuple]:
    """source_path -> (split, sha256, label, stored image bytes) of every record; each path once."""
    found = {}
    for split, rows in read_records(out).items():
        for row in rows:
            assert row["source_path"] not in found, f"{row['source_path']} is in the dataset twice"
            found[row["source_path"]] = (split, row["sha256"], row["label"], row["image"])
    return found


def _unlabeled_records(out) -> list[tuple]:
    """(id, source_path, image bytes) of every record of an unlabeled set, sorted."""
    found = []
    for split in _info(out)["splits"].values():
        for shard in split["shards"]:
            for raw in iter_records(str(out / shard["file"])):
                f = Example.FromString(raw).features.feature
                found.append((f["id"].bytes_list.value[0], f["source_path"].bytes_list.value[0],
                              f["image"].bytes_list.value[0]))
    return sorted(found)


def _sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _folder(out) -> dict[str, bytes]:
    return {name: (out / name).read_bytes() for name in sorted(os.listdir(out)) if (out / name).is_file()}


@pytest.fixture
def grown(tmp_path):
    """(input folder, output folder, the records before the append): 40 images converted, then 10 added."""
    src, out = tmp_path / "in", tmp_path / "out"
    write_tiny_tree(src, CLASSES)
    assert convert(src, out, *OPTIONS) == 0
    before = _records(out)
    write_tiny_tree(src, ADDED, start=10)
    return src, out, before


def test_append_converts_only_the_new_images_and_keeps_every_old_record(grown):
    src, out, before = grown
    assert len(before) == 40
    assert convert(src, out, *OPTIONS, "--if_exists=append") == 0
    info, after = _info(out), _records(out)
    # The run's own counts: 10 converted, the 40 recorded ones only hashed.
    assert info["appends"][-1]["converted"] == 10
    assert info["appends"][-1]["already_in_dataset"] == 40
    assert info["appends"][-1]["changed"] == 0
    assert len(after) == 50 and info["files"]["written"] == 50
    assert info["files"]["found"] == info["files"]["written"] + info["files"]["rejected"] + info["files"]["skipped"]
    for path, record in before.items():  # no old record changed split, label or bytes
        assert after[path] == record
    for path in set(after) - set(before):  # the new ones, with their own bytes' hashes
        assert after[path][1] == _sha(src / path)
    assert set(after) - set(before) == {f"{c}/img_{i:05d}.jpg" for c, n in ADDED.items() for i in range(10, 10 + n)}
    # Every shard of a split under the standard names, numbered 0..N-1 of N, each read once by the docs' globs.
    names = sorted(os.listdir(out))
    for split, split_info in info["splits"].items():
        listed = [s["file"] for s in split_info["shards"]]
        count = len(listed)
        assert listed == [f"{split}-{i:05d}-of-{count:05d}.tfrecord" for i in range(count)]
        matched = {n for glob in shard_globs(split) for n in fnmatch.filter(names, glob)}
        assert matched == set(listed)
        assert sum(s["records"] for s in split_info["shards"]) == split_info["records"]
    assert len(info["splits"]["train"]["shards"]) > 2  # new shards beside the old two
    assert main_of(verify.run, [str(out)]) == 0


def test_a_second_and_third_append_add_up_and_appending_nothing_changes_nothing(grown):
    src, out, _ = grown
    assert convert(src, out, *OPTIONS, "--if_exists=append") == 0
    write_tiny_tree(src, {"cat": 2, "owl": 1}, start=20)
    assert convert(src, out, *OPTIONS, "--if_exists=append") == 0
    info = _info(out)
    assert [a["converted"] for a in info["appends"]] == [10, 3]
    assert len(_records(out)) == info["files"]["written"] == 53
    assert main_of(verify.run, [str(out)]) == 0
    files = _folder(out)
    assert convert(src, out, *OPTIONS, "--if_exists=append") == 0  # nothing new: a no-op, exit 0
    assert _folder(out) == files
    assert not (out / ".image-tfrecords-tmp").exists()


def test_a_changed_file_is_rejected_and_the_dataset_keeps_its_record(grown):
    src, out, before = grown
    changed = "dog/img_00003.jpg"
    Image.new("RGB", (24, 24), (1, 2, 3)).save(src / changed, quality=80)
    assert convert(src, out, *OPTIONS, "--if_exists=append") == 0
    after = _records(out)
    assert after[changed] == before[changed]
    rows = [r for r in error_rows(out) if r["reason"] == "changed_since_dataset"]
    assert [r["relpath"] for r in rows] == [changed]
    assert before[changed][1] in rows[0]["detail"] and _sha(src / changed) in rows[0]["detail"]
    info = _info(out)
    assert info["appends"][-1]["changed"] == 1 and info["appends"][-1]["converted"] == 10
    assert info["rejected_by_reason"]["changed_since_dataset"] == 1
    assert main_of(verify.run, [str(out)]) == 0


def test_an_append_whose_only_new_files_are_rejected_counts_and_reports_each(grown):
    """An HTML page saved as .jpg and an empty file, the only new files: each is counted and has its errors.jsonl
    line with its reason, as on a first run; the records stay; the same append again changes nothing."""
    src, out, before = grown
    for name in (f"{c}/img_{i:05d}.jpg" for c, n in ADDED.items() for i in range(10, 10 + n)):
        (src / name).unlink()  # the fixture's added images: no new file but the two below
    (src / "cat" / "new_download.jpg").write_text("<html><body>404 Not Found</body></html>\n")
    (src / "dog" / "new_empty.jpg").write_bytes(b"")
    assert convert(src, out, *OPTIONS, "--if_exists=append") == 0
    info = _info(out)
    assert info["files"]["written"] == 40 and info["files"]["rejected"] == 2
    assert info["files"]["found"] == 42
    assert info["rejected_by_reason"] == {"empty_file": 1, "not_an_image": 1}
    assert sorted((r["relpath"], r["reason"]) for r in error_rows(out)) == [
        ("cat/new_download.jpg", "not_an_image"), ("dog/new_empty.jpg", "empty_file")]
    assert _records(out) == before
    assert info["appends"][-1]["converted"] == 0 and info["appends"][-1]["already_in_dataset"] == 40
    assert main_of(verify.run, [str(out)]) == 0
    files = _folder(out)
    assert convert(src, out, *OPTIONS, "--if_exists=append") == 0  # nothing new since: a no-op
    assert _folder(out) == files


def test_an_unlabeled_append_rejects_a_new_file_whose_id_the_dataset_holds(tmp_path):
    """A new file whose id (its name without the extension) a record of the dataset has is rejected and reported,
    whether its name sorts after the record's file (a.png beside a.jpg) or before it (a.bmp)."""
    src, out = tmp_path / "flat", tmp_path / "out"
    write_tiny_tree(tmp_path / "tree", {"x": 4})
    src.mkdir()
    for name in os.listdir(tmp_path / "tree" / "x"):
        os.rename(tmp_path / "tree" / "x" / name, src / name)
    assert convert(src, out, "--unlabeled", "--image_size=16") == 0
    before = _unlabeled_records(out)
    Image.open(src / "img_00000.jpg").save(src / "img_00000.png")
    Image.open(src / "img_00001.jpg").save(src / "img_00001.bmp")
    assert convert(src, out, "--unlabeled", "--image_size=16", "--if_exists=append") == 0
    info = _info(out)
    assert _unlabeled_records(out) == before  # one record per id, each the one it was
    assert info["files"]["written"] == 4 and info["files"]["rejected"] == 2
    assert sorted((r["relpath"], r["reason"]) for r in error_rows(out)) == [
        ("img_00000.png", "duplicate_id"), ("img_00001.bmp", "duplicate_id")]
    assert main_of(verify.run, [str(out)]) == 0


def test_a_damaged_sources_file_fails_the_append_in_one_line_and_keeps_the_dataset(grown, capsys):
    """A line of the dataset's own list of what it holds that is not a record would drop that image from the
    list, and the append would write it twice: the run stops instead, naming the file."""
    src, out, _ = grown
    sources = sorted(name for name in os.listdir(out) if name.startswith("sources-"))
    damaged = out / sources[0]
    lines = damaged.read_text().splitlines()
    damaged.write_text("\n".join(["[not a record", *lines[1:]]) + "\n")
    files = _folder(out)
    code, err = main_in_process(capsys, f"--input_dir={src}", f"--output_dir={out}", "--quiet", *OPTIONS,
                                "--if_exists=append", *FAST)
    assert code == 1
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"error: the dataset's sources file {damaged} is damaged")
    assert "--if_exists=overwrite" in last
    assert _folder(out) == files  # the old dataset as it was


def test_options_that_shape_records_must_be_the_datasets(grown, capsys):
    src, out, _ = grown
    files = _folder(out)
    code, err = main_in_process(capsys, f"--input_dir={src}", f"--output_dir={out}", "--quiet", *OPTIONS,
                                "--image_size=32", "--jpeg_quality=70", "--if_exists=append")
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --if_exists=append")
    assert "image_size: '16x16' -> '32x32'" in lines[0] and "jpeg_quality: 95 -> 70" in lines[0]
    assert _folder(out) == files


def test_a_new_class_folder_is_refused(grown):
    src, out, _ = grown
    write_tiny_tree(src, {"bee": 2})
    with pytest.raises(UserError, match=r"1 class\(es\) that the dataset .* does not \(bee\)"):
        convert(src, out, *OPTIONS, "--if_exists=append")


def test_append_to_an_empty_folder_is_a_first_conversion(tmp_path):
    src, out = tmp_path / "in", tmp_path / "out"
    write_tiny_tree(src, {"cat": 3, "dog": 3})
    assert convert(src, out, "--if_exists=append") == 0
    info = _info(out)
    assert info["files"]["written"] == 6 and "appends" not in info
    assert len(info["sources"]["files"]) >= 1


def test_the_reader_and_tfds_read_every_record_of_a_grown_dataset(grown):
    import tensorflow_datasets as tfds

    from pipeline import reader

    src, out, _ = grown
    assert convert(src, out, *OPTIONS, "--if_exists=append") == 0
    info, records = _info(out), _records(out)
    builder = tfds.builder_from_directory(str(out))
    tfds_paths, reader_paths = [], []
    for split, split_info in info["splits"].items():
        loaded = builder.info.splits[split]
        assert loaded.shard_lengths == [s["records"] for s in split_info["shards"]]
        assert [os.path.basename(p) for p in loaded.filepaths] == [s["file"] for s in split_info["shards"]]
        tfds_paths += [r["source_path"].decode() for r in tfds.as_numpy(builder.as_dataset(split=split))]
        reader_paths += [r["source_path"].decode() for r in
                         reader.make_dataset(str(out), split, decode=False).as_numpy_iterator()]
    assert sorted(tfds_paths) == sorted(reader_paths) == sorted(records) and len(records) == 50


def _killed_append(src, out, kill_at: str) -> subprocess.CompletedProcess:
    """An append as a user runs it (one in-process worker), killed with SIGKILL where `kill_at` says
    (tests/killed_publish_main.py)."""
    return subprocess.run([sys.executable, "-m", "tests.killed_publish_main", f"--input_dir={src}",
                           f"--output_dir={out}", *OPTIONS, "--if_exists=append", *FAST, "--quiet"], cwd=REPO,
                          capture_output=True, text=True, timeout=240, env=dict(os.environ, KILL_AT=kill_at))


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("kill_at", ["create:" + ERRORS_FILE, "rename:1", "rename:3"])
def test_a_killed_append_leaves_the_old_dataset_or_is_finished_by_the_next(grown, kill_at):
    """Killed before the window: the old dataset is there byte for byte and verifies. Killed inside it (after
    the first or third rename into the folder): the next append finishes publishing, and nothing is lost or
    twice in the dataset."""
    src, out, before = grown
    files = _folder(out)
    killed = _killed_append(src, out, kill_at)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    if kill_at.startswith("create:"):
        assert {n: b for n, b in _folder(out).items() if n != LOCK_FILE} == files
        assert main_of(verify.run, [str(out)]) == 0
    else:
        assert not (out / INFO_FILE).exists()  # inside the window: no dataset, never a mix
    assert convert(src, out, *OPTIONS, "--if_exists=append") == 0
    after = _records(out)
    assert len(after) == 50 and all(after[path] == record for path, record in before.items())
    assert main_of(verify.run, [str(out)]) == 0
    assert not (out / TEMP_DIR).exists() and not (out / LOCK_FILE).exists()


def test_kaggle_names_and_index_files_of_a_grown_dataset_are_read_once(tmp_path):
    src, out = tmp_path / "in", tmp_path / "out"
    options = ["--num_shards=train=2,validation=1", "--image_size=16", "--shard_names=kaggle", "--index_files"]
    write_tiny_tree(src, {"cat": 6, "dog": 6})
    assert convert(src, out, *options) == 0
    before = _records(out)
    write_tiny_tree(src, {"cat": 3, "dog": 3}, start=6)
    assert convert(src, out, *options, "--if_exists=append") == 0
    info, after = _info(out), _records(out)
    assert len(after) == 18 and all(after[path] == record for path, record in before.items())
    names = sorted(os.listdir(out))
    for split, split_info in info["splits"].items():
        shards = split_info["shards"]
        assert [s["file"] for s in shards] == [f"{split}{i:02d}-{s['records']}.tfrec" for i, s in enumerate(shards)]
        assert [s["index"] for s in shards] == [f"{split}{i:02d}-{s['records']}.idx" for i, s in enumerate(shards)]
        matched = {n for glob in shard_globs(split) for n in fnmatch.filter(names, glob)}
        assert matched == {s["file"] for s in shards}
    assert len([n for n in names if n.endswith(".idx")]) == sum(len(s["shards"]) for s in info["splits"].values())
    assert main_of(verify.run, [str(out)]) == 0


def test_statistics_and_the_duplicate_report_cover_the_whole_grown_dataset(grown):
    src, out, before = grown
    copy = src / "owl" / "img_00099.jpg"  # a new file with the bytes of an old record
    copy.write_bytes((src / "cat" / "img_00000.jpg").read_bytes())
    assert convert(src, out, *OPTIONS, "--if_exists=append") == 0
    info = _info(out)
    for split, split_info in info["splits"].items():
        assert info["statistics"]["splits"][split]["images"] == split_info["records"]
    assert info["duplicates"]["groups"] >= 1  # the new copy against the old record
    assert json.dumps(info["duplicates"]).count("img_00099.jpg") >= 1


def test_a_manifest_grows_with_the_datasets_classes(tmp_path):
    """With a manifest, the dataset's class names are the labels: new rows of its classes are converted, a row of
    a class it lacks is skipped as unknown_class, and the old records keep their ids."""
    from tests.datasets import convert_manifest

    src, out = tmp_path / "in", tmp_path / "out"
    first = write_tiny_tree(src, {"cat": 4, "dog": 4})
    manifest = src / "m.csv"
    manifest.write_text("path,label\n" + "".join(f"{p},{p.split('/')[0]}\n" for p in first))
    assert convert_manifest(manifest, out, *OPTIONS) == 0
    before = _records(out)
    more = write_tiny_tree(src, {"cat": 2, "dog": 2, "eel": 1}, start=4)
    manifest.write_text(manifest.read_text() + "".join(f"{p},{p.split('/')[0]}\n" for p in more))
    assert convert_manifest(manifest, out, *OPTIONS, "--if_exists=append") == 0
    info, after = _info(out), _records(out)
    assert info["appends"][-1]["converted"] == 4 and info["class_names"] == ["cat", "dog"]
    assert len(after) == 12 and all(after[path] == record for path, record in before.items())
    assert [r["relpath"] for r in error_rows(out) if r["reason"] == "unknown_class"] == ["eel/img_00004.jpg"]
    assert main_of(verify.run, [str(out)]) == 0


def _largest_sources_file(out):
    """The dataset's sources file of the most lines (an empty one lists nothing to lose)."""
    names = _info(out)["sources"]["files"]
    return max((out / name for name in names), key=lambda path: len(path.read_text().splitlines()))


def _damage_sources(path, how: str) -> None:
    lines = path.read_text().splitlines(keepends=True)
    if how == "missing":
        path.unlink()
    elif how == "empty":
        path.write_text("")
    elif how == "lines":  # the last lines gone, cut at a line boundary: every line left is a sound record
        path.write_text("".join(lines[:-3]))
    elif how == "twice":  # a line lost and another doubled: as many lines as records, one path listed twice
        path.write_text("".join([lines[0], *lines[:-1]]))


@pytest.mark.parametrize("how", ["missing", "empty", "lines", "twice"])
def test_an_append_that_cannot_account_for_every_record_stops_in_one_line_and_changes_nothing(grown, capsys, how):
    """A sources file missing, emptied, cut at a newline, or with a line doubled: its images would be written a
    second time (once beside their records). The append stops with one line naming the damage, and the folder is
    left byte for byte as it was."""
    src, out, _ = grown
    _damage_sources(_largest_sources_file(out), how)
    files = _folder(out)
    code, err = main_in_process(capsys, f"--input_dir={src}", f"--output_dir={out}", "--quiet", *OPTIONS,
                                "--if_exists=append", *FAST)
    lines = [line for line in err.strip().splitlines() if line.startswith("error: ")]
    assert code != 0 and len(lines) == 1, err
    if how == "missing":  # found by the launcher, before the job: a one-line user error
        assert code == 2 and "which is missing" in lines[0] and "--if_exists=overwrite" in lines[0]
    else:  # counted in the job, before its last step writes anything
        assert code == 1 and lines[0].startswith("error: the dataset's list of its records is damaged"), lines[0]
        assert "--if_exists=overwrite" in lines[0] and "the dataset already in --output_dir is unchanged" in lines[0]
    assert _folder(out) == files


@pytest.mark.timeout(300)
@pytest.mark.parametrize("how", ["missing", "empty"])
def test_a_damaged_sources_file_on_gcs_stops_the_append(gcs_emulator, tmp_path, how):
    from apache_beam.io.filesystems import FileSystems

    from tests.gcs_fixtures import NO_AUTH

    bucket = gcs_emulator.create_bucket(f"append-sources-{how}")
    src, out = tmp_path / "in", f"{bucket}/out"
    write_tiny_tree(src, {"cat": 6, "dog": 6})
    assert convert(src, out, *OPTIONS, NO_AUTH) == 0
    described = gcs_emulator.read(f"{out}/{INFO_FILE}")
    info = json.loads(described)
    name = max(info["sources"]["files"], key=lambda n: gcs_emulator.read(f"{out}/{n}").count(b"\n"))
    if how == "missing":
        FileSystems.delete([f"{out}/{name}"])
    else:
        gcs_emulator.write(f"{out}/{name}", b"")
    names = gcs_emulator.list_names(out)
    with pytest.raises(UserError, match="which is missing" if how == "missing" else "list of its records is damaged"):
        convert(src, out, *OPTIONS, NO_AUTH, "--if_exists=append")
    assert gcs_emulator.read(f"{out}/{INFO_FILE}") == described
    assert [n for n in gcs_emulator.list_names(out) if not n.startswith(TEMP_DIR)] == \
        [n for n in names if not n.startswith(TEMP_DIR)]


def _with_a_copy(src) -> str:
    """A byte-identical copy of cat/img_00000.jpg, in the same class, named after it (so it is the copy dropped)."""
    copy = src / "cat" / "img_00000_copy.jpg"
    copy.write_bytes((src / "cat" / "img_00000.jpg").read_bytes())
    return "cat/img_00000_copy.jpg"


def test_a_copy_that_drop_left_out_stays_out_when_the_same_input_is_appended(tmp_path):
    """--duplicates=drop, then the same command with --if_exists=append and no change: nothing is new (the copy is
    the dataset's record, by its bytes), so the folder is left byte for byte as it was."""
    src, out = tmp_path / "in", tmp_path / "out"
    write_tiny_tree(src, {"cat": 6, "dog": 6})
    copy = _with_a_copy(src)
    assert convert(src, out, *OPTIONS, "--duplicates=drop") == 0
    assert [r["relpath"] for r in error_rows(out) if r["reason"] == "duplicate"] == [copy]
    files = _folder(out)
    assert convert(src, out, *OPTIONS, "--duplicates=drop", "--if_exists=append") == 0
    assert _folder(out) == files and copy not in _records(out)
    # a new image and a new copy of a record: the image is written, the copy is not
    write_tiny_tree(src, {"dog": 1}, start=6)
    (src / "dog" / "img_00000_again.jpg").write_bytes((src / "dog" / "img_00000.jpg").read_bytes())
    assert convert(src, out, *OPTIONS, "--duplicates=drop", "--if_exists=append") == 0
    records = _records(out)
    assert "dog/img_00006.jpg" in records and copy not in records and "dog/img_00000_again.jpg" not in records
    rows = {r["relpath"]: r for r in error_rows(out)}
    assert rows["dog/img_00000_again.jpg"]["reason"] == "duplicate"
    assert "'dog/img_00000.jpg', a record of the dataset" in rows["dog/img_00000_again.jpg"]["detail"]
    assert len(records) == _info(out)["files"]["written"] == 13
    assert main_of(verify.run, [str(out)]) == 0


def test_an_append_of_a_dropped_dataset_must_drop(tmp_path, capsys):
    """An append with --duplicates=keep would write the copies the dataset dropped: one line, nothing changed."""
    src, out = tmp_path / "in", tmp_path / "out"
    write_tiny_tree(src, {"cat": 4, "dog": 4})
    _with_a_copy(src)
    assert convert(src, out, *OPTIONS, "--duplicates=drop") == 0
    files = _folder(out)
    code, err = main_in_process(capsys, f"--input_dir={src}", f"--output_dir={out}", "--quiet", *OPTIONS,
                                "--if_exists=append", *FAST)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "made with --duplicates=drop" in lines[0], err
    assert "pass --duplicates=drop" in lines[0]
    assert _folder(out) == files
