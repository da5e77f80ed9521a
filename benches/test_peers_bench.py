"""gpumm against Python allocators people use, on the same churn stream (issue 7): PyPI's
``tlsfallocator`` (OffsetAllocator, pybind11) and ``virtual-allocator`` (pure Python, best
fit), a plain-Python best fit (a sorted free list with bisect) as a floor, and a null loop to
subtract. Run with ``pytest benches/test_peers_bench.py --benchmark-enable``; ratios:
``python benches/compare.py``. A peer that cannot be installed is skipped with the reason."""

import bisect
import itertools

import numpy as np
import pytest

import gpumm

GiB = 1 << 30
LIVE = 2048
UNIT = 256
ROUNDS = 400
ITERATIONS = 100


def stream():
    rng = np.random.default_rng(1)
    sizes = (2.0 ** rng.uniform(8, 26, LIVE + (1 << 16))).astype(np.int64).tolist()
    slots = np.random.default_rng(3).integers(0, LIVE // 2, 1 << 16).tolist()
    return sizes[:LIVE], list(zip(slots, sizes[LIVE:]))


class BestFit:
    """A plain-Python coalescing best fit: free blocks in a list sorted by (size, offset)."""

    def __init__(self, size):
        self.free_by_size = [(size, 0)]
        self.free_by_off = {0: size}
        self.end = {size: 0}

    def allocate(self, size):
        size = -(-size // UNIT) * UNIT
        i = bisect.bisect_left(self.free_by_size, (size, -1))
        if i == len(self.free_by_size):
            raise MemoryError
        length, off = self.free_by_size.pop(i)
        del self.free_by_off[off]
        del self.end[off + length]
        if length > size:
            self._add(off + size, length - size)
        return (off, size)

    def _add(self, off, length):
        bisect.insort(self.free_by_size, (length, off))
        self.free_by_off[off] = length
        self.end[off + length] = off

    def _remove(self, off):
        length = self.free_by_off.pop(off)
        del self.end[off + length]
        self.free_by_size.pop(bisect.bisect_left(self.free_by_size, (length, off)))
        return length

    def free(self, a):
        off, length = a
        if off + length in self.free_by_off:
            length += self._remove(off + length)
        if off in self.end:
            prev = self.end[off]
            length += self._remove(prev)
            off = prev
        self._add(off, length)


def peers():
    out = {"gpumm": None, "best-fit (Python)": None}
    try:
        import TLSFAllocator

        out["tlsfallocator"] = TLSFAllocator
    except ImportError as e:
        out["tlsfallocator"] = pytest.param(None, marks=pytest.mark.skip(reason=f"tlsfallocator: {e}"))
    try:
        import virtual_allocator

        out["virtual-allocator"] = virtual_allocator
    except ImportError as e:
        out["virtual-allocator"] = pytest.param(None, marks=pytest.mark.skip(reason=f"virtual-allocator: {e}"))
    return out


def make(name):
    """(alloc, free, keep, arg) for a peer over 80 GiB: ``alloc`` and ``free`` are the
    allocator's own calls (bound methods, no wrapper), and ``arg`` turns a byte size into what
    ``alloc`` takes, applied to the whole stream before timing, so every peer's pair is the
    same loop around two direct calls."""
    if name == "gpumm":
        pool = gpumm.MemoryPool(gpumm.Device(vidmem=80 * GiB))
        return pool.alloc, gpumm.Allocation.free, pool, int
    if name == "tlsfallocator":
        import TLSFAllocator

        a = TLSFAllocator.OffsetAllocator(80 * GiB // UNIT, 128 * 1024)
        return a.allocate, a.free, a, lambda s: -(-s // UNIT)
    if name == "virtual-allocator":
        import virtual_allocator as v

        a = v.Allocator(0, 80 * GiB, UNIT, UNIT, v.AllocationPolicy.BEST_FIT)
        return a.allocate, a.free, a, lambda s: -(-s // UNIT) * UNIT
    bf = BestFit(80 * GiB)
    return bf.allocate, bf.free, bf, int


NAMES = list(peers())


@pytest.mark.parametrize("name", NAMES)
def test_churn(benchmark, name):
    """One alloc + free pair of the mixed churn (log-uniform 256 B – 64 MiB, half the live set
    churning), through each allocator."""
    alloc, free, keep, arg = make(name)
    first, steps = stream()
    live = [alloc(arg(s)) for s in first]
    steps = [(slot, arg(size)) for slot, size in steps]
    it = itertools.cycle(steps)

    def pair():
        slot, size = next(it)
        free(live[slot])
        live[slot] = alloc(size)

    benchmark.group = "peers churn"
    benchmark.extra_info["allocator"] = name
    # ITERATIONS pairs a round: the timer's own cost and jitter, which dwarfed a single
    # pair, are shared out (the same for every allocator and for the null loop)
    benchmark.pedantic(pair, rounds=20 if name == "virtual-allocator" else ROUNDS,
                       iterations=ITERATIONS, warmup_rounds=2)
    assert keep is not None


def test_churn_null(benchmark):
    """The loop's own cost: the same iteration with two trivial calls."""
    first, steps = stream()
    live = list(first)
    it = itertools.cycle(steps)
    nop = len

    def pair():
        slot, size = next(it)
        nop(live)
        live[slot] = nop(live) and size

    benchmark.group = "peers churn"
    benchmark.extra_info["allocator"] = "null"
    benchmark.pedantic(pair, rounds=ROUNDS, iterations=ITERATIONS, warmup_rounds=2)


@pytest.mark.parametrize("arena", [False, True], ids=["batch", "arena"])
def test_churn_batch(benchmark, arena):
    """gpumm's alloc_batch + free_batch of 1024 mixed sizes (divide by 1024 for a pair); with
    ``arena=True``, one placement for the 1024."""
    pool = gpumm.MemoryPool(gpumm.Device(vidmem=80 * GiB))
    first, steps = stream()
    keep = pool.alloc_batch(np.array(first[: LIVE // 2]))
    batch = np.array([s for _, s in steps[:1024]])

    def run():
        pool.free_batch(pool.alloc_batch(batch, arena=arena))

    benchmark.group = "peers batch"
    benchmark.extra_info["allocator"] = f"gpumm alloc_batch{' arena' if arena else ''} (1024)"
    benchmark(run)
    assert len(keep) == LIVE // 2
