"""Host backend: real memory. Views are zero-copy, writes through numpy are seen through the
pointer, stitching really maps pages back to back, scrub really zeroes, defrag keeps bytes."""

import ctypes
import gc

import numpy as np
import pytest

import gpumm
from gpumm.units import KiB, MiB


def read(ptr, n):
    return ctypes.string_at(ptr, n)


def test_numpy_views_are_zero_copy(host_pool):
    a = host_pool.alloc(10_000)
    v = np.asarray(a)
    assert v.dtype == np.uint8 and v.shape == (10_000,)
    assert v.ctypes.data == a.ptr
    v[:] = np.arange(10_000) % 251
    assert read(a.ptr, 10_000) == bytes(v)
    ctypes.memset(a.ptr, 7, 16)
    assert list(v[:3]) == [7, 7, 7]
    d = np.from_dlpack(a)
    assert d.ctypes.data == a.ptr and d.shape == (10_000,)
    i = np.array(a.__array_interface__ and a, copy=False)
    assert i.ctypes.data == a.ptr
    del v, d, i
    gc.collect()
    a.free()


def test_array_interface(host_pool):
    a = host_pool.alloc(300)
    ai = a.__array_interface__
    assert ai["shape"] == (300,) and ai["typestr"] == "|u1" and ai["data"] == (a.ptr, False)


def test_dlpack_capsule_not_consumed_unpins(host_pool):
    a = host_pool.alloc(300)
    cap = a.__dlpack__()
    assert a.__dlpack_device__() == (1, 0)
    with pytest.raises(gpumm.InvalidStateError):
        a.free()
    del cap
    gc.collect()
    a.free()


def test_stitched_allocation_is_contiguous_memory():
    pool = gpumm.MemoryPool(gpumm.Device(backend="host", vidmem="16MiB"), check=True)
    held = [pool.alloc(2 * MiB) for _ in range(8)]
    for a in held[1::2]:
        a.free()
    big = pool.alloc(7 * MiB)
    assert pool.stats()["stitched"] == 1
    v = np.asarray(big)
    v[:] = np.arange(v.size, dtype=np.uint64).astype(np.uint8)
    assert read(big.ptr + 2 * MiB - 8, 16) == bytes(v[2 * MiB - 8:2 * MiB + 8])
    # the neighbours were not touched
    for a in held[::2]:
        assert read(a.ptr, 4096) == bytes(4096)
    del v
    big.free()


def test_scrub_zeroes_on_free():
    pool = gpumm.MemoryPool(gpumm.Device(backend="host", vidmem="16MiB"), scrub=True)
    a = pool.alloc(5000)
    np.asarray(a)[:] = 0xAB
    ptr = a.ptr
    a.free()
    b = pool.alloc(5000)
    assert b.ptr == ptr and read(b.ptr, 5000) == bytes(5000)


def test_zero_param(host_pool):
    a = host_pool.alloc(5000)
    np.asarray(a)[:] = 1
    ptr = a.ptr
    a.free()
    b = host_pool.alloc(5000)
    assert b.ptr == ptr and read(b.ptr, 10) == b"\x01" * 10  # reuse is not zeroed ...
    b.zero()
    assert read(b.ptr, 5000) == bytes(5000)  # ... unless asked


def test_defrag_preserves_contents(host_pool):
    assert host_pool.page_size == 64 * KiB and host_pool.small_threshold == 32 * KiB
    n = 8 * KiB  # heap allocations: eight to a 64 KiB page
    allocs = [host_pool.alloc(n, movable=True) for _ in range(96)]
    keep = []
    for i, a in enumerate(allocs):
        if i % 8:
            a.free()
        else:
            ctypes.memset(a.ptr, i, n)
            keep.append((i, a))
    r = host_pool.defrag()
    assert r["moved_allocations"] == 10 and r["pages_emptied"] == 10
    for i, a in keep:
        assert read(a.ptr, n) == bytes([i]) * n


