"""MemoryPool behaviour on a simulated device: placement, stitching, limits, streams, defrag,
scopes, batches, statistics, and the driver's parameter form."""

import numpy as np
import pytest

import gpumm
from gpumm.units import KiB, MiB


def test_any_size_rounded_to_256(pool):
    a = pool.alloc(1)
    b = pool.alloc("1KiB")
    assert (a.size, b.size) == (1, 1024)
    assert b.ptr - a.ptr == 256 and a.ptr % 256 == 0
    s = pool.stats()
    assert s["live_bytes"] == 1025 and s["used_bytes"] == 256 + 1024
    assert s["pages_heap"] == 1


def test_large_allocations_share_page_ends(pool):
    a = pool.alloc(3 * MiB)
    b = pool.alloc(3 * MiB)
    # 6 MiB in exactly three 2 MiB pages: b starts in the second half of a's last page
    assert pool.stats()["reserved_bytes"] == 6 * MiB
    assert b.ptr == a.ptr + 3 * MiB
    assert pool.stats()["stitched"] == 0  # consecutive pages: the direct map serves them


def test_stitching_makes_fragmented_memory_usable():
    pool = gpumm.MemoryPool(gpumm.Device(vidmem="20MiB"), check=True)
    held = [pool.alloc(2 * MiB) for _ in range(10)]
    for a in held[::2]:
        a.free()
    s = pool.stats()
    assert (s["free_bytes"], s["largest_free_run"]) == (10 * MiB, 2 * MiB)
    assert s["fragmentation"] == pytest.approx(0.8)
    assert s["largest_request"] == 10 * MiB
    big = pool.alloc(10 * MiB)  # five scattered pages, mapped back to back
    assert pool.stats()["stitched"] == 1
    assert pool.snapshot()["allocations"][-1]["stitched"] in (True, False)
    assert any(x["stitched"] for x in pool.snapshot()["allocations"])
    with pytest.raises(gpumm.OutOfMemoryError):
        pool.alloc(1)
    big.free()


def test_out_of_memory_message(device):
    pool = gpumm.MemoryPool(device, max_size="8MiB")
    pool.alloc(5 * MiB)
    with pytest.raises(gpumm.OutOfMemoryError) as e:
        pool.alloc(4 * MiB)
    msg = str(e.value)
    for word in ("cannot allocate 4 MiB", "live 5 MiB", "reserved 6 MiB", "largest free run",
                 "largest request it can serve 1 MiB",
                 "fragmentation", "limit 8 MiB", "device: 58 MiB free"):
        assert word in msg
    assert isinstance(e.value, MemoryError)
    assert pool.stats()["failures"] == 1
    assert pool.stats()["success_rate"] == pytest.approx(0.5)


def test_size_reserves_up_front_and_max_size_limits(device):
    pool = gpumm.MemoryPool(device, size="10MiB", max_size="12MiB")
    assert pool.stats()["reserved_bytes"] == 10 * MiB
    assert device.pmm.stats()["allocated_bytes"] == 10 * MiB
    pool.alloc(12 * MiB)
    with pytest.raises(gpumm.OutOfMemoryError):
        pool.alloc(1)
    pool.close()
    assert device.pmm.stats()["allocated_bytes"] == 0


def test_failure_callback_may_free_and_retry(device):
    held = []
    calls = []

    def on_failure(nbytes):
        calls.append(nbytes)
        if held:
            held.pop().free()
            return True
        return False

    pool = gpumm.MemoryPool(device, max_size="4MiB", on_failure=on_failure)
    held.append(pool.alloc(4 * MiB))
    a = pool.alloc(MiB)  # the callback frees the 4 MiB, the retry succeeds
    assert calls == [MiB] and a.size == MiB
    with pytest.raises(gpumm.OutOfMemoryError):
        pool.alloc(4 * MiB)  # nothing left to free: the callback says no
    assert calls == [MiB, 4 * MiB]


def test_failure_callback_errors_propagate(device):
    def boom(nbytes):
        raise RuntimeError("callback failed")

    pool = gpumm.MemoryPool(device, max_size="2MiB", on_failure=boom)
    pool.alloc(2 * MiB)
    with pytest.raises(RuntimeError, match="callback failed"):
        pool.alloc(MiB)
    with pytest.raises(TypeError, match="callable"):
        gpumm.MemoryPool(device, on_failure=42)


