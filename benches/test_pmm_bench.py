"""pytest-benchmark mirrors of benches/pmm.rs: the same scenarios through Python.

Run with ``pytest benches --benchmark-enable``. ``null_pair`` is two calls of a trivial
extension method in the same loop: subtract it to get the net cost of crossing into gpumm.
"""

import pytest

import gpumm

GiB = 1 << 30


def warm(size, kind):
    p = gpumm.Pmm(arch="hopper", vidmem=80 * GiB)
    keep = [p.alloc_chunk(size, kind) for _ in range(70)]  # as in pmm.rs: parent stays split
    return p, keep


@pytest.mark.parametrize("size, kind", [(64 << 10, "user"), (4 << 10, "user"), (256, "kernel")])
def test_pair(benchmark, size, kind):
    p, _keep = warm(size, kind)
    alloc, free = p.alloc_chunk, p.free

    def pair():
        free(alloc(size, kind))

    benchmark.group = "pmm pair"
    benchmark(pair)
    p.validate()


def test_null_pair(benchmark):
    """The loop's own cost: two calls of a trivial method of the extension."""
    p, _keep = warm(64 << 10, "user")
    num_roots = type(p).num_roots.__get__

    def pair():
        num_roots(p)
        num_roots(p)

    benchmark.group = "pmm pair"
    benchmark(pair)


def test_exhaust_80gib(benchmark):
    n = 80 * GiB // (64 << 10)

    def setup():
        return (gpumm.Pmm(arch="hopper", vidmem=80 * GiB),), {}

    def run(p):
        chunks = p.alloc_chunks(n, 64 << 10)
        p.free_chunks(chunks)

    benchmark.group = "pmm exhaust 80 GiB"
    benchmark.pedantic(run, setup=setup, rounds=3, iterations=1)
