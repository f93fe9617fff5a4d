"""The read benchmark: strategy fallback, the stages' figures, the JSON, the plot and its errors."""

from __future__ import annotations

import io
import json
import re
import shutil
import socket
import subprocess
import sys
import textwrap

import pytest

from pipeline.cli import main_of
from pipeline.errors import UserError
from pipeline.readers.bench_report import FIGURE_FIELDS, StageResult
from tests.conftest import REPO, run_tool
from transforms.base.tfrecord import iter_records

tf = pytest.importorskip("tensorflow")

from pipeline import benchmark, reader  # noqa: E402 - these import TensorFlow
from pipeline.readers import bench_input, strategy  # noqa: E402


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tiny_jpeg(index: int) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (32, 24), (index * 8 % 256, 100, 200)).save(buffer, format="JPEG")
    return buffer.getvalue()


@pytest.fixture(scope="module")
def tiny_records(tmp_path_factory):
    """30 tf_slim Examples of 32x24 JPEGs in 3 files; each label is the record's own index."""
    from transforms.base.examples import build_example

    root = tmp_path_factory.mktemp("tiny_records")
    for shard in range(3):
        with tf.io.TFRecordWriter(str(root / f"part-{shard}.tfrecord")) as writer:
            for i in range(shard * 10, shard * 10 + 10):
                writer.write(build_example(image=_tiny_jpeg(i), image_format="jpeg", label=i, class_name="c",
                                           height=24, width=32, source_path=f"{i}.jpg", schema="tf_slim"))
    return root


def _run(capsys, *argv) -> tuple[int, str, str]:
    code = main_of(benchmark.run, list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# ---- Strategy ------------------------------------------------------------------------------------

def _never_called(**_):
    raise AssertionError("no TPU should be tried without a sign of one")


def test_without_a_sign_of_a_tpu_no_tpu_is_tried_and_the_cpu_is_used():
    choice = strategy.select_strategy(None, environ={}, device_paths=[], resolver_factory=_never_called)
    assert (choice.kind, choice.num_replicas, choice.notes) == ("cpu", 1, [])


def test_tpu_name_without_a_metadata_server_falls_back(monkeypatch):
    # The real TPUClusterResolver asks the GCE metadata server for the project: nobody answers here.
    monkeypatch.setenv("TPU_NAME", "my-tpu")
    monkeypatch.setenv("GCE_METADATA_HOST", f"127.0.0.1:{_closed_port()}")
    choice = strategy.select_strategy(None, device_paths=[])
    assert choice.kind == "cpu"
    assert "TPU_NAME=my-tpu" in choice.notes[0] and "falling back" in choice.notes[0]


def test_unreachable_tpu_address_falls_back_without_waiting_for_retries(monkeypatch):
    monkeypatch.setenv("TPU_NAME", f"grpc://127.0.0.1:{_closed_port()}")
    choice = strategy.select_strategy(None, device_paths=[])
    assert choice.kind == "cpu"
    assert "does not answer" in choice.notes[0]


def test_tpu_devices_without_a_tpu_runtime_fall_back():
    # The whole standard path runs: resolver 'local', connect, initialize_tpu_system (which finds no TPU).
    choice = strategy.select_strategy(None, environ={}, device_paths=["/dev/accel0"])
    assert choice.kind == "cpu"
    assert "TPU devices /dev/accel0" in choice.notes[0] and "TPUs not found" in choice.notes[0]
    assert choice.strategy.run(tf.function(lambda: tf.constant(2) * 3)).numpy() == 6  # the runtime still works


def test_a_tpu_asked_for_by_name_must_connect():
    with pytest.raises(UserError, match=r"could not connect to the TPU 'local' \(NotFoundError"):
        strategy.select_strategy("local")


def test_tpu_detection_prefers_attached_chips_then_env_vars():
    assert strategy.detect_tpu({"TPU_NAME": "v3"}, ["/dev/accel0"]) == ("local", "TPU devices /dev/accel0")
    assert strategy.detect_tpu({}, ["/dev/vfio/0"]) == ("local", "TPU devices /dev/vfio/0")
    assert strategy.detect_tpu({"TPU_NAME": "v3"}, []) == (None, "TPU_NAME=v3")
    assert strategy.detect_tpu({"TPU_NAME": "local"}, []) == ("local", "TPU_NAME=local")
    assert strategy.detect_tpu({}, []) is None


# ---- Input pipelines -------------------------------------------------------------------------------

def test_each_input_pipeline_gets_its_own_files():
    files = [f"f{i}" for i in range(5)]
    parts = [bench_input.pipeline_files(files, tf.distribute.InputContext(2, i, 4)) for i in range(2)]
    assert parts == [(["f0", "f2", "f4"], False), (["f1", "f3"], False)]
    # Fewer files than pipelines: every pipeline reads them all and keeps every n-th record.
    assert bench_input.pipeline_files(["f0"], tf.distribute.InputContext(2, 1, 4)) == (["f0"], True)
    assert bench_input.pipeline_files(files, None) == (files, False)


def test_two_input_pipelines_read_disjoint_records_with_the_per_replica_batch(tiny_records):
    source = bench_input.pattern_source(str(tiny_records / "*.tfrecord"), "image/encoded", "image/class/label")
    assert source.image_size == (24, 32) and not source.resize
    seen = []
    for pipeline_id in range(2):
        context = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=pipeline_id,
                                             num_replicas_in_sync=4)
        per_replica = context.get_per_replica_batch_size(8)
        labels = []
        for batch in bench_input.tfrecord_dataset(source, "device", per_replica, "uint8", context=context):
            assert batch["image"].shape == (2, 24, 32, 3) and batch["image"].dtype == tf.uint8
            labels += batch["label"].numpy().tolist()
        seen.append(set(labels))
    assert not seen[0] & seen[1]
    assert seen[0] == set(range(0, 10)) | set(range(20, 30))  # files 0 and 2
    assert seen[1] == set(range(10, 20))  # file 1


