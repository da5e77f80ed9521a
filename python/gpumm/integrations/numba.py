"""Numba: ``use(pool)`` installs an External Memory Management plugin that allocates device
memory from ``pool`` (``numba.cuda.set_memory_manager``)."""

from __future__ import annotations

import ctypes
from typing import Any

from gpumm.errors import InvalidStateError

__all__ = ["use", "manager_class"]


def manager_class(pool: Any) -> Any:
    """A ``numba.cuda.HostOnlyCUDAMemoryManager`` subclass bound to ``pool``."""
    from numba import cuda

    class GpummMemoryManager(cuda.HostOnlyCUDAMemoryManager):  # type: ignore[misc,name-defined]
        def memalloc(self, size: int) -> Any:
            a = pool.alloc(max(int(size), 1))
            return cuda.MemoryPointer(self.context, ctypes.c_uint64(a.ptr), size,
                                      finalizer=a.free)

        def initialize(self) -> None:
            pass

        def get_memory_info(self) -> Any:
            s = pool.stats()
            free = pool.device.capacity - s["reserved_bytes"] + s["free_bytes"]
            return cuda.MemoryInfo(free=free, total=pool.device.capacity)

        def get_ipc_handle(self, memory: Any) -> Any:
            # gpumm's chunks are not made exportable (no shareable handle type requested)
            raise InvalidStateError("gpumm pools do not export CUDA IPC handles")

        def reset(self) -> None:
            pass

        @property
        def interface_version(self) -> int:
            return 1

    return GpummMemoryManager


def use(pool: Any) -> None:
    """Routes Numba's device allocations to ``pool``."""
    from numba import cuda

    cuda.set_memory_manager(manager_class(pool))
