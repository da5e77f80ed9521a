"""Every bad input to a pool gets its named error and leaves the pool unchanged."""

import numpy as np
import pytest

import gpumm
from gpumm.units import MiB


def state(pool):
    s = pool.stats()
    for k in ("failures", "success_rate", "latency_samples", "latency_mean_ns",
              "latency_p50_ns", "latency_p99_ns"):
        s.pop(k)
    return s, pool.snapshot()


def refused(pool, exc, fn, *args, match=None, **kw):
    before = state(pool)
    with pytest.raises(exc, match=match):
        fn(*args, **kw)
    assert state(pool) == before
    pool.validate()


@pytest.fixture
def busy(pool):
    pool.alloc(100)
    pool.alloc(3 * MiB)
    return pool


@pytest.mark.parametrize(
    "size, exc, match",
    [
        (0, gpumm.InvalidSizeError, "at least 1 byte"),
        (-1, gpumm.InvalidSizeError, "negative"),
        (-(2**70), gpumm.InvalidSizeError, "negative"),
        (2**70, gpumm.InvalidSizeError, "too large"),
        (65 * MiB, gpumm.InvalidSizeError, "larger than the pool can ever hold"),
        ("lots", gpumm.InvalidSizeError, "cannot read size"),
        ("-5MiB", gpumm.InvalidSizeError, "not negative"),
        (True, TypeError, "not bool"),
        (np.bool_(True), TypeError, "not bool"),
        (np.float32(3), TypeError, "not float32"),
        (np.int32(-4), gpumm.InvalidSizeError, "negative"),
        (1.5, TypeError, "not float"),
        (None, TypeError, "not NoneType"),
        ([1], TypeError, "not list"),
    ],
)
def test_bad_sizes(busy, size, exc, match):
    refused(busy, exc, busy.alloc, size, match=match)


def test_bad_streams(busy):
    refused(busy, TypeError, busy.alloc, 100, "s")
    refused(busy, OverflowError, busy.alloc, 100, -1)
    a = busy.alloc(100)
    refused(busy, TypeError, a.free, stream=True, match="not bool")
    refused(busy, TypeError, a.free, stream=-3, match="non-negative")


def test_double_free(busy):
    a = busy.alloc(1000)
    a.free()
    refused(busy, gpumm.InvalidFreeError, a.free, match="double free")
    refused(busy, gpumm.InvalidFreeError, busy.free, a, match="double free")
    refused(busy, gpumm.InvalidFreeError, busy.free, a.ptr, match="foreign pointer or double free")


def test_double_free_after_stream_free(busy):
    a = busy.alloc(1000)
    a.free(stream=3)
    refused(busy, gpumm.InvalidFreeError, a.free, match="already freed on stream 3")
    refused(busy, gpumm.InvalidFreeError, busy.free, a.ptr, match="already freed on stream 3")


def test_foreign_and_interior_pointers(busy, device):
    a = busy.alloc(4096)
    other = gpumm.MemoryPool(device).alloc(100)
    refused(busy, gpumm.InvalidFreeError, busy.free, other, match="another pool")
    refused(busy, gpumm.InvalidFreeError, busy.free, a.ptr + 256, match="interior pointer")
    refused(busy, gpumm.InvalidFreeError, busy.free, 0xdead0000, match="foreign pointer")
    refused(busy, gpumm.InvalidFreeError, busy.free, -1, match="not a pointer")
    refused(busy, TypeError, busy.free, "0x1000", match="Allocation or an int pointer")
    refused(busy, TypeError, busy.free, True, match="not bool")


def test_bad_batches(busy):
    refused(busy, gpumm.InvalidSizeError, busy.alloc_batch, np.array([100, 0]))
    refused(busy, gpumm.InvalidSizeError, busy.alloc_batch, np.array([100, -5]), match="negative")
    refused(busy, TypeError, busy.alloc_batch, np.array([1.0, 2.0]), match="int64/uint64")
    refused(busy, TypeError, busy.alloc_batch, "100", match="int64/uint64")
    refused(busy, gpumm.OutOfMemoryError, busy.alloc_batch, np.array([31 * MiB, 31 * MiB]))
    ptrs = busy.alloc_batch([1000, 2000])
    refused(busy, gpumm.InvalidFreeError, busy.free_batch, np.array([ptrs[0], ptrs[0]]),
            match="twice")
    refused(busy, gpumm.InvalidFreeError, busy.free_batch, np.array([ptrs[0], 12345], dtype=np.uint64))


def test_bad_fences(busy):
    refused(busy, gpumm.InvalidArgumentError, busy.complete, 99, match="never issued")
    refused(busy, gpumm.InvalidArgumentError, busy.complete, 0, match="never issued")
    refused(busy, OverflowError, busy.complete, -1)


def test_bad_pool_options(device):
    with pytest.raises(gpumm.InvalidSizeError, match="below the page size"):
        gpumm.MemoryPool(device, small_threshold="2MiB")
    with pytest.raises(gpumm.InvalidSizeError, match="above the pool's maximum"):
        gpumm.MemoryPool(device, size="8MiB", max_size="4MiB")
    with pytest.raises(gpumm.OutOfMemoryError, match="cannot reserve"):
        gpumm.MemoryPool(device, size="1GiB", max_size="2GiB")
    with pytest.raises(TypeError, match="gpumm.Device"):
        gpumm.MemoryPool(42)
    assert device.pmm.stats()["allocated_bytes"] == 0  # nothing leaked by the refusals


def test_views_pin_the_allocation(host_pool):
    a = host_pool.alloc(1000)
    v = memoryview(a)
    refused(host_pool, gpumm.InvalidStateError, a.free, match="live views")
    refused(host_pool, gpumm.InvalidStateError, host_pool.close, match="live views")
    v.release()
    a.free()


def test_simulated_memory_has_no_bytes(busy):
    a = busy.alloc(100)
    with pytest.raises(BufferError, match="simulated"):
        memoryview(a)
    with pytest.raises(BufferError, match="simulated"):
        a.__array_interface__
    with pytest.raises(BufferError, match="simulated"):
        np.from_dlpack(a)
    assert busy.snapshot()["allocations"][-1]["ptr"] == a.ptr


def test_pickle_of_an_allocation_is_refused(busy):
    import pickle

    with pytest.raises(TypeError):
        pickle.dumps(busy.alloc(100))
