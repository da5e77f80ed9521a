"""Devices, memory pools and allocations: the allocator users call.

A :class:`Device` is a PMM over the device's vidmem plus a backend that holds the bytes
(``"simulated"``: accounting only, any capacity; ``"host"``: real memory in a memfd, mapped
and stitched with mmap). A :class:`MemoryPool` takes pages from its device and serves requests
of any size; see ``docs/design.md`` for the placement policy.

>>> dev = Device("h100")                       # a simulated 80 GB H100
>>> pool = MemoryPool(dev, size="1GiB")        # reserve 1 GiB up front, grow on demand
>>> a = pool.alloc("3MiB")
>>> a.size
3145728
>>> a.free()
>>> pool.stats()["live_bytes"]
0
"""

from __future__ import annotations

import contextlib
import os
import threading
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple, Union

from gpumm import _core
from gpumm._core import Allocation
from gpumm.arch import Arch, DeviceSpec, arch_of, get_device
from gpumm.errors import InvalidArgumentError
from gpumm.pmm import Pmm
from gpumm.units import KiB, MiB, SizeLike, format_size, parse_size

__all__ = [
    "Device",
    "MemoryPool",
    "Allocation",
    "Scope",
    "AllocParams",
    "alloc_vidmem",
    "alloc_sysmem",
    "sysmem_device",
]

class Device:
    """A device gpumm allocates from.

    Args:
        name: a device preset (``"h100"``, ``"a100-80"``..., see ``gpumm info``): its
            architecture and capacity.
        arch: an architecture name (overrides the preset's); default Hopper.
        vidmem: capacity (default: the preset's; 8 GiB without one; 1 GiB on the host backend).
        backend: ``"simulated"`` (no bytes, any capacity) or ``"host"`` (real memory).
        check: validate the PMM after every operation (slow; for tests).
    """

    def __init__(
        self,
        name: Optional[str] = None,
        *,
        arch: Union[str, Arch, None] = None,
        vidmem: Optional[SizeLike] = None,
        backend: str = "simulated",
        check: bool = False,
    ) -> None:
        spec: Optional[DeviceSpec] = get_device(name) if name is not None else None
        if arch is not None:
            a = arch_of(arch)
        else:
            a = spec.arch if spec is not None else arch_of("hopper")
        if vidmem is None:
            if spec is not None:
                vidmem = spec.vidmem
            else:
                vidmem = "1GiB" if backend == "host" else "8GiB"
        self.spec = spec
        self.arch = a
        self.pmm = Pmm(arch=a, vidmem=vidmem, check=check)
        self.backend = _core.Backend(backend, self.pmm.vidmem)
        self.name = spec.name if spec is not None else a.name
        self._pools: Dict[int, MemoryPool] = {}
        self._lock = threading.Lock()

    @property
    def capacity(self) -> int:
        """Bytes of vidmem (whole 2 MiB root chunks)."""
        return self.pmm.vidmem

    def pool(self, page_size: Optional[SizeLike] = None) -> "MemoryPool":
        """The device's default pool for ``page_size`` (made on first use)."""
        ps = parse_size(page_size) if page_size is not None else self.backend.default_page_size
        with self._lock:
            p = self._pools.get(ps)
            if p is None or p.closed:
                p = self._pools[ps] = MemoryPool(self, page_size=ps)
            return p

    def __repr__(self) -> str:
        return (
            f"<gpumm.Device {self.name} arch={self.arch.name} "
            f"vidmem={format_size(self.capacity)} backend={self.backend.name}>"
        )


class Scope:
    """What a ``pool.scope()`` block made. After the block: ``made`` (allocations made
    inside), ``freed`` (of those, how many were still live and freed by the scope) and
    ``leaked`` (their ``(ptr, size)``)."""

    def __init__(self, pool: "MemoryPool", scope_id: int) -> None:
        self._pool = pool
        self._id = scope_id
        self.open = True
        self.made = 0
        self.freed = 0
        self.leaked: List[Tuple[int, int]] = []

    def allocations(self) -> List[Allocation]:
        """The allocations made in the scope that are live now (a new list each call, so
        freeing while iterating over it is safe)."""
        if not self.open:
            return []
        return self._pool._scope_allocations(self._id)

    @property
    def leaked_bytes(self) -> int:
        return sum(size for _, size in self.leaked)

    def __repr__(self) -> str:
        state = "open" if self.open else f"made={self.made} freed={self.freed}"
        return f"<gpumm.Scope {state}>"


