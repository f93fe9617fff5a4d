"""Reads that never idle a worker: more helpers read than convert, as many as the read latency asks for, within
the memory budget (transforms/images/convert.py ReadPacing, read_room; memory.hold_for_read; pool.core_slot)."""

from __future__ import annotations

import threading
import time
import types

import pytest

from tests import image_cases as cases
from transforms.base import memory
from transforms.base.records import ImageRef
from transforms.images import convert, imaging
from transforms.images.convert import ReadPacing, collect_in_order, read_room, start_conversions
from transforms.images.pool import ConversionPool, Job, core_slot
from transforms.images.settings import ImageSettings


def test_pacing_follows_the_read_latency_not_the_core_count():
    pacing = ReadPacing(2, most=64)
    assert pacing.helpers() == 2  # nothing measured yet
    pacing.add(0.0001, 0.005)  # a local disk: one helper more than the slots
    assert pacing.helpers() == 3
    slow = ReadPacing(2, most=64)
    slow.add(0.1, 0.005)  # 100 ms a read, 5 ms a conversion: 40 reads in flight keep 2 slots busy
    assert slow.helpers() == 42
    capped = ReadPacing(2, most=16)
    capped.add(1.0, 0.001)
    assert capped.helpers() == 16


def test_read_room_is_the_budget_less_one_conversion():
    assert read_room(ImageSettings(worker_memory_mb=2048, max_image_mb=512, max_file_mb=256)) == 1280 * 10**6
    assert read_room(ImageSettings(worker_memory_mb=600, max_image_mb=512, max_file_mb=256)) == 0
    assert read_room(ImageSettings(worker_memory_mb=0)) == 0


def test_files_read_ahead_stay_within_their_room_and_never_pass_a_waiting_conversion():
    budget = memory.MemoryBudget(100)
    assert budget.hold_for_read(30, room=50)[0] is True
    assert budget.hold_for_read(30, room=50, stall_s=0.2)[0] is False  # 60 > room: given up, read without a hold
    assert budget.hold_for_read(80, room=50)[0] is False  # larger than the room: never held
    assert budget.held == 30
    budget.acquire(60)
    waiting = threading.Thread(target=budget.acquire, args=(40,))  # 30 + 60 + 40 > 100: it queues
    waiting.start()
    while not budget.waiting:
        time.sleep(0.01)
    assert budget.hold_for_read(5, room=50, stall_s=0.3)[0] is False  # would fit, but a conversion is waiting
    budget.release(60)
    waiting.join(timeout=10)
    assert budget.held == 70
    budget.release_read(30)
    assert budget.held == 40


@pytest.mark.timeout(30)
def test_a_wait_for_a_core_stops_the_image_clock(monkeypatch):
    """The wait is counted from an injected clock: exactly the time that passed while the slot was taken."""
    clock = [100.0]
    monkeypatch.setattr(memory, "time", types.SimpleNamespace(monotonic=lambda: clock[0]))
    seen = []
    inside = threading.Event()
    leave = threading.Event()

    def first():
        with core_slot(1):
            inside.set()
            leave.wait()

    def second(job):
        with memory.track(job), core_slot(1) as waited:
            seen.append(waited)

    job = Job(lambda _: None)
    holder = threading.Thread(target=first, daemon=True)
    holder.start()
    inside.wait()  # the slot is held until the test lets go
    waiter = threading.Thread(target=second, args=(job,), daemon=True)
    waiter.start()
    while job.memory_wait_since is None:
        time.sleep(0.01)
    assert job.memory_wait_since == 100.0  # the wait shows while it lasts
    clock[0] = 103.5
    leave.set()
    holder.join()
    waiter.join()
    assert job.memory_wait_since is None and job.memory_waited == seen[0] == 3.5


@pytest.fixture
def counted(monkeypatch):
    """read_bytes and convert_image wrapped to count how many run at once; reads wait until `wanted` are in
    flight (or `guard_s` has passed), as reads from a store with a high latency overlap."""
    state = {"reads": 0, "most_reads": 0, "converts": 0, "most_converts": 0, "wanted": 1, "guard_s": 5.0}
    lock, cond = threading.Lock(), threading.Condition()
    real_read, real_convert = convert.read_bytes, imaging.convert_image

    def read_bytes(*args, **kwargs):
        with cond:
            state["reads"] += 1
            state["most_reads"] = max(state["most_reads"], state["reads"])
            cond.notify_all()
            cond.wait_for(lambda: state["reads"] >= state["wanted"], timeout=state["guard_s"])
        try:
            return real_read(*args, **kwargs)
        finally:
            with cond:
                state["reads"] -= 1

    def convert_image(*args, **kwargs):
        with lock:
            state["converts"] += 1
            state["most_converts"] = max(state["most_converts"], state["converts"])
        try:
            return real_convert(*args, **kwargs)
        finally:
            with lock:
                state["converts"] -= 1

    monkeypatch.setattr(convert, "read_bytes", read_bytes)
    monkeypatch.setattr(imaging, "convert_image", convert_image)
    return state


