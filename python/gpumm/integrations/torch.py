"""PyTorch: ``use(pool)`` makes PyTorch allocate CUDA memory from ``pool`` through
``torch.cuda.memory.CUDAPluggableAllocator``, with the C functions ``gpumm_torch_alloc`` and
``gpumm_torch_free`` that gpumm's extension exports. It must run before PyTorch's first CUDA
allocation. PyTorch's own memory statistics stop working under a pluggable allocator; the
pool's (``pool.stats()``, ``pool.metrics()``) keep working. ``with step():`` around a
training step serves PyTorch's requests of later steps from a plan of the recorded ones
(``MemoryPool.step``)."""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Optional

from gpumm import _core
from gpumm.errors import InvalidStateError
from gpumm.integrations import library_path

__all__ = ["use", "release", "step"]

_pool: Optional[Any] = None


def use(pool: Any) -> Any:
    """Routes PyTorch's CUDA allocations to ``pool``; returns the pluggable allocator."""
    import torch

    if torch.cuda.is_initialized():
        raise InvalidStateError(
            "PyTorch has already allocated CUDA memory with its own allocator; call "
            "gpumm.integrations.torch.use(pool) before the first CUDA tensor"
        )
    global _pool
    _core._set_c_pool(pool)
    _pool = pool
    alloc = torch.cuda.memory.CUDAPluggableAllocator(library_path(), "gpumm_torch_alloc",
                                                     "gpumm_torch_free")
    torch.cuda.memory.change_current_allocator(alloc)
    return alloc


def release() -> None:
    """Stops serving allocations (the C functions then return null)."""
    global _pool
    _core._set_c_pool(None)
    _pool = None


@contextlib.contextmanager
def step() -> Iterator[Any]:
    """``with gpumm.integrations.torch.step():`` around one training step of the pool that
    ``use`` chose: the pool's ``step()`` (see ``MemoryPool.step``), so PyTorch's requests
    of later steps are served from the plan of the recorded ones."""
    if _pool is None:
        raise InvalidStateError("no pool serves PyTorch: call gpumm.integrations.torch.use(pool)")
    with _pool.step() as p:
        yield p
