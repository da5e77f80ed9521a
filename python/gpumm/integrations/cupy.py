"""CuPy: ``use(pool)`` makes CuPy allocate from ``pool`` through ``cupy.cuda.set_allocator``;
each allocation is a ``MemoryPointer(UnownedMemory(ptr, size, owner, device))`` on CuPy's
current stream, freed when CuPy drops it."""

from __future__ import annotations

from typing import Any

__all__ = ["use", "allocator"]


class _Owner:
    """Keeps a gpumm allocation alive while CuPy holds its memory; frees it after."""

    __slots__ = ("allocation",)

    def __init__(self, allocation: Any) -> None:
        self.allocation = allocation

    def __del__(self) -> None:
        a = self.allocation
        if a is not None and not a.freed:
            a.free_when_done(a.stream)  # kernels on its stream may still be using it


def allocator(pool: Any) -> Any:
    """The function CuPy calls: ``nbytes -> MemoryPointer``."""
    import cupy

    def malloc(nbytes: int) -> Any:
        stream = cupy.cuda.get_current_stream().ptr
        a = pool.alloc(max(int(nbytes), 1), stream)
        owner = _Owner(a)
        mem = cupy.cuda.UnownedMemory(a.ptr, a.size, owner, cupy.cuda.Device().id)
        return cupy.cuda.MemoryPointer(mem, 0)

    return malloc


def use(pool: Any) -> None:
    """Routes CuPy's device allocations to ``pool``."""
    import cupy

    cupy.cuda.set_allocator(allocator(pool))
