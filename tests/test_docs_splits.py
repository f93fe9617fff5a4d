"""docs/splits-and-duplicates.md: its reader examples run on a real conversion and find what the input holds."""

from __future__ import annotations

import pytest
from PIL import Image

from tests.conftest import REPO, convert, doc_example

DOC = f"{REPO}/docs/splits-and-duplicates.md"
PATIENT = r"^[^/]+/(patient\d+)_"


def _block(marker: str) -> str:
    block = doc_example("docs/splits-and-duplicates.md", marker)
    assert '"tfrecords/"' in block
    return block


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """30 patients x 3 images in two classes, plus byte-identical copies: one within a split's class, one
    under two labels; converted with --group_by into tmp/tfrecords/."""
    root = tmp_path_factory.mktemp("groups")
    src, out = root / "xray", root / "tfrecords"
    n = 0
    for patient in range(30):
        for k in range(3):
            cls = "benign" if (patient + k) % 2 else "malign"
            path = src / cls / f"patient{patient:02d}_{k}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.new("RGB", (8, 8), (n % 256, n // 256, 50)).save(path)
            n += 1
    # the same bytes as patient00_0 under its own class, but its own group: the same label
    (src / "malign" / "copy_of_p00.png").write_bytes((src / "malign" / "patient00_0.png").read_bytes())
    # the same bytes as patient01_0 under the other class: a conflict
    (src / "malign" / "copy_of_p01.png").write_bytes((src / "benign" / "patient01_0.png").read_bytes())
    assert convert(src, out, f"--group_by={PATIENT}", "--validation_split=0.3", "--image_size=8") == 0
    return root


def test_the_group_example_finds_every_group_in_one_split(converted, monkeypatch):
    monkeypatch.chdir(converted)
    namespace: dict = {}
    exec(compile(_block("splits_of_group"), DOC, "exec"), namespace)
    groups = namespace["splits_of_group"]
    assert len(groups) == 32  # 30 patients, and the two copies each their own group
    assert {f"patient{p:02d}" for p in range(30)} <= set(groups)
    assert namespace["leaks"] == []
    assert {split for splits in groups.values() for split in splits} == {"train", "validation"}


def test_the_group_example_finds_a_group_that_spans_two_splits(converted, monkeypatch):
    """The example can fail: a pattern that groups every patient into one group 'patient' must see it in both."""
    monkeypatch.chdir(converted)
    block = _block("splits_of_group").replace(r'r"^[^/]+/(patient\d+)_"', r'r"^[^/]+/(patient)\d+_"')
    namespace: dict = {}
    exec(compile(block, DOC, "exec"), namespace)
    assert namespace["leaks"] == ["patient"]


def test_the_duplicate_example_reads_the_report_and_the_hashes(converted, monkeypatch, capsys):
    monkeypatch.chdir(converted)
    namespace: dict = {}
    exec(compile(_block("def sources"), DOC, "exec"), namespace)
    duplicates = namespace["duplicates"]
    assert (duplicates["groups"], duplicates["conflicting_labels"]) == (2, 1)
    printed = capsys.readouterr().out
    assert "2 groups: " in printed and "1 with different labels" in printed
    assert "conflicting_labels [('benign/patient01_0.png'," in printed
    kinds = {tuple(sorted(c["relpath"] for c in g["copies"])): g["kind"] for g in duplicates["examples"]}
    assert kinds[("benign/patient01_0.png", "malign/copy_of_p01.png")] == "conflicting_labels"
    assert kinds[("malign/copy_of_p00.png", "malign/patient00_0.png")] in ("within_split", "across_splits")
    train, validation = namespace["train"], namespace["validation"]
    assert len(train.keys() | validation.keys()) == 90  # 92 files, of which 2 copies
    # `leaked`: each validation path whose bytes a train record has too, with that train path
    expected = {}
    for group in duplicates["examples"]:
        where = {c["split"]: c["relpath"] for c in group["copies"]}
        if set(where) == {"train", "validation"}:
            expected[where["validation"]] = where["train"]
    assert namespace["leaked"] == expected
