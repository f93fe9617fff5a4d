"""The job's last step on gs:// at thousands of shards: a few listings, and the copies and deletions in parallel.

Against the GCS emulator behind tests/fault_proxy.py, which counts every request (also each operation inside a
batch) and the most requests it passed on at once. No image is converted: the run's shard files are made directly
in the emulator, as the shards step leaves them, and the last step publishes them.
"""

from __future__ import annotations

import json

import pytest

from tests.fault_proxy import COPY, DELETE, LIST, METADATA, FaultProxy
from tests.publish_helpers import OLD_SHARDS, RUN, fill
from transforms.base.dataset_format import ERRORS_FILE, INFO_FILE, LABELS_FILE
from transforms.output import files, ownership, publishing


def descriptions_of(names: list[str]) -> dict:
    info = {"run_id": RUN, "splits": {"train": {"shards": [{"file": name} for name in names]}}}
    return {ERRORS_FILE: ["\n"], LABELS_FILE: ["cat\n"], INFO_FILE: [json.dumps(info)]}


def publish(emulator, bucket: str, count: int, monkeypatch) -> tuple:
    """Run `count` shards' last step (publish, then the run's folder removed) through a counting proxy."""
    out = f"gs://{bucket}/out"
    names = fill(emulator, out, count)
    with FaultProxy(emulator.host) as proxy, monkeypatch.context() as patched:
        patched.setenv("STORAGE_EMULATOR_HOST", proxy.url)
        publishing.publish_dataset(out, RUN, names, descriptions_of(names))
        publishing.remove_run_dir(out, RUN)
        return out, names, proxy.reset_traffic(), proxy.max_in_flight


@pytest.mark.timeout(600)
def test_publishing_thousands_of_shards_takes_a_few_listings_and_parallel_copies(gcs_emulator, monkeypatch):
    gcs_emulator.create_bucket("publish-small")
    gcs_emulator.create_bucket("publish-large")
    _, _, small, _ = publish(gcs_emulator, "publish-small", 200, monkeypatch)
    out, names, large, most_at_once = publish(gcs_emulator, "publish-large", 2000, monkeypatch)

    # The dataset is the new one: every shard under its name with its bytes, the old shards gone, no run folder.
    listed = gcs_emulator.list_names(out)
    assert listed == sorted([*names, ERRORS_FILE, INFO_FILE, LABELS_FILE])
    assert gcs_emulator.read(f"{out}/{names[-1]}") == names[-1].encode()
    assert json.loads(gcs_emulator.read(f"{out}/{INFO_FILE}"))["run_id"] == RUN

    # The requests one after another do not grow with the shards: the same object GETs (the plan, the markers)
    # at 200 and at 2,000 shards, and a listing per folder (a page per 1,000 objects)...
    assert large.calls_of(METADATA) == small.calls_of(METADATA) <= 10
    assert large.calls_of(LIST) <= small.calls_of(LIST) + 2 * (2000 // 1000) <= 20
    # ... while the per-shard work, one copy and one deletion of each file, is done in parallel.
    moved = 2000 + 3  # the shards and the three descriptions
    assert large.calls_of(COPY, "out/") == moved
    assert large.calls_of(DELETE, "out/.image-tfrecords-tmp/") == moved + 1  # and the publish plan
    assert large.calls_of(DELETE, "out/train-") == OLD_SHARDS  # the old dataset's shards, by its description
    assert most_at_once > 1


@pytest.mark.timeout(600)
@pytest.mark.parametrize("runs_again", ["--if_exists=overwrite", "--if_exists=refuse"])
def test_a_publish_that_fails_halfway_is_finished_by_the_next_run_never_undone(gcs_emulator, monkeypatch,
                                                                                 runs_again):
    """Some batches of copies fail (the rest went through, in parallel): the old marker is gone and half the new
    shards have their names. The next run into the folder finishes the publishing from the plan; it never takes
    the half-published shards for an interrupted run's leftovers, which would leave neither dataset."""
    from pipeline.errors import UserError
    from pipeline.output_folder import prepare_output
    from tests.crash_helpers import settings_for

    bucket = gcs_emulator.create_bucket(f"publish-halfway{runs_again[-3:]}")
    out = f"{bucket}/out"
    names = fill(gcs_emulator, out, 450)  # 5 batches of copies
    real = files._gcsio
    batches = []

    class FailingCopies:
        """GcsIO whose third batch of copies and later ones fail, as a lost connection or a 403 would."""

        def __init__(self, path):
            self._gcsio = real(path)

        def copy_batch(self, pairs):
            batches.append(len(pairs))
            if len(batches) >= 3:
                return [(src, dst, 503) for src, dst in pairs]
            return self._gcsio.copy_batch(pairs)

    with monkeypatch.context() as patched:
        patched.setattr(files, "_gcsio", FailingCopies)
        patched.setattr(files, "PUBLISH_THREADS", 1)  # the batches in order: the first two go through
        with pytest.raises(OSError, match=r"copying gs://.* failed \(503\), and \d+ more"):
            publishing.publish_dataset(out, RUN, names, descriptions_of(names))
    listed = set(gcs_emulator.list_names(out))
    assert ownership.completion_marker(out) is None and names[0] in listed and names[-1] not in listed  # halfway

    try:
        prepare_output(settings_for(out, runs_again), "20261202-020000-0f0f0f0f")
    except UserError as e:  # refused: the finished dataset was made with other options than this run's
        assert "this run finished publishing it, but it was made with other options" in str(e)
    listed = gcs_emulator.list_names(out)
    assert listed == sorted([*names, ERRORS_FILE, INFO_FILE, LABELS_FILE])  # the new dataset, whole
    assert json.loads(gcs_emulator.read(f"{out}/{INFO_FILE}"))["run_id"] == RUN
    assert all(gcs_emulator.read(f"{out}/{name}") == name.encode() for name in names[::50])
