"""Steps served from a plan (``with pool.step():``, rust/alloc/step.rs): recording, serving,
departures, rebuilds, streams, threads, the raw pointer path and what stats and validate say."""

import threading

import pytest

import gpumm
from gpumm.units import KiB, MiB
from shared_traces import TRACES, needs_shared


def training_step(pool, sizes=(3 * MiB, MiB, 5 * MiB, 4 * KiB, 2 * MiB + 512, 700 * KiB),
                  stream=0, keep=()):
    """A forward pass (activations kept), a backward pass (freed in reverse) and temporaries;
    returns the allocations named in ``keep`` (left live)."""
    made = {}
    for i, n in enumerate(sizes):
        made[i] = pool.alloc(n, stream)
        if i == 3:
            made.pop(3).free()  # a temporary
    for i in sorted(made, reverse=True):
        if i not in keep:
            made.pop(i).free()
    return made


@pytest.fixture
def big_pool():
    return gpumm.MemoryPool(gpumm.Device(arch="hopper", vidmem="512MiB"), check=True)


def planned(pool):
    """``pool`` after one recorded ``training_step``: it holds that step's plan."""
    pool.set_step_recording(1)
    with pool.step():
        training_step(pool)
    return pool


def test_later_steps_are_served_from_the_plan(big_pool):
    pool = big_pool
    for _ in range(2):  # recorded
        with pool.step():
            training_step(pool)
    s = pool.stats()
    assert (s["plan_hits"], s["plan_misses"]) == (0, 0)
    assert s["plan_arena_bytes"] >= 11 * MiB and s["used_bytes"] == s["plan_arena_bytes"]
    for _ in range(3):
        with pool.step():
            training_step(pool)
    s = pool.stats()
    assert (s["plan_hits"], s["plan_misses"], s["plan_rebuilds"]) == (18, 0, 0)
    pool.validate()
    # outside any step: the normal path, not counted
    pool.alloc(MiB).free()
    assert pool.stats()["plan_hits"] == 18


def test_recording_one_step(big_pool):
    pool = planned(big_pool)
    with pool.step():
        training_step(pool)
    assert pool.stats()["plan_hits"] == 6
    with pytest.raises(gpumm.InvalidStateError):
        pool.set_step_recording(2)
    with pytest.raises(gpumm.InvalidArgumentError):
        gpumm.MemoryPool(gpumm.Device(vidmem="64MiB")).set_step_recording(0)


def test_departing_requests_fall_back_without_failing(big_pool):
    pool = planned(big_pool)
    # dynamic shapes: two sizes change; MoE-like routing: one request on another stream
    with pool.step():
        training_step(pool, sizes=(3 * MiB, MiB, 6 * MiB, 4 * KiB, 2 * MiB + 512, 900 * KiB))
    s = pool.stats()
    assert (s["plan_hits"], s["plan_misses"]) == (4, 2)
    with pool.step():
        training_step(pool, stream=3)
    assert pool.stats()["plan_misses"] == 2 + 6
    pool.validate()


def test_a_plan_that_keeps_missing_is_rebuilt(big_pool):
    pool = planned(big_pool)
    other = tuple(n + 768 for n in (3 * MiB, MiB, 5 * MiB, 4 * KiB, 2 * MiB + 512, 700 * KiB))
    for _ in range(2):
        with pool.step():
            training_step(pool, sizes=other)
    s = pool.stats()
    assert (s["plan_rebuilds"], s["plan_arena_bytes"]) == (1, 0)
    with pool.step():  # recorded again
        training_step(pool, sizes=other)
    hits = pool.stats()["plan_hits"]
    with pool.step():
        training_step(pool, sizes=other)
    assert pool.stats()["plan_hits"] == hits + 6
    pool.validate()


def test_a_block_live_after_its_step_is_never_handed_out_twice(big_pool):
    pool = planned(big_pool)
    with pool.step():
        kept = training_step(pool, keep=(1,))
    with pool.step():
        again = training_step(pool, keep=(1,))
    assert again[1].ptr != kept[1].ptr
    ranges = sorted((a.ptr, a.ptr + a.size) for a in pool.allocations())
    assert all(b[0] >= a[1] for a, b in zip(ranges, ranges[1:]))
    kept[1].free()
    again[1].free()
    pool.validate()


