"""The PMM through Python: the driver's patterns, states, LRU lists and eviction."""

import pytest

import gpumm
from gpumm.units import KiB, MiB


def assert_all_free(p: gpumm.Pmm) -> None:
    p.validate()
    s = p.stats()
    assert s["allocated_bytes"] == 0
    assert s["roots_pma_owned"] + s["roots_free"] == s["num_roots"]
    assert p.allocated_chunks() == []


def test_constructor_reads_the_architecture_table():
    p = gpumm.Pmm(arch="maxwell", vidmem="64MiB")
    assert p.user_sizes == [4 * KiB, 64 * KiB, 128 * KiB, 2 * MiB]
    assert p.arch.name == "maxwell"
    assert p.num_roots == 32
    h = gpumm.Pmm(device="h100")
    assert h.vidmem == gpumm.arch.get_device("h100").vidmem
    assert h.kernel_sizes == [256, 4 * KiB, 64 * KiB, 2 * MiB]
    big = gpumm.Pmm(vidmem="1TiB")
    assert big.num_roots == 512 * 1024
    decimal = gpumm.Pmm(vidmem="80GB")  # whole root chunks only
    assert decimal.num_roots == 80_000_000_000 // (2 * MiB)


@pytest.mark.parametrize("arch", list(gpumm.arch.ARCHES))
def test_every_size_of_every_arch(arch):
    p = gpumm.Pmm(arch=arch, vidmem="8MiB", check=True)
    for kind, sizes in (("user", p.user_sizes), ("kernel", p.kernel_sizes)):
        held = []
        for size in sizes + sizes[::-1]:
            c = p.alloc_chunk(size, kind)
            assert c.size == size and c.address % size == 0 and c.type == kind
            assert c.state == ("temp_pinned" if kind == "user" else "allocated")
            held.append(c)
        for c in held:
            p.free(c)
            assert c.state in ("free", "freed")  # "freed" once merged away
    assert_all_free(p)


