"""What a --manifest of millions of rows costs the launcher, and the job's row parsing per range.

    .venv/bin/python -m benchmarks.manifest_scale --rows 1e5,1e7 --out benchmarks/results/2026-11-30-manifest
    [--classes 100] [--range_mb 64] [--parse all|first] [--labels_file] [--dir /tmp/manifest-scale]

For each N, a synthetic CSV manifest of N rows (path,label,split; `--classes` labels; about 50 bytes a row)
is written to `--dir` (kept for the next run). Then, each in a fresh process:

- the launcher: `python -m pipeline.main --manifest=M --output_dir=...` on the local runner (in memory, one
  worker), stopped when the graph is built (`pipeline.graph:build_pipeline` returns; benchmarks.launcher_listing's
  child mode): its wall time from the process's start and its peak RSS. Without --labels_file (the default
  here) the class names are the job's to find, so nothing the launcher does should grow with N.
- the job's row parsing, as its workers do it (transforms.inputs.manifest): the ranges of `--range_mb`; the records of
  every range but the last counted (count_records), then each range parsed (parse_range) from its first row
  number. `--parse first` times the first range only; `all` (the default) every range, one after the other,
  and checks that the rows come out numbered 1..N. Per range: seconds to count and to parse, and the
  process's peak RSS (a worker holds one range's bytes, not the rows).

Results: one JSON per N and `summary.json` in `--out`, and a table on stdout.
"""

from __future__ import annotations

import argparse
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
MB = 1 << 20


def write_manifest(path: Path, rows: int, classes: int) -> None:
    """path,label,split rows: images/cNNN/imgNNNNNNNNN.jpg, every tenth a validation row."""
    tmp = path.with_suffix(".part")
    with open(tmp, "w", newline="") as f:
        f.write("path,label,split\n")
        block = []
        for i in range(rows):
            label = f"c{i % classes:03d}"
            block.append(f"images/{label}/img{i:09d}.jpg,{label},{'validation' if i % 10 == 9 else 'train'}\n")
            if len(block) >= 100_000:
                f.write("".join(block))
                block = []
        f.write("".join(block))
    tmp.rename(path)


# --- the job's row parsing, in a process of its own ------------------------------------------------------------------

def parse_child(manifest: str, range_bytes: int, which: str) -> dict:
    from transforms.inputs import manifest as m
    from transforms.inputs import rows as reading

    ranges = reading.manifest_ranges(manifest, range_bytes)
    todo = ranges if which == "all" else ranges[:1]
    count_s, counts = [], []
    for item in todo:
        if not item.last:
            start = time.time()
            with open(manifest, "rb") as raw:
                lines, _ = reading.range_lines(raw, item)
                counts.append((item.index, reading.count_records(lines, "csv")))
            count_s.append(time.time() - start)
    starts = reading.range_starts(counts) if which == "all" else {0: reading.RangeStart(0, reading.START)}
    with open(manifest, "rb") as raw:
        header = reading.header_of(next(reading.group_records(reading.file_lines(raw), "csv"), None))
    parse_s, rows, expected, numbered = [], 0, 1, True
    for item in todo:
        start = time.time()
        for row, result in m.parse_range(manifest, item, "csv", "/base", starts[item.index], header):
            numbered = numbered and row == expected and isinstance(result, m.ManifestRow)
            expected += 1
            rows += 1
        parse_s.append(time.time() - start)
    return {
        "ranges": len(ranges),
        "ranges_timed": len(todo),
        "count_s": [round(s, 3) for s in count_s],
        "parse_s": [round(s, 3) for s in parse_s],
        "rows_parsed": rows,
        "rows_numbered_in_order": numbered,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }


# --- the benchmark ---------------------------------------------------------------------------------------------------

def _child_env(result_path: str) -> dict:
    from benchmarks.launcher_listing import RESULT_ENV

    env = dict(os.environ, **{RESULT_ENV: result_path})
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


