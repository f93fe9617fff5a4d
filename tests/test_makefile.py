"""The Makefile's .venv: an unsupported Python is refused in one line, another Python's .venv is built anew; make
test under CI runs the suite on the oldest and the newest supported Python, each in its own venv.

Run on a copy of the Makefile with stand-in interpreters (scripts that report a given version, make a stand-in
venv and log the pip, ruff and pytest commands; pytest fails where a `fail` file lies beside them), so that
nothing is installed and no suite runs.
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
    for name in ("version", "fail"):
        if os.path.exists(os.path.join(here, name)):
            shutil.copy(os.path.join(here, name), os.path.join(bin_dir, name))
if args[:2] == ["-m", "pytest"] and os.path.exists(os.path.join(here, "fail")):
    sys.exit(1)
"""

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs GNU make")


def fake_python(folder, version: str, name: str = "python", fail: bool = False) -> str:
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, name)
    with open(path, "w") as f:
        f.write(FAKE_PYTHON)
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)
    with open(os.path.join(folder, "version"), "w") as f:
        f.write(version)
    if fail:
        (folder / "fail").write_text("")
    return path


def executable(path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)


@pytest.fixture
def project(tmp_path):
    shutil.copy(os.path.join(REPO, "Makefile"), tmp_path)
    (tmp_path / "setup.py").write_text("")
    return tmp_path


# What the caller's make (make test runs this file) and CI set, and would pass on to the Makefile under test.
OUTER = ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES", "CI", "TEST_PYTHONS", "TEST_WORKERS", "PYTHON", "VENV")


def make(project, python: str, *goals: str, **env: str) -> subprocess.CompletedProcess:
    """make GOALS PYTHON=python in the copy; env's entries are set (CI="true", PATH=..., HOME=...)."""
    environ = {name: value for name, value in os.environ.items() if name not in OUTER}
    environ.update(FAKE_LOG=str(project / "log"), **env)
    return subprocess.run(["make", "--no-print-directory", *goals, f"PYTHON={python}"], cwd=project,
                          env=environ, capture_output=True, text=True, timeout=60)


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
                               "3.11.7 -m pip install --quiet --disable-pip-version-check -e .[tf,dev]",
                               f"3.11.7 {MODEL_GARDEN.format(venv='.venv')}"]
    assert os.path.exists(project / venv_python)
    # The same interpreter again: nothing to do.
    again = make(project, py311, "venv")
    assert (again.returncode, logged(project)) == (0, [])
    # Another one (make demo PYTHON=python3.13 after a 3.11 .venv): one line says so, and the .venv is rebuilt.
    other = make(project, py313, "venv")
    assert other.returncode == 0, other.stderr
    assert f".venv was built by another Python: building it anew with {py313} (3.13.0)" in other.stdout
    assert [line.split(" ", 3)[:3] for line in logged(project)] == [["3.13.0", "-m", "venv"],
                                                                    ["3.13.0", "-m", "pip"], ["3.13.0", "-m", "pip"],
                                                                    ["3.13.0", "-m", "pip"]]
    assert (project / ".venv" / "bin" / "version").read_text() == "3.13.0"
    assert sorted(p.name for p in (project / ".venv").glob(".installed-*")) == [".installed-python3.13.0"]


def test_the_makefiles_pythons_are_setup_pys():
    makefile = open(os.path.join(REPO, "Makefile")).read()
    supported = re.search(r"^SUPPORTED := (.*)$", makefile, re.M).group(1).split()
    setup = open(os.path.join(REPO, "setup.py")).read()
    low, high = re.search(r'python_requires=">=3\.(\d+),<3\.(\d+)"', setup).groups()
    assert supported == [f"3.{minor}" for minor in range(int(low), int(high))]


# make test with several Pythons. The PATH holds only the stand-ins and the commands the Makefile runs (so the
# machine's own python3.13 or pyenv is not found), and HOME is the test's (so ~/.pyenv is the test's too).
PYTEST = f"-m pytest -n {len(os.sched_getaffinity(0)) + 1} --dist worksteal --durations=25"  # nproc + 1
RUFF = "-m ruff check pipeline transforms tests benchmarks"
BUILT = ["-m venv", "-m pip install --quiet --disable-pip-version-check --upgrade pip>=24",
         "-m pip install --quiet --disable-pip-version-check -e .[tf,dev]"]
# Model Garden's decoder, a test consumer of detection records, into the venv's own folder
MODEL_GARDEN = ("-m pip install --quiet --disable-pip-version-check --no-deps --upgrade --target {venv}/model-garden "
                "tf-models-official==2.20.0")


