"""The CUDA backend and the framework hooks, against tests/fake_cuda/fake_cuda.c: a fake
driver over host memory (so every path runs without a GPU, and the bytes can be checked).
PyTorch, CuPy and Numba are stood in by small modules that record what gpumm asks of them."""

import ctypes
import os
import random
import shutil
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import pytest

import gpumm
from gpumm import _core
from gpumm.units import MiB

SRC = Path(__file__).parent / "fake_cuda" / "fake_cuda.c"


@pytest.fixture(scope="module")
def fake_driver(tmp_path_factory):
    if shutil.which("cc") is None:
        pytest.skip("no C compiler (cc) to build the fake CUDA driver")
    so = tmp_path_factory.mktemp("cuda") / "libcuda.so.1"
    subprocess.run(["cc", "-shared", "-fPIC", "-O1", "-o", str(so), str(SRC)], check=True)
    old = {k: os.environ.get(k) for k in ("GPUMM_LIBCUDA", "FAKE_CUDA_MEM", "FAKE_CUDA_EVENT_DELAY")}
    os.environ["GPUMM_LIBCUDA"] = str(so)
    os.environ["FAKE_CUDA_MEM"] = str(512 * MiB)
    os.environ["FAKE_CUDA_EVENT_DELAY"] = "3"  # an event is reached at its 4th query
    yield so
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture
def cuda_pool(fake_driver):
    pool = gpumm.MemoryPool(gpumm.Device(backend="cuda"), check=True)
    yield pool
    pool.close()


def test_device_from_the_driver(fake_driver):
    d = gpumm.Device(backend="cuda")
    assert d.name == "Fake NVIDIA H100 80GB HBM3" and d.arch.name == "hopper"
    assert d.capacity == 512 * MiB and d.backend.name == "cuda"
    info = d.backend.device_info
    assert info["compute_capability"] == (9, 0) and info["granularity"] == 2 * MiB
    assert gpumm.Device(backend="cuda", vidmem="128MiB").capacity == 128 * MiB


def test_allocations_are_device_memory(cuda_pool):
    held = [cuda_pool.alloc(2 * MiB) for _ in range(8)]
    for a in held[::2]:
        a.free()
    big = cuda_pool.alloc(7 * MiB)  # stitched from four scattered chunks
    assert cuda_pool.stats()["stitched"] == 1
    ctypes.memset(big.ptr, 0x5A, big.size)  # the fake's device memory is host memory
    assert ctypes.string_at(big.ptr + 7 * MiB - 4, 4) == b"\x5a" * 4
    cai = big.__cuda_array_interface__
    assert cai["data"] == (big.ptr, False) and cai["shape"] == (7 * MiB,) and cai["version"] == 3
    assert big.__dlpack_device__() == (2, 0)
    cap = big.__dlpack__()
    with pytest.raises(gpumm.InvalidStateError):
        big.free()  # exported
    del cap
    with pytest.raises(BufferError, match="GPU memory"):
        memoryview(big)
    big.free()


def test_defrag_and_scrub_use_the_driver(fake_driver):
    pool = gpumm.MemoryPool(gpumm.Device(backend="cuda"), scrub=True)
    allocs = [pool.alloc(64 * 1024, movable=True) for _ in range(64)]
    for i, a in enumerate(allocs):
        if i % 8:
            a.free()
        else:
            ctypes.memset(a.ptr, i, a.size)
    r = pool.defrag()  # cuMemcpy moves the bytes
    assert r["moved_allocations"] > 0
    for i, a in enumerate(allocs[::8]):
        assert ctypes.string_at(a.ptr, 16) == bytes([i * 8]) * 16
    ptr = allocs[0].ptr
    allocs[0].free()  # scrubbed with cuMemsetD8
    again = pool.alloc(64 * 1024)
    if again.ptr == ptr:
        assert ctypes.string_at(ptr, 16) == bytes(16)
    pool.close()