def _refs(folder, count: int, size: int) -> list[ImageRef]:
    folder.mkdir(exist_ok=True)
    data = cases.encode(cases.quadrants(40, 30), "PNG")
    refs = []
    for i in range(count):
        (folder / f"{i}.png").write_bytes(data)
        refs.append(ImageRef(str(folder / f"{i}.png"), f"c/{i}.png", size, "train", "c", 0, i))
    return refs


def _convert_all(refs, settings, slots):
    pool = ConversionPool(60.0, threads=slots)
    pacing = ReadPacing(slots)
    try:
        jobs = start_conversions(pool, refs, settings, slots, pacing)
        outcomes = []
        for outcome in collect_in_order(pool, jobs, "default"):
            pool.grow(pacing.helpers())
            outcomes.append(outcome)
        return outcomes, pool.threads
    finally:
        pool.close()


@pytest.mark.timeout(120)
def test_slow_reads_overlap_far_beyond_the_conversion_slots(tmp_path, counted):
    counted["wanted"] = 12
    refs = _refs(tmp_path / "in", 80, 1000)
    outcomes, helpers = _convert_all(refs, ImageSettings(width=8, height=8), slots=2)
    assert [o.ref for o in outcomes] == refs and all(o.rejection is None for o in outcomes)
    assert counted["most_reads"] >= 12 and helpers > 12  # the reads in flight followed the latency
    assert counted["most_converts"] <= 2  # and the conversions the slots


@pytest.mark.timeout(120)
def test_reads_ahead_hold_no_more_than_the_budget_has_room_for(tmp_path, counted):
    counted["wanted"], counted["guard_s"] = 12, 0.2  # the reads would like 12 in flight
    refs = _refs(tmp_path / "in", 40, 1_000_000)  # listed at 1 MB each
    # 6 MB of budget, less 1 MB for one image and 1 MB for one file: room for 4 files read ahead
    settings = ImageSettings(width=8, height=8, worker_memory_mb=6, max_image_mb=1, max_file_mb=1)
    assert read_room(settings) == 4_000_000
    outcomes, _ = _convert_all(refs, settings, slots=2)
    assert all(o.rejection is None for o in outcomes) and len(outcomes) == 40
    assert counted["most_reads"] <= 4


@pytest.mark.timeout(40)
def test_a_conversion_stuck_past_its_time_limit_gives_its_core_back(tmp_path, monkeypatch):
    """One place for CPU work: the first conversion never returns (a decoder in a loop); it is abandoned as
    `timeout`, and the next images still convert instead of waiting for ever for its place."""
    refs = _refs(tmp_path / "in", 3, 1000)
    release = threading.Event()
    real_convert = imaging.convert_image
    # The pool's clock stands still but for the stuck conversion's whole time limit, which it moves on: the others
    # cannot run out of time however busy the machine. An hour ahead of time.monotonic(), the deadlines it hands to
    # the conversions (checked there on the real clock) are an hour away.
    clock = [time.monotonic() + 3600.0]

    def convert_image(data, settings, deadline=None):
        if not release.is_set() and threading.current_thread().name == "convert-image" and not stuck:
            stuck.append(threading.current_thread())
            clock[0] += 1.0
            release.wait()  # until the test ends
        return real_convert(data, settings, deadline)

    stuck: list = []
    monkeypatch.setattr(imaging, "convert_image", convert_image)
    settings = ImageSettings(width=8, height=8, timeout_s=1.0)
    pool = ConversionPool(1.0, threads=1, clock=lambda: clock[0])
    try:
        jobs = start_conversions(pool, refs, settings, slots=1)
        outcomes = list(collect_in_order(pool, jobs, "default"))
    finally:
        release.set()
        pool.close()
    assert [o.rejection.reason if o.rejection else "ok" for o in outcomes] == ["timeout", "ok", "ok"]
