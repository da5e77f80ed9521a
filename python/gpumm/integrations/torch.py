"""PyTorch: ``use(pool)`` makes PyTorch allocate CUDA memory from ``pool`` through
``torch.cuda.memory.CUDAPluggableAllocator``, with the C functions ``gpumm_torch_alloc`` and
``gpumm_torch_free`` that gpumm's extension exports. It must run before PyTorch's first CUDA
allocation. PyTorch's own memory statistics stop working under a pluggable allocator; the
pool's (``pool.stats()``, ``pool.metrics()``) keep working."""

from __future__ import annotations

from typing import Any

from gpumm import _core
from gpumm.errors import InvalidStateError
from gpumm.integrations import library_path

__all__ = ["use", "release"]


def use(pool: Any) -> Any:
    """Routes PyTorch's CUDA allocations to ``pool``; returns the pluggable allocator."""
    import torch

    if torch.cuda.is_initialized():
        raise InvalidStateError(
            "PyTorch has already allocated CUDA memory with its own allocator; call "
            "gpumm.integrations.torch.use(pool) before the first CUDA tensor"
        )
    _core._set_c_pool(pool)
    alloc = torch.cuda.memory.CUDAPluggableAllocator(library_path(), "gpumm_torch_alloc",
                                                     "gpumm_torch_free")
    torch.cuda.memory.change_current_allocator(alloc)
    return alloc


def release() -> None:
    """Stops serving allocations (the C functions then return null)."""
    _core._set_c_pool(None)