def test_stream_ordered_frees_of_served_blocks(big_pool):
    pool = big_pool
    pool.set_step_recording(1)

    def step():
        a = pool.alloc(2 * MiB)
        fence = pool.free(a, stream=5)
        b = pool.alloc(2 * MiB)
        b.free()
        return a.ptr, b.ptr, fence

    with pool.step():
        step()
    with pool.step():
        pa, pb, fence = step()
    assert pa != pb  # the second waits for stream 5's fence: other memory
    pool.complete(fence)
    pool.validate()
    assert pool.stats()["pending_frees"] == 0


def test_threads_inside_a_step_never_share_memory(big_pool):
    pool = big_pool
    errors = []

    def worker(seed):
        try:
            for _ in range(30):
                a = pool.alloc((seed + 1) * 64 * KiB, seed)
                b = pool.alloc(MiB + seed * 4096, seed)
                if a.ptr < b.ptr + b.size and b.ptr < a.ptr + a.size:
                    errors.append("overlap")
                a.free()
                b.free()
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    for _ in range(6):
        with pool.step():
            ts = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
    assert not errors, errors[:3]
    pool.validate()
    s = pool.stats()
    assert s["live_allocs"] == 0 and s["plan_hits"] + s["plan_misses"] > 0


def test_raw_pointers_in_steps(big_pool):
    pool = big_pool
    pool.set_step_recording(1)
    for _ in range(3):
        with pool.step():
            a = pool.alloc_raw(3 * MiB)
            b = pool.alloc_raw(MiB)
            pool.free_raw(a)
            c = pool.alloc_raw(2 * MiB)
            pool.free_raw(b)
            pool.free_raw(c)
    assert pool.stats()["plan_hits"] == 6
    with pytest.raises(gpumm.InvalidFreeError):
        pool.free_raw(a)
    pool.validate()


def test_steps_pair_and_close(big_pool):
    pool = big_pool
    pool._step_begin()
    with pytest.raises(gpumm.InvalidStateError):
        pool._step_begin()
    pool._step_end()
    with pytest.raises(gpumm.InvalidStateError):
        pool._step_end()
    with pool.step():
        training_step(pool)
    with pool.step():
        training_step(pool)
    with pool.step():
        kept = training_step(pool, keep=(0,))
    assert kept[0].ptr
    assert pool.close() == 1
    assert pool.stats()["reserved_bytes"] == 0


@needs_shared
def test_a_corpus_trace_is_served_from_its_plan():
    """resnet50_train repeats its step twice (the period of its sizes, found as
    benches/step_traces.py does): with one step recorded, the second is served from the plan,
    and the plan's arena is within 1 % of the planner's bound."""
    import numpy as np

    from gpumm.traces import read_rmm_csv

    events = [e for e in read_rmm_csv(TRACES / "resnet50_train.csv.gz").events
              if e.action in ("alloc", "free")]
    sizes = np.array([e.size for e in events if e.action == "alloc"])
    half = len(sizes) // 2
    assert (sizes[:half] == sizes[half:2 * half]).mean() > 0.99, "two equal steps"
    pool = gpumm.MemoryPool(gpumm.Device(vidmem="80GiB"))
    pool.set_step_recording(1)
    live, n = {}, 0
    pool._step_begin()
    for e in events:
        if e.action == "alloc":
            if n == half:
                pool._step_end()
                pool._step_begin()
            live[e.ptr] = pool.alloc(e.size, e.stream)
            n += 1
        elif e.ptr in live:
            live.pop(e.ptr).free()
    pool._step_end()
    s = pool.stats()
    assert s["plan_hits"] + s["plan_misses"] <= len(sizes) - half
    assert s["plan_hits"] >= 0.95 * (len(sizes) - half), s
    assert s["plan_arena_bytes"] <= 1.01 * s["plan_bound_bytes"]
    pool.validate()
