"""The files a user names that the launcher reads (--manifest, --metadata, --labels_file, --features=@FILE):
checked by type before they are opened, and read within a bound.

A local path must be a regular file (a symlink to one is fine): a FIFO would block the launcher, /dev/zero or
/dev/urandom would never end; both are refused with one line, never opened. A gs:// object is always a
regular object; its reads are bounded all the same.
"""

from __future__ import annotations

import os
import stat

from apache_beam.io.filesystems import FileSystems

from pipeline.errors import UserError
from transforms.base.paths import is_local

_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def check_file(flag: str, path: str, what: str = "file") -> None:
    """Raises UserError for a local `path` that does not exist or is not a regular file (stat, never opened)."""
    if not is_local(path):
        return
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise UserError(f"{flag} {path} does not exist: give the {what}") from None
    except OSError as e:
        raise UserError(f"{flag} {path} cannot be looked at ({e.strerror or type(e).__name__}): give the "
                        f"{what}") from None
    if not stat.S_ISREG(mode):
        kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
        raise UserError(f"{flag} {path} is {kind}, not a regular file, and is not read: give the {what}")


def read_small_file(flag: str, path: str, limit: int, what: str) -> bytes:
    """The bytes of a file that is small by its nature (a labels file, a --features schema): checked by type,
    and refused when it holds more than `limit` bytes (read up to limit + 1, never whole).

    Raises:
        UserError: for a missing or unreadable file, one that is not a regular file, or one over `limit`.
    """
    check_file(flag, path, what)
    try:
        with FileSystems.open(path, compression_type="uncompressed") as f:
            data = f.read(limit + 1)
    except Exception as e:  # noqa: BLE001 - what the file system says
        raise UserError(f"{flag} {path} cannot be read ({type(e).__name__}): give the {what}") from None
    if len(data) > limit:
        raise UserError(f"{flag} {path} is over {limit // (1 << 20)} MiB, more than a {what} holds: check the "
                        "path")
    return data