def test_compaction_keeps_every_allocations_bytes(host_pool):
    """Movable allocations of mixed sizes (heap, large, stitched) filled with their own bytes,
    half freed at random, then the pool filled until a request fails even after compacting
    on the way, then defragmented: every allocation still holds its bytes at its (possibly
    new) address."""
    rng = np.random.default_rng(7)
    live = {}

    def pattern(j, n):  # differs from byte to byte, so a shifted copy shows
        return ((np.arange(n) + j) % 251).astype(np.uint8).tobytes()

    def make(k):
        n = int(2 ** rng.uniform(8, 21))  # 256 B to 2 MiB: heap, large and stitched
        try:
            a = host_pool.alloc(n, movable=True)
        except gpumm.OutOfMemoryError:
            return False
        ctypes.memmove(a.ptr, pattern(k, n), n)
        live[k] = (a, n)
        return True

    k = 0
    while host_pool.stats()["live_bytes"] < 40 * MiB:
        assert make(k)
        k += 1
    for j in rng.permutation(list(live))[: len(live) // 2]:
        live.pop(j)[0].free()
    kept = {j: a.ptr for j, (a, _) in live.items()}
    while make(k):  # fills the holes, then compacts on the way to out of memory
        k += 1
    assert sum(kept[j] != live[j][0].ptr for j in kept) > 0  # (those moved then)
    before = {j: a.ptr for j, (a, _) in live.items()}
    r = host_pool.defrag()
    assert sum(before[j] != a.ptr for j, (a, _) in live.items()) == len(r["moves"])
    for j, (a, n) in live.items():
        assert read(a.ptr, n) == pattern(j, n), f"allocation {j} lost its bytes"
    assert host_pool.stats()["live_bytes"] > 0.9 * 64 * MiB
    host_pool.validate()


def test_released_pages_give_memory_back():
    dev = gpumm.Device(backend="host", vidmem="64MiB")
    pool = gpumm.MemoryPool(dev)
    a = pool.alloc(32 * MiB)
    np.asarray(a)[:] = 1
    a.free()
    assert pool.trim() == 32 * MiB
    b = pool.alloc(32 * MiB)  # the punched pages read back as zeros
    assert read(b.ptr, 4096) == bytes(4096)


def test_batch_members_keep_their_bytes_through_every_free(host_pool):
    """A batch placed in one block is one block until a member is freed alone (then cut into
    one per member); its members' bytes stay theirs either way, a free_batch refused because
    one member is viewed frees nothing, and the page map lists every member."""
    sizes = [1000, 5000, 70_000, 300, 9000]
    ptrs = host_pool.alloc_batch(sizes)
    members = {a.ptr: a for a in host_pool.allocations()}
    for i, p in enumerate(ptrs):
        ctypes.memset(int(p), i + 1, sizes[i])
    owners = [owner for pg in host_pool.snapshot()["pages"] for _, _, owner in pg["blocks"]
              if owner is not None]
    assert list(dict.fromkeys(owners)) == [int(p) for p in ptrs]  # (a member may span pages)
    view = np.asarray(members[int(ptrs[2])])  # a live view pins the third member
    before = host_pool.stats()
    with pytest.raises(gpumm.InvalidStateError):
        host_pool.free_batch(ptrs)
    after = host_pool.stats()
    assert (after["live_allocs"], after["used_bytes"], after["frees"]) == (
        before["live_allocs"], before["used_bytes"], before["frees"])
    del view
    gc.collect()
    host_pool.free(int(ptrs[1]))  # one alone: the block is cut, the others keep their bytes
    reuse = host_pool.alloc(5000)
    ctypes.memset(reuse.ptr, 0xEE, 5000)
    for i in (0, 2, 3, 4):
        assert read(int(ptrs[i]), sizes[i]) == bytes([i + 1]) * sizes[i]
    reuse.free()
    host_pool.free_batch(ptrs[[0, 2, 3, 4]])
    assert host_pool.stats()["live_allocs"] == 0
    host_pool.validate()


EXIT_WITH_LIVE_VIEWS = r"""
import ctypes
import gc
import numpy as np
import gpumm

pool = gpumm.MemoryPool(gpumm.Device("h100", vidmem="64MiB", backend="host")).tracking()
a, b, c, d = (pool.alloc("1MiB", tag=t) for t in "abcd")
view = np.asarray(a)                  # buffer protocol
view[:] = 7
ctypes.memset(b.ptr, 9, b.size)
tensor = np.from_dlpack(b)            # a consumed DLPack capsule (read-only in numpy)
capsule = c.__dlpack__()              # a capsule nobody consumed
raw = memoryview(d)
ptr = a.ptr
del pool, a, b, c, d                  # the views alone keep the memory
gc.collect()
assert int(view.sum()) == 7 * len(view) and int(tensor.sum()) == 9 * len(tensor)
print("views", int(view[-1]), int(tensor[-1]))
"""


def test_exit_with_live_views_is_quiet(tmp_path):
    """An interpreter that ends while numpy views, DLPack tensors and capsules of host memory
    are alive (in module globals) exits 0 with nothing on stderr; the memory stays readable
    until then, the pool and the allocations themselves dropped."""
    import subprocess
    import sys

    script = tmp_path / "live_views.py"
    script.write_text(EXIT_WITH_LIVE_VIEWS)
    r = subprocess.run([sys.executable, "-X", "dev", str(script)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "views 7 9\n"
    assert r.stderr == ""