def test_defrag_slides_large_allocations_in_disjoint_copies(fake_driver):
    # 1 MiB and 3 MiB allocations in turn, the 1 MiB ones freed: each 3 MiB one slides down
    # by 1 MiB over itself, which the driver cannot copy in one call (the fake refuses
    # overlapping copies, as the real one leaves them undefined)
    pool = gpumm.MemoryPool(gpumm.Device(backend="cuda"), check=True)
    made = [pool.alloc(MiB if i % 2 == 0 else 3 * MiB, movable=True) for i in range(8)]
    kept = made[1::2]
    for a in made[0::2]:
        a.free()
    for i, a in enumerate(kept):
        ctypes.memset(a.ptr, 0x10 + i, a.size)
    before = [a.ptr for a in kept]
    r = pool.defrag()
    assert r["moved_allocations"] == len(kept)
    for i, a in enumerate(kept):
        assert a.ptr == before[i] - MiB
        assert ctypes.string_at(a.ptr, 4) == bytes([0x10 + i]) * 4
        assert ctypes.string_at(a.ptr + a.size - 4, 4) == bytes([0x10 + i]) * 4
    pool.close()


def test_stream_ordered_free_waits_for_the_cuda_event(fake_driver):
    lib = ctypes.CDLL(str(fake_driver))
    lib.fake_cuda_events_live.restype = ctypes.c_long
    before = lib.fake_cuda_events_live()
    pool = gpumm.MemoryPool(gpumm.Device(backend="cuda"), max_size="8MiB", check=True)
    a = pool.alloc(8 * MiB, stream=7)
    fence = a.free(stream=7)  # records an event on stream 7
    assert lib.fake_cuda_events_live() == before + 1
    failed = 0
    while True:
        try:
            b = pool.alloc(8 * MiB, stream=8)  # another stream: must wait for the event
            break
        except gpumm.OutOfMemoryError:
            failed += 1
            assert failed < 10
    # The event answers "not ready" three times; each failed alloc asked it at least once, and
    # the memory came back only once the event said "done" (how many queries one alloc makes is
    # the pool's business).
    assert 1 <= failed <= 3 and b.ptr == a.ptr
    assert lib.fake_cuda_events_live() == before + 1  # reached: kept for the next free
    assert pool.complete(fence) == 0  # already completed by the event
    b.free(stream=8)
    assert pool.stats()["pending_frees"] == 1
    assert lib.fake_cuda_events_live() == before + 1  # the spare event was reused
    for _ in range(4):
        pool.poll()
    assert pool.stats()["pending_frees"] == 0
    pool.close()


def test_pinned_host_pool(fake_driver):
    np = pytest.importorskip("numpy")
    lib = ctypes.CDLL(str(fake_driver))
    lib.fake_cuda_registered_bytes.restype = ctypes.c_uint64
    before = lib.fake_cuda_registered_bytes()
    dev = gpumm.Device(backend="pinned", vidmem="64MiB")
    assert dev.backend.name == "pinned" and dev.backend.has_bytes
    pool = gpumm.MemoryPool(dev, check=True)
    assert pool.page_size == 2 * MiB  # one registration per 2 MiB page
    held = [pool.alloc(2 * MiB) for _ in range(8)]
    assert lib.fake_cuda_registered_bytes() - before == pool.stats()["reserved_bytes"] == 16 * MiB
    for a in held[::2]:
        a.free()
    big = pool.alloc(7 * MiB)  # stitched: its window is registered as well
    assert pool.stats()["stitched"] == 1
    assert lib.fake_cuda_registered_bytes() - before == pool.stats()["reserved_bytes"] + 8 * MiB
    view = np.asarray(big)  # host memory: readable and writable from Python
    view[:] = 5
    assert int(view.sum()) == 5 * 7 * MiB
    assert big.__dlpack_device__() == (3, 0)  # kDLCUDAHost
    del view
    big.free()
    st = pool.stats()
    assert st["allocs"] == 9 and st["frees"] == 5 and st["live_allocs"] == 4
    assert lib.fake_cuda_registered_bytes() - before == st["reserved_bytes"]
    for a in held[1::2]:
        a.free()
    pool.trim()
    assert lib.fake_cuda_registered_bytes() == before
    pool.close()
    with pytest.raises(gpumm.GpummError):
        _core.Backend("pinned", 64 * MiB, granularity=4096)


def _c_functions():
    lib = ctypes.CDLL(gpumm.integrations.library_path())
    lib.gpumm_torch_alloc.restype = ctypes.c_void_p
    lib.gpumm_torch_alloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    lib.gpumm_torch_free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    return lib


