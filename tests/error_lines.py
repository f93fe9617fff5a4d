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