def measure_launcher(manifest: Path, tmp: Path, args) -> dict:
    result = tmp / "launcher.json"
    extra = [f"--labels_file={args.labels_file}"] if args.labels_file else []
    command = [sys.executable, "-m", "benchmarks.launcher_listing", "--child", "pipeline.graph:build_pipeline", "--",
               f"--manifest={manifest}", f"--output_dir={tmp / 'out'}", "--direct_running_mode=in_memory",
               "--direct_num_workers=1", "--quiet", *extra]
    proc = subprocess.run(command, cwd=REPO, env=_child_env(str(result)), capture_output=True, text=True,
                          timeout=args.timeout)
    if not result.exists():
        return {"error": f"exit {proc.returncode}: {proc.stderr[-2000:]}"}
    record = json.loads(result.read_text())
    return {
        "wall_s": round(record["plan_ended"] - record["child_started"], 2),
        "build_s": round(record["plan_s"], 3),
        "cpu_s": record["cpu_s"],
        "peak_rss_bytes": record["peak_rss_bytes"],
    }


def measure_parse(manifest: Path, tmp: Path, args) -> dict:
    result = tmp / "parse.json"
    command = [sys.executable, "-m", "benchmarks.manifest_scale", "--parse_child", str(manifest),
               str(int(args.range_mb * MB)), args.parse, str(result)]
    proc = subprocess.run(command, cwd=REPO, env=_child_env(str(result)), capture_output=True, text=True,
                          timeout=args.timeout)
    if not result.exists():
        return {"error": f"exit {proc.returncode}: {proc.stderr[-2000:]}"}
    return json.loads(result.read_text())


def main(argv=None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["--parse_child"]:
        manifest, range_bytes, which, out = argv[1:5]
        Path(out).write_text(json.dumps(parse_child(manifest, int(range_bytes), which)))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="1e5", help="comma-separated row counts (default 1e5)")
    parser.add_argument("--classes", type=int, default=100, help="labels in the manifest (default 100)")
    parser.add_argument("--range_mb", type=float, default=64, help="range size of the job's reading (default 64)")
    parser.add_argument("--parse", choices=("all", "first"), default="all",
                        help="time every range's parsing, or the first's (default all)")
    parser.add_argument("--labels_file", default="", help="give the launcher this --labels_file (default none)")
    parser.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "manifest-scale"),
                        help="where the manifests are written and kept (default /tmp/manifest-scale)")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per measured process (default 3600)")
    parser.add_argument("--out", required=True, help="folder for the results")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    Path(args.dir).mkdir(parents=True, exist_ok=True)
    runs = []
    print("| rows | manifest MB | launcher s | launcher peak RSS MB | ranges | count s/range | parse s/range "
          "| parse peak RSS MB | rows parsed |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for rows in (int(float(n)) for n in args.rows.split(",")):
        manifest = Path(args.dir) / f"m-{rows}-{args.classes}.csv"
        if not manifest.exists():
            write_manifest(manifest, rows, args.classes)
        with tempfile.TemporaryDirectory(prefix="manifest-scale-") as tmp:
            run = {"rows": rows, "classes": args.classes, "manifest_bytes": manifest.stat().st_size,
                   "range_bytes": int(args.range_mb * MB),
                   "launcher": measure_launcher(manifest, Path(tmp), args),
                   "parse": measure_parse(manifest, Path(tmp), args),
                   "machine": {"cpus": os.cpu_count(), "python": platform.python_version()}}
        runs.append(run)
        (out / f"rows-{rows}.json").write_text(json.dumps(run, indent=2))
        launcher, parse = run["launcher"], run["parse"]
        mean = lambda xs: sum(xs) / len(xs) if xs else 0.0  # noqa: E731
        print(f"| {rows:,} | {run['manifest_bytes'] / 1e6:.0f} | {launcher.get('wall_s', 'error')} | "
              f"{launcher.get('peak_rss_bytes', 0) / 1e6:.0f} | {parse.get('ranges')} | "
              f"{mean(parse.get('count_s', [])):.2f} | {mean(parse.get('parse_s', [])):.2f} | "
              f"{parse.get('peak_rss_bytes', 0) / 1e6:.0f} | {parse.get('rows_parsed', 0):,} |", flush=True)
    (out / "summary.json").write_text(json.dumps({"runs": runs}, indent=2))
    return 0 if all("error" not in r["launcher"] and "error" not in r["parse"] for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
