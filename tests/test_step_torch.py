"""The step API from the PyTorch hook (``gpumm.integrations.torch.step()``), against the fake
CUDA driver of tests/fake_cuda (as tests/test_cuda.py does): PyTorch is stood in by a small
module, and its calls are the C functions it would make (``gpumm_torch_alloc`` /
``gpumm_torch_free``), with the bytes of every tensor checked."""

import ctypes
import sys
import types

import pytest

import gpumm
from gpumm.units import KiB, MiB
from test_cuda import _c_functions, cuda_pool, fake_driver  # noqa: F401 - fixtures


@pytest.fixture
def hook(cuda_pool, monkeypatch):  # noqa: F811 - the fixture imported above
    torch = types.ModuleType("torch")
    torch.cuda = types.SimpleNamespace(
        is_initialized=lambda: False,
        memory=types.SimpleNamespace(CUDAPluggableAllocator=lambda *a: a,
                                     change_current_allocator=lambda a: None))
    monkeypatch.setitem(sys.modules, "torch", torch)
    from gpumm.integrations import torch as hook

    hook.use(cuda_pool)
    yield hook
    hook.release()


# a forward and backward pass as PyTorch asks for them: weights' gradients, activations and
# workspace (sizes of a small MLP at batch 64)
STEP = [64 * 4096 * 4, 64 * 1024 * 4, 1024 * 4096 * 4, 256 * KiB, 64 * 1024 * 4, 3 * MiB + 4]


def torch_step(lib, stream, mark, sizes=STEP):
    held = []
    for i, n in enumerate(sizes):
        p = lib.gpumm_torch_alloc(n, 0, stream)
        assert p
        ctypes.memset(p, mark + i, min(n, 256))
        held.append((p, n, mark + i))
        if i == 3:  # workspace, freed at once
            lib.gpumm_torch_free(*held.pop()[:2], 0, stream)
    for p, n, byte in reversed(held):
        assert ctypes.string_at(p, min(n, 256)) == bytes([byte]) * min(n, 256)
        lib.gpumm_torch_free(p, n, 0, stream)


def test_torch_steps_are_served_from_the_plan(hook, cuda_pool):  # noqa: F811
    lib = _c_functions()
    stream = ctypes.c_void_p(11)
    for k in range(5):
        with hook.step():
            torch_step(lib, stream, 16 * k)
    s = cuda_pool.stats()
    # two steps recorded, three served: six requests each
    assert (s["plan_hits"], s["plan_misses"]) == (18, 0)
    assert s["plan_arena_bytes"] > 0
    cuda_pool.validate()


def test_torch_steps_with_a_second_stream_stay_sound(hook, cuda_pool):  # noqa: F811
    """A second stream makes PyTorch's frees stream-ordered (events): served blocks wait for
    them like any other, and what is not safe yet takes the normal path."""
    lib = _c_functions()
    s1, s2 = ctypes.c_void_p(11), ctypes.c_void_p(12)
    for k in range(6):
        with hook.step():
            torch_step(lib, s1, 8 * k)
            torch_step(lib, s2, 8 * k + 100, sizes=STEP[:3])
    cuda_pool.synchronize()
    cuda_pool.validate()
    s = cuda_pool.stats()
    assert s["live_allocs"] == 0 and s["plan_hits"] > 0


def test_torch_step_needs_a_pool():
    from gpumm.integrations import torch as hook

    hook.release()
    with pytest.raises(gpumm.InvalidStateError, match="use"):
        with hook.step():
            pass