def test_stream_ordered_free(device):
    pool = gpumm.MemoryPool(device, max_size="4MiB", check=True)
    a = pool.alloc(4 * MiB, stream=1)
    fence = a.free(stream=1)
    assert isinstance(fence, int) and pool.stats()["freeing_bytes"] == 4 * MiB
    with pytest.raises(gpumm.OutOfMemoryError):
        pool.alloc(4 * MiB, stream=2)  # not before the fence
    b = pool.alloc(4 * MiB, stream=1)  # the same stream may reuse at once
    assert b.ptr == a.ptr
    f2 = pool.free(b, stream=1)
    assert pool.complete(f2) == 1
    assert pool.alloc(4 * MiB, stream=2).size == 4 * MiB


def test_synchronize(pool):
    for s in (1, 2, 3):
        pool.alloc(MiB, stream=s).free(stream=s)
    assert pool.stats()["pending_frees"] == 3
    assert pool.synchronize(2) == 1
    assert pool.synchronize() == 2
    assert pool.stats()["used_bytes"] == 0


def test_defrag_moves_movable_allocations(pool):
    allocs = [pool.alloc(64 * KiB, movable=True) for _ in range(128)]
    for i, a in enumerate(allocs):
        if i % 8:
            a.free()
    keep = allocs[::8]
    before = {id(a): a.ptr for a in keep}
    r = pool.defrag()
    # each page slides its later allocations down (12 copies), then three pages are emptied
    # into the fourth (12 more): 15 allocations moved, one (old, new) pair each
    assert (r["moved_allocations"], r["pages_emptied"]) == (15, 3)
    assert r["moved_bytes"] == 24 * 64 * KiB and len(r["moves"]) == 15
    assert r["bytes_released"] == 3 * 2 * MiB and r["roots_released"] == 3
    assert pool.stats()["pages_heap"] == 1
    moved = {old: new for old, new in r["moves"]}
    for a in keep:  # handles follow their allocation
        assert a.ptr == moved.get(before[id(a)], before[id(a)])
    for a in keep:
        a.free()


def test_defrag_plan_changes_nothing_and_is_what_defrag_does(pool):
    allocs = [pool.alloc(64 * KiB, movable=True) for _ in range(128)]
    for i, a in enumerate(allocs):
        if i % 8:
            a.free()
    keep = allocs[::8]
    snap, ptrs = pool.snapshot(), [a.ptr for a in keep]
    plan = pool.defrag_plan()
    assert pool.snapshot() == snap and [a.ptr for a in keep] == ptrs
    assert (plan["movable_heap_pages"], plan["pages_freed"]) == (4, 3)
    r = pool.defrag()
    assert {k: plan[k] for k in r} == r
    for a in keep:
        a.free()


def test_defrag_leaves_immovable_allocations(pool):
    allocs = [pool.alloc(64 * KiB) for _ in range(64)]
    for a in allocs[1:]:
        a.free()
    r = pool.defrag()
    assert r["moved_allocations"] == 0 and r["moves"] == []


def test_scope_frees_what_it_made(pool):
    outer = pool.alloc(100)
    with pool.scope() as s:
        kept = pool.alloc(3 * MiB)
        gone = pool.alloc(200)
        gone.free()
        assert [a.ptr for a in s.allocations()] == [kept.ptr]
        for a in s.allocations():  # freeing while iterating is safe
            a.free()
        again = pool.alloc(5 * MiB)
    assert (s.made, s.freed) == (3, 1) and s.leaked == [(again.ptr, 5 * MiB)]
    assert s.leaked_bytes == 5 * MiB
    assert again.freed and not outer.freed


def test_scopes_nest_and_are_per_pool(device):
    p, q = gpumm.MemoryPool(device), gpumm.MemoryPool(device)
    with p.scope() as outer:
        a = p.alloc(100)
        b = q.alloc(100)  # another pool: not in p's scope
        with p.scope() as inner:
            c = p.alloc(100)
        assert c.freed and not a.freed
    assert a.freed and not b.freed
    assert (outer.made, inner.made) == (1, 1)


def test_scope_is_per_thread(pool):
    import threading

    made = []
    with pool.scope() as s:
        t = threading.Thread(target=lambda: made.append(pool.alloc(100)))
        t.start()
        t.join()
        mine = pool.alloc(100)
    # the other thread's allocation is not in this thread's scope; after it, nothing is
    assert (s.made, s.freed) == (1, 1) and mine.freed and not made[0].freed
    after = pool.alloc(100)
    with pool.scope() as s2:
        pass
    assert s2.made == 0 and not after.freed


