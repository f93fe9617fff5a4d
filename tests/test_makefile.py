"""The Makefile's .venv: an unsupported Python is refused in one line, another Python's .venv is built anew.

Run on a copy of the Makefile with stand-in interpreters (scripts that report a given version, make a stand-in
venv and log the pip commands), so that nothing is installed.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys

import pytest

from tests.conftest import REPO

FAKE_PYTHON = f"""#!{sys.executable}
import os, shutil, sys
here = os.path.dirname(os.path.abspath(__file__))
version = open(os.path.join(here, "version")).read().strip()
args = sys.argv[1:]
if args[0] == "-c":  # the Makefile asks for the version
    sys.version_info = tuple(map(int, version.split(".")))
    exec(args[1])
    sys.exit()
with open(os.environ["FAKE_LOG"], "a") as log:
    log.write(version + " " + " ".join(args) + "\\n")
if args[:2] == ["-m", "venv"]:
    bin_dir = os.path.join(args[2], "bin")
    os.makedirs(bin_dir, exist_ok=True)
    shutil.copy(__file__, os.path.join(bin_dir, "python"))
    shutil.copy(os.path.join(here, "version"), os.path.join(bin_dir, "version"))
"""

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs GNU make")


def fake_python(folder, version: str) -> str:
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "python")
    with open(path, "w") as f:
        f.write(FAKE_PYTHON)
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)
    with open(os.path.join(folder, "version"), "w") as f:
        f.write(version)
    return path


@pytest.fixture
def project(tmp_path):
    shutil.copy(os.path.join(REPO, "Makefile"), tmp_path)
    (tmp_path / "setup.py").write_text("")
    return tmp_path


def make(project, python: str, *goals: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, FAKE_LOG=str(project / "log"))
    return subprocess.run(["make", "--no-print-directory", *goals, f"PYTHON={python}"], cwd=project, env=env,
                          capture_output=True, text=True, timeout=60)


def logged(project) -> list[str]:
    path = project / "log"
    lines = path.read_text().splitlines() if path.exists() else []
    path.unlink(missing_ok=True)
    return lines


def test_an_unsupported_python_is_refused_in_one_line(project):
    old = fake_python(project / "py310", "3.10.13")
    done = make(project, old, "demo")
    assert done.returncode == 2
    assert re.fullmatch(rf"Makefile:\d+: \*\*\* {re.escape(old)} is Python 3\.10\.13; image-tfrecords supports "
                        r"Python 3\.11, 3\.12, 3\.13: give one, e\.g\. make demo PYTHON=python3\.12\.  Stop\.\n",
                        done.stderr), done.stderr
    assert not (project / ".venv").exists() and logged(project) == []
    missing = make(project, str(project / "no_such_python"), "venv")
    assert missing.returncode == 2 and "is not a Python that runs here" in missing.stderr
    assert make(project, old, "clean").returncode == 0  # clean needs no interpreter


def test_a_venv_of_another_python_is_built_anew(project):
    py311, py313 = fake_python(project / "py311", "3.11.7"), fake_python(project / "py313", "3.13.0")
    first = make(project, py311, "venv")
    assert first.returncode == 0, first.stderr
    venv_python = os.path.join(".venv", "bin", "python")
    assert logged(project) == ["3.11.7 -m venv .venv",
                               "3.11.7 -m pip install --quiet --disable-pip-version-check --upgrade pip>=24",
                               "3.11.7 -m pip install --quiet --disable-pip-version-check -e .[tf,dev]"]
    assert os.path.exists(project / venv_python)
    # The same interpreter again: nothing to do.
    again = make(project, py311, "venv")
    assert (again.returncode, logged(project)) == (0, [])
    # Another one (make demo PYTHON=python3.13 after a 3.11 .venv): one line says so, and the .venv is rebuilt.
    other = make(project, py313, "venv")
    assert other.returncode == 0, other.stderr
    assert f".venv was built by another Python: building it anew with {py313} (3.13.0)" in other.stdout
    assert [line.split(" ", 3)[:3] for line in logged(project)] == [["3.13.0", "-m", "venv"],
                                                                    ["3.13.0", "-m", "pip"], ["3.13.0", "-m", "pip"]]
    assert (project / ".venv" / "bin" / "version").read_text() == "3.13.0"
    assert sorted(p.name for p in (project / ".venv").glob(".installed-*")) == [".installed-python3.13.0"]


def test_the_makefiles_pythons_are_setup_pys():
    makefile = open(os.path.join(REPO, "Makefile")).read()
    supported = re.search(r"^SUPPORTED := (.*)$", makefile, re.M).group(1).split()
    setup = open(os.path.join(REPO, "setup.py")).read()
    low, high = re.search(r'python_requires=">=3\.(\d+),<3\.(\d+)"', setup).groups()
    assert supported == [f"3.{minor}" for minor in range(int(low), int(high))]