@pytest.mark.slow
def test_device_stage_on_two_replicas_counts_every_record(tiny_records):
    # MirroredStrategy over two logical CPUs: the same distribute_datasets_from_function and
    # strategy.run path a TPU takes, with two replicas. Logical devices need a fresh process.
    script = textwrap.dedent(f"""
        import os, json
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
        from pipeline.cli import import_tensorflow
        tf = import_tensorflow()  # as the benchmark imports it
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
        from pipeline.readers import bench_input as bi
        strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
        source = bi.pattern_source({str(tiny_records / "*.tfrecord")!r}, "image/encoded", "image/class/label")
        make = lambda ctx: bi.tfrecord_dataset(source, "device", ctx.get_per_replica_batch_size(6), epochs=2,
                                               context=ctx)
        result = bi.time_stage("device", bi.device_batches(strategy, make))
        print(json.dumps([strategy.num_replicas_in_sync, result.records, result.batches, result.bytes]))
    """)
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    replicas, records, batches, stored = json.loads(proc.stdout.strip().splitlines()[-1])
    record_bytes = sum(len(r) for path in sorted(tiny_records.glob("*.tfrecord")) for r in iter_records(str(path)))
    assert (replicas, records, batches, stored) == (2, 60, 10, 2 * record_bytes)


# ---- Figures -------------------------------------------------------------------------------------------

def test_stage_figures_exclude_the_warm_up_batch():
    result = StageResult("decode", records=40, batches=5, bytes=4_000_000, time_to_first_batch_s=3.0,
                         first_batch_records=8, first_batch_bytes=800_000, batch_intervals_s=[0.1, 0.2, 0.3, 0.4])
    assert result.measured_records == 32 and result.elapsed_s == pytest.approx(1.0)
    assert result.images_per_s == pytest.approx(32.0)
    assert result.mb_per_s == pytest.approx(3.2)
    assert result.batches_per_s == pytest.approx(4.0)
    assert result.ms_per_batch_p50 == pytest.approx(250.0)
    assert result.ms_per_batch_p95 == pytest.approx(385.0)
    assert StageResult("read", records=8, batches=1, time_to_first_batch_s=1.0).images_per_s is None


