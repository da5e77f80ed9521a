"""Every bad input gets a clear error and changes nothing."""

import pytest

import gpumm


def snapshot(p):
    return p.stats(), [(c.address, c.size, c.state) for c in p.allocated_chunks()]


def refused(p, exc, fn, *args, match=None, **kw):
    before = snapshot(p)
    with pytest.raises(exc, match=match):
        fn(*args, **kw)
    after = snapshot(p)
    # Counting a failed allocation is the one change a refused allocation makes.
    after[0]["counters"]["failed_allocs"] = before[0]["counters"]["failed_allocs"]
    assert after == before
    p.validate()


@pytest.fixture
def busy(pmm):
    pmm.alloc_chunk("64KiB")
    pmm.alloc_chunk("256", "kernel")
    return pmm


@pytest.mark.parametrize(
    "size, exc, match",
    [
        (0, gpumm.InvalidSizeError, "0 B is not one of them"),
        (-1, gpumm.InvalidSizeError, "negative"),
        (-(2**70), gpumm.InvalidSizeError, "negative"),
        (2**70, gpumm.InvalidSizeError, "too large"),
        (3000, gpumm.InvalidSizeError, "not one of them"),
        (256, gpumm.InvalidSizeError, "user chunks come in"),
        ("4MiB", gpumm.InvalidSizeError, "not one of them"),
        ("lots", gpumm.InvalidSizeError, "cannot read size"),
        ("-4KiB", gpumm.InvalidSizeError, "cannot read size"),
        (4096.0, TypeError, "float"),
        (True, TypeError, "bool"),
        (None, TypeError, "NoneType"),
        ([4096], TypeError, "list"),
    ],
)
def test_bad_sizes(busy, size, exc, match):
    refused(busy, exc, busy.alloc_chunk, size, match=match)
    refused(busy, exc, busy.alloc_chunks, 2, size, match=match)


def test_bad_types_and_flags(busy):
    refused(busy, gpumm.InvalidArgumentError, busy.alloc_chunk, 4096, "sysmem", match="unknown chunk type")
    refused(busy, TypeError, busy.alloc_chunk, 4096, 7)
    refused(busy, TypeError, busy.alloc_chunk, 4096, evict="yes")
    refused(busy, TypeError, busy.free, "0x1000")
    refused(busy, TypeError, busy.free, 4096)
    refused(busy, OverflowError, busy.alloc_chunks, -1, 4096)
    refused(busy, gpumm.OutOfMemoryError, busy.alloc_chunks, 10**6, 4096)


def test_double_free_and_split_parent(busy):
    c = busy.alloc_chunk("2MiB", "kernel")
    kids = busy.split(c)
    refused(busy, gpumm.InvalidFreeError, busy.free, c, match="split")
    busy.free(kids[1])
    refused(busy, gpumm.InvalidFreeError, busy.free, kids[1], match="double free")
    busy.free_chunks([kids[0]] + kids[2:])
    refused(busy, gpumm.InvalidFreeError, busy.free, kids[0], match="double free")
    assert isinstance(gpumm.InvalidFreeError("x"), ValueError)


def test_stale_and_foreign_chunks(busy):
    one_root = gpumm.Pmm(vidmem="2MiB")
    c = one_root.alloc_chunk("2MiB", "kernel")
    one_root.free(c)
    e = one_root.alloc_chunk("2MiB", "kernel")  # the same root, a new allocation
    assert e.address == c.address and e != c
    refused(one_root, gpumm.InvalidFreeError, one_root.free, c, match="stale")
    refused(one_root, gpumm.InvalidHandleError, one_root.unpin, c, match="stale")
    d = busy.alloc_chunk("64KiB", "kernel")
    other = gpumm.Pmm(vidmem="4MiB")
    foreign = other.alloc_chunk("64KiB")
    refused(busy, gpumm.InvalidFreeError, busy.free, foreign, match="another Pmm")
    refused(busy, gpumm.InvalidHandleError, busy.split, foreign, match="another Pmm")
    refused(busy, gpumm.InvalidFreeError, busy.free_chunks, [d, foreign])
    assert d.state == "allocated", "a refused batch free frees nothing"
    refused(busy, gpumm.InvalidFreeError, busy.free_chunks, [d, d], match="twice")
    e2 = busy.alloc_chunk("64KiB", "kernel")
    busy.free(e2)
    refused(busy, gpumm.InvalidFreeError, busy.free_chunks, [d, e2])
    assert d.state == "allocated"


def test_illegal_state_transitions(busy):
    k = busy.alloc_chunk("4KiB", "kernel")
    refused(busy, gpumm.InvalidStateError, busy.unpin, k, match="temp_pinned")
    refused(busy, gpumm.InvalidStateError, busy.mark_root_used, k)
    refused(busy, gpumm.InvalidStateError, busy.merge, k, match="split")
    refused(busy, gpumm.InvalidSizeError, busy.split, k, "64KiB")
    refused(busy, gpumm.InvalidSizeError, busy.split, k, "3KiB")
    u = busy.alloc_chunk("4KiB")
    refused(busy, gpumm.InvalidSizeError, busy.split, u, match="cannot split")


def test_bad_constructor_arguments():
    with pytest.raises(gpumm.InvalidSizeError, match="less than one"):
        gpumm.Pmm(vidmem="1MiB")
    with pytest.raises(gpumm.InvalidSizeError, match="negative"):
        gpumm.Pmm(vidmem=-2 * 1024 * 1024)
    with pytest.raises(gpumm.InvalidSizeError, match="multiple of 2 MiB"):
        gpumm._core.Pmm("3MiB", [2 * 1024 * 1024], [2 * 1024 * 1024])
    with pytest.raises(gpumm.InvalidSizeError):
        gpumm.Pmm(vidmem=0)
    with pytest.raises(gpumm.InvalidSizeError):
        gpumm.Pmm(vidmem="2TiB")
    with pytest.raises(gpumm.InvalidArgumentError):
        gpumm.Pmm(arch="fermi")
    with pytest.raises(TypeError):
        gpumm.Pmm(arch=5)
    with pytest.raises(gpumm.InvalidSizeError, match="2 MiB"):
        gpumm._core.Pmm("8MiB", [4096], [4096, 2 * 1024 * 1024])
    with pytest.raises(gpumm.InvalidSizeError, match="power of two"):
        gpumm._core.Pmm("8MiB", [3000, 2 * 1024 * 1024], [2 * 1024 * 1024])


def test_error_hierarchy():
    for cls in (gpumm.OutOfMemoryError, gpumm.InvalidSizeError, gpumm.InvalidFreeError,
                gpumm.InvalidStateError, gpumm.InvalidHandleError, gpumm.InvalidArgumentError):
        assert issubclass(cls, gpumm.GpummError)
    assert issubclass(gpumm.OutOfMemoryError, MemoryError)
    assert issubclass(gpumm.InvalidSizeError, ValueError)
