"""transforms.images.pool: helper threads, input order, the time limit per image and stuck conversions."""

from __future__ import annotations

import functools
import threading
import time

import pytest

from tests import image_cases as cases
from transforms.base.examples import Example
from transforms.base.records import ImageRef
from transforms.images import imaging
from transforms.images.convert import convert_in_order, read_and_convert
from transforms.images.diagnosis import ImageRejected
from transforms.images.pool import ConversionPool, time_limit
from transforms.images.settings import ImageSettings

QUADRANTS = cases.quadrants(64, 48)


class StoppedClock:
    """A pool's clock that stands still until a test moves it on: a job takes the time the test says it took, however
    busy the machine. It starts an hour ahead of time.monotonic(), so that the deadline the pool hands to a
    conversion (which checks it on the real clock) is an hour away."""

    def __init__(self):
        self.now = time.monotonic() + 3600.0
        self._lock = threading.Lock()  # helpers move it on from their own threads

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self.now += seconds


def wait_until(condition) -> None:
    """Wait for `condition`; one that never comes true is ended by the pytest timeout (no timed assertion)."""
    while not condition():
        time.sleep(0.005)


def test_jobs_run_on_several_helpers_and_results_keep_their_job():
    started = threading.Barrier(3, timeout=10)  # only passes if three jobs run at once

    def work(i):
        def run(deadline):
            started.wait()
            return (i, threading.current_thread().name)
        return run

    pool = ConversionPool(None, threads=3)
    jobs = [pool.submit(work(i)) for i in range(3)]
    results = [pool.result(job) for job in jobs]
    assert [i for i, _ in results] == [0, 1, 2]
    assert {name for _, name in results} == {"convert-image"}
    pool.close()


def test_an_exception_reaches_the_caller_and_the_pool_carries_on():
    pool = ConversionPool(5.0, threads=2)

    def fail(deadline):
        raise ImageRejected("empty_file", "the file is empty")

    with pytest.raises(ImageRejected) as caught:
        pool.result(pool.submit(fail))
    assert caught.value.reason == "empty_file"
    assert pool.result(pool.submit(lambda deadline: deadline is not None)) is True
    pool.close()


@pytest.mark.timeout(30)
def test_a_stuck_job_times_out_and_queued_jobs_still_finish():
    clock, release = StoppedClock(), threading.Event()
    pool = ConversionPool(0.2, threads=1, clock=clock)

    def stuck_work(deadline):
        clock.advance(0.2)  # its whole time limit passes, and it goes on
        release.wait()

    try:
        stuck = pool.submit(stuck_work)
        queued = pool.submit(lambda deadline: "next")  # behind the stuck one on the only helper
        with pytest.raises(ImageRejected) as caught:
            pool.result(stuck)
        assert caught.value.reason == "timeout"
        assert "0.2 s" in caught.value.detail
        assert pool.result(queued) == "next"  # a new helper took over the queue
    finally:
        release.set()
        pool.close()


@pytest.mark.timeout(30)
def test_a_queued_job_is_not_timed_while_it_waits():
    """Each job takes 0.6 s on the pool's clock, well within the limit of 1 s; the last one is submitted at once but
    starts only after 0.6 s in the queue, so a clock started at submission would leave it 0.4 s."""
    clock, go, waits = StoppedClock(), threading.Event(), []
    pool = ConversionPool(1.0, threads=1, clock=clock)

    def takes_0_6_s(name, after=None):
        def work(deadline):
            if after is not None:
                after.wait()
            clock.advance(0.6)
            return name
        return work

    class Watched(threading.Event):
        def wait(self, timeout=None):  # the pool waits for the last job, which runs from now on
            waits.append(timeout)
            go.set()
            return super().wait(timeout)

    first = pool.submit(takes_0_6_s("first"))
    second = pool.submit(lambda deadline: "second")
    third = pool.submit(takes_0_6_s("third", after=go))  # it cannot end before the pool waits for it
    third.done = Watched()
    assert [pool.result(j) for j in (first, second)] == ["first", "second"]
    wait_until(lambda: third.started is not None)  # taken off the queue 0.6 s after its submission
    assert pool.result(third) == "third"
    assert waits[0] == pytest.approx(1.0)  # its whole limit was left when it started
    pool.close()


def _helper_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name == "convert-image"}


