"""The read benchmark's figures per stage, and their outputs: a table, a JSON file, a bar chart.

No TensorFlow here: the figures are plain numbers measured by pipeline.readers.bench_input.
"""

from __future__ import annotations

import io
import json
import os
from dataclasses import dataclass, field

import numpy as np

from transforms.base.paths import is_local, write_bytes

MB = 1_000_000

# Stage name -> what it adds, in the order they run.
STAGES: dict[str, str] = {
    "read": "raw TFRecord records, parallel reads in no fixed order",
    "parse": "+ parse each Example (image bytes, label)",
    "decode": "+ decode the image, cast, batch, prefetch",
    "device": "+ feed the device(s): one strategy.run step per batch",
    "files_decode": "image files: read each file, decode, resize, cast, batch",
    "files_device": "image files: + feed the device(s)",
}
TFRECORD_STAGES = ("read", "parse", "decode", "device")
FILE_STAGES = ("files_decode", "files_device")

# The figures of each stage, in the JSON and (most of them) in the table.
FIGURE_FIELDS = (
    "records", "batches", "bytes", "time_to_first_batch_s", "measured_records", "measured_batches",
    "elapsed_s", "images_per_s", "mb_per_s", "batches_per_s", "ms_per_batch_p50", "ms_per_batch_p95",
)


@dataclass
class StageResult:
    """What one stage delivered. The first batch is warm-up: it counts in `records` but not in the rates."""

    stage: str
    records: int = 0
    batches: int = 0
    bytes: int = 0
    time_to_first_batch_s: float | None = None
    first_batch_records: int = 0
    first_batch_bytes: int = 0
    batch_intervals_s: list[float] = field(default_factory=list)  # each batch after the first
    notes: list[str] = field(default_factory=list)

    @property
    def measured_records(self) -> int:
        return self.records - self.first_batch_records

    @property
    def measured_batches(self) -> int:
        return max(self.batches - 1, 0)

    @property
    def elapsed_s(self) -> float:
        """Seconds from the first batch to the last: the measured part of the stage."""
        return float(sum(self.batch_intervals_s))

    def _rate(self, amount: float) -> float | None:
        return amount / self.elapsed_s if self.elapsed_s > 0 else None

    @property
    def images_per_s(self) -> float | None:
        return self._rate(self.measured_records)

    @property
    def mb_per_s(self) -> float | None:
        rate = self._rate(self.bytes - self.first_batch_bytes)
        return None if rate is None else rate / MB

    @property
    def batches_per_s(self) -> float | None:
        return self._rate(self.measured_batches)

    def _ms_percentile(self, q: float) -> float | None:
        if not self.batch_intervals_s:
            return None
        return float(np.percentile(np.asarray(self.batch_intervals_s) * 1000.0, q))

    @property
    def ms_per_batch_p50(self) -> float | None:
        return self._ms_percentile(50)

    @property
    def ms_per_batch_p95(self) -> float | None:
        return self._ms_percentile(95)

    def to_json(self) -> dict:
        out = {"stage": self.stage, "description": STAGES[self.stage]}
        out.update({name: getattr(self, name) for name in FIGURE_FIELDS})
        out["notes"] = list(self.notes)
        return out