def test_pluggable_allocator_c_functions(cuda_pool):
    lib = _c_functions()
    _core._set_c_pool(None)
    assert lib.gpumm_torch_alloc(1024, 0, None) is None  # no pool chosen: null
    _core._set_c_pool(cuda_pool)
    try:
        p = lib.gpumm_torch_alloc(3 * MiB, 0, ctypes.c_void_p(7))
        assert p and cuda_pool.stats()["live_allocs"] == 1
        ctypes.memset(p, 1, 3 * MiB)
        assert lib.gpumm_torch_alloc(-5, 0, None) is None
        lib.gpumm_torch_free(p, 3 * MiB, 0, None)
        lib.gpumm_torch_free(12345, 1, 0, None)  # a foreign pointer is ignored, not a crash
        # stream-ordered: freed behind an event on PyTorch's stream, not at once
        assert cuda_pool.stats()["live_allocs"] == 0 and cuda_pool.stats()["pending_frees"] == 1
    finally:
        _core._set_c_pool(None)


def test_c_functions_and_python_threads_share_a_pool(cuda_pool):
    """Once the C functions may use a pool (``_set_c_pool``), Python's calls on it take its
    lock too, not the GIL alone (rust/bindings/pool.rs, ``Core``). Three threads allocate
    through the C functions (ctypes calls them without the GIL) and three through Python, at
    once, each on its own stream: every allocation keeps its thread's bytes, and the pool is
    sound after."""
    lib = _c_functions()
    errors = []
    stop = time.monotonic() + 1.0

    def worker(seed, through_c):
        rng = random.Random(seed)
        stream = ctypes.c_void_p(seed)
        mine = []

        def release(entry):
            p, n, a = entry
            k = min(n, 64)
            if ctypes.string_at(p, k) != bytes([seed]) * k:
                errors.append(f"thread {seed}: {p:#x} was overwritten")
            if through_c:
                lib.gpumm_torch_free(p, n, 0, stream)
            else:
                a.free()

        try:
            while time.monotonic() < stop:
                if len(mine) < 12 and rng.random() < 0.55:
                    n = rng.randrange(1, 3 * MiB)
                    if through_c:
                        p, a = lib.gpumm_torch_alloc(n, 0, stream), None
                        if not p:
                            continue
                    else:
                        try:
                            a = cuda_pool.alloc(n, seed)
                        except gpumm.OutOfMemoryError:
                            continue
                        p = a.ptr
                    ctypes.memset(p, seed, min(n, 64))
                    mine.append((p, n, a))
                elif mine:
                    release(mine.pop(rng.randrange(len(mine))))
            for entry in mine:
                release(entry)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(f"thread {seed}: {e!r}")

    _core._set_c_pool(cuda_pool)
    try:
        threads = [threading.Thread(target=worker, args=(i + 1, i % 2 == 0)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        _core._set_c_pool(None)
    assert not errors, errors[:5]
    cuda_pool.synchronize()
    cuda_pool.validate()
    s = cuda_pool.stats()
    assert s["live_allocs"] == 0 and s["allocs"] > 100, s["allocs"]


def test_one_stream_frees_at_once(cuda_pool):
    """While every request is on one stream, a free on it needs no event: what reuses the
    memory is queued after the work that used it (as in PyTorch's own allocator)."""
    lib = _c_functions()
    _core._set_c_pool(cuda_pool)
    try:
        s = ctypes.c_void_p(5)
        p = lib.gpumm_torch_alloc(3 * MiB, 0, s)
        lib.gpumm_torch_free(p, 3 * MiB, 0, s)
        assert cuda_pool.stats()["pending_frees"] == 0
        assert lib.gpumm_torch_alloc(MiB, 0, s) == p  # reused at once, any size
    finally:
        _core._set_c_pool(None)


def test_torch_hook(cuda_pool, monkeypatch):
    calls = {}
    torch = types.ModuleType("torch")

    class Pluggable:
        def __init__(self, path, alloc, free):
            calls["args"] = (path, alloc, free)

    torch.cuda = types.SimpleNamespace(
        is_initialized=lambda: calls.get("initialized", False),
        memory=types.SimpleNamespace(CUDAPluggableAllocator=Pluggable,
                                     change_current_allocator=lambda a: calls.setdefault("set", a)))
    monkeypatch.setitem(sys.modules, "torch", torch)
    from gpumm.integrations import torch as hook

    a = hook.use(cuda_pool)
    assert calls["args"] == (gpumm.integrations.library_path(), "gpumm_torch_alloc", "gpumm_torch_free")
    assert calls["set"] is a
    lib = _c_functions()
    p = lib.gpumm_torch_alloc(4096, 0, None)  # what PyTorch would call
    assert p and cuda_pool.stats()["live_allocs"] == 1
    lib.gpumm_torch_free(p, 4096, 0, None)
    hook.release()
    calls["initialized"] = True
    with pytest.raises(gpumm.InvalidStateError, match="before the first CUDA tensor"):
        hook.use(cuda_pool)


def test_cupy_and_pytorch_share_one_pool(cuda_pool, monkeypatch):
    made = []
    cupy = types.ModuleType("cupy")

    class UnownedMemory:
        def __init__(self, ptr, size, owner, device_id):
            self.ptr, self.size, self.owner, self.device_id = ptr, size, owner, device_id

    class MemoryPointer:
        def __init__(self, mem, offset):
            self.mem, self.ptr = mem, mem.ptr + offset
            made.append(self)

    cupy.cuda = types.SimpleNamespace(
        get_current_stream=lambda: types.SimpleNamespace(ptr=3),
        UnownedMemory=UnownedMemory, MemoryPointer=MemoryPointer,
        Device=lambda: types.SimpleNamespace(id=0),
        set_allocator=lambda f: made.append(("allocator", f)))
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    from gpumm.integrations import cupy as hook

    hook.use(cuda_pool)
    malloc = made.pop()[1]
    _core._set_c_pool(cuda_pool)
    lib = _c_functions()
    held = lib.gpumm_torch_alloc(MiB, 0, None)  # PyTorch works on stream 0, CuPy on stream 3
    m = malloc(5 * MiB)
    assert cuda_pool.stats()["live_bytes"] == 6 * MiB and m.mem.owner.allocation.stream == 3
    ptr = m.ptr
    del m, made[:]  # CuPy drops it: the pool gets it back
    import gc

    gc.collect()
    assert cuda_pool.stats()["live_allocs"] == 1  # PyTorch's
    # CuPy's kernels on stream 3 may still be running: the free waits for an event there
    assert cuda_pool.stats()["pending_frees"] == 1
    for _ in range(4):
        cuda_pool.poll()
    assert cuda_pool.stats()["pending_frees"] == 0
    # PyTorch (the C functions) reuses what CuPy freed
    try:
        p = lib.gpumm_torch_alloc(5 * MiB, 0, None)
        assert p == ptr
        lib.gpumm_torch_free(p, 5 * MiB, 0, None)
        lib.gpumm_torch_free(held, MiB, 0, None)
    finally:
        _core._set_c_pool(None)


def test_numba_hook(cuda_pool, monkeypatch):
    numba = types.ModuleType("numba")

    class HostOnly:
        def __init__(self, context=None):
            self.context = context

    class MemoryPointer:
        def __init__(self, context, pointer, size, finalizer=None):
            self.pointer, self.size, self.finalizer = pointer, size, finalizer

    numba.cuda = types.SimpleNamespace(
        HostOnlyCUDAMemoryManager=HostOnly, MemoryPointer=MemoryPointer,
        MemoryInfo=lambda free, total: (free, total),
        set_memory_manager=lambda cls: setattr(numba, "manager", cls))
    monkeypatch.setitem(sys.modules, "numba", numba)
    from gpumm.integrations import numba as hook

    hook.use(cuda_pool)
    mgr = numba.manager(context="ctx")
    assert mgr.interface_version == 1
    mp = mgr.memalloc(1000)
    assert mp.pointer.value and cuda_pool.stats()["live_allocs"] == 1
    mp.finalizer()
    assert cuda_pool.stats()["live_allocs"] == 0
    free, total = mgr.get_memory_info()
    assert total == cuda_pool.device.capacity and 0 < free <= total
    with pytest.raises(gpumm.InvalidStateError, match="IPC"):
        mgr.get_ipc_handle(mp)


def test_no_driver_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("GPUMM_LIBCUDA", "/nonexistent/libcuda.so.1")
    with pytest.raises(gpumm.InvalidStateError, match="no CUDA driver"):
        gpumm.Device(backend="cuda")
    with pytest.raises(gpumm.InvalidStateError, match="no CUDA driver"):
        gpumm.Device(backend="pinned")


def test_arch_from_compute_capability():
    from gpumm.arch import arch_for_compute_capability as a

    assert [a(cc).name for cc in [(6, 0), (7, 0), (7, 5), (8, 0), (8, 9), (9, 0), (10, 0)]] == [
        "pascal", "volta", "turing", "ampere", "ada", "hopper", "blackwell"]
    with pytest.raises(gpumm.InvalidArgumentError):
        a((3, 5))
