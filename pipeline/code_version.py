"""Which code this is: the package version and a hash of every Python file of pipeline/ and transforms/.

The launcher and the Dataflow workers must run the same code: a worker image (--sdk_container_image,
the Flex Template's image) built from another commit would convert with other rules than the launcher
planned with. `dataflow/build_template.sh` tags the image it builds with this identity
(`0.1.0-3f2a9c81b0d4`), so that the launcher can compare before it submits anything, without pulling the
image; and the job's first step compares the workers' own code with the launcher's (`pipeline.cloud`).

Standard library only: build_template.sh runs it without the project's environment.
"""

from __future__ import annotations

import hashlib
import os
import re
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("pipeline", "transforms")
# The tag build_template.sh gives an image: the version, then the first 12 hex digits of the code hash.
IMAGE_TAG = re.compile(r"(?P<version>[0-9][0-9A-Za-z.+]*)-(?P<code>[0-9a-f]{12})")


def _version(root: str) -> str:
    with open(os.path.join(root, "pipeline", "__init__.py"), encoding="utf-8") as f:
        found = re.search(r'^__version__ = "([^"]+)"', f.read(), re.MULTILINE)
    return found.group(1) if found else "unknown"


def code_hash(root: str = _ROOT) -> str:
    """SHA-256 of every .py file's path (relative, with /) and bytes under pipeline/ and transforms/: 12 hex digits."""
    digest = hashlib.sha256()
    files = []
    for package in PACKAGES:
        for folder, dirs, names in os.walk(os.path.join(root, package)):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            files += [os.path.join(folder, name) for name in names if name.endswith(".py")]
    for path in sorted(files, key=lambda p: os.path.relpath(p, root).replace(os.sep, "/")):
        with open(path, "rb") as f:
            data = f.read()
        digest.update(os.path.relpath(path, root).replace(os.sep, "/").encode() + b"\0")
        digest.update(len(data).to_bytes(8, "big") + data)
    return digest.hexdigest()[:12]


def code_identity(root: str = _ROOT) -> str:
    """This code's identity, as an image tag: `<version>-<code hash>`."""
    return f"{_version(root)}-{code_hash(root)}"


def image_identity(image: str) -> str | None:
    """The code identity an image name declares in its tag (as build_template.sh tags it), None if it declares none."""
    name = image.split("@", 1)[0]  # a digest names no code
    last = name.rsplit("/", 1)[-1]
    if ":" not in last:
        return None
    tag = last.rsplit(":", 1)[1]
    return tag if IMAGE_TAG.fullmatch(tag) else None


if __name__ == "__main__":  # build_template.sh: the default tag
    print(code_identity(sys.argv[1] if len(sys.argv) > 1 else _ROOT))