@pytest.fixture(scope="module")
def cli_run(sample_output, sample_tree, tmp_path_factory):
    """One benchmark run as a user runs it: validation split, 2 epochs, compared with one class's image files."""
    out = tmp_path_factory.mktemp("bench")
    # The dataset folder as the first argument, as for verify and preview.
    proc = run_tool("pipeline.benchmark", str(sample_output), "--split=validation", "--batch_size=2",
               "--epochs=2", f"--compare_files={sample_tree / 'circle'}", f"--json={out / 'bench.json'}",
               f"--plot={out / 'bench.png'}", "--global_batch=64", "--target_steps_per_s=1000")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc, json.loads((out / "bench.json").read_text()), out / "bench.png"


@pytest.mark.slow
def test_every_stage_is_in_the_table_and_the_json(cli_run):
    proc, doc, _ = cli_run
    stages = ["read", "parse", "decode", "device", "files_decode", "files_device"]
    assert [s["stage"] for s in doc["stages"]] == stages
    for stage in doc["stages"]:
        assert set(stage) == {"stage", "description", "notes", *FIGURE_FIELDS}
        row = next(line for line in proc.stdout.splitlines() if line.startswith(stage["stage"] + " "))
        assert row.split()[1] == f"{stage['records']:,}"
    for field in ("source", "split", "files", "stored_bytes", "records_per_epoch", "image_size", "dtype",
                  "batch_size", "per_replica_batch_size", "epochs", "steps", "strategy", "strategy_kind",
                  "replicas", "compare_files", "compare_files_count", "tensorflow_version", "notes"):
        assert field in doc["setup"], field
    assert doc["setup"]["strategy_kind"] == "cpu" and doc["setup"]["image_size"] == [512, 512]
    assert "images/s" in proc.stdout and "ms/batch p50" in proc.stdout
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_records_counted_are_the_dataset_times_the_epochs(cli_run, sample_output, sample_tree):
    _, doc, _ = cli_run
    info = reader.load_info(str(sample_output))
    shard = reader.shard_paths(str(sample_output), "validation", info)
    assert len(shard) == 1
    record_bytes = sum(len(r) for r in iter_records(shard[0]))
    images = [p for p in (sample_tree / "circle").iterdir() if p.suffix in (".jpg", ".png")]
    for stage in doc["stages"]:
        if stage["stage"].startswith("files_"):
            assert stage["records"] == len(images) * 2
            assert stage["bytes"] == sum(p.stat().st_size for p in images) * 2
        else:
            assert stage["records"] == info["splits"]["validation"]["records"] * 2
            assert stage["bytes"] == record_bytes * 2
        assert stage["batches"] == stage["records"] // 2
        assert stage["measured_records"] == stage["records"] - 2
        # Rates are reported; their arithmetic is checked on injected intervals (test_stage_figures_exclude_...).
        assert {"images_per_s", "batches_per_s", "elapsed_s"} <= set(stage)
        assert isinstance(stage["time_to_first_batch_s"], float)  # reported; its value is the machine's, not checked
        assert stage["ms_per_batch_p50"] <= stage["ms_per_batch_p95"]


@pytest.mark.slow
def test_plot_is_a_png_bar_chart(cli_run):
    from PIL import Image

    _, _, png = cli_run
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with Image.open(png) as image:
        assert image.format == "PNG" and image.width >= 400 and image.height >= 200


@pytest.mark.slow
def test_the_report_ends_with_a_verdict(cli_run):
    """After the table: the slowest stage, what the host feeds, and the accelerator's need (64 x 1000/s)."""
    proc, doc, _ = cli_run
    last = proc.stdout.rstrip().splitlines()[-1]
    assert last.startswith("Verdict: ") and " is the slowest stage (" in last
    rate, stage = max((s["images_per_s"], s["stage"]) for s in doc["stages"] if s["stage"] in ("decode", "device"))
    assert f"this host feeds about {rate:,.0f} images/s (the {stage} stage)" in last
    assert "the 64,000 images/s an accelerator needs at a global batch of 64 and 1000 steps/s: NOT enough" in last
    assert doc["setup"]["required_images_per_s"] == 64000
    # a CPU-only host: the device row says what it measured
    assert "note: device row: no TPU or GPU here, so it measured batches handed to this host's own CPU" in proc.stdout


