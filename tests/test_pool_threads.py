"""Pools under concurrent use: 8 threads allocating and freeing on one pool, then validate;
and the GIL is released around core work."""

import ctypes
import random
import threading
import time

import gpumm
from gpumm.units import KiB, MiB


def run_threads(worker, n, errors, pool):
    """Runs ``worker(1..n)`` on n threads, then checks that none failed and the pool is sound."""
    threads = [threading.Thread(target=worker, args=(i + 1,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:5]
    pool.synchronize()
    pool.validate()


def test_eight_threads_on_one_pool():
    pool = gpumm.MemoryPool(gpumm.Device(backend="host", vidmem="256MiB"))
    errors = []
    stop = time.monotonic() + 2.0

    def worker(seed):
        rng = random.Random(seed)
        mine = []
        try:
            while time.monotonic() < stop:
                if len(mine) < 20 and rng.random() < 0.6:
                    size = int(2 ** rng.uniform(8, 22))
                    stream = rng.randrange(3)
                    try:
                        a = pool.alloc(size, stream, movable=rng.random() < 0.2)
                    except gpumm.OutOfMemoryError:
                        continue
                    ctypes.memset(a.ptr, seed, min(size, 4096))
                    mine.append(a)
                elif mine:
                    a = mine.pop(rng.randrange(len(mine)))
                    head = ctypes.string_at(a.ptr, min(a.size, 4096))
                    if head != bytes([seed]) * len(head):
                        errors.append(f"thread {seed}: allocation at {a.ptr:#x} was overwritten")
                    if rng.random() < 0.3:
                        a.free(stream=a.stream)
                    else:
                        a.free()
                if rng.random() < 0.01:
                    pool.synchronize()
            for a in mine:
                a.free()
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    run_threads(worker, 8, errors, pool)
    s = pool.stats()
    assert s["live_allocs"] == 0 and s["used_bytes"] == 0
    assert s["allocs"] == s["frees"] > 1000


def test_core_work_releases_the_gil():
    """A Python thread keeps running while another thread is inside a long core call
    (a 64 GiB exhaustion stream through one alloc_batch)."""
    pool = gpumm.MemoryPool(gpumm.Device(vidmem="64GiB"))
    sizes = [64 * KiB] * 200_000 + [3 * MiB] * 15_000
    ticks = []
    done = threading.Event()

    def ticker():
        while not done.is_set():
            ticks.append(time.perf_counter())
            time.sleep(0.0005)

    t = threading.Thread(target=ticker)
    t.start()
    time.sleep(0.01)
    t0 = time.perf_counter()
    ptrs = pool.alloc_batch(sizes)
    t1 = time.perf_counter()
    done.set()
    t.join()
    inside = [x for x in ticks if t0 < x < t1]
    assert len(ptrs) == len(sizes)
    # the ticker ran during the call (a call that held the GIL lets it tick not once: the
    # interpreter cannot switch threads inside it); a count, not a rate, so that a loaded
    # machine's slow sleeps do not fail it
    assert len(inside) >= 3, (len(inside), t1 - t0)
    pool.free_batch(ptrs)


def test_sixteen_threads_stress():
    """16 threads on one host pool for a bounded time: mixed sizes, streams, stream-ordered
    and immediate frees, synchronizations, batches. Every allocation carries its thread's
    pattern (head and tail) and is checked before it is freed; afterwards validate(), and
    no two live allocations overlap."""
    pool = gpumm.MemoryPool(gpumm.Device(backend="host", vidmem="512MiB"))
    errors = []
    ops = [0] * 16
    survivors = []
    lock = threading.Lock()
    stop = time.monotonic() + 3.0

    def check(a, seed):
        n = min(a.size, 256)
        head = ctypes.string_at(a.ptr, n)
        tail = ctypes.string_at(a.ptr + a.size - n, n)
        if head != bytes([seed]) * n or tail != bytes([seed]) * n:
            errors.append(f"thread {seed}: allocation at {a.ptr:#x} ({a.size} B) was overwritten")

    def worker(seed):
        rng = random.Random(seed)
        mine = []
        try:
            while time.monotonic() < stop:
                r = rng.random()
                if len(mine) < 24 and r < 0.55:
                    size = int(2 ** rng.uniform(4, 23))
                    try:
                        a = pool.alloc(size, rng.randrange(4), movable=rng.random() < 0.1)
                    except gpumm.OutOfMemoryError:
                        continue
                    n = min(size, 256)
                    ctypes.memset(a.ptr, seed, n)
                    ctypes.memset(a.ptr + size - n, seed, n)
                    mine.append(a)
                elif mine and r < 0.97:
                    a = mine.pop(rng.randrange(len(mine)))
                    check(a, seed)
                    if rng.random() < 0.4:
                        a.free(stream=a.stream)
                    else:
                        a.free()
                elif r < 0.985:
                    pool.synchronize(rng.randrange(4))
                else:
                    arena = rng.random() < 0.5
                    sizes = [rng.randrange(1, 5000) for _ in range(8)]
                    ptrs = pool.alloc_batch(sizes, arena=arena)
                    for p, n in zip(ptrs, sizes):  # the bytes are this thread's
                        ctypes.memset(int(p), seed, n)
                    for p, n in zip(ptrs, sizes):
                        assert ctypes.string_at(int(p), n) == bytes([seed]) * n
                    pool.free_batch(ptrs)
                ops[seed - 1] += 1
            with lock:
                survivors.extend((a, seed) for a in mine)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(f"thread {seed}: {e!r}")

    run_threads(worker, 16, errors, pool)
    spans = sorted((a.ptr, a.ptr + a.size) for a, _ in survivors)
    for (s0, e0), (s1, _) in zip(spans, spans[1:]):
        assert e0 <= s1, "live allocations overlap"
    for a, seed in survivors:
        check(a, seed)
        a.free()
    assert not errors, errors[:5]
    pool.validate()
    s = pool.stats()
    assert s["live_allocs"] == 0 and s["used_bytes"] == 0
    assert sum(ops) > 5000
    print(f"16-thread stress: {sum(ops)} operations, {s['allocs']} allocations, "
          f"{s['stitched']} stitched")


def test_allocation_objects_are_recycled_clean():
    """A dropped ``Allocation``'s memory is kept and reused for the next one, under the GIL
    (rust/bindings/recycle.rs). A reused object starts clean: the new allocation's fields, no
    weak reference left from the old one, and not tracked by the GC (an object CPython made
    afresh is: PyO3's classes are all GC types)."""
    import gc
    import weakref

    pool = gpumm.MemoryPool(gpumm.Device(vidmem="64MiB"))
    # (no collection in between: one would drop earlier tests' objects into the kept ones)
    gc.collect()
    gc.disable()
    try:
        a = pool.alloc(1000)
        gone = weakref.ref(a)
        a.free()
        del a
        assert gone() is None
        b = pool.alloc(3000, stream=7)
        assert not gc.is_tracked(b)
        assert (b.size, b.stream, weakref.getweakrefcount(b)) == (3000, 7, 0)
        assert weakref.ref(b)() is b
        # more objects than are kept at once (1,024): the rest go back to CPython and come
        # anew
        many = [pool.alloc(256 + i) for i in range(3000)]
        assert [m.size for m in many] == [256 + i for i in range(3000)]
        for m in many:
            m.free()
        del many, m
        again = [pool.alloc(512) for _ in range(3000)]
        assert sum(not gc.is_tracked(x) for x in again) == 1024
        assert len({x.ptr for x in again}) == 3000
    finally:
        gc.enable()
    for x in again:
        x.free()
    b.free()
    pool.validate()


def test_allocation_objects_from_many_threads():
    """Eight threads make and drop ``Allocation`` objects at once (the kept objects are shared
    under the GIL), with weak references on some: every object keeps the fields of its own
    allocation, and each weak reference dies with its object."""
    import weakref

    pool = gpumm.MemoryPool(gpumm.Device(vidmem="512MiB"))
    errors = []

    def worker(seed):
        rng = random.Random(seed)
        held = []
        try:
            for _ in range(4000):
                if held and rng.random() < 0.5:
                    a, size, ref = held.pop(rng.randrange(len(held)))
                    if (a.size, a.stream) != (size, seed):
                        errors.append((a.size, a.stream, size, seed))
                    a.free()
                    del a
                    if ref is not None and ref() is not None:
                        errors.append("a weak reference outlived its allocation")
                else:
                    size = rng.randrange(1, 256 * KiB)
                    a = pool.alloc(size, stream=seed)
                    held.append((a, size, weakref.ref(a) if rng.random() < 0.2 else None))
            for a, _, _ in held:
                a.free()
        except Exception as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    run_threads(worker, 8, errors, pool)


def test_quick_calls_while_another_thread_works_without_the_gil():
    """One thread frees and allocates batches larger than a quick call takes, so it works on
    the pool with the GIL released; three others make single calls meanwhile. The single calls
    must then take the pool's lock, not the GIL alone (rust/bindings/pool.rs, ``Core``): every
    allocation keeps its thread's bytes, no two overlap, and the pool is sound after."""
    pool = gpumm.MemoryPool(gpumm.Device(backend="host", vidmem="512MiB"))
    errors = []
    stop = time.monotonic() + 1.5

    def batches():
        rng = random.Random(0)
        while time.monotonic() < stop:
            sizes = [rng.randrange(256, 8 * KiB) for _ in range(6000)]
            ptrs = pool.alloc_batch(sizes)
            ctypes.memset(int(ptrs[0]), 0xEE, sizes[0])
            pool.free_batch(ptrs)

    def singles(seed):
        rng = random.Random(seed)
        mine = []
        while time.monotonic() < stop:
            if len(mine) < 32 and rng.random() < 0.55:
                a = pool.alloc(rng.randrange(1, 64 * KiB))
                ctypes.memset(a.ptr, seed, a.size)
                mine.append(a)
            elif mine:
                a = mine.pop(rng.randrange(len(mine)))
                if ctypes.string_at(a.ptr, a.size) != bytes([seed]) * a.size:
                    errors.append(f"thread {seed}: {a.ptr:#x} was overwritten")
                a.free()
        for a in mine:
            a.free()

    def worker(i):  # thread 1 works in batches, 2-4 in single calls
        try:
            batches() if i == 1 else singles(i)
        except Exception as e:  # noqa: BLE001 - reported by run_threads
            errors.append(f"thread {i}: {e!r}")

    run_threads(worker, 4, errors, pool)
    s = pool.stats()
    assert s["live_allocs"] == 0 and s["frees"] > 1000, s["frees"]