def test_allocation_context_manager(pool):
    with pool.alloc(1000) as a:
        assert not a.freed
    assert a.freed
    with pool.alloc(1000) as b:
        b.free()  # freeing inside the block is fine
    assert pool.stats()["live_allocs"] == 0


def test_alloc_batch(pool):
    sizes = np.array([100, 2 * MiB, 3 * MiB + 5, 1], dtype=np.int64)
    ptrs = pool.alloc_batch(sizes)
    assert ptrs.dtype == np.uint64 and len(ptrs) == 4
    assert pool.stats()["live_bytes"] == int(sizes.sum())
    pool.free_batch(ptrs)
    assert pool.stats()["live_allocs"] == 0
    assert list(pool.alloc_batch([10, 20])) and pool.stats()["live_allocs"] == 2
    # a numpy array of its own (made from the core's vector, not viewing a bytes object);
    # the pointers as bytes too, for callers without numpy
    more = pool.alloc_batch([30, 40], 2, arena=True)
    assert type(more) is np.ndarray and more.flags.owndata is False and more.flags.c_contiguous
    assert not isinstance(more.base, bytes)  # (frombuffer over a bytes object, before)
    raw = pool.alloc_batch_raw([50, 60])
    assert type(raw) is bytes and len(np.frombuffer(raw, dtype=np.uint64)) == 2
    pool.free_batch(more)
    pool.free_batch(np.frombuffer(raw, dtype=np.uint64))
    assert pool.stats()["live_allocs"] == 2


def test_batches_freed_every_way(pool):
    """Batches in flight together, freed whole (from the batch's record), in another order,
    one member first by pointer, or by a pointer that is not theirs: each gives the answer a
    pool without records gives, and the pool stays valid."""
    sizes = np.array([1000, 5000, 70_000, 3 * MiB], dtype=np.int64)
    a, b, c, d = (pool.alloc_batch(sizes) for _ in range(4))
    pool.free_batch(b)  # whole, though not the latest
    pool.free_batch(d[::-1].copy())  # another order
    pool.free(int(a[2]))  # a member alone, by pointer
    with pytest.raises(gpumm.InvalidFreeError):
        pool.free_batch(a)  # a[2] went already: all or none
    with pytest.raises(gpumm.InvalidFreeError):
        pool.free_batch(np.append(c, c[0] + 256).astype(np.uint64))  # an interior pointer
    assert pool.stats()["live_allocs"] == 3 + 4
    pool.validate()
    pool.free_batch(a[[0, 1, 3]])
    pool.free_batch(c)
    s = pool.stats()
    assert s["live_allocs"] == 0 and s["used_bytes"] == 0
    pool.validate()


def test_alloc_batch_arena(pool):
    sizes = np.array([100, 2 * MiB, 3 * MiB + 5, 1], dtype=np.int64)
    ptrs = pool.alloc_batch(sizes, arena=True)
    rounded = (sizes + 255) // 256 * 256
    assert list(np.diff(ptrs.astype(np.int64))) == list(rounded[:-1])  # back to back
    s = pool.stats()
    assert s["live_allocs"] == 4 and s["live_bytes"] == int(sizes.sum())
    assert s["used_bytes"] == int(rounded.sum())
    pool.free(int(ptrs[1]))  # one member alone: its memory stays with the arena
    assert pool.stats()["used_bytes"] == int(rounded.sum())
    with pytest.raises(gpumm.InvalidFreeError):
        pool.free_batch(ptrs)  # ptrs[1] is already freed: all or none
    assert pool.stats()["live_allocs"] == 3
    pool.free_batch(ptrs[[0, 2, 3]])
    s = pool.stats()
    assert s["live_allocs"] == 0 and s["used_bytes"] == 0
    with pytest.raises(gpumm.InvalidSizeError):
        pool.alloc_batch([10, 0], arena=True)
    assert pool.stats()["live_allocs"] == 0
    pool.validate()


def test_free_by_pointer(pool):
    a = pool.alloc(5000)
    pool.free(a.ptr)
    assert a.freed