def _stage(name, images_per_s):
    """A stage that measured `images_per_s` over one second."""
    return StageResult(name, records=int(images_per_s) + 10, batches=3, first_batch_records=10,
                       batch_intervals_s=[0.5, 0.5])


def test_verdict_names_the_stage_that_costs_most_and_compares_with_the_need():
    from pipeline.readers.bench_report import noise_note, verdict

    results = [_stage("read", 20000), _stage("parse", 10000), _stage("decode", 400), _stage("device", 380)]
    setup = {"required_images_per_s": 256 * 1.0, "global_batch": 256, "target_steps_per_s": 1.0}
    line = verdict(setup, results)
    assert line.startswith("Verdict: decode is the slowest stage (2.40 ms of its own per image)")
    assert "this host feeds about 400 images/s (the decode stage), 1.6x the 256 images/s" in line
    assert line.endswith(": enough.")
    setup = {"required_images_per_s": 1280.0, "global_batch": 128, "target_steps_per_s": 10.0}
    assert "31% of the 1,280 images/s an accelerator needs at a global batch of 128 and 10 steps/s: NOT enough" \
        in verdict(setup, results)
    # only the raw reads measured: they are what the host feeds
    assert "read is the slowest stage" in verdict(setup, [_stage("read", 5000)])
    # device does decode's work too: when it measured faster, decode's pass was slowed by something else
    noisy = [_stage("read", 20000), _stage("decode", 275), _stage("device", 1150)]
    assert "this host feeds about 1,150 images/s (the device stage)" in verdict(setup, noisy)
    assert noise_note(noisy).startswith("device ran 4.2x faster than decode although it decodes too")
    assert noise_note(results) is None


def test_plot_shows_the_need_as_a_line_on_a_linear_axis():
    from pipeline.readers.bench_report import NEEDED_COLOUR, plot_figure

    results = [_stage("read", 20000), _stage("decode", 166), _stage("device", 127)]
    setup = {"source": "x", "batch_size": 128, "strategy": "CPU", "required_images_per_s": 1280.0,
             "global_batch": 128, "target_steps_per_s": 10.0}
    fig = plot_figure(setup, results)
    ax = fig.axes[0]
    assert ax.get_xscale() == "linear"  # 166 and 127 must not look alike
    lines = [line for line in ax.get_lines() if line.get_color() == NEEDED_COLOUR]
    assert len(lines) == 1 and list(lines[0].get_xdata()) == [1280.0, 1280.0]
    assert "needed: 1,280 images/s (batch 128 x 10 steps/s)" in lines[0].get_label()
    assert {text.get_text().strip() for text in ax.texts} == {"20,000", "166", "127"}


def test_any_tfrecords_by_pattern_with_tf_slim_keys(tiny_records, tmp_path, capsys):
    code, out, _ = _run(capsys, f"--file_pattern={tiny_records}/part-*.tfrecord", "--schema=tf_slim",
                        "--batch_size=5", "--epochs=2", f"--json={tmp_path / 'b.json'}")
    assert code == 0
    doc = json.loads((tmp_path / "b.json").read_text())
    assert doc["setup"]["image_size"] == [24, 32] and doc["setup"]["files"] == 3
    assert [s["records"] for s in doc["stages"]] == [60, 60, 60, 60]
    assert "part-*.tfrecord" in out


def test_image_size_resizes_and_stages_can_be_chosen(tiny_records, tmp_path, capsys):
    code, _, _ = _run(capsys, f"--file_pattern={tiny_records}/*.tfrecord", "--schema=tf_slim", "--image_size=16x8",
                      "--label_key=", "--stages=decode", "--batch_size=10", "--dtype=bfloat16",
                      f"--json={tmp_path / 'b.json'}")
    assert code == 0
    doc = json.loads((tmp_path / "b.json").read_text())
    assert doc["setup"]["image_size"] == [8, 16] and doc["setup"]["resized"]
    assert [(s["stage"], s["records"]) for s in doc["stages"]] == [("decode", 30)]


# ---- Errors -------------------------------------------------------------------------------------------

