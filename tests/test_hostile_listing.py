"""Hostile file-system inputs, end to end: odd names, symlinks, special files, glob characters in paths.

Every directory entry under the input must end up either in the dataset or as a
line of errors.jsonl with a reason, and found = written + rejected + skipped.
A name that cannot be used gets one clear `error:` line, never a traceback.
Trees are built by tests/hostile_tree.py; every test has a time limit.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter

import pytest

from pipeline.options import ConvertOptions, validate
from pipeline.plan import plan_dataset
from tests import hostile_tree as tree
from tests.conftest import FAST, cli, convert, main_in_process, run_tool
from tests.datasets import read_records
from tests.error_lines import error_line
from tests.hostile_files import bounded_cli
from transforms.base.paths import text_name
from transforms.labels.layout import class_name_problem, hash_split, place, shuffle_key

IS_ROOT = os.geteuid() == 0


def settings_of(input_dir, output_dir, *args):
    return validate(ConvertOptions([f"--input_dir={input_dir}", f"--output_dir={output_dir}", *args]))


def run_ok(input_dir, output_dir, *args):
    """Convert; returns (info, errors by relpath, labels lines). Checks exit 0 and the accounting."""
    assert convert(input_dir, output_dir, *args) == 0
    info = json.loads((output_dir / "image_tfrecords.json").read_text())
    errors = {}
    with open(output_dir / "errors.jsonl", encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            assert row["relpath"] not in errors, row
            errors[row["relpath"]] = row
    files = info["files"]
    assert files["found"] == files["written"] + files["rejected"] + files["skipped"]
    assert len(errors) == files["rejected"] + files["skipped"]
    labels = (output_dir / "labels.txt").read_text(encoding="utf-8").split("\n")
    assert labels[-1] == ""
    assert labels[:-1] == info["class_names"]
    # The launcher's plan (class folders and a sample) and the job's listing agree on the classes.
    plan = plan_dataset(settings_of(input_dir, output_dir, *args))
    assert plan.class_names == info["class_names"]
    return info, errors, labels[:-1]


def reasons(errors) -> dict[str, tuple[str, str]]:
    return {relpath: (row["stage"], row["reason"]) for relpath, row in errors.items()}


# ---- 3. non-UTF-8 file names ---------------------------------------------------------------


@pytest.mark.timeout(180)
def test_a_non_utf8_file_name_is_converted_with_an_escaped_source_path(tmp_path):
    root = tmp_path / "in"
    tree.class_tree(root, {"cats": 6, "dogs": 6})
    tree.bytes_image(root / "cats", b"caf\xe9.jpg")
    tree.bytes_image(root / "dogs", b"\xff\xfe.jpg")
    tree.write_file(os.path.join(os.fsencode(root / "dogs"), b"notes\xff.txt"), b"x")
    info, errors, labels = run_ok(root, tmp_path / "out", "--validation_split=0.5")
    assert labels == ["cats", "dogs"]
    assert info["files"] == dict(info["files"], found=15, written=14, skipped=1, rejected=0)
    sources = {r["source_path"]: split for split, rows in read_records(tmp_path / "out").items() for r in rows}
    assert "cats/caf\\xe9.jpg" in sources and "dogs/\\xff\\xfe.jpg" in sources
    for raw in (b"cats/caf\xe9.jpg", b"dogs/\xff\xfe.jpg"):  # the graph's split is the plan's, from the bytes
        assert sources[raw.decode("utf-8", "backslashreplace")] == hash_split(os.fsdecode(raw), 42, 0.5, 0.0)
    assert reasons(errors) == {"dogs/notes\\xff.txt": ("skipped", "not_an_image_extension")}
    verified = run_tool("pipeline.verify", str(tmp_path / "out"))
    assert verified.returncode == 0, verified.stdout + verified.stderr


@pytest.mark.timeout(180)
def test_a_non_utf8_file_name_in_split_folders(tmp_path):
    root = tmp_path / "in"
    tree.class_tree(root / "train", {"cats": 3, "dogs": 3})
    tree.class_tree(root / "validation", {"cats": 2, "dogs": 2})
    tree.bytes_image(root / "train" / "cats", b"caf\xe9.jpg")
    tree.bytes_image(root / "validation" / "dogs", b"\xff.jpg")
    info, errors, _ = run_ok(root, tmp_path / "out")
    assert info["files"]["written"] == 12 and not errors
    records = read_records(tmp_path / "out")
    assert "train/cats/caf\\xe9.jpg" in {r["source_path"] for r in records["train"]}
    assert "validation/dogs/\\xff.jpg" in {r["source_path"] for r in records["validation"]}


def test_the_split_hash_of_a_non_utf8_name_is_the_hash_of_its_bytes():
    raw = os.fsdecode(b"cats/caf\xe9.jpg")  # as os.scandir names it
    digest = hashlib.blake2b(b"split\x0042\x00cats/caf\xe9.jpg", digest_size=8).digest()
    expected = "validation" if int.from_bytes(digest, "big") / 2.0**64 < 0.5 else "train"
    assert hash_split(raw, 42, 0.5, 0.0) == expected
    assert shuffle_key(raw, 42) != shuffle_key(os.fsdecode(b"cats/caf\xe8.jpg"), 42)
    # A UTF-8 name hashes exactly as before (existing datasets keep their splits).
    assert [hash_split(f"c/{i}.jpg", 7, 0.5, 0.0) for i in range(6)] == \
        ['validation', 'validation', 'validation', 'train', 'validation', 'train']


@pytest.mark.timeout(240)
def test_utf8_class_folders_convert_in_the_c_locale_without_utf8_mode(tmp_path):
    """Names are bytes on disk: a UTF-8 folder name is the same class in the C locale (where Python lists `café`
    as 'caf\\udcc3\\udca9') as in any other, never 'not UTF-8'; its labels.txt, sources and splits are the ones
    a UTF-8 locale gives."""
    root = tmp_path / "in"
    tree.class_tree(root, {"café": 3, "dogs": 3})
    tree.bytes_image(root / "dogs", b"caf\xe9.jpg")  # and a name that is not UTF-8 at all, as before
    env = {"PYTHONUTF8": "0", "LC_ALL": "C", "LANG": "C", "PYTHONIOENCODING": "utf-8"}
    done = cli("pipeline.main", f"--input_dir={root}", f"--output_dir={tmp_path / 'c'}", "--quiet", *FAST,
               env=env)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "c" / "labels.txt").read_bytes() == "café\ndogs\n".encode()
    info, _, _ = run_ok(root, tmp_path / "utf8")  # this process: UTF-8
    c_info = json.loads((tmp_path / "c" / "image_tfrecords.json").read_text(encoding="utf-8"))
    assert c_info["files"] == info["files"] and c_info["class_names"] == ["café", "dogs"]
    assert read_records(tmp_path / "c") == read_records(tmp_path / "utf8")
    # a manifest's UTF-8 paths open in that locale too (before: read_error, UnicodeEncodeError)
    (root / "m.csv").write_text("path,label\ncafé/img0_00.jpg,café\ndogs/img1_00.jpg,dogs\n", encoding="utf-8")
    done = cli("pipeline.main", f"--manifest={root / 'm.csv'}", f"--output_dir={tmp_path / 'cm'}", "--quiet", *FAST,
               env=env)
    assert done.returncode == 0, done.stderr
    files = json.loads((tmp_path / "cm" / "image_tfrecords.json").read_text(encoding="utf-8"))["files"]
    assert files == dict(files, found=2, written=2, rejected=0, skipped=0)


def test_a_listed_name_is_read_as_utf8_in_any_locale():
    assert text_name("caf\udcc3\udca9") == "café"  # how the C locale (ASCII) names b'caf\xc3\xa9'
    assert text_name("café") == "café" and text_name(os.fsdecode(b"caf\xe9")) == os.fsdecode(b"caf\xe9")
    placed = place(text_name("caf\udcc3\udca9/1.jpg"), split_folders=False, seed=42, validation_split=0.5,
                   test_split=0)
    assert placed.class_name == "café" and class_name_problem(placed.class_name) is None


# ---- 4 and 13. class names that cannot round-trip through labels.txt -----------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name, what", [
    ("a\nb", "line break"),
    ("a\rb", "line break"),
    ("a\tb", "control character"),
    ("a\u2028b", "line break"),
    (" cats", "leading or trailing whitespace"),
    ("cats ", "leading or trailing whitespace"),
    ("cats\\kittens", "backslash"),
    (b"caf\xe9", "not UTF-8"),
])
def test_a_class_folder_name_that_cannot_round_trip_is_refused_up_front(tmp_path, name, what):
    root = tmp_path / "in"
    tree.class_tree(root, {"cats": 2, "dogs": 2})
    folder = os.fsdecode(os.path.join(os.fsencode(root), name)) if isinstance(name, bytes) else root / name
    tree.images(folder, 2)
    message = error_line(f"--input_dir={root}", f"--output_dir={tmp_path / 'out'}")
    shown = "'caf\\xe9'" if isinstance(name, bytes) else repr(name)
    assert f"the class folder {shown} in {root} has " in message
    assert what in message and "rename" in message
    assert not (tmp_path / "out").exists()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("names, shown, how", [
    (["Dog", "dog"], "'Dog' and 'dog'", "differ only in letter case"),
    (["caf\u00e9", "cafe\u0301"], "'cafe\\u0301' and 'caf\\xe9'", "differ only in their Unicode normal form"),
])
def test_class_folders_equal_but_for_case_or_normal_form_are_refused(tmp_path, names, shown, how):
    root = tmp_path / "in"
    tree.class_tree(root, {name: 2 for name in [*names, "cats"]})
    message = error_line(f"--input_dir={root}", f"--output_dir={tmp_path / 'out'}")
    assert message == (f"the class folders {shown} in {root} {how}" + message.split(how, 1)[1])
    assert "two classes that read as one: merge them into one folder, or rename one" in message
    assert not (tmp_path / "out").exists()
    labels = tmp_path / "labels.txt"
    labels.write_text("\n".join(names) + "\n", encoding="utf-8")
    tree.class_tree(tmp_path / "ok", {names[0]: 2})
    message = error_line(f"--input_dir={tmp_path / 'ok'}", f"--output_dir={tmp_path / 'out'}",
                         f"--labels_file={labels}")
    assert f"--labels_file {labels} lists the classes {shown}, which {how}" in message


@pytest.mark.timeout(60)
def test_a_bad_class_name_is_the_one_line_on_stderr_and_exit_2(tmp_path, capsys):
    root = tmp_path / "in"
    tree.class_tree(root, {"cats": 2, "a\nb": 2})
    code, stderr = main_in_process(capsys, f"--input_dir={root}", f"--output_dir={tmp_path / 'out'}")
    assert code == 2
    assert stderr.splitlines() == [
        "error: the class folder 'a\\nb' in " + str(root) + " has a line break in its name, which labels.txt "
        "(one class per line) cannot hold: rename the folder"
    ]


@pytest.mark.timeout(240)
def test_labels_txt_round_trips_as_labels_file(tmp_path):
    root = tmp_path / "in"
    names = ["café", "naïve ü", "x y", "Ω#[1]", "emoji 🐱"]
    tree.class_tree(root, {name: 2 for name in names})
    info, errors, labels = run_ok(root, tmp_path / "out1")
    assert labels == sorted(names) and info["files"]["written"] == 10
    again, errors2, labels2 = run_ok(root, tmp_path / "out2", f"--labels_file={tmp_path / 'out1' / 'labels.txt'}")
    assert labels2 == labels and again["files"]["written"] == 10 and not errors2


@pytest.mark.timeout(180)
def test_a_backslash_in_a_file_name_is_not_a_path_separator(tmp_path):
    root = tmp_path / "in"
    tree.class_tree(root, {"cats": 2, "dogs": 2})
    tree.write_file(root / "cats" / "a\\b.jpg", tree.jpeg_bytes(3))
    info, errors, labels = run_ok(root, tmp_path / "out")
    assert labels == ["cats", "dogs"] and not errors
    rows = [r for rows in read_records(tmp_path / "out").values() for r in rows]
    assert {r["source_path"]: r["class_name"] for r in rows}["cats/a\\b.jpg"] == "cats"


# ---- 5. symlinks, special files, unreadable folders: nothing dropped without a trace --------


def symlink_tree(tmp_path):
    root = tmp_path / "in"
    tree.class_tree(root, {"cats": 3, "dogs": 3})
    elsewhere = tmp_path / "elsewhere"
    tree.images(elsewhere / "birds", 2)
    tree.images(elsewhere, 1, prefix="loose")
    os.symlink(elsewhere / "birds", root / "birds")  # a class folder outside the input
    os.symlink("cats", root / "kittens")  # a class folder linked inside the input
    os.symlink("img0_00.jpg", root / "cats" / "alias.jpg")  # a file linked inside the input
    os.symlink(elsewhere / "loose_00.jpg", root / "dogs" / "outside.jpg")  # a file outside
    os.symlink("missing.jpg", root / "dogs" / "gone.jpg")  # dangling
    os.symlink("..", root / "dogs" / "up")  # a loop back to an ancestor
    os.symlink("self", root / "dogs" / "self")  # a link to itself (ELOOP)
    return root


@pytest.mark.timeout(240)
def test_symlinks_are_followed_inside_the_input_and_reported_otherwise(tmp_path):
    root = symlink_tree(tmp_path)
    info, errors, labels = run_ok(root, tmp_path / "out")
    assert labels == ["cats", "dogs", "kittens"]
    assert reasons(errors) == {
        "birds": ("rejected", "symlink_outside_input"),
        "dogs/outside.jpg": ("rejected", "symlink_outside_input"),
        "dogs/gone.jpg": ("rejected", "dangling_symlink"),
        "dogs/up": ("rejected", "symlink_loop"),
        "dogs/self": ("rejected", "symlink_loop"),
        # one file, one record: the names that reach a file read under its own name are skipped
        "cats/alias.jpg": ("skipped", "symlink_alias"),
        **{f"kittens/{name}": ("skipped", "symlink_alias") for name in
           ("alias.jpg", "img0_00.jpg", "img0_01.jpg", "img0_02.jpg")},
    }
    assert "--follow_symlinks" in errors["birds"]["detail"]
    assert errors["cats/alias.jpg"]["detail"].startswith("a symlink (or a path through a linked folder) to "
                                                         "'cats/img0_00.jpg', which is read under that name")
    assert "'cats/img0_01.jpg'" in errors["kittens/img0_01.jpg"]["detail"]
    # cats 3 (its alias skipped), kittens (= cats) all skipped, dogs 3
    assert info["files"] == dict(info["files"], found=16, written=6, rejected=5, skipped=5)
    rows = [r for rows in read_records(tmp_path / "out").values() for r in rows]
    assert Counter(r["class_name"] for r in rows) == {"cats": 3, "dogs": 3}
    assert len({r["sha256"] for r in rows}) == 6
    # the launcher says so up front, as a warning
    notes = plan_dataset(settings_of(root, tmp_path / "out2")).notes
    assert ("the class folder 'kittens' is a symlink to the class folder 'cats': its images are read once, in that "
            "class, and each name through the link is skipped (symlink_alias); remove the link to drop the class"
            ) in notes


@pytest.mark.timeout(240)
def test_follow_symlinks_reads_links_to_outside_the_input(tmp_path):
    root = symlink_tree(tmp_path)
    info, errors, labels = run_ok(root, tmp_path / "out", "--follow_symlinks")
    assert labels == ["birds", "cats", "dogs", "kittens"]
    assert reasons(errors) == {
        "dogs/gone.jpg": ("rejected", "dangling_symlink"),
        "dogs/up": ("rejected", "symlink_loop"),
        "dogs/self": ("rejected", "symlink_loop"),
        "cats/alias.jpg": ("skipped", "symlink_alias"),
        **{f"kittens/{name}": ("skipped", "symlink_alias") for name in
           ("alias.jpg", "img0_00.jpg", "img0_01.jpg", "img0_02.jpg")},
    }
    assert info["files"]["written"] == 9  # + birds 2 + dogs/outside.jpg


@pytest.mark.timeout(240)
def test_a_file_reached_twice_through_symlinks_is_one_record(tmp_path):
    """A symlink to a file that is listed itself (in its class or another) is skipped as symlink_alias, and so
    is a second link to a file outside the input (--follow_symlinks): one file, one record, each other name one
    line of errors.jsonl, and found = written + rejected + skipped."""
    root = tmp_path / "in"
    tree.class_tree(root, {"cats": 3, "dogs": 3})
    tree.images(tmp_path / "elsewhere", 1, prefix="loose")
    os.symlink("img0_00.jpg", root / "cats" / "same.jpg")  # the repro: a link beside its file
    os.symlink("../cats/img0_01.jpg", root / "dogs" / "cat.jpg")  # a link into another class
    os.symlink(tmp_path / "elsewhere" / "loose_00.jpg", root / "dogs" / "b.jpg")  # two links to one outside file
    os.symlink(tmp_path / "elsewhere" / "loose_00.jpg", root / "cats" / "a.jpg")
    info, errors, _ = run_ok(root, tmp_path / "out", "--follow_symlinks", "--validation_split=0")
    assert reasons(errors) == {"cats/same.jpg": ("skipped", "symlink_alias"),
                               "dogs/cat.jpg": ("skipped", "symlink_alias"),
                               "dogs/b.jpg": ("skipped", "symlink_alias")}
    assert "'cats/a.jpg'" in errors["dogs/b.jpg"]["detail"]  # the first name of the outside file is read
    assert info["files"] == dict(info["files"], found=10, written=7, rejected=0, skipped=3)
    rows = read_records(tmp_path / "out")["train"]
    assert sorted(r["source_path"] for r in rows) == sorted(
        [f"cats/img0_0{i}.jpg" for i in range(3)] + [f"dogs/img1_0{i}.jpg" for i in range(3)] + ["cats/a.jpg"])
    verified = run_tool("pipeline.verify", str(tmp_path / "out"))
    assert verified.returncode == 0, verified.stdout + verified.stderr


@pytest.mark.timeout(180)
def test_special_files_are_classified_at_listing_time(tmp_path):
    root = tmp_path / "in"
    tree.class_tree(root, {"cats": 3, "dogs": 3})
    tree.fifo(root / "cats" / "pipe.jpg")
    tree.fifo(root / "cats" / "pipe.txt")
    sock = tree.unix_socket(root / "dogs" / "sock.png")
    try:
        os.symlink("/dev/null", root / "dogs" / "null.jpg")
        os.symlink("/dev/null", root / "dogs" / ".null.jpg")
        info, errors, _ = run_ok(root, tmp_path / "out")
        assert reasons(errors) == {
            "dogs/.null.jpg": ("skipped", "hidden_file"),
            "cats/pipe.jpg": ("rejected", "not_a_regular_file"),
            "cats/pipe.txt": ("skipped", "not_an_image_extension"),
            "dogs/sock.png": ("rejected", "not_a_regular_file"),
            "dogs/null.jpg": ("rejected", "symlink_outside_input"),
        }
        info, errors, _ = run_ok(root, tmp_path / "out2", "--follow_symlinks")
        assert reasons(errors)["dogs/null.jpg"] == ("rejected", "not_a_regular_file")
        assert "character device" in errors["dogs/null.jpg"]["detail"]
        assert info["files"]["written"] == 6
    finally:
        sock.close()


@pytest.mark.timeout(180)
def test_an_unreadable_class_folder_is_reported(tmp_path, monkeypatch):
    root = tmp_path / "in"
    tree.class_tree(root, {"cats": 3, "dogs": 3, "locked": 2})
    locked = root / "locked"
    if IS_ROOT:
        # chmod does not stop root from reading: simulate the failing listing of that one folder.
        real_scandir = os.scandir

        def scandir(path="."):
            if isinstance(path, (str, bytes)) and os.fsdecode(path).rstrip("/") == str(locked):
                raise PermissionError(13, "Permission denied", os.fsdecode(path))
            return real_scandir(path)

        monkeypatch.setattr(os, "scandir", scandir)
    else:
        locked.chmod(0)
    try:
        info, errors, labels = run_ok(root, tmp_path / "out")
    finally:
        locked.chmod(0o755)
    assert reasons(errors) == {"locked": ("rejected", "unreadable_folder")}
    assert "Permission denied" in errors["locked"]["detail"]
    assert info["files"] == dict(info["files"], found=7, written=6, rejected=1)
    assert labels == ["cats", "dogs"]


# ---- 9. glob characters in folder names --------------------------------------------------


@pytest.mark.timeout(180)
def test_glob_characters_in_the_input_folder_are_plain_characters(tmp_path):
    tree.class_tree(tmp_path / "set[1]", {"cats": 2, "dogs": 2})
    tree.class_tree(tmp_path / "set1", {"birds": 5, "fish": 5})
    tree.class_tree(tmp_path / "set*", {"x": 1, "y": 1})
    info, errors, labels = run_ok(tmp_path / "set[1]", tmp_path / "out")
    assert labels == ["cats", "dogs"] and info["files"]["found"] == 4 and not errors
    assert info["options"]["input_dir"] == str(tmp_path / "set[1]")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", ["out[1]", "out*", "out?"])
def test_glob_characters_in_the_output_folder_are_refused_with_one_line(tmp_path, name, capsys):
    tree.class_tree(tmp_path / "in", {"cats": 2, "dogs": 2})
    code, stderr = main_in_process(capsys, f"--input_dir={tmp_path / 'in'}", f"--output_dir={tmp_path / name}")
    assert code == 2, stderr
    assert len(stderr.splitlines()) == 1 and stderr.startswith("error: --output_dir")
    assert "glob" in stderr and "Traceback" not in stderr
    assert not (tmp_path / name).exists()


# ---- 12. tracebacks instead of error lines ----------------------------------------------


@pytest.mark.timeout(60)
def test_an_infinite_image_timeout_is_refused(tmp_path):
    tree.class_tree(tmp_path / "in", {"cats": 1, "dogs": 1})
    message = error_line(f"--input_dir={tmp_path / 'in'}", f"--output_dir={tmp_path / 'out'}",
                         "--image_timeout_s=inf")
    assert message.startswith("--image_timeout_s=inf") and "0 (no limit)" in message


@pytest.mark.timeout(60)
@pytest.mark.parametrize("where", ["under_a_file", "dev_null", "under_dev_null", "proc"])
def test_an_output_folder_that_cannot_be_made_is_one_line(tmp_path, where, capsys):
    tree.class_tree(tmp_path / "in", {"cats": 1, "dogs": 1})
    (tmp_path / "file").write_text("x")
    output = {
        "under_a_file": str(tmp_path / "file" / "out"),
        "dev_null": "/dev/null",
        "under_dev_null": "/dev/null/out",
        "proc": "/proc/no-such-process/out",
    }[where]
    code, stderr = main_in_process(capsys, f"--input_dir={tmp_path / 'in'}", f"--output_dir={output}")
    assert code == 2, stderr
    assert len(stderr.splitlines()) == 1, stderr
    assert stderr.startswith(f"error: --output_dir {output} ")
    assert (tmp_path / "file").read_text() == "x"


@pytest.mark.timeout(240)
def test_glob_characters_in_a_gcs_input_folder_are_plain_characters(gcs_emulator, tmp_path):
    from tests.gcs_fixtures import NO_AUTH

    bucket = gcs_emulator.create_bucket("hostile-glob")
    tree.class_tree(tmp_path / "a", {"cats": 2, "dogs": 2})
    tree.class_tree(tmp_path / "b", {"birds": 5, "fish": 5})
    assert gcs_emulator.upload_tree(tmp_path / "a", f"{bucket}/set[1]") == 4
    assert gcs_emulator.upload_tree(tmp_path / "b", f"{bucket}/set1") == 10
    info, errors, labels = run_ok(f"{bucket}/set[1]", tmp_path / "out", NO_AUTH)
    assert labels == ["cats", "dogs"] and info["files"]["found"] == 4 and not errors


@pytest.mark.timeout(200)
def test_the_whole_hostile_corpus_as_a_user_runs_it(tmp_path):
    """Every case at once, in a memory-limited subprocess: exit 0, one summary, every entry accounted for."""
    root = symlink_tree(tmp_path)
    tree.fifo(root / "cats" / "pipe.jpg")
    tree.bytes_image(root / "dogs", b"caf\xe9.jpg")
    os.symlink("/dev/zero", root / "dogs" / "zero.jpg")
    os.symlink(root, root / "cats" / "root")  # an absolute link to the input folder itself
    sock = tree.unix_socket(root / "cats" / "sock.jpg")
    try:
        result = bounded_cli(f"--input_dir={root}", f"--output_dir={tmp_path / 'out'}", "--quiet")
    finally:
        sock.close()
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    # 16 of the symlink tree + caf\xe9, zero, and pipe, sock, root twice (kittens/ is a link to cats/, whose
    # images are read once: under cats/, each other name skipped as symlink_alias)
    assert "Found 24 files: 7 written, 12 rejected, 5 skipped." in result.stdout
    assert ("Rejected: dangling_symlink 1, not_a_regular_file 4, symlink_loop 4, symlink_outside_input 3 "
            "(see errors.jsonl)") in result.stdout
    lines = (tmp_path / "out" / "errors.jsonl").read_bytes().decode("utf-8").splitlines()
    assert {json.loads(line)["relpath"] for line in lines} == {
        "birds", "dogs/outside.jpg", "dogs/gone.jpg", "dogs/up", "dogs/self", "dogs/zero.jpg",
        "cats/pipe.jpg", "cats/sock.jpg", "cats/root", "kittens/pipe.jpg", "kittens/sock.jpg", "kittens/root",
        "cats/alias.jpg", "kittens/alias.jpg", "kittens/img0_00.jpg", "kittens/img0_01.jpg", "kittens/img0_02.jpg"}


@pytest.mark.timeout(180)
def test_a_deeply_nested_folder_is_listed(tmp_path):
    """Deeper than Python's recursion limit: the walk keeps its own stack."""
    root = tmp_path / "in"
    tree.class_tree(root, {"cats": 2})
    deep = str(root / "dogs")
    os.mkdir(deep)
    for _ in range(1100):  # os.makedirs itself recurses
        deep = os.path.join(deep, "d")
        os.mkdir(deep)
    tree.images(deep, 2)
    try:
        info, errors, labels = run_ok(root, tmp_path / "out")
        assert labels == ["cats", "dogs"] and info["files"]["written"] == 4 and not errors
    finally:
        # Deepest first, by hand: shutil.rmtree (pytest's clean-up of tmp_path) and os.walk recurse, and would
        # end in a RecursionError.
        folder = deep
        while True:
            for name in os.listdir(folder):
                path = os.path.join(folder, name)
                if not os.path.isdir(path) or os.path.islink(path):
                    os.unlink(path)
            os.rmdir(folder)
            if folder == str(root / "dogs"):
                break
            folder = os.path.dirname(folder)
