"""What Beam's local runner holds in the launcher between steps: the bytes each PCollection buffer received.

    python -m benchmarks.runner_buffers --input_dir=set/coco --output_dir=/tmp/out --task=detection --overwrite

A diagnostic, not the product: it runs the converter (pipeline.main) in this process with Beam's FnApiRunner's
buffers wrapped (`fn_api_runner.execution`'s ListBuffer and GroupingBuffer, which are not public API: it may stop
working with another Beam), and prints on stderr, after the run, the encoded bytes every buffer received, by its
PCollection or grouping, largest first, and the launcher's peak RSS. The FnApiRunner keeps every PCollection that
crosses from one fused stage to the next (a GroupByKey's input, a Flatten of several stages' outputs, a
PCollection a later stage reads after a side input is ready) whole in the launcher's memory until the next stage
has read it; a GroupingBuffer holds its elements decoded. Dataflow's shuffle keeps them out of any worker's memory.
"""

from __future__ import annotations

import collections
import sys
import threading

import psutil
from apache_beam.runners.portability.fn_api_runner import execution

_RECEIVED: collections.Counter = collections.Counter()


def _wrap_buffers() -> None:
    get_buffer = execution.BundleContextManager.get_buffer

    def named_buffer(self, buffer_id, transform_id):
        buffer = get_buffer(self, buffer_id, transform_id)
        if not hasattr(buffer, "_bench_name"):
            buffer._bench_name = buffer_id.decode(errors="replace").split(":", 1)[-1]
        return buffer

    execution.BundleContextManager.get_buffer = named_buffer
    for kind in (execution.ListBuffer, execution.GroupingBuffer):
        def append(self, data, _append=kind.append):
            _RECEIVED[getattr(self, "_bench_name", "?")] += len(data)
            return _append(self, data)

        kind.append = append


def main(argv: list[str]) -> int:
    _wrap_buffers()
    process, peak, stop = psutil.Process(), [0], threading.Event()

    def watch():
        while not stop.is_set():
            peak[0] = max(peak[0], process.memory_info().rss)
            stop.wait(0.1)

    threading.Thread(target=watch, daemon=True).start()
    from pipeline.main import main as convert

    code = convert(argv)
    stop.set()
    print(f"launcher peak RSS {peak[0] / 2**20:.0f} MiB; {sum(_RECEIVED.values()) / 2**20:.1f} MiB through the "
          "runner's buffers:", file=sys.stderr)
    for name, size in _RECEIVED.most_common(15):
        print(f"  {size / 2**20:7.2f} MiB  {name}", file=sys.stderr)
    return code


if __name__ == "__main__":  # the local workers are started from this module too: the run only in the main one
    sys.exit(main(sys.argv[1:]))