@pytest.fixture()
def dataset_copy(sample_output, tmp_path):
    copy = tmp_path / "dataset"
    shutil.copytree(sample_output, copy)
    return copy


def _one_error_line(code: int, err: str) -> str:
    """The one `error:` line, last on stderr (after the progress lines), with no traceback."""
    assert code == 2
    lines = err.strip().splitlines()
    assert lines[-1].startswith("error: ") and all(line.startswith("measuring ") for line in lines[:-1]), err
    return lines[-1]


def test_a_folder_without_dataset_info_is_refused(dataset_copy, capsys):
    (dataset_copy / "image_tfrecords.json").unlink()  # as an interrupted conversion leaves it
    code, out, err = _run(capsys, f"--dataset_dir={dataset_copy}")
    line = _one_error_line(code, err)
    assert f"{dataset_copy} has no image_tfrecords.json" in line and out == ""


def test_a_corrupt_shard_is_named_with_its_record(dataset_copy, capsys):
    shard = next(dataset_copy.glob("train-*.tfrecord"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    code, _, err = _run(capsys, f"--dataset_dir={dataset_copy}", "--stages=read", "--batch_size=8")
    line = _one_error_line(code, err)
    assert re.search(rf"{re.escape(str(shard))} is corrupt \(record \d+: data checksum mismatch\)", line), line


def test_an_empty_shard_is_named(dataset_copy, capsys):
    shard = next(dataset_copy.glob("validation-*.tfrecord"))
    shard.write_bytes(b"")
    code, _, err = _run(capsys, f"--dataset_dir={dataset_copy}", "--split=validation")
    assert f"{shard} is empty (0 bytes)" in _one_error_line(code, err)


def test_a_truncated_shard_is_named(dataset_copy, capsys):
    shard = next(dataset_copy.glob("train-*.tfrecord"))
    shard.write_bytes(shard.read_bytes()[:1000])
    code, _, err = _run(capsys, f"--dataset_dir={dataset_copy}")
    line = _one_error_line(code, err)
    assert re.search(rf"{re.escape(str(shard))} is 1000 bytes but image_tfrecords.json says \d+", line)


def test_no_files_matching_the_pattern(tmp_path, capsys):
    code, _, err = _run(capsys, f"--file_pattern={tmp_path}/train-*.tfrecord")
    assert f"no files match --file_pattern {tmp_path}/train-*.tfrecord" in _one_error_line(code, err)


def test_records_without_the_expected_keys(sample_output, capsys):
    code, _, err = _run(capsys, f"--file_pattern={sample_output}/train-*", "--schema=tf_slim")
    line = _one_error_line(code, err)
    assert "train-00000-of-00001.tfrecord have no int64 feature 'image/class/label'" in line


@pytest.mark.parametrize("argv, message", [
    ([], "give the dataset folder (python -m pipeline.benchmark DIR, or --dataset_dir=DIR)"),
    (["x", "--dataset_dir=y"], "two dataset folders: x and --dataset_dir=y; give one"),
    (["x", "--file_pattern=y"], "not both"),
    (["x", "--target_steps_per_s=0"], "--target_steps_per_s=0.0 must be a positive number"),
    (["x", "--global_batch=-1"], "--global_batch=-1 must be 0"),
    (["--dataset_dir=x", "--file_pattern=y"], "not both"),
    (["--dataset_dir=x", "--schema=tf_slim"], "are for --file_pattern"),
    (["--dataset_dir=x", "--steps=1"], "the first batch is warm-up"),
    (["--dataset_dir=x", "--stages=read,write"], "--stages='read,write': choose from read,parse,decode,device"),
    (["--dataset_dir=x", "--image_size=big"], "is not a size"),
])
def test_bad_options_are_refused_before_tensorflow_runs(argv, message):
    with pytest.raises(UserError, match=re.escape(message)):
        benchmark.validate(benchmark.build_parser().parse_args(argv))


def test_a_batch_larger_than_the_split(sample_output, capsys):
    code, _, err = _run(capsys, f"--dataset_dir={sample_output}", "--batch_size=100000", "--stages=read")
    assert "read: no complete batch" in _one_error_line(code, err)
