"""The converter's one-line errors as tests expect them: a launcher run's message, the line of a full output disk."""

from __future__ import annotations

import pytest

from pipeline.errors import UserError


def error_line(*argv) -> str:
    """The message of the UserError that the launcher's run of `argv` raises: one line, checked."""
    with pytest.raises(UserError) as caught:
        from pipeline.launcher import run

        run(list(argv))
    message = str(caught.value)
    assert "\n" not in message and "\r" not in message
    return message


def full_disk_line(out, state: str = "no dataset was written") -> str:
    """The one line a run prints when the disk of --output_dir `out` is full, ending with what became of it."""
    return (f"error: the disk of --output_dir {out} is full (No space left on device), and {state}: a run needs the "
            "new dataset's size free; free some space or choose another folder, then run the same command again (it "
            "removes this run's files first)")


def unpublished(out):
    """The folder in which the one run into `out` that converted no image left its errors.jsonl and
    image_tfrecords.json, unpublished (`pipeline.report.unpublished_folder`)."""
    from transforms.base.dataset_format import TEMP_DIR, UNPUBLISHED_DIR

    found = sorted(out.glob(f"{TEMP_DIR}/*/{UNPUBLISHED_DIR}"))
    assert len(found) == 1, found
    return found[0]


def nothing_converted_line(out, found: int, reasons: str) -> str:
    """The one error line of a run into `out` in which every one of `found` files was rejected or skipped."""
    return (f"error: no image could be converted: every one of the {found} files found was rejected or skipped "
            f"({reasons}), so nothing was published (a dataset already in --output_dir is unchanged); each file's "
            f"reason is in {unpublished(out) / 'errors.jsonl'}, which the next run into the folder removes: fix the "
            "input and run the command again")