def test_exhaustion_then_free_every_third(pmm):
    chunks = pmm.alloc_chunks(16 * MiB // (64 * KiB), "64KiB")
    addrs = {c.address for c in chunks}
    assert len(addrs) == len(chunks)
    with pytest.raises(gpumm.OutOfMemoryError) as e:
        pmm.alloc_chunk("4KiB")
    assert isinstance(e.value, MemoryError)
    assert "largest free chunk" in str(e.value)
    for c in chunks[::3] + [c for i, c in enumerate(chunks) if i % 3]:
        pmm.free(c)
    assert_all_free(pmm)


def test_split_merge_and_unpin(pmm):
    root = pmm.alloc_chunk("2MiB")
    pmm.unpin(root)
    assert root.state == "allocated"
    kids = pmm.split(root)
    assert [k.address for k in kids] == [root.address + i * 64 * KiB for i in range(32)]
    assert root.state == "is_split"
    pmm.merge(root)
    assert root.state == "allocated"
    leaves = pmm.split(root, "4KiB")
    assert len(leaves) == 512
    pmm.free_chunks(leaves)
    assert_all_free(pmm)


def test_zeroed_chunks_and_stats(pmm):
    c = pmm.alloc_chunk("64KiB")
    assert c.is_zero
    s = pmm.stats()
    assert s["chunks"]["user"][64 * KiB] == {"free": 31, "is_split": 0, "temp_pinned": 1, "allocated": 0}
    assert s["reserved_bytes"] == 2 * MiB
    assert s["free_bytes_by_size"] == {64 * KiB: 31 * 64 * KiB}
    assert s["largest_free_chunk"] == 64 * KiB
    assert s["pinned_chunks"] == 1
    pmm.free(c)
    d = pmm.alloc_chunk("2MiB")
    assert d.address == c.address
    assert not d.is_zero, "a freed chunk is no longer known to be zero"
    assert pmm.stats()["counters"]["merges"] == 1


def test_release_free_roots():
    p = gpumm.Pmm(vidmem="8MiB", release_free_roots=True)
    c = p.alloc_chunk("4KiB")
    assert p.stats()["roots_pma_owned"] == 3
    p.free(c)
    assert p.stats()["roots_pma_owned"] == 4
    q = gpumm.Pmm(vidmem="8MiB")
    q.free_chunks(q.alloc_chunks(4, "2MiB", "kernel"))
    assert q.release_free_roots() == 4


def _unpinned_roots(p, n):
    firsts = []
    for _ in range(n):
        kids = p.split(p.alloc_chunk("2MiB"))
        for k in kids:
            p.unpin(k)
        firsts.append(kids[0])
    return firsts


def test_lru_lists_and_eviction(pmm):
    a, b, c = _unpinned_roots(pmm, 3)
    assert pmm.stats()["root_lists"] == {"unused": 0, "discarded": 0, "used": 3}
    pmm.mark_root_discarded(b)
    pmm.mark_root_unused(c)
    ev = pmm.evict_root()
    assert ev.root_address == c.address and len(ev.chunks) == 32
    assert all(x.state == "freed" for x in ev.chunks)
    hold = pmm.alloc_chunks(6, "2MiB", "kernel")  # takes the free root and the 5 untouched
    assert pmm.evict_root().root_address == b.address
    pmm.alloc_chunk("2MiB", "kernel")
    ev = pmm.begin_eviction()
    assert ev.root_address == a.address
    assert pmm.stats()["roots_in_eviction"] == 1
    with pytest.raises(gpumm.OutOfMemoryError):
        pmm.begin_eviction()
    pmm.end_eviction(ev)
    with pytest.raises(gpumm.InvalidStateError):
        pmm.end_eviction(ev)
    assert pmm.stats()["counters"]["evictions"] == 3
    pmm.free_chunks(hold)


def test_alloc_with_evict(pmm):
    _unpinned_roots(pmm, 8)
    with pytest.raises(gpumm.OutOfMemoryError):
        pmm.alloc_chunk("64KiB")
    c = pmm.alloc_chunk("64KiB", evict=True)
    evicted = pmm.take_evicted()
    assert len(evicted) == 32 and c.state == "temp_pinned"
    assert pmm.take_evicted() == []


def test_chunk_identity(pmm):
    c = pmm.alloc_chunk("4KiB")
    same = pmm.allocated_chunks()[0]
    assert c == same and hash(c) == hash(same)
    assert c != pmm.alloc_chunk("4KiB")
    assert "4 KiB" in repr(c) and "temp_pinned" in repr(c)
    assert "gpumm.Pmm" in repr(pmm)


def test_units():
    assert gpumm.parse_size("80GB") == 80_000_000_000
    assert gpumm.parse_size("1.5KiB") == 1536
    assert gpumm.parse_size(4096) == 4096
    assert gpumm.format_size(3 * MiB) == "3 MiB"


def test_arch_and_device_tables():
    a = gpumm.arch.get_arch("Hopper")
    assert a.va_bits == 57 and a.page_table_levels == 6 and a.big_page_size == 64 * KiB
    assert gpumm.arch.get_arch("maxwell").va_bits == 40
    assert 256 * 1024**3 in gpumm.arch.get_arch("blackwell").page_sizes
    assert not gpumm.arch.get_arch("maxwell").replayable_faults
    assert gpumm.arch.get_arch("pascal").replayable_faults
    assert not gpumm.arch.get_arch("pascal").access_counters
    assert gpumm.arch.get_arch("volta").access_counters
    for name in ("p100", "v100", "t4", "a100-40", "a100-80", "l40s", "h100", "h200", "gh200", "b200"):
        d = gpumm.arch.get_device(name)
        assert d.vidmem % (2 * MiB) == 0 and d.vidmem > 10 * 1024**3
        assert d.link.bandwidth > 1e10 and d.memory_bandwidth > 1e11
    assert gpumm.arch.get_device("gh200").link.name == "NVLink-C2C"
    with pytest.raises(gpumm.InvalidArgumentError, match="known: maxwell"):
        gpumm.arch.get_arch("kepler")
    with pytest.raises(gpumm.InvalidArgumentError, match="h100"):
        gpumm.arch.get_device("x999")