@pytest.mark.timeout(30)
def test_stuck_helpers_are_never_waited_for_and_a_full_pool_rejects_at_once():
    """Work that blocks forever: the pool never joins a stuck helper; it keeps at most
    threads + max_abandoned threads, then rejects what it cannot run as stalled_worker."""
    clock, never = StoppedClock(), threading.Event()
    ran = []
    before = _helper_threads()
    pool = ConversionPool(0.1, threads=2, max_abandoned=1, clock=clock)

    def stuck_work(deadline):
        clock.advance(0.1)  # its whole time limit passes, and it never returns
        never.wait()

    try:
        stuck = [pool.submit(stuck_work) for _ in range(3)]
        queued = [pool.submit(lambda deadline, i=i: ran.append(i) or i) for i in range(3)]
        for job in stuck:
            with pytest.raises(ImageRejected) as caught:
                pool.result(job)
            assert caught.value.reason == "timeout"
        # Three threads are stuck, the most two helpers and one spare place allow: none is left to run the rest.
        assert len(_helper_threads() - before) == 3
        for job in queued:
            with pytest.raises(ImageRejected) as caught:
                pool.result(job)
            assert caught.value.reason == "stalled_worker"
            assert "3 earlier images on this worker are stuck" in caught.value.detail
        with pytest.raises(ImageRejected) as caught:
            pool.result(pool.submit(lambda deadline: "later"))
        assert caught.value.reason == "stalled_worker"
        assert len(_helper_threads() - before) == 3  # no thread was added for them
    finally:
        never.set()
    # The stuck threads return: their places are free again, and the jobs given up on are never run.
    for thread in _helper_threads() - before:
        thread.join()
    assert pool.result(pool.submit(lambda deadline: "after")) == "after"
    assert ran == []
    pool.close()


@pytest.mark.timeout(30)
def test_a_stuck_helper_past_the_spare_places_leaves_the_others_working():
    clock, never = StoppedClock(), threading.Event()
    pool = ConversionPool(0.1, threads=2, max_abandoned=0, clock=clock)

    def stuck_work(deadline):
        clock.advance(0.1)  # its whole time limit passes, and it never returns
        never.wait()

    try:
        with pytest.raises(ImageRejected) as caught:
            pool.result(pool.submit(stuck_work))
        assert caught.value.reason == "timeout"
        # No spare place: the stuck helper is not replaced, and the other one carries on alone.
        assert [pool.result(pool.submit(lambda deadline, i=i: i)) for i in range(5)] == list(range(5))
    finally:
        never.set()
        pool.close()


@pytest.mark.timeout(60)
def test_a_stuck_conversion_is_given_up_and_the_next_images_carry_on(tmp_path, monkeypatch):
    """The conversion path itself (read, then convert) under the pool's time limit."""
    clock, release = StoppedClock(), threading.Event()
    real_convert = imaging.convert_image

    def convert(data, settings, deadline=None):
        if data == b"stuck":
            clock.advance(0.2)  # its whole time limit passes in a decoder that will not return for a long time
            release.wait()
        return real_convert(data, settings, deadline)

    monkeypatch.setattr(imaging, "convert_image", convert)
    settings = ImageSettings(width=8, height=8, timeout_s=0.2)
    files = {"stuck": b"stuck", "good": cases.encode(QUADRANTS, "PNG"), "empty": b""}
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    pool = ConversionPool(time_limit(settings), threads=1, clock=clock)
    try:
        stuck, good, empty = (pool.submit(functools.partial(read_and_convert, str(tmp_path / name), settings))
                              for name in files)
        with pytest.raises(ImageRejected) as caught:
            pool.result(stuck)
        assert caught.value.reason == "timeout"
        assert "0.2 s" in caught.value.detail
        assert pool.result(good).width == 8  # the next image is not held up
        with pytest.raises(ImageRejected) as caught:
            pool.result(empty)
        assert caught.value.reason == "empty_file"  # rejections pass through the helper thread
    finally:
        release.set()
        pool.close()


@pytest.mark.parametrize("threads", [1, 3])
def test_convert_in_order_gives_every_image_once_in_input_order_with_any_thread_count(tmp_path, threads):
    good = []
    for i in range(7):
        path = tmp_path / f"{i}.png"
        path.write_bytes(cases.encode(QUADRANTS, "PNG"))
        good.append(ImageRef(str(path), f"{i}.png", 0, "validation" if i == 3 else "train", "cls", i % 2, i))
    empty = tmp_path / "empty.png"
    empty.write_bytes(b"")
    refs = [*good[:3], ImageRef(str(empty), "empty.png", 0, "train", "cls", 0, 99), *good[3:],
            ImageRef(str(tmp_path / "gone.png"), "gone.png", 0, "train", "cls", 0, 100)]

    def source_and_label(serialized):
        feature = Example.FromString(serialized).features.feature
        return feature["source_path"].bytes_list.value[0].decode(), feature["label"].int64_list.value[0]

    pool = ConversionPool(None, threads=threads)
    try:
        outcomes = list(convert_in_order(pool, refs, ImageSettings(width=8, height=8), "default"))
    finally:
        pool.close()
    assert [o.ref.relpath for o in outcomes] == [r.relpath for r in refs]
    assert [source_and_label(o.example) for o in outcomes if o.example] == [(r.relpath, r.label) for r in good]
    assert [(o.ref.relpath, o.rejection.reason) for o in outcomes if o.rejection] == [
        ("empty.png", "empty_file"), ("gone.png", "read_error")]
