"""Builders of hostile input trees, made by code: odd names, symlink cases, special files.

Every builder works with bytes paths where the name is not UTF-8 (os.open(b'...\\xff.jpg')),
so the corpus holds the real thing, not a decoded stand-in. Images are tiny JPEGs:
the point is the file system, not the pixels.
"""

from __future__ import annotations

import io
import os
import socket
import zlib

from PIL import Image


def jpeg_bytes(seed: int = 0, size: int = 16) -> bytes:
    """A small solid-colour JPEG; different seeds give different colours (so verify sees no duplicates)."""
    buffer = io.BytesIO()
    colour = (seed % 251, (seed // 251) % 241, (seed // (251 * 241)) % 239)
    Image.new("RGB", (size, size), colour).save(buffer, "JPEG", quality=95)
    return buffer.getvalue()


def _seed(path) -> int:
    return zlib.crc32(os.fsencode(os.fspath(path)))


def write_file(path, data: bytes) -> None:
    """Write `data` to `path` (str, pathlib.Path or bytes: bytes keep a non-UTF-8 name exactly)."""
    fd = os.open(os.fspath(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def images(folder, count: int, prefix: str = "img", start: int = 0) -> list[str]:
    """`count` JPEGs named <prefix>_NN.jpg in `folder` (created); returns their names."""
    os.makedirs(folder, exist_ok=True)
    names = []
    for i in range(start, start + count):
        name = f"{prefix}_{i:02d}.jpg"
        path = os.path.join(os.fspath(folder), name)
        write_file(path, jpeg_bytes(_seed(path)))
        names.append(name)
    return names


def bytes_image(folder, name: bytes) -> bytes:
    """One JPEG whose file name is the raw bytes `name` (may be invalid UTF-8); returns its full bytes path."""
    path = os.path.join(os.fsencode(os.fspath(folder)), name)
    write_file(path, jpeg_bytes(_seed(path)))
    return path


def fifo(path) -> None:
    os.mkfifo(os.fspath(path))


def unix_socket(path) -> socket.socket:
    """A bound (listening) Unix socket at `path`; the caller closes it."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(os.fspath(path))
    return sock


def class_tree(root, classes: dict[str, int]) -> dict[str, list[str]]:
    """<root>/<class>/img_NN.jpg for each class; returns {class: [names]}."""
    return {name: images(os.path.join(os.fspath(root), name), count, prefix=f"img{c}")
            for c, (name, count) in enumerate(sorted(classes.items()))}
