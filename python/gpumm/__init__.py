"""gpumm: a GPU memory manager for Python with a Rust core.

Modelled on the physical memory manager of NVIDIA's UVM driver: 2 MiB root chunks split
into power-of-two chunks, free lists per size, eager merge, root LRU lists and eviction.
"""

from gpumm import arch, errors, units
from gpumm._core import Chunk, Eviction, __version__
from gpumm.errors import *  # noqa: F403 - the exception classes, listed in errors.__all__
from gpumm.pmm import Pmm
from gpumm.pool import (
    AllocParams,
    Allocation,
    Device,
    MemoryPool,
    Scope,
    alloc_sysmem,
    alloc_vidmem,
    sysmem_device,
)
from gpumm.units import format_size, parse_size

__all__ = [
    "Device",
    "MemoryPool",
    "Allocation",
    "Scope",
    "AllocParams",
    "alloc_vidmem",
    "alloc_sysmem",
    "sysmem_device",
    "Pmm",
    "Chunk",
    "Eviction",
    "arch",
    "errors",
    "integrations",
    "policy",
    "replay",
    "uvm",
    "track",
    "record",
    "metrics_text",
    "publish",
    "LeakError",
    "units",
    "parse_size",
    "format_size",
    "__version__",
    *errors.__all__,
]

from gpumm import integrations, policy, replay, uvm  # noqa: E402 - modules built on the above
from gpumm.observe import LeakError, metrics_text, publish  # noqa: E402
from gpumm.record import record  # noqa: E402 - imports torch only when called


def track(pool: MemoryPool, on: bool = True) -> MemoryPool:
    """Turns on leak tracking for ``pool`` (see :meth:`MemoryPool.tracking`)."""
    return pool.tracking(on)
