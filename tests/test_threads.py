"""Concurrent use from many threads, with the GIL released around core work."""

import random
import threading

import gpumm


def test_eight_threads_then_validate():
    p = gpumm.Pmm(arch="hopper", vidmem="256MiB")
    errors = []
    barrier = threading.Barrier(8)

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        live = []
        try:
            barrier.wait()
            for _ in range(20000):
                if live and rng.random() < 0.5:
                    p.free(live.pop(rng.randrange(len(live))))
                else:
                    kind = rng.choice(["user", "kernel"])
                    sizes = p.user_sizes if kind == "user" else p.kernel_sizes
                    try:
                        c = p.alloc_chunk(rng.choice(sizes), kind)
                    except gpumm.OutOfMemoryError:
                        continue
                    if kind == "user" and rng.random() < 0.5:
                        p.unpin(c)
                    live.append(c)
            # Hand the survivors back half the time, keep the rest to check at the end.
            for c in live[::2]:
                p.free(c)
            kept.extend(live[1::2])
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    kept = []
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    p.validate()
    held = p.allocated_chunks()
    assert sorted(c.address for c in held) == sorted(c.address for c in kept)
    for a, b in zip(sorted(held, key=lambda c: c.address), sorted(held, key=lambda c: c.address)[1:]):
        assert a.address + a.size <= b.address
    p.free_chunks(kept)
    p.validate()
    assert p.stats()["allocated_bytes"] == 0


def test_gil_is_released_during_core_work():
    """A thread busy in the core must not stop another Python thread from running."""
    import sys

    import time

    p = gpumm.Pmm(vidmem="64GiB")
    started = threading.Event()
    done = threading.Event()
    ticks = []

    def python_work():
        started.set()
        while not done.is_set():
            ticks.append(time.perf_counter())

    old = sys.getswitchinterval()
    # With a long switch interval the other thread only runs when the GIL is given up on
    # purpose: by the core's detach, not by the interpreter's time slicing.
    sys.setswitchinterval(0.25)
    t = threading.Thread(target=python_work)
    try:
        t.start()
        started.wait()
        chunks = p.alloc_chunks(1_000_000, "64KiB")
        t0 = time.perf_counter()
        p.free_chunks(chunks)  # one long call into the core
        t1 = time.perf_counter()
    finally:
        done.set()
        sys.setswitchinterval(old)
        t.join()
    during = [x for x in ticks if t0 < x < t1]
    assert during, "no Python thread ran while the core worked: the GIL was held"


def test_chunk_objects_are_recycled_clean():
    """``Chunk`` objects are recycled under the GIL as ``Allocation`` objects are
    (rust/bindings/recycle.rs): a reused one has its new chunk's fields and is not tracked
    by the GC (an object CPython made afresh is)."""
    import gc

    p = gpumm.Pmm(arch="hopper", vidmem="64MiB")
    c = p.alloc_chunk("64KiB")
    p.free(c)
    del c
    d = p.alloc_chunk("2MiB", "kernel")
    assert not gc.is_tracked(d)
    assert (d.size, d.type, d.state) == (2 << 20, "kernel", "allocated")
    p.free(d)
    p.validate()