def _number(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def format_table(results: list[StageResult]) -> str:
    """The stages as an aligned text table."""
    header = ("stage", "records", "first batch s", "images/s", "MB/s", "batches/s", "ms/batch p50", "p95")
    rows = [header]
    for r in results:
        rows.append((
            r.stage, f"{r.records:,}", _number(r.time_to_first_batch_s, 2), _number(r.images_per_s),
            _number(r.mb_per_s), _number(r.batches_per_s, 2), _number(r.ms_per_batch_p50, 1),
            _number(r.ms_per_batch_p95, 1),
        ))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = []
    for n, row in enumerate(rows):
        cells = [row[0].ljust(widths[0])] + [cell.rjust(width) for cell, width in zip(row[1:], widths[1:], strict=True)]
        lines.append("  ".join(cells).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def slowest_stage(results: list[StageResult]) -> tuple[str, float] | None:
    """The TFRecord stage whose own work costs the most time per image, and that cost in ms.

    The stages are cumulative (parse = read + parsing, ...), so a stage's own
    cost is its time per image minus the previous measured stage's.
    """
    costs, before = [], 0.0
    for r in results:
        if r.stage not in TFRECORD_STAGES or not r.images_per_s:
            continue
        per_image = 1.0 / r.images_per_s
        costs.append((max(per_image - before, 0.0) * 1000.0, r.stage))
        before = per_image
    if not costs:
        return None
    cost, stage = max(costs)
    return stage, cost


def host_rate(results: list[StageResult]) -> tuple[str, float] | None:
    """The images/s the host delivers, and the stage that measured it.

    That is its fullest pipeline: decode, or device (which does the decode
    stage's work and more), whichever measured faster (a slower pass of the
    same work is noise); else parse, else read.
    """
    rates = {r.stage: r.images_per_s for r in results if r.images_per_s}
    full = [(rates[stage], stage) for stage in ("decode", "device") if stage in rates]
    if full:
        rate, stage = max(full)
        return stage, rate
    for stage in ("parse", "read"):
        if stage in rates:
            return stage, rates[stage]
    return None


def noise_note(results: list[StageResult]) -> str | None:
    """When device ran much faster than decode, although it does decode's work too: the figures are noisy."""
    rates = {r.stage: r.images_per_s for r in results if r.images_per_s}
    if "decode" in rates and "device" in rates and rates["device"] > 1.5 * rates["decode"]:
        return (f"device ran {rates['device'] / rates['decode']:.1f}x faster than decode although it decodes too: "
                "the machine was busy or the files came from disk in one pass and from the cache in the other; "
                "run again with more batches (--epochs) before trusting the difference")
    return None


def device_row_note(setup: dict, results: list[StageResult]) -> str | None:
    """What the device row measured when there is no accelerator."""
    if setup.get("strategy_kind") != "cpu" or not any(r.stage in ("device", "files_device") for r in results):
        return None
    return ("device row: no TPU or GPU here, so it measured batches handed to this host's own CPU (a "
            "strategy.run step on the CPU), competing with decoding for the same cores; it is no accelerator's "
            "figure, and its rate changes little with --dtype")


def verdict(setup: dict, results: list[StageResult]) -> str | None:
    """One plain conclusion: the slowest stage, the host's feed rate, and whether it covers the accelerator's need."""
    fed = host_rate(results)
    if fed is None:
        return None
    stage, rate = fed
    needed = setup.get("required_images_per_s")
    batch, steps = setup.get("global_batch"), setup.get("target_steps_per_s")
    slowest = slowest_stage(results)
    text = "Verdict: "
    if slowest:
        text += f"{slowest[0]} is the slowest stage ({slowest[1]:,.2f} ms of its own per image); "
    text += f"this host feeds about {rate:,.0f} images/s (the {stage} stage)"
    if not needed:
        return text + "."
    need = f"the {needed:,.0f} images/s an accelerator needs at a global batch of {batch:,} and {steps:g} steps/s"
    if rate >= needed:
        return text + f", {rate / needed:,.1f}x {need}: enough."
    return (text + f", {rate / needed:.0%} of {need}: NOT enough, the accelerator would wait for input (see "
            "'Is it enough?' in the README's benchmark guide).")


def format_report(setup: dict, results: list[StageResult]) -> str:
    """The heading lines (what was measured, on what), the table and the notes."""
    lines = [
        f"Read benchmark of {setup['source']}"
        + (f" (split {setup['split']})" if setup.get("split") else ""),
        f"  {setup['files']} file(s), {setup['stored_bytes'] / MB:,.1f} MB"
        + (f", {setup['records_per_epoch']:,} records per epoch" if setup.get("records_per_epoch") else "")
        + f"; images {setup['image_size'][1]}x{setup['image_size'][0]} cast to {setup['dtype']}",
        f"  {setup['strategy']}, {setup['replicas']} replica(s); global batch {setup['batch_size']}"
        f" ({setup['per_replica_batch_size']} per replica), {setup['epochs']} epoch(s)"
        + (f", at most {setup['steps']} batches per stage" if setup.get("steps") else ""),
    ]
    if setup.get("compare_files"):
        lines.append(f"  compared with {setup['compare_files_count']:,} image files in {setup['compare_files']}")
    lines += ["", format_table(results), ""]
    lines.append("MB/s counts record bytes (file bytes in files_ rows); the first batch is warm-up, "
                 "excluded from the rates.")
    lines += [f"note: {note}" for note in setup.get("notes", [])]
    stages_of: dict[str, list[str]] = {}
    for r in results:
        for note in r.notes:
            stages_of.setdefault(note, []).append(r.stage)
    lines += [f"note: {', '.join(stages)}: {note}" for note, stages in stages_of.items()]
    for extra in (device_row_note(setup, results), noise_note(results)):
        if extra:
            lines.append(f"note: {extra}")
    conclusion = verdict(setup, results)
    if conclusion:
        lines += ["", conclusion]
    return "\n".join(lines)


def write_json(path: str, setup: dict, results: list[StageResult]) -> None:
    """The setup and every stage's figures as one JSON document."""
    doc = {"setup": setup, "stages": [r.to_json() for r in results]}
    _write_bytes(path, (json.dumps(doc, indent=2) + "\n").encode("utf-8"))


NEEDED_COLOUR = "#c0392b"


def plot_figure(setup: dict, results: list[StageResult]):
    """The bar chart as a matplotlib Figure: a linear axis (a log axis made 166 and 127 look alike),
    each bar's value written, and the accelerator's need as a labelled vertical line."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    names = [r.stage for r in results]
    rates = [r.images_per_s or 0.0 for r in results]
    colours = ["#e07b39" if r.stage in FILE_STAGES else "#3b75af" for r in results]
    fig, ax = plt.subplots(figsize=(8, 1.4 + 0.55 * len(results)), dpi=100)
    bars = ax.barh(names, rates, color=colours)
    ax.invert_yaxis()
    ax.set_xscale("linear")
    ax.set_xlabel("images/s, warm-up excluded (blue: TFRecords, orange: image files)")
    ax.set_title(f"{setup['source']}: batch {setup['batch_size']}, {setup['strategy']}", fontsize=9)
    for bar, rate in zip(bars, rates, strict=True):
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {rate:,.0f}", va="center", fontsize=8)
    needed = setup.get("required_images_per_s")
    if needed:
        ax.axvline(needed, color=NEEDED_COLOUR, linestyle="--", linewidth=1.5,
                   label=f"needed: {needed:,.0f} images/s (batch {setup.get('global_batch'):,} x "
                         f"{setup.get('target_steps_per_s'):g} steps/s)")
        ax.legend(loc="lower right", fontsize=8)
    ax.set_xlim(0, max(rates + [needed or 0.0, 1.0]) * 1.18)
    fig.tight_layout()
    return fig


def write_plot(path: str, setup: dict, results: list[StageResult]) -> None:
    """A PNG bar chart of images/s per stage (matplotlib's Agg backend: no display needed)."""
    from matplotlib import pyplot as plt

    fig = plot_figure(setup, results)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    _write_bytes(path, buffer.getvalue())


def _write_bytes(path: str, data: bytes) -> None:
    """Write a local file (creating its folder) or a gs:// object."""
    if is_local(path):
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    write_bytes(path, data)
