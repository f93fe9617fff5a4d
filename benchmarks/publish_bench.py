"""The job's last step on gs:// (publishing the shards, then removing the run's folder), timed on the GCS emulator.

    .venv/bin/python -m benchmarks.publish_bench --shards 200,2000 [--code /path/to/another/checkout] \
        [--latency_ms 50] [--out benchmarks/results/2026-12-02-publish]

For each shard count N, a fresh in-memory GCS emulator (tests/gcs_fixtures.py) gets an old
complete dataset of 3 shards and a run's N shard files (a few bytes each: the step's cost is
its requests, not its bytes, since every copy is server-side). Then a fresh process runs
`transforms.output.publishing.publish_dataset` and `remove_run_dir` of the code in `--code` (this
checkout by default; another checkout measures the code before a change), and reports:

- `publish_s`: from the call to the new image_tfrecords.json's arrival (the descriptions
  written, the plan, the window);
- `window_s`: the publish window itself (from the old marker's deletion to the new one's
  arrival: `finish_publish`);
- `cleanup_s`: removing the run's temporary folder afterwards.

The emulator serves one request at a time on a machine shared with other work: the times
show how the step's requests add up, not what Cloud Storage takes (tens of ms a request
there, but thousands of requests at once). `--latency_ms` puts tests/fault_proxy.py in
between, which waits that long before passing each request on, in parallel for requests
made in parallel: a store a round trip away.
Results: `summary.json` in `--out` (if given), and a table on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RUN = "20261202-010000-0a1b2c3d"

# Runs in the measured process, with the measured code first on sys.path.
_CHILD = r"""
import json, sys, time
from pipeline.cloud import skip_credential_lookup
skip_credential_lookup()
from transforms.output import publishing
out, run, names = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
info = {"run_id": run, "splits": {"train": {"shards": [{"file": n} for n in names]}}}
descriptions = {"errors.jsonl": ["\n"], "labels.txt": ["cat\n"], "image_tfrecords.json": [json.dumps(info)]}
window = []
finish = publishing.finish_publish
def timed_finish(*args, **kwargs):
    start = time.perf_counter()
    finish(*args, **kwargs)
    window.append(time.perf_counter() - start)
publishing.finish_publish = timed_finish
start = time.perf_counter()
publishing.publish_dataset(out, run, names, descriptions)
published = time.perf_counter()
publishing.remove_run_dir(out, run)
done = time.perf_counter()
print(json.dumps({"publish_s": published - start, "window_s": sum(window), "cleanup_s": done - published}))
"""


def measure(shards: int, code: Path, latency_ms: float = 0.0) -> dict:
    from tests.fault_proxy import FaultProxy
    from tests.gcs_fixtures import running_emulator
    from tests.publish_helpers import fill

    with tempfile.TemporaryDirectory() as config, running_emulator(config) as emulator, \
            FaultProxy(emulator.host) as proxy:
        bucket = emulator.create_bucket("publish-bench")
        out = f"{bucket}/out"
        names = fill(emulator, out, shards)
        proxy.latency_s = latency_ms / 1000
        host = proxy.url if latency_ms else emulator.host
        env = dict(os.environ, PYTHONPATH=str(code), STORAGE_EMULATOR_HOST=host)
        child = subprocess.run([sys.executable, "-c", _CHILD, out, RUN, json.dumps(names)], cwd=str(code), env=env,
                               capture_output=True, text=True, check=False)
        if child.returncode != 0:
            raise RuntimeError(f"the measured process failed:\n{child.stderr[-3000:]}")
        result = json.loads(child.stdout.strip().splitlines()[-1])
        published = set(emulator.list_names(out))
        if not set(names) <= published or any(name.startswith(".image-tfrecords-tmp/") for name in published):
            raise RuntimeError("the step did not publish every shard, or left the run's folder behind")
    return {"shards": shards, "code": str(code), "latency_ms": latency_ms,
            "most_requests_at_once": proxy.max_in_flight if latency_ms else None, **result}


def table(records: list[dict]) -> str:
    lines = ["| shards | latency (ms) | publish (s) | of it the window (s) | run folder removed (s) |",
             "|---:|---:|---:|---:|---:|"]
    for r in records:
        lines.append(f"| {r['shards']:,} | {r['latency_ms']:g} | {r['publish_s']:.1f} | {r['window_s']:.1f} | "
                     f"{r['cleanup_s']:.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", default="200,2000", help="shard counts, comma-separated (default 200,2000)")
    parser.add_argument("--code", type=Path, default=REPO, help="the checkout whose last step is measured "
                        "(default: this one)")
    parser.add_argument("--latency_ms", type=float, default=0.0, help="a delay before every request, through "
                        "tests/fault_proxy.py (default 0: straight to the emulator)")
    parser.add_argument("--out", type=Path, help="a folder for summary.json (default: none)")
    args = parser.parse_args(argv)
    records = [measure(int(n), args.code.resolve(), args.latency_ms) for n in args.shards.split(",")]
    print(table(records))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "summary.json").write_text(json.dumps({"runs": records}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