@pytest.fixture
def machine(project):
    """A PATH and a HOME with no Python: (env for make(), the PATH's folder for stand-ins)."""
    tools = project / "tools"
    tools.mkdir()
    for name in ("make", "rm", "touch", "nproc"):
        os.symlink(shutil.which(name), tools / name)
    bin_dir = project / "bin"
    bin_dir.mkdir()
    home = project / "home"
    home.mkdir()
    return {"PATH": f"{bin_dir}:{tools}", "HOME": str(home)}, bin_dir


def test_without_ci_make_test_runs_the_suite_once_on_one_python(project, machine):
    env, bin_dir = machine
    py311 = fake_python(project / "py311", "3.11.7")
    fake_python(bin_dir, "3.13.0", name="python3.13")  # there, but not asked for
    done = make(project, py311, "test", **env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert logged(project) == ["3.11.7 -m venv .venv", *[f"3.11.7 {c}" for c in BUILT[1:]],
                             f"3.11.7 {MODEL_GARDEN.format(venv='.venv')}", f"3.11.7 {RUFF}", f"3.11.7 {PYTEST}"]
    assert not (project / ".venv-3.13").exists() and "make test:" not in done.stdout
    # The same with the ones CI sets to something else than true: still one Python.
    assert make(project, py311, "test", CI="false", **env).returncode == 0
    assert logged(project) == [f"3.11.7 {RUFF}", f"3.11.7 {PYTEST}"]


def test_under_ci_make_test_runs_the_oldest_and_the_newest_python_each_in_its_venv(project, machine):
    env, bin_dir = machine
    py311 = fake_python(project / "py311", "3.11.7")
    fake_python(bin_dir, "3.12.1", name="python3.12")  # supported, but neither the oldest nor the newest
    fake_python(bin_dir, "3.13.0", name="python3.13")
    done = make(project, py311, "test", CI="true", **env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert logged(project) == ["3.11.7 -m venv .venv", *[f"3.11.7 {c}" for c in BUILT[1:]],
                             f"3.11.7 {MODEL_GARDEN.format(venv='.venv')}",
                             f"3.11.7 {RUFF}", f"3.11.7 {PYTEST}",  # the lint once, in .venv
                             "3.13.0 -m venv .venv-3.13", *[f"3.13.0 {c}" for c in BUILT[1:]],
                             f"3.13.0 {MODEL_GARDEN.format(venv='.venv-3.13')}", f"3.13.0 {PYTEST}"]
    assert (project / ".venv-3.13" / "bin" / "version").read_text() == "3.13.0"
    assert f"make test: the suite on Python 3.13 ({bin_dir}/python3.13, in .venv-3.13)" in done.stdout
    assert done.stdout.splitlines()[-1] == "make test: passed on Python 3.11 3.13"
    # Again: both venvs are reused, the suite runs twice.
    again = make(project, py311, "test", CI="true", **env)
    assert again.returncode == 0, again.stdout + again.stderr
    assert logged(project) == [f"3.11.7 {RUFF}", f"3.11.7 {PYTEST}", f"3.13.0 {PYTEST}"]
    # setup.py changed: each venv is updated from it.
    for stamp in [*project.glob(".venv/.installed-*"), *project.glob(".venv-3.13/.installed-*")]:
        os.utime(stamp, (os.path.getmtime(stamp) - 10,) * 2)  # built before setup.py's change
    (project / "setup.py").write_text("# changed\n")
    assert make(project, py311, "test", CI="true", **env).returncode == 0
    assert [line for line in logged(project) if "-e .[tf,dev]" in line] == [f"3.11.7 {BUILT[2]}", f"3.13.0 {BUILT[2]}"]


@pytest.mark.parametrize("failing", ["3.11", "3.13"])
def test_every_python_runs_even_after_one_fails_and_the_last_line_names_the_failures(project, machine, failing):
    env, bin_dir = machine
    py311 = fake_python(project / "py311", "3.11.7", fail=failing == "3.11")
    fake_python(bin_dir, "3.13.0", name="python3.13", fail=failing == "3.13")
    done = make(project, py311, "test", TEST_PYTHONS="3.11 3.13", **env)  # as given, without CI
    assert done.returncode == 2, done.stdout + done.stderr
    assert [line for line in logged(project) if "pytest" in line] == [f"3.11.7 {PYTEST}", f"3.13.0 {PYTEST}"]
    passing = {"3.11": "3.13", "3.13": "3.11"}[failing]
    assert done.stdout.splitlines()[-1] == f"make test: failed on Python {failing} (passed on {passing})"


def test_a_python_that_is_not_found_is_one_line_and_fails_make_test_under_ci(project, machine):
    env, bin_dir = machine
    py311 = fake_python(project / "py311", "3.11.7")
    # A pyenv shim of a version that is not selected: on the PATH, but it does not run.
    executable(bin_dir / "python3.13", "#!/bin/sh\necho 'pyenv: python3.13: command not found' >&2\nexit 127\n")
    done = make(project, py311, "test", CI="true", **env)
    assert done.returncode == 2
    assert "make test: Python 3.13 not found (no python3.13 on the PATH, none under pyenv): install it (pyenv " \
           "install 3.13) or put python3.13 on the PATH\n" in done.stdout
    assert [line for line in done.stdout.splitlines() if "3.13" in line][1:] == [
        "make test: failed on Python 3.13 (not found) (passed on 3.11)"]
    assert [line for line in logged(project) if "pytest" in line] == [f"3.11.7 {PYTEST}"]  # 3.11's still ran
    assert "pyenv: python3.13" not in done.stdout + done.stderr
    # Without CI (a developer's TEST_PYTHONS): the same line says it is not run, and make test passes.
    given = make(project, py311, "test", TEST_PYTHONS="3.11 3.13", **env)
    assert given.returncode == 0, given.stdout + given.stderr
    assert "or put python3.13 on the PATH - the suite is not run on it\n" in given.stdout
    assert given.stdout.splitlines()[-1] == "make test: passed on Python 3.11 (not run on 3.13: not found)"
    # Nothing at all ran: that is a failure, not a pass.
    none = make(project, py311, "test", TEST_PYTHONS="3.13", **env)
    assert none.returncode == 2 and none.stdout.splitlines()[-1] == "make test: the suite ran on none of Python 3.13"


def test_pythons_are_found_under_pyenv(project, machine):
    env, bin_dir = machine
    py311 = fake_python(project / "py311", "3.11.7")
    # `pyenv prefix 3.13` names the installed version's folder.
    prefix = project / "pyenv-root" / "versions" / "3.13.0"
    found = fake_python(prefix / "bin", "3.13.0", name="python3.13")
    executable(bin_dir / "pyenv", f"#!/bin/sh\n[ \"$1 $2\" = 'prefix 3.13' ] && echo {prefix} && exit 0\nexit 1\n")
    done = make(project, py311, "test", CI="true", **env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"make test: the suite on Python 3.13 ({found}, in .venv-3.13)" in done.stdout
    # No pyenv command, but ~/.pyenv/versions/3.13.*: found there.
    (bin_dir / "pyenv").unlink()
    shutil.rmtree(project / ".venv-3.13")
    in_home = fake_python(project / "home" / ".pyenv" / "versions" / "3.13.1" / "bin", "3.13.1", name="python3.13")
    done = make(project, py311, "test", CI="true", **env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"make test: the suite on Python 3.13 ({in_home}, in .venv-3.13)" in done.stdout
    assert logged(project)[-1] == f"3.13.1 {PYTEST}"


def test_pythons_own_version_runs_in_dot_venv_and_clean_removes_every_venv(project, machine):
    env, bin_dir = machine
    py313 = fake_python(project / "py313", "3.13.0")
    fake_python(bin_dir, "3.11.7", name="python3.11")
    done = make(project, py313, "test", CI="true", **env)  # PYTHON is the newest: .venv is 3.13's, 3.11 the other
    assert done.returncode == 0, done.stdout + done.stderr
    assert [line for line in logged(project) if " -m pip " not in line] == [
        "3.13.0 -m venv .venv", f"3.13.0 {RUFF}", "3.11.7 -m venv .venv-3.11", f"3.11.7 {PYTEST}", f"3.13.0 {PYTEST}"]
    assert done.stdout.splitlines()[-1] == "make test: passed on Python 3.11 3.13"
    assert make(project, py313, "clean", **env).returncode == 0
    assert not (project / ".venv").exists() and not (project / ".venv-3.11").exists()


def test_an_unsupported_test_python_is_refused_in_one_line(project, machine):
    env, _ = machine
    done = make(project, fake_python(project / "py311", "3.11.7"), "test", TEST_PYTHONS="3.11 3.10", **env)
    assert done.returncode == 2
    assert re.fullmatch(r"Makefile:\d+: \*\*\* TEST_PYTHONS names Python 3\.10; image-tfrecords supports Python "
                        r'3\.11, 3\.12, 3\.13: give versions such as make test TEST_PYTHONS="3\.11 3\.13"\.  Stop\.\n',
                        done.stderr), done.stderr
    assert logged(project) == []


def test_ci_calls_exactly_make_test():
    lines = [line.strip() for line in open(os.path.join(REPO, ".ci", "run"))]
    commands = [line for line in lines if line and not line.startswith("#")]
    assert commands[-1] == "make test" and not any("make" in line for line in commands[:-1])
