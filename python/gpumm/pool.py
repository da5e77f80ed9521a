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
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple, Union

from gpumm import _core
from gpumm._core import Allocation
from gpumm.arch import Arch, DeviceSpec, arch_for_compute_capability, arch_of, get_device
from gpumm.diagnosis import Diagnosis, Finding, diagnose_pool
from gpumm.errors import InvalidArgumentError, InvalidStateError, OutOfMemoryError
from gpumm.observe import LeakError, LeakGroup, Tracker, counter_delta, iter_stack, register
from gpumm.pmm import Pmm
from gpumm.units import KiB, MiB, SizeLike, format_size, parse_size

__all__ = [
    "Audit",
    "Device",
    "MemoryPool",
    "Allocation",
    "Scope",
    "AllocParams",
    "alloc_vidmem",
    "alloc_sysmem",
    "sysmem_device",
]

_pool_number = 0


class Audit:
    """What a ``pool.audit()`` block left live, grouped by stack (filled on exit)."""

    def __init__(self, since: int) -> None:
        self.since = since
        self.leaks: List[LeakGroup] = []

    @property
    def leaked_bytes(self) -> int:
        return sum(g.bytes for g in self.leaks)


class Device:
    """A device gpumm allocates from.

    Args:
        name: a device preset (``"h100"``, ``"a100-80"``..., see ``gpumm info``): its
            architecture and capacity.
        arch: an architecture name (overrides the preset's); default Hopper.
        vidmem: capacity (default: the preset's; 8 GiB without one; 1 GiB on the host backend).
        backend: ``"simulated"`` (no bytes, any capacity), ``"host"`` (real memory),
            ``"pinned"`` (host memory page-locked for the GPU with ``cuMemHostRegister``, for
            fast asynchronous copies; ``vidmem`` is how much host memory it may pin) or
            ``"cuda"`` (a real GPU through the driver, ``libcuda.so.1`` or ``GPUMM_LIBCUDA``:
            name, capacity and architecture come from the device).
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
        if backend == "cuda":
            self._init_cuda(vidmem, check)
            return
        spec: Optional[DeviceSpec] = get_device(name) if name is not None else None
        if arch is not None:
            a = arch_of(arch)
        else:
            a = spec.arch if spec is not None else arch_of("hopper")
        if vidmem is None:
            if spec is not None:
                vidmem = spec.vidmem
            else:
                vidmem = "1GiB" if backend in ("host", "pinned") else "8GiB"
        self.spec = spec
        self.arch = a
        self.pmm = Pmm(arch=a, vidmem=vidmem, check=check)
        self.backend = _core.Backend(backend, self.pmm.vidmem)
        if backend == "pinned":
            self.name = "pinned host memory"
        else:
            self.name = spec.name if spec is not None else a.name
        self._pools: Dict[int, MemoryPool] = {}
        self._lock = threading.Lock()

    def _init_cuda(self, vidmem: Optional[SizeLike], check: bool) -> None:
        """A real GPU through the CUDA driver: name, capacity and architecture from it."""
        be = _core.Backend("cuda", parse_size(vidmem) if vidmem is not None else None)
        info = be.device_info
        self.arch = arch_for_compute_capability(info["compute_capability"])
        self.spec = None
        self.pmm = Pmm(arch=self.arch, vidmem=be.capacity, check=check)
        self.backend = be
        self.name = info["name"]
        self._pools = {}
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
        size_cache: keep a freed small allocation's block whole for the request that comes
            next, when that request is of its rounded size and the pool would place it there
            anyway: it then costs no merge, search or split, and every request lands where
            it would without the cache (so the cache never costs memory). Anything else the
            pool does first gives the block back. Its memory counts as free; ``stats()``
            reports ``cache_hits`` and ``cached_allocs``. Off with a ``release_threshold``.
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
        size_cache: bool = True,
        on_failure: Optional[Callable[[int], bool]] = None,
        check: bool = False,
        name: Optional[str] = None,
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
            size_cache=size_cache,
            on_failure=on_failure,
            check=check,
        )
        self._device = device
        self._tracker: Optional[Tracker] = None
        self._counter_stack: List[Dict[str, Any]] = []
        global _pool_number
        _pool_number += 1
        self._name = name if name is not None else f"pool{_pool_number}"
        register(self)
        return self

    @property
    def device(self) -> Device:
        return self._device  # type: ignore[no-any-return]

    @property
    def name(self) -> str:
        """The pool's name in metrics (``name=`` or pool1, pool2...)."""
        return self._name  # type: ignore[no-any-return]

    # -- leak tracking ----------------------------------------------------------------------

    def tracking(self, on: bool = True, depth: int = 12) -> "MemoryPool":
        """Records every allocation's size, stream, time, tag and Python stack (``depth``
        frames) from now on (``on=False`` stops; the records stay until their allocations are
        freed). Costs about 6.5 µs per allocation while on; nothing while off."""
        if on and self._tracker is None:
            self._tracker = Tracker(lambda: {hash(a) for a in self.allocations()}, depth)
        elif self._tracker is not None:
            self._tracker.depth = depth
        self._set_tracking(on)
        self._tracking_on = on
        return self

    @property
    def is_tracking(self) -> bool:
        return bool(getattr(self, "_tracking_on", False))

    def _on_alloc(self, allocation: Allocation, tag: Any) -> None:
        if self._tracker is not None:
            self._tracker.add(allocation, None if tag is None else str(tag))

    def leaks(self) -> List[LeakGroup]:
        """Live tracked allocations grouped by the stack that made them, most bytes first."""
        return self._tracker.groups() if self._tracker is not None else []

    @contextlib.contextmanager
    def audit(self, raise_on_leak: bool = False) -> Iterator["Audit"]:
        """``with pool.audit() as a:`` tracks what is allocated inside; on exit ``a.leaks``
        lists what is still live, grouped by stack (and raises :class:`LeakError` if asked)."""
        was = self.is_tracking
        self.tracking(True)
        assert self._tracker is not None
        a = Audit(self._tracker.seq)
        try:
            yield a
        finally:
            a.leaks = self._tracker.groups(since=a.since)
            if not was:
                self.tracking(False)
        if raise_on_leak and a.leaks:
            raise LeakError(a.leaks)

    # -- metrics ----------------------------------------------------------------------------

    def metrics(self) -> Dict[str, Any]:
        """Success rate, latency (mean, p50, p99), fragmentation, live, reserved, peaks,
        counts, and live bytes by size class, as a dict (the same as ``gpumm.metrics_text``)."""
        s = self.stats()
        keys = ("live_bytes", "reserved_bytes", "free_bytes", "peak_live", "peak_reserved",
                "largest_free_run", "largest_request", "fragmentation", "success_rate",
                "latency_mean_ns", "latency_p50_ns", "latency_p99_ns", "latency_samples",
                "allocs", "frees", "failures", "reused", "cache_hits", "stitched", "pages_taken",
                "pages_released", "live_allocs", "pending_frees", "live_by_size")
        return {k: s[k] for k in keys}

    def push_counters(self) -> None:
        """Starts a nested counting scope (like RMM's statistics adaptor push)."""
        self._counter_stack.append(self.metrics())

    def pop_counters(self) -> Dict[str, Any]:
        """Ends the innermost counting scope: the metrics with counts since its push."""
        if not self._counter_stack:
            raise InvalidStateError("pop_counters without push_counters")
        return counter_delta(self.metrics(), self._counter_stack.pop())

    @contextlib.contextmanager
    def counting(self) -> Iterator[Dict[str, Any]]:
        """``with pool.counting() as c:``: ``c`` holds the counts of the block on exit."""
        out: Dict[str, Any] = {}
        self.push_counters()
        try:
            yield out
        finally:
            out.update(self.pop_counters())

    # -- diagnosis --------------------------------------------------------------------------

    def diagnose(self, size: Optional[SizeLike] = None) -> Diagnosis:
        """The out-of-memory checklist for this pool (for a request of ``size`` if given)."""
        return diagnose_pool(self, parse_size(size) if size is not None else None)

    def _oom_error(self, size: int, message: str) -> OutOfMemoryError:
        """The error a failed allocation raises: the core's message, the diagnosis, and the
        numbers as attributes."""
        try:
            d = diagnose_pool(self, size)
        except Exception as e:  # noqa: BLE001 - a diagnosis must never hide the OOM itself
            d = Diagnosis(numbers={"requested": size})
            d.findings.append(Finding("fact", f"(no diagnosis: {e!r})"))
        exc = OutOfMemoryError(f"{message}\nDiagnosis:\n{d}")
        for k, v in d.numbers.items():
            setattr(exc, k, v)
        exc.diagnosis = d
        return exc

    def snapshot(self) -> Dict[str, Any]:  # type: ignore[override]
        """Pages and allocations (with tags and stacks while tracking)."""
        snap = super().snapshot()
        if self._tracker is not None:
            by_ptr = {r.allocation.ptr: r for r in self._tracker.live()}
            for a in snap["allocations"]:
                r = by_ptr.get(a["ptr"])
                if r is not None:
                    a["tag"] = r.tag
                    a["frames"] = list(iter_stack(r.stack))
        return snap

    def close(self) -> int:  # type: ignore[override]
        """Frees everything and gives every page back; warns (ResourceWarning) with the top
        stacks when tracked allocations were still live."""
        groups = self.leaks() if self._tracker is not None and not self.closed else []
        n = super().close()
        if groups:
            top = "\n".join(f"  {g}" for g in groups[:3])
            warnings.warn(f"pool {self.name} closed with {sum(g.count for g in groups)} live "
                          f"allocation(s):\n{top}", ResourceWarning, stacklevel=2)
        return n

    @contextlib.contextmanager
    def scope(self, name: Optional[str] = None) -> Iterator[Scope]:
        """``with pool.scope() as s:`` frees, on exit, what this thread allocated from this
        pool inside the block and had not freed; ``s.leaked`` says what that was. While
        tracking, ``name`` tags the allocations made inside (in leak reports and snapshots)."""
        sid = self._enter_scope()
        s = Scope(self, sid)
        tags = None
        if name is not None and self._tracker is not None:
            tags = self._tracker.tag_stack.__dict__.setdefault("tags", [])
            tags.append(name)
        try:
            yield s
        finally:
            if tags is not None:
                tags.pop()
            s.made, s.freed, s.leaked = self._exit_scope(sid)
            s.open = False

    @contextlib.contextmanager
    def step(self) -> Iterator["MemoryPool"]:
        """``with pool.step():`` around one training iteration. The first steps (2 by
        default, ``set_step_recording(n)``) are recorded: each request's size, stream and
        order; the next is planned offline, and later steps are served in request order from
        the plan's arena (``stats()["plan_hits"]``). A request that departs from the plan
        (another size, stream or order) takes the normal path; a plan under half hits over
        two steps is dropped and made again. Requests of every thread count while a step is
        open; allocations outside any step take the normal path. See docs/plan.md."""
        self._step_begin()
        try:
            yield self
        finally:
            self._step_end()

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

