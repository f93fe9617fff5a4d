"""docs/layouts.md: every command in the page runs on a small generated copy of its layout, and the records it
writes carry the labels and splits of that layout's own truth, record by record (issue 48)."""

from __future__ import annotations

import json
import os
import re
import shlex

import pytest
from PIL import Image

from tests.conftest import FAST, REPO, run_tool
from transforms.base.examples import Example
from transforms.base.tfrecord import iter_records

DOC = os.path.join(REPO, "docs", "layouts.md")


def sections() -> dict[str, list[list[str]]]:
    """Each `## ` section of the page: the argument lists of its ```shell commands (`python -m pipeline.main`)."""
    text = open(DOC).read()
    out = {}
    for part in re.split(r"^## ", text, flags=re.MULTILINE)[1:]:
        title = part.splitlines()[0].strip()
        commands = []
        for block in re.findall(r"```shell\n(.*?)```", part, re.DOTALL):
            for line in block.strip().splitlines():
                words = shlex.split(line)
                assert words[:3] == ["python", "-m", "pipeline.main"], line
                commands.append(words[3:])
        out[title] = commands
    return out


def _image(path, n: int) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    Image.new("RGB", (16, 16), ((37 * n) % 256, (91 * n) % 256, (13 * n) % 256)).save(path, quality=90)


def _write(files: dict[str, tuple[str, str]], root) -> None:
    for n, relpath in enumerate(sorted(files)):
        _image(os.path.join(root, relpath), n)


# Each layout: the files to generate ({path below the working folder: (class, split)}; split '' for "any"),
# and the other files it ships. The truth the records are checked against is the same table.

def class_folders():
    return {f"flowers/{c}/{c[0]}{i}.jpg": (c, "") for c in ("daisy", "roses", "tulips") for i in range(6)}, {}


def split_folders():
    files = {}
    for folder, split in (("train", "train"), ("valid", "validation"), ("test", "test")):
        for c in ("daisy", "roses"):
            for i in range(3):
                files[f"data/{folder}/{c}/{folder}{c}{i}.jpg"] = (c, split)
    return files, {}


def kaggle():
    files = {f"kaggle/train/{c}/{i}{c}.jpg": (c, "") for c in ("cat", "dog") for i in range(6)}
    files.update({f"kaggle/test/{i}.jpg": ("", "test") for i in range(5)})
    return files, {}


def file_names():
    files = {f"dogs-vs-cats/train/{c}.{i}.jpg": (c, "") for c in ("cat", "dog") for i in range(8)}
    files.update({f"pets/images/{c}_{i}.jpg": (c, "") for c in ("Abyssinian", "american_bulldog", "Bengal")
                  for i in (1, 3, 12, 100)})
    return files, {}


def split_lists():
    files, train, test = {}, [], []
    for c in ("apple_pie", "waffles", "baby_back_ribs"):
        for i in range(6):
            split = "test" if i % 3 == 0 else "train"
            files[f"food/images/{c}/{1000 + i}.jpg"] = (c, split)
            (test if split == "test" else train).append(f"{c}/{1000 + i}")
    return files, {"food/meta/train.txt": "\n".join(train) + "\n", "food/meta/test.txt": "\n".join(test) + "\n"}


def one_hot():
    classes = ("helmet", "no-helmet", "person")
    files, csvs = {}, {}
    for folder, split in (("train", "train"), ("valid", "validation"), ("test", "test")):
        rows = ["filename, " + ", ".join(classes)]
        for i in range(5):
            c = classes[i % 3]
            name = f"img{i}_{folder}.rf.{i:04x}.jpg"
            files[f"helmets/{folder}/{name}"] = (c, split)
            rows.append(f"{name}," + ",".join("1" if k == c else "0" for k in classes))
        csvs[f"helmets/{folder}/_classes.csv"] = "\n".join(rows) + "\n"
    return files, csvs


def a_manifest():
    files, rows = {}, ["path,label,split"]
    for i in range(8):
        c, split = ("rose", "tulip")[i % 2], ("train", "validation", "test", "train")[i % 4]
        files[f"photos/{c}s/{i}.jpg"] = (c, split)
        rows.append(f"{c}s/{i}.jpg,{c},{split}")
    return files, {"photos/list.csv": "\n".join(rows) + "\n"}