def test_stats_and_snapshot(pool):
    # (the small one first: made after, it would take the large segment's free end, as a
    # small pool takes no heap page while a free block holds the request)
    b = pool.alloc(100)
    a = pool.alloc(3 * MiB)
    s = pool.stats()
    assert s["live_allocs"] == 2 and s["peak_live"] == 3 * MiB + 100
    assert s["live_by_size"] == [(256, 1, 100), (4 * MiB, 1, 3 * MiB)]
    assert s["reserved_bytes"] == s["used_bytes"] + s["free_bytes"]
    # the 3 MiB allocation starts in the heap page's free end and runs on over one more
    # page (two pages, not three: `heap_ends_for`), listed page by page
    assert s["reserved_bytes"] == 4 * MiB
    snap = pool.snapshot()
    assert [p["kind"] for p in snap["pages"]] == ["heap", "heap"]
    first, second = snap["pages"]
    assert first["blocks"] == [(0, 256, b.ptr), (256, 2 * MiB - 256, a.ptr)]
    assert second["blocks"] == [(0, MiB + 256, a.ptr), (MiB + 256, MiB - 256, None)]
    assert {x["ptr"] for x in snap["allocations"]} == {a.ptr, b.ptr}
    a.free()
    b.free()
    assert pool.stats()["peak_live"] == 3 * MiB + 100


def test_freed_blocks_wait_for_a_request_of_their_size(pool):
    """The size cache: a freed block between live ones is held whole for the next request
    when it is of its rounded size; the memory counts as free, the old handle is dead, and
    an empty pool gives the cache back."""
    keep = pool.alloc(100)
    a, b = pool.alloc(64 * KiB), pool.alloc(64 * KiB)
    free_before = pool.stats()["free_bytes"]
    a.free()
    s = pool.stats()
    assert (s["cached_allocs"], s["cache_hits"]) == (1, 0)
    assert s["free_bytes"] == free_before + 64 * KiB
    heap = [p for p in pool.snapshot()["pages"] if p["kind"] == "heap"][0]
    assert all(owner != a.ptr for _, _, owner in heap["blocks"]), "shown as free"
    with pytest.raises(gpumm.InvalidFreeError):
        a.free()
    with pytest.raises(gpumm.InvalidFreeError):
        pool.free(a.ptr)
    c = pool.alloc(64 * KiB - 200)  # rounds to the same size
    assert c.ptr == a.ptr
    assert pool.stats()["cache_hits"] == 1 and pool.metrics()["cache_hits"] == 1
    for x in (b, c, keep):
        x.free()
    s = pool.stats()
    assert (s["cached_allocs"], s["pages_heap"], s["used_bytes"]) == (0, 0, 0)


def test_size_cache_can_be_switched_off(device):
    pool = gpumm.MemoryPool(device, size_cache=False, check=True)
    keep = pool.alloc(100)
    for _ in range(4):
        pool.alloc(4096).free()
    assert (pool.stats()["cached_allocs"], pool.stats()["cache_hits"]) == (0, 0)
    keep.free()


def test_size_cache_on_real_memory_scrubs_and_keeps_bytes():
    """On host memory: a block taken back from the cache is the same memory, zeroed when the
    pool scrubs; without scrub, other allocations' bytes are untouched throughout."""
    pool = gpumm.MemoryPool(gpumm.Device(arch="hopper", vidmem="64MiB", backend="host"),
                            scrub=True, check=True)
    other = pool.alloc(10000)
    np.asarray(other)[:] = 7
    a, b = pool.alloc(5000), pool.alloc(5000)
    np.asarray(a)[:] = 0xAB
    ptr = a.ptr
    a.free()
    assert pool.stats()["cached_allocs"] == 1
    c = pool.alloc(5000)
    assert c.ptr == ptr and pool.stats()["cache_hits"] == 1
    assert not np.asarray(c).any(), "scrubbed on free"
    np.asarray(c)[:] = 3
    assert (np.asarray(other) == 7).all() and (np.asarray(c) == 3).all()
    for x in (b, c, other):
        x.free()
    pool.close()


def test_trim_and_release_threshold(device):
    pool = gpumm.MemoryPool(device, release_threshold="2MiB")
    pool.alloc(10 * MiB).free()
    assert pool.stats()["reserved_bytes"] == 2 * MiB
    assert pool.trim() == 2 * MiB
    assert device.pmm.stats()["allocated_bytes"] == 0


def test_pools_share_a_device(device):
    p = gpumm.MemoryPool(device)
    q = gpumm.MemoryPool(device)
    p.alloc(40 * MiB)
    with pytest.raises(gpumm.OutOfMemoryError, match="device: 24 MiB free"):
        q.alloc(30 * MiB)
    p.close()
    q.alloc(30 * MiB)


