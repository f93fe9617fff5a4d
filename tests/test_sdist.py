"""What a Dataflow worker installs: the source distribution of setup.py, installed outside the checkout.

Beam builds it for --setup_file with `python setup.py sdist` (its fallback when `build` is not installed) and
every worker pip-installs it; a module or data file missing from it fails every worker on its first bundle,
while tests run from the checkout would still pass. So this builds it, checks its files, installs it into a
fresh virtual environment (which borrows this one's dependencies through a .pth file: no network, no
--deps), and runs the installed `image-tfrecords` command from a folder outside the checkout, without
PYTHONPATH: a conversion on Beam's local runner (its worker processes import the installed package too), then
`image-tfrecords verify`, which reads every record back with the installed reader. An environment with
TensorFlow and no Beam installs the reader with the README's command and runs the reader, verify and preview.
"""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
import tarfile
import venv

import pytest

from pipeline.cloud import package_build_lock
from tests.conftest import REPO

PACKAGES = ("pipeline", "transforms")


def run(args: list[str], cwd, timeout: int = 300) -> subprocess.CompletedProcess:
    # Without make test's PYTHONPYCACHEPREFIX: the packages these environments see through symlinked folders
    # would be compiled again under each new temporary path (12 s of CPU, and 83 MB more cache a run); their
    # own __pycache__ folders, which pip wrote when it installed them, serve them through the links.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONPYCACHEPREFIX")}
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def checkout_files() -> set[str]:
    """Every file of the packages in the checkout (modules and any data file beside them), relative to it."""
    found = set()
    for package in PACKAGES:
        for folder, dirs, files in os.walk(os.path.join(REPO, package)):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            found.update(os.path.relpath(os.path.join(folder, name), REPO) for name in files
                         if not name.endswith((".pyc", ".pyo")))
    return found


@pytest.fixture(scope="module")
def sdist(tmp_path_factory) -> str:
    """The source distribution built from the checkout as Beam builds it, in a temporary folder."""
    dist = tmp_path_factory.mktemp("dist")
    # --egg-base keeps the build's egg-info out of the checkout (and out of a parallel test's way).
    # The release tree is made in the checkout all the same: not while a dry run's launcher builds its own there.
    with package_build_lock(os.path.join(REPO, "setup.py")):
        built = run([sys.executable, "setup.py", "-q", "egg_info", "--egg-base", str(dist), "sdist", "--dist-dir",
                     str(dist)], cwd=REPO)
    assert built.returncode == 0, built.stderr
    (tarball,) = dist.glob("*.tar.gz")
    return str(tarball)


@pytest.fixture(scope="module")
def installed(sdist, tmp_path_factory) -> str:
    """The bin/ folder of a fresh venv with the sdist installed (no deps: this venv's are borrowed)."""
    env_dir = tmp_path_factory.mktemp("worker_venv")
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = str(env_dir / "bin" / "python")
    env_site = run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=env_dir)
    with open(os.path.join(env_site.stdout.strip(), "borrowed_dependencies.pth"), "w") as f:
        f.write("\n".join(site.getsitepackages()) + "\n")  # after the venv's own site-packages on sys.path
    # --ignore-installed: this venv's editable install of the checkout is visible, and must stay as it is.
    done = run([python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps",
                "--no-build-isolation", "--ignore-installed", sdist], cwd=env_dir)
    assert done.returncode == 0, done.stderr
    return str(env_dir / "bin")


def test_the_sdist_holds_every_module_and_file_of_the_packages(sdist):
    with tarfile.open(sdist) as tar:
        root = tar.getnames()[0].split("/")[0]
        names = {name.removeprefix(root + "/") for name in tar.getnames()}
    missing = sorted(checkout_files() - names)
    assert not missing, f"left out of the source distribution (setup.py packages / MANIFEST.in): {missing}"
    assert {"setup.py", "pipeline/command.py", "pipeline/verify.py", "transforms/output/write.py"} <= names
    assert not {n for n in names if n.startswith(("tests/", "benchmarks/", "docs/", "dataflow/"))}


def test_the_installed_command_converts_reads_back_and_verifies_outside_the_checkout(installed, tmp_path):
    from pipeline.sample_data import generate_dataset

    photos, out, elsewhere = tmp_path / "photos", tmp_path / "out", tmp_path / "elsewhere"
    elsewhere.mkdir()
    written = generate_dataset(str(photos), images_per_class=6, classes=("cat", "dog"), seed=3, min_side=32,
                               max_side=64)
    python, command = os.path.join(installed, "python"), os.path.join(installed, "image-tfrecords")

    where = run([python, "-c", "import pipeline, transforms; print(pipeline.__file__, transforms.__file__)"],
                cwd=elsewhere)
    assert where.returncode == 0, where.stderr
    assert all(path.startswith(os.path.dirname(installed)) for path in where.stdout.split()), where.stdout

    version = run([command, "--version"], cwd=elsewhere)
    assert (version.returncode, version.stdout.split()[0]) == (0, "image-tfrecords"), version.stderr

    converted = run([command, "convert", f"--input_dir={photos}", f"--output_dir={out}", "--runner=DirectRunner",
                     "--direct_num_workers=2", "--quiet"], cwd=elsewhere)
    assert converted.returncode == 0, converted.stderr
    info = json.loads((out / "image_tfrecords.json").read_text())
    assert info["class_names"] == ["cat", "dog"]

    # Every image once, with its folder's label (read here: the installed reader reads every record in verify).
    from pipeline import reader

    labels = {split: sorted(int(x["label"]) for x in reader.make_dataset(str(out), split, decode=True))
              for split in info["splits"]}
    assert sorted(label for split in labels.values() for label in split) == [0] * 6 + [1] * 6
    assert {split: len(split_labels) for split, split_labels in labels.items()} == \
        {split: info["splits"][split]["records"] for split in info["splits"]}
    assert len(written) == 12

    verified = run([command, "verify", str(out)], cwd=elsewhere)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert f"Read 12 records from {out}" in verified.stdout