LAYOUTS = {
    "Class folders": class_folders,
    "Split folders": split_folders,
    "Kaggle: train and a flat test": kaggle,
    "Labels in file names": file_names,
    "Split lists": split_lists,
    "One-hot label CSVs (Roboflow)": one_hot,
    "A manifest": a_manifest,
}


def test_every_section_with_commands_has_a_layout_here():
    assert {title for title, commands in sections().items() if commands} == set(LAYOUTS) | {"Detection exports"}


def _records(out) -> dict[str, tuple[str, str]]:
    """{source_path: (class name(s), split)} of a written dataset ('' for an unlabeled record; the names joined
    by ';' for a multi-label one)."""
    info = json.loads((out / "image_tfrecords.json").read_text())
    found = {}
    for split, split_info in info["splits"].items():
        for shard in split_info["shards"]:
            for raw in iter_records(str(out / shard["file"])):
                feature = Example.FromString(raw).features.feature
                source = feature["source_path"].bytes_list.value[0].decode()
                names = ";".join(v.decode() for v in feature["class_name"].bytes_list.value)
                assert source not in found, source
                found[source] = (names, split)
    return found


def _output(args: list[str]) -> str:
    return next(a.split("=", 1)[1] for a in args if a.startswith("--output_dir="))


@pytest.mark.parametrize("title", sorted(LAYOUTS))
def test_the_command_converts_its_layout_as_the_layout_says(title, tmp_path, monkeypatch):
    files, others = LAYOUTS[title]()
    monkeypatch.chdir(tmp_path)
    _write(files, tmp_path)
    for relpath, text in others.items():
        (tmp_path / relpath).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relpath).write_text(text)
    commands = sections()[title]
    expected = {os.path.normpath(p): truth for p, truth in files.items()}
    seen: dict[str, tuple[str, str]] = {}
    for args in commands:
        result = run_tool("pipeline.main", *args, "--quiet", *FAST)
        assert result.returncode == 0, (args, result.stderr)
        out = tmp_path / _output(args)
        for source, truth in _records(out).items():
            # a record's source path is below --input_dir, or the manifest's folder: the generated file it names
            [path] = [p for p in expected if p == source or p.endswith("/" + source)]
            assert path not in seen, path
            seen[path] = truth
    assert set(seen) == set(expected)
    for path, (class_name, split) in expected.items():
        got_class, got_split = seen[path]
        assert got_class == class_name, path
        if split:
            assert got_split == split, path


def test_the_detection_export_is_refused_in_one_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for split in ("train", "valid"):
        for i in range(3):
            _image(tmp_path / "yolo" / split / "images" / f"{i}.jpg", i)
            (tmp_path / "yolo" / split / "labels" / f"{i}.txt").parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / "yolo" / split / "labels" / f"{i}.txt").write_text("0 0.5 0.5 0.2 0.2\n")
    (tmp_path / "yolo" / "data.yaml").write_text("train: train/images\nval: valid/images\nnames: ['helmet']\n")
    [args] = sections()["Detection exports"]
    assert "--task=detection" in args
    plain = [arg for arg in args if arg != "--task=detection"]
    result = run_tool("pipeline.main", *plain, "--quiet", *FAST)
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "YOLO" in lines[0] and "give --task=detection" in lines[0], result.stderr
    assert not (tmp_path / "tfrecords" / "yolo" / "image_tfrecords.json").exists()
    # the page's command converts it: one record per image, each with its box of class helmet
    result = run_tool("pipeline.main", *args, "--quiet", *FAST)
    assert result.returncode == 0, result.stderr
    info = json.loads((tmp_path / "tfrecords" / "yolo" / "image_tfrecords.json").read_text())
    assert info["task"] == "detection" and info["class_names"] == ["helmet"]
    assert {split: s["records"] for split, s in info["splits"].items()} == {"train": 3, "validation": 3}
    assert info["detection"]["annotations"] == {"found": 6, "written": 6, "rejected": {}}