def test_closed_pool_refuses_everything(pool):
    a = pool.alloc(100)
    assert pool.close() == 1
    assert pool.closed and a.freed
    for call in (lambda: pool.alloc(1), lambda: pool.free(a), lambda: pool.defrag(),
                 lambda: pool.synchronize(), lambda: pool.trim(), lambda: pool.alloc_batch([1]),
                 lambda: a.free(), lambda: pool.free_batch(np.array([1], dtype=np.uint64))):
        with pytest.raises(gpumm.InvalidStateError, match="closed"):
            call()
    assert pool.close() == 0  # closing twice is harmless


def test_pool_as_context_manager(device):
    with gpumm.MemoryPool(device) as p:
        p.alloc(100)
    assert p.closed


def test_device_presets_and_default_pool():
    d = gpumm.Device("a100-80")
    assert d.arch.name == "ampere" and d.capacity == 80 * 1024 * MiB
    assert d.pool() is d.pool("2MiB")
    with pytest.raises(gpumm.InvalidArgumentError, match="unknown device"):
        gpumm.Device("k80")
    with pytest.raises(gpumm.InvalidArgumentError, match="unknown backend"):
        gpumm.Device(backend="tape")


def test_page_size_must_fit_the_device(device):
    with pytest.raises(gpumm.InvalidSizeError, match="page size"):
        gpumm.MemoryPool(device, page_size="64KiB")  # below the simulated 2 MiB granularity
    host = gpumm.Device(backend="host", vidmem="16MiB")
    assert gpumm.MemoryPool(host, page_size="64KiB").page_size == 64 * KiB
    with pytest.raises(gpumm.InvalidSizeError, match="page size"):
        gpumm.MemoryPool(host, page_size="128KiB")  # not a Hopper chunk size


@pytest.mark.parametrize(
    "size, expected",
    [(100, 4 * KiB), (64 * KiB - 1, 4 * KiB), (64 * KiB, 64 * KiB), (2 * MiB - 1, 64 * KiB),
     (2 * MiB, 2 * MiB), (1 << 30, 2 * MiB)],
)
def test_alloc_params_page_size_rule(size, expected):
    assert gpumm.AllocParams(size).resolved_page_size() == expected
    assert gpumm.AllocParams(size, page_size="2MiB").resolved_page_size() == 2 * MiB


def test_alloc_vidmem_and_sysmem():
    dev = gpumm.Device("h100")
    a = gpumm.alloc_vidmem(gpumm.AllocParams("3MiB", backing_gpu=dev))
    assert a.size == 3 * MiB and dev.pool().stats()["live_bytes"] == 3 * MiB
    s = gpumm.alloc_sysmem(gpumm.AllocParams(100_000, zero=True))
    assert bytes(memoryview(s)) == bytes(100_000)
    assert gpumm.sysmem_device().backend.name == "host"
    with pytest.raises(gpumm.InvalidArgumentError, match="sysmem"):
        gpumm.alloc_vidmem(gpumm.AllocParams(100))
    with pytest.raises(gpumm.InvalidArgumentError, match="alloc_vidmem"):
        gpumm.alloc_sysmem(gpumm.AllocParams(100, backing_gpu=dev))
    a.free()
    s.free()


def test_80_gib_device_on_a_small_machine():
    pool = gpumm.MemoryPool(gpumm.Device("h100"))
    allocs = [pool.alloc(1 << 30) for _ in range(74)]
    assert pool.stats()["live_bytes"] == 74 << 30
    for a in allocs:
        a.free()


def test_sizes_of_any_integer_type(pool):
    # numpy's integers (sizes read from an array) and int subclasses, through `__index__`;
    # floats, bools and numpy's bools stay refused (tests/test_pool_bad_input.py)
    import enum

    class Size(enum.IntEnum):
        SMALL = 1000

    sizes = [np.int64(1000), np.uint64(1000), np.int32(1000), Size.SMALL]
    allocs = [pool.alloc(s) for s in sizes]
    assert [a.size for a in allocs] == [1000] * 4
    assert all(type(a.size) is int for a in allocs)
    big = pool.alloc(np.int64(3 * MiB), np.uint32(2))
    assert (big.size, big.stream) == (3 * MiB, 2)
