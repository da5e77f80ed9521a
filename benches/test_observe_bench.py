"""The cost of leak tracking: the same alloc + free pair with tracking off and on (each
tracked allocation records its stack)."""

import pytest

import gpumm


@pytest.mark.parametrize("tracking", [False, True])
def test_pair_with_tracking(benchmark, tracking):
    pool = gpumm.MemoryPool(gpumm.Device(vidmem="1GiB"))
    keep = [pool.alloc(4096) for _ in range(64)]
    pool.tracking(tracking)
    alloc = pool.alloc

    def pair():
        alloc(4096).free()

    benchmark.group = "tracking"
    benchmark(pair)
    assert len(keep) == 64
