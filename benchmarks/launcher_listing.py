"""The launcher's time and peak memory against a synthetic gs:// input of millions of names.

    .venv/bin/python -m benchmarks.launcher_listing --names 1e6,1e7 --classes 1000 \
        --timeout 3000 --max_gb 6 --out benchmarks/results/2026-11-30-listing
    [--splits train,validation] [--stop_after pipeline.graph:build_pipeline] [-- more pipeline.main options]

For each N, a fake GCS (`tests/fake_gcs_listing.py`, on a thread of this process)
serves gs://listing-bench/in with `--classes` class folders of N / classes JPEG names each;
nothing is stored per name, and every object reads as the same small JPEG. Then the
command a user runs for Dataflow starts in a fresh process, against that fake:

    python -m pipeline.main --runner=DataflowRunner --project=test-project --region=us-central1 \
        --temp_location=gs://listing-bench/tmp --input_dir=gs://listing-bench/in \
        --output_dir=gs://listing-bench/out --dry_run=True --no_auth

and is stopped right after the launcher's plan (`pipeline.plan.plan_dataset`, or the
module:function given with --stop_after, replaced wherever pipeline/ imported it by name)
returns: everything before it (Beam's import, the options and their checks, the
output folder's check) and the plan itself (listing, the sample of images, class ids
and shard counts) are measured; building, translating and staging the graph are not
(staging uploads the package, which the fake does not take, and costs the same at any N).

Measured per N: the wall time from the process's start to the plan's end, the plan's
own time, the process's CPU seconds (on a shared machine wall time also counts waiting for
a core, and the fake's own CPU), and the process's peak RSS (its ru_maxrss when the plan returns; psutil
samples when it is stopped); plus what the fake served (list requests, objects,
prefixes, downloads). A run is stopped, and reported as such, past `--timeout`
seconds or `--max_gb` of RSS; the process also runs under RLIMIT_AS (`--max_gb` +
`--as_slack_gb` of address space) so it cannot take the machine's memory.

Results: one JSON per N and `summary.json` in `--out`, and a table on stdout.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
GIB = 1 << 30
SAMPLE_S = 0.2
RESULT_ENV = "LAUNCHER_LISTING_RESULT"  # the child writes its measurements there
STOP_AFTER = "pipeline.plan:plan_dataset"  # the launcher's plan: listing, sample, class ids, shard counts


BUCKET = "listing-bench"  # a valid bucket name (3 to 63 characters): Beam's option validator checks it


def launcher_argv(extra: list[str]) -> list[str]:
    return [
        "--runner=DataflowRunner", "--project=test-project", "--region=us-central1",
        f"--temp_location=gs://{BUCKET}/tmp", f"--input_dir=gs://{BUCKET}/in", f"--output_dir=gs://{BUCKET}/out",
        "--dry_run=True", "--no_auth", *extra,
    ]


# --- in the measured process --------------------------------------------------------------------------------------

def _summary_of(plan) -> dict:
    """What the plan says, as far as this version of Plan has it (the launcher is being rewritten)."""
    out = {}
    for attr in ("total_images", "files_found", "num_shards", "expected_per_split", "split_folders"):
        try:
            value = getattr(plan, attr, None)
        except Exception as e:  # a property that needs what this plan does not have
            value = f"{type(e).__name__}: {e}"
        if value is not None and not callable(value):
            out[attr] = value
    names = getattr(plan, "class_names", None)
    if names is not None:
        out["classes"] = len(names)
    return out


def child_main(argv: list[str], stop_after: str) -> int:
    """Run `pipeline.main` with `argv`; when `stop_after` (module:function) returns, write the measurements and end.

    The function is replaced in its module and wherever a pipeline module has imported it by name.
    """
    started = time.time()
    result_path = os.environ[RESULT_ENV]
    import pipeline.main  # noqa: I001  (first: it sets up the environment before Beam is imported)
    import pipeline.launcher  # noqa: F401  (its imports bind the function to measure)

    module_name, _, function_name = stop_after.partition(":")
    module = importlib.import_module(module_name)
    real = getattr(module, function_name, None)
    if real is None:
        print(f"launcher_listing: {module_name} has no {function_name} to measure; pass --stop_after "
              "module:function of this version of the launcher", file=sys.stderr)
        return 3

    def measured(*args, **kwargs):
        start = time.time()
        usage = resource.getrusage(resource.RUSAGE_SELF)
        rss_before, cpu_before = usage.ru_maxrss * 1024, usage.ru_utime + usage.ru_stime
        returned = real(*args, **kwargs)
        end = time.time()
        usage = resource.getrusage(resource.RUSAGE_SELF)
        record = {
            "stopped_after_plan": True,
            "stop_after": stop_after,
            "child_started": started,
            "plan_started": start,
            "plan_ended": end,
            "plan_s": end - start,
            "peak_rss_before_plan_bytes": rss_before,
            "peak_rss_bytes": usage.ru_maxrss * 1024,
            "cpu_before_plan_s": round(cpu_before, 2),
            "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),  # the process's, from its start to the plan's end
            "plan": _summary_of(returned),
        }
        Path(result_path).write_text(json.dumps(record, default=str))
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)  # nothing after it is measured; no interpreter teardown over millions of objects

    for name, loaded in list(sys.modules.items()):
        if (name == module_name or name.split(".")[0] in ("pipeline", "transforms")) and \
                getattr(loaded, function_name, None) is real:
            setattr(loaded, function_name, measured)
    sys.argv = ["pipeline.main", *argv]
    return pipeline.main.main()


# --- the benchmark --------------------------------------------------------------------------------------------------

def _limit_address_space(max_bytes: int):
    def apply():
        resource.setrlimit(resource.RLIMIT_AS, (max_bytes, max_bytes))
    return apply


def _tree_rss(process) -> int:
    import psutil

    try:
        procs = [process, *process.children(recursive=True)]
    except psutil.Error:
        return 0
    total = 0
    for proc in procs:
        try:
            total += proc.memory_info().rss
        except psutil.Error:
            pass
    return total


def measure(names: int, classes: int, args, out_dir: Path) -> dict:
    """One fresh launcher process against a fake bucket of `names` objects in `classes` folders (per split)."""
    import psutil

    from tests.fake_gcs_listing import serve

    splits = tuple(split for split in args.splits.split(",") if split)
    folders = classes * max(1, len(splits))
    if names % folders:
        raise SystemExit(f"--names {names} is not a multiple of {folders} class folders")
    per_class = names // folders
    max_rss = int(args.max_gb * GIB)
    address_space = int((args.max_gb + args.as_slack_gb) * GIB)
    with tempfile.TemporaryDirectory(prefix="launcher-listing-") as tmp, \
            serve(classes, per_class, bucket_name=BUCKET, splits=splits) as fake:
        result_path = Path(tmp) / "result.json"
        env = dict(os.environ, **fake.client_env(str(Path(tmp) / "gcloud")), **{RESULT_ENV: str(result_path)})
        (Path(tmp) / "gcloud").mkdir()
        env.pop("GOOGLE_APPLICATION_CREDENTIALS", None)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        argv = launcher_argv(args.launcher_args)
        command = [sys.executable, "-m", "benchmarks.launcher_listing", "--child", args.stop_after, "--", *argv]
        stdout_path, stderr_path = Path(tmp) / "stdout", Path(tmp) / "stderr"
        peak_sampled, cpu_sampled, stopped = 0, 0.0, None
        own_cpu = resource.getrusage(resource.RUSAGE_SELF)
        start = time.time()
        with open(stdout_path, "wb") as stdout, open(stderr_path, "wb") as stderr:
            child = subprocess.Popen(command, cwd=REPO, env=env, stdout=stdout, stderr=stderr,
                                     preexec_fn=_limit_address_space(address_space))
            handle = psutil.Process(child.pid)
            while child.poll() is None:
                rss = _tree_rss(handle)
                peak_sampled = max(peak_sampled, rss)
                try:
                    times = handle.cpu_times()
                    cpu_sampled = times.user + times.system
                except psutil.Error:
                    pass
                elapsed = time.time() - start
                if rss > max_rss:
                    stopped = f"over {args.max_gb:g} GiB RSS after {elapsed:.0f} s"
                elif elapsed > args.timeout:
                    stopped = f"over {args.timeout:g} s (RSS {rss / GIB:.2f} GiB then)"
                if stopped:
                    for proc in [*handle.children(recursive=True), handle]:
                        try:
                            proc.kill()
                        except psutil.Error:
                            pass
                    child.wait()
                    break
                time.sleep(SAMPLE_S)
        wall = time.time() - start
        fake_stats = fake.stats()
        usage = resource.getrusage(resource.RUSAGE_SELF)
        # This process does little but serve the fake: its CPU is about the fake's.
        fake_stats["cpu_s"] = round(usage.ru_utime + usage.ru_stime - own_cpu.ru_utime - own_cpu.ru_stime, 2)
        stderr_text = stderr_path.read_text(errors="replace")
        record = {
            "names": names,
            "classes": classes,
            "splits": list(splits),
            "per_class": per_class,
            "command": "python -m pipeline.main " + " ".join(argv),
            "exit_code": child.returncode,
            "stopped": stopped,
            "wall_s_until_exit": round(wall, 2),
            "peak_rss_sampled_bytes": peak_sampled,
            "cpu_s_sampled": round(cpu_sampled, 2),
            "limits": {"timeout_s": args.timeout, "max_rss_gb": args.max_gb, "rlimit_as_gb": args.max_gb +
                       args.as_slack_gb},
            "fake": fake_stats,
            "stderr_tail": stderr_text[-3000:],
            "stdout_tail": stdout_path.read_text(errors="replace")[-2000:],
        }
        if result_path.exists():
            child_record = json.loads(result_path.read_text())
            record.update(child_record)
            record["wall_s"] = round(child_record["plan_ended"] - start, 2)
            record["startup_s"] = round(child_record["plan_started"] - start, 2)
            record["plan_s"] = round(child_record["plan_s"], 2)
        else:
            record["stopped_after_plan"] = False
            if stopped is None:
                memory = "MemoryError" in stderr_text or "Cannot allocate memory" in stderr_text
                record["stopped"] = (f"failed: out of the {args.max_gb + args.as_slack_gb:g} GiB address space"
                                     if memory else f"failed with exit code {child.returncode}")
    if stderr_text.strip():
        (out_dir / f"names-{names}.stderr.txt").write_text(stderr_text[-200_000:])
    (out_dir / f"names-{names}.json").write_text(json.dumps(record, indent=2, default=str) + "\n")
    return record


def _fmt(record: dict) -> tuple[str, ...]:
    gb = lambda n: f"{n / GIB:.2f}"  # noqa: E731
    if record.get("stopped_after_plan"):
        wall, plan, rss = f"{record['wall_s']:.1f}", f"{record['plan_s']:.1f}", gb(record["peak_rss_bytes"])
        cpu, outcome = f"{record['cpu_s']:.1f}", f"done: {record['stop_after'].rpartition(':')[2]}"
    else:
        wall, plan, rss = f">{record['wall_s_until_exit']:.0f}", "-", f">={gb(record['peak_rss_sampled_bytes'])}"
        cpu, outcome = f">={record['cpu_s_sampled']:.0f}", record["stopped"]
    fake = record["fake"]
    return (f"{record['names']:,}", f"{record['classes']:,}", wall, plan, cpu, rss, f"{fake['list_requests']:,}",
            f"{fake['objects_listed']:,}", f"{fake['prefixes_listed']:,}", f"{fake['downloads']:,}", outcome)


HEADER = ("names", "classes", "wall s", "{} s", "CPU s", "peak RSS GiB", "list requests", "objects listed",
          "prefixes listed", "downloads", "outcome")


def table(records: list[dict], stop_after: str = STOP_AFTER) -> str:
    """A markdown table; the fourth column is the time of the function the run stopped after (the plan's)."""
    header = tuple(h.format(stop_after.rpartition(":")[2]) for h in HEADER)
    rows = [header, *(_fmt(r) for r in records)]
    lines = ["| " + " | ".join(row) + " |" for row in rows]
    lines.insert(1, "|" + "|".join("---" for _ in header) + "|")
    return "\n".join(lines)


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--child"]:  # the measured process: --child MODULE:FUNCTION -- LAUNCHER OPTIONS
        return child_main(argv[3:], argv[1])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--names", default="1e6,1e7", help="comma-separated object counts (default 1e6,1e7)")
    parser.add_argument("--classes", type=int, default=1000, help="class folders (default 1000)")
    parser.add_argument("--splits", default="",
                        help="comma-separated split folders, e.g. train,validation: the layout "
                             "<input>/<split>/<class>/, --names in all (default: none, <input>/<class>/)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds before a run is stopped (default 900)")
    parser.add_argument("--max_gb", type=float, default=6.0,
                        help="RSS in GiB (2^30 bytes) at which a run is stopped (default 6)")
    parser.add_argument("--as_slack_gb", type=float, default=2.0,
                        help="RLIMIT_AS is --max_gb plus this much address space (default 2)")
    parser.add_argument("--stop_after", default=STOP_AFTER,
                        help=f"module:function whose return ends the measurement (default {STOP_AFTER})")
    parser.add_argument("--out", default=None, help="folder for the JSON results (default: a temporary folder)")
    parser.add_argument("launcher_args", nargs="*", help="after --: more pipeline.main options")
    args = parser.parse_args(argv)
    out_dir = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="launcher-listing-results-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    counts = [int(float(n)) for n in args.names.split(",") if n.strip()]
    code = {  # the code measured, as it is when the runs start
        "commit": _git("rev-parse", "HEAD"), "branch": _git("rev-parse", "--abbrev-ref", "HEAD"),
        "last_launcher_commit": _git("log", "-1", "--format=%h %s", "--", "pipeline", "transforms"),
        "dirty": bool(_git("status", "--porcelain", "--untracked-files=no", "--", "pipeline", "transforms")),
    }
    records = []
    for names in counts:
        print(f"# {names:,} names in {args.classes:,} classes ...", file=sys.stderr, flush=True)
        record = measure(names, args.classes, args, out_dir)
        records.append(record)
        print(table([record], args.stop_after).splitlines()[-1], file=sys.stderr, flush=True)
        if record["fake"]["unknown"]:
            print(f"# the fake answered 501 to: {record['fake']['unknown'][:5]}", file=sys.stderr)
    summary = {
        "measured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "code": code,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "args": {k: v for k, v in vars(args).items()},
        "runs": [{k: v for k, v in r.items() if k not in ("stderr_tail", "stdout_tail")} for r in records],
    }
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    print(table(records, args.stop_after))
    print(f"results: {out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