def test_the_installed_package_requirements_are_met_and_the_images_import_line_runs(installed, tmp_path):
    # What dataflow/Dockerfile runs after installing the package (`pip check`, then its import line), without
    # Docker: pip check over this borrowed environment would judge every tool installed here, so this checks
    # the installed package's own requirements, as pip check does for it.
    script = """if True:
        from importlib.metadata import PackageNotFoundError, requires, version
        from packaging.requirements import Requirement
        import pipeline.launcher, transforms.images.convert, transforms.detection.annotated, pycocotools.mask
        unmet = []
        for requirement in map(Requirement, requires("image-tfrecords")):
            if requirement.marker and not requirement.marker.evaluate({"extra": ""}):
                continue  # an extra's ([tf], [dev])
            try:
                found = version(requirement.name)
            except PackageNotFoundError:
                found = None
            if found is None or not requirement.specifier.contains(found, prereleases=True):
                unmet.append(f"{requirement} (installed: {found})")
        print(unmet)
    """
    done = run([os.path.join(installed, "python"), "-c", script], cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "[]", done.stdout


def _readme_reader_install() -> list[str]:
    """The README's reader-only install command, as its words: `pip install --no-deps ... <path>`."""
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
        (line,) = [line for line in f if line.startswith("pip install --no-deps ")]
    words = line.split("#")[0].split()
    assert words[-1] == "/path/to/image-tfrecords", line
    return words[2:-1]  # the options and the packages beside this one


def _site_without_beam(folder) -> str:
    """A folder that holds this environment's installed packages except Apache Beam and this project (its
    editable install): what a TPU VM's or a training image's environment with TensorFlow has."""
    folder.mkdir()
    for site_dir in site.getsitepackages():
        for name in os.listdir(site_dir):
            if name.startswith(("apache_beam", "__editable__", "image_tfrecords", "_image_tfrecords")) or \
                    name.endswith(".pth"):
                continue
            if not (folder / name).exists():
                os.symlink(os.path.join(site_dir, name), folder / name)
    return str(folder)


def test_a_tensorflow_only_environment_installs_the_reader_with_the_readmes_command(sdist, sample_output,
                                                                                     tmp_path):
    env_dir, elsewhere = tmp_path / "tpu_vm", tmp_path / "elsewhere"
    elsewhere.mkdir()
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = str(env_dir / "bin" / "python")
    env_site = run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=env_dir)
    with open(os.path.join(env_site.stdout.strip(), "tensorflow_environment.pth"), "w") as f:
        f.write(_site_without_beam(tmp_path / "site") + "\n")
    # Found, not imported (TensorFlow's import alone takes 4 s; the reader below imports it for real).
    found = run([python, "-c", "import importlib.util as u; print([u.find_spec(m) is not None for m in "
                 "('tensorflow', 'PIL', 'apache_beam')])"], cwd=elsewhere)
    assert found.stdout.split() == ["[True,", "True,", "False]"], found.stdout + found.stderr[-2000:]

    # The README's command, with the sdist for the checkout's path and no package index (tests are offline).
    installed = run([python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-index",
                     "--no-build-isolation", *_readme_reader_install(), sdist], cwd=elsewhere)
    assert installed.returncode == 0, installed.stderr[-3000:]

    # The reader, then `python -m pipeline.verify` and `python -m pipeline.preview` as -m runs them (runpy, with
    # their own argv), in one interpreter: TensorFlow's import is 5 s a process.
    sheet, chart = tmp_path / "sheet.png", tmp_path / "chart.png"
    tools = [("pipeline.verify", [str(sample_output)]),
             ("pipeline.preview", [str(sample_output), "--contact_sheet", str(sheet), "--class_chart", str(chart)])]
    read_back = run([python, "-c", f"""if True:
        import runpy, sys
        import pipeline
        from pipeline import reader
        info = reader.load_info({str(sample_output)!r})
        records = sum(1 for _ in reader.make_dataset({str(sample_output)!r}, "train", decode=True))
        print(pipeline.__file__.startswith({str(env_dir)!r}), records == info["splits"]["train"]["records"],
              "apache_beam" in sys.modules)
        for module, args in {tools!r}:
            sys.argv = [module, *args]
            try:
                runpy.run_module(module, run_name="__main__", alter_sys=True)
            except SystemExit as e:
                print(module, "exit", e.code, "apache_beam" in sys.modules)"""], cwd=elsewhere)
    assert read_back.returncode == 0, read_back.stderr[-3000:]
    lines = read_back.stdout.splitlines()
    assert lines[0].split() == ["True", "True", "False"], read_back.stdout
    assert [line for line in lines if line.startswith("pipeline.")] == [
        "pipeline.verify exit 0 False", "pipeline.preview exit 0 False"], read_back.stdout + read_back.stderr[-3000:]
    assert f"Read 160 records from {sample_output}" in read_back.stdout
    assert sheet.stat().st_size > 0 and chart.stat().st_size > 0
