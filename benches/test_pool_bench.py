"""pytest-benchmark mirrors of benches/pool.rs: the same streams through Python.

Run with ``pytest benches --benchmark-enable``. ``null_pair`` is the same loop calling two
trivial extension methods: subtract it to get the net cost of a pair through gpumm.
"""

import itertools

import numpy as np
import pytest

import gpumm

GiB = 1 << 30
LIVE = 2048


def sizes(n, seed, lo=8.0, hi=26.0):
    """Log-uniform sizes from 2**lo to 2**hi bytes (256 B to 64 MiB by default)."""
    rng = np.random.default_rng(seed)
    return (2.0 ** rng.uniform(lo, hi, n)).astype(np.int64)


def churn_pool():
    pool = gpumm.MemoryPool(gpumm.Device(vidmem=80 * GiB))
    live = [pool.alloc(int(s)) for s in sizes(LIVE, 1)]
    stream = sizes(1 << 16, 2).tolist()
    slots = np.random.default_rng(3).integers(0, LIVE // 2, 1 << 16).tolist()
    return pool, live, stream, slots


@pytest.mark.parametrize("kind", ["mixed"])
def test_churn_pair(benchmark, kind):
    """One alloc + free of the mixed churn: free a random allocation of the churning half,
    allocate a new log-uniform size in its place."""
    pool, live, stream, slots = churn_pool()
    steps = itertools.cycle(zip(slots, stream))
    alloc = pool.alloc

    def pair():
        slot, size = next(steps)
        live[slot].free()
        live[slot] = alloc(size)

    # Steady state, as criterion's warm-up gives the Rust row and the peer bench does: one
    # untimed pass over the stream (the pool grows as it needs during it; timed, its growth
    # made the median move between 470 and 850 ns from run to run).
    for _ in range(len(stream)):
        pair()
    benchmark.group = "pool pair"
    # 100 pairs a round: the timer's own cost and jitter, larger than a pair, are shared out
    benchmark.pedantic(pair, rounds=400, iterations=100, warmup_rounds=2)
    pool.validate()


def test_null_pair(benchmark):
    """The loop's own cost: the same iteration with two trivial C calls (``len``, as the peer
    bench's null loop), not an ``Allocation``'s ``size`` getter: the getter goes through its
    descriptor's ``__get__``, a slot wrapper that costs more than a C function, and a null
    loop of getters costs nearly what gpumm's pair does (245.6 against 256.8 ns a pair)."""
    pool, live, stream, slots = churn_pool()
    steps = itertools.cycle(zip(slots, stream))
    nop = len

    def pair():
        slot, size = next(steps)
        nop(live)
        live[slot] = nop(live) and live[slot]

    benchmark.group = "pool pair"
    # 100 pairs a round: the timer's own cost and jitter, larger than a pair, are shared out
    benchmark.pedantic(pair, rounds=400, iterations=100, warmup_rounds=2)


@pytest.mark.parametrize("arena", [False, True], ids=["batch", "arena"])
def test_batch_pairs(benchmark, arena):
    """1024 mixed sizes through alloc_batch then free_batch (divide by 1024 for a pair); with
    ``arena=True``, one placement for the 1024."""
    pool = gpumm.MemoryPool(gpumm.Device(vidmem=80 * GiB))
    keep = [pool.alloc(int(s)) for s in sizes(1024, 4)]
    batch = sizes(1024, 5)

    def run():
        pool.free_batch(pool.alloc_batch(batch, arena=arena))

    benchmark.group = "pool batch of 1024"
    benchmark(run)
    assert pool.stats()["live_allocs"] == len(keep)