class MemoryPool(_core.Pool):
    """A pool of device memory: any size, thread-safe, the GIL released around core work.

    Args:
        device: a :class:`Device`, a preset name, or None for a simulated H100.
        size: bytes reserved up front (0: nothing until the first request).
        max_size: the most the pool may reserve (None: the device's capacity).
        page_size: the unit the pool takes from the device and stitches with: a USER chunk
            size of the architecture and a multiple of the backend's granularity (default: the
            backend's, 2 MiB simulated like CUDA's VMM, 64 KiB on host memory).
        small_threshold: requests below it are sub-allocated in heap pages (default 1 MiB,
            at most half a page).
        release_threshold: free pages above this many bytes go back to the device at once
            (default: kept until ``trim``, ``defrag`` or ``close``).
        tail_slack: a stitched allocation's last partial page may take a free page start at
            most this much larger than it needs (default 1/16 of a page); else a fresh page.
        scrub: zero memory when it is freed.
        on_failure: ``callback(nbytes) -> bool`` called on out of memory; True retries.
        check: validate every invariant after every operation (slow; for tests).
    """

    def __new__(
        cls,
        device: Union[Device, str, None] = None,
        size: SizeLike = 0,
        max_size: Optional[SizeLike] = None,
        page_size: Optional[SizeLike] = None,
        *,
        small_threshold: Optional[SizeLike] = None,
        release_threshold: Optional[SizeLike] = None,
        tail_slack: Optional[SizeLike] = None,
        scrub: bool = False,
        on_failure: Optional[Callable[[int], bool]] = None,
        check: bool = False,
    ) -> "MemoryPool":
        if device is None:
            device = Device("h100")
        elif isinstance(device, str):
            device = Device(device)
        elif not isinstance(device, Device):
            raise TypeError(f"device must be a gpumm.Device or a preset name, not {type(device).__name__}")
        self = super().__new__(
            cls,
            device.pmm,
            device.backend,
            page_size=page_size if page_size is not None else device.backend.default_page_size,
            initial_size=size,
            max_size=max_size,
            small_threshold=small_threshold,
            release_threshold=release_threshold,
            tail_slack=tail_slack,
            scrub=scrub,
            on_failure=on_failure,
            check=check,
        )
        self._device = device
        return self

    @property
    def device(self) -> Device:
        return self._device  # type: ignore[no-any-return]

    def alloc_batch(self, sizes: Any, stream: int = 0) -> Any:
        """Allocates every size in ``sizes`` (a numpy int64/uint64 array or a list) in one call
        and one lock: all or none. Returns the pointers as a numpy uint64 array; free them with
        :meth:`free_batch`."""
        import numpy as np

        return np.frombuffer(self.alloc_batch_raw(sizes, stream), dtype=np.uint64)

    @contextlib.contextmanager
    def scope(self) -> Iterator[Scope]:
        """``with pool.scope() as s:`` frees, on exit, what this thread allocated from this
        pool inside the block and had not freed; ``s.leaked`` says what that was."""
        sid = self._enter_scope()
        s = Scope(self, sid)
        try:
            yield s
        finally:
            s.made, s.freed, s.leaked = self._exit_scope(sid)
            s.open = False

    def __enter__(self) -> "MemoryPool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True)
class AllocParams:
    """The driver's allocation parameters (``uvm_mem_alloc_params_t``): a size, an optional
    page size, the GPU whose vidmem backs it (None: sysmem) and whether it must be zeroed."""

    size: SizeLike
    page_size: Optional[SizeLike] = None
    backing_gpu: Optional[Device] = None
    zero: bool = False

    def resolved_page_size(self, arch: Optional[Arch] = None) -> int:
        """The explicit page size, else the driver's rule: 4 KiB below 64 KiB, 64 KiB below
        the largest page of at most 2 MiB, else that page."""
        if self.page_size is not None:
            return parse_size(self.page_size)
        a = arch if arch is not None else arch_of("hopper")
        size = parse_size(self.size)
        largest = max(p for p in a.user_chunk_sizes if p <= 2 * MiB)
        if size < 64 * KiB:
            return 4 * KiB
        if size < largest:
            return 64 * KiB
        return largest


def alloc_vidmem(params: AllocParams) -> Allocation:
    """Allocates ``params.size`` of vidmem on ``params.backing_gpu`` from its default pool for
    the resolved page size."""
    dev = params.backing_gpu
    if not isinstance(dev, Device):
        raise InvalidArgumentError(
            "alloc_vidmem needs backing_gpu=<gpumm.Device>; backing_gpu=None means sysmem "
            "(use alloc_sysmem)"
        )
    return _alloc(dev, params)


_sysmem: Optional[Device] = None
_sysmem_lock = threading.Lock()


def sysmem_device() -> Device:
    """The process's sysmem: host memory on the host backend, ``GPUMM_SYSMEM`` bytes
    (default 4 GiB, reserved lazily: a page costs RAM only once written)."""
    global _sysmem
    with _sysmem_lock:
        if _sysmem is None:
            _sysmem = Device(
                arch="hopper", vidmem=os.environ.get("GPUMM_SYSMEM", "4GiB"), backend="host"
            )
        return _sysmem


def alloc_sysmem(params: AllocParams) -> Allocation:
    """Allocates ``params.size`` of sysmem (real host memory)."""
    if params.backing_gpu is not None:
        raise InvalidArgumentError("backing_gpu names vidmem; use alloc_vidmem")
    return _alloc(sysmem_device(), params)


def _alloc(dev: Device, params: AllocParams) -> Allocation:
    ps = params.resolved_page_size(dev.arch)
    if ps % dev.backend.granularity:
        ps = dev.backend.granularity
    a = dev.pool(ps).alloc(params.size)
    if params.zero:
        a.zero()
    return a

