"""Unified memory under oversubscription: the price of faults, migrations and thrashing,
estimated by a model of the UVM driver (``rust/uvm``, described in ``docs/uvm.md``).

>>> from gpumm.uvm import benchmark
>>> r = benchmark("h100", "random_warp", oversubscription=1.25, mode="page_fault",
...               vidmem="1GiB")                      # a small H100-like device, quick
>>> r["estimated_time_s"] > 0
True

The workloads follow NVIDIA's oversubscription benchmark: a managed allocation of
``oversubscription`` × the GPU's memory, initialized by the CPU, then read by a GPU kernel with
a ``streaming`` (grid-stride), ``block_streaming`` (each thread block its own chunk) or
``random_warp`` (each warp a random page) pattern, ``iterations`` times, in one of the modes:

- ``page_fault``: plain managed memory: faults, migration, prefetch, eviction, thrashing;
- ``zero_copy``: the data stays in pinned host memory and the GPU reads it over the link;
- ``prefetch``: prefetch the allocation to the GPU once before the kernels (what does not fit
  is evicted, then faulted back);
- ``stripe``: as much of the allocation as fits is placed on the GPU, striped evenly; the
  GPU reads the rest in place.
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Optional, Union

from gpumm import _core
from gpumm.arch import DeviceSpec, get_device
from gpumm.errors import InvalidArgumentError
from gpumm.units import SizeLike, parse_size

__all__ = ["MODES", "PATTERNS", "FACTORS", "model", "benchmark", "sweep"]

MODES = ("page_fault", "zero_copy", "prefetch", "stripe")
PATTERNS = ("streaming", "block_streaming", "random_warp")
FACTORS = (0.5, 0.9, 1.1, 1.25, 1.5)

_KEYS = ("estimated_time_s", "faults", "bytes_h2d", "bytes_d2h", "evictions", "thrashing_pages")


def _spec(device: Union[str, DeviceSpec]) -> DeviceSpec:
    return device if isinstance(device, DeviceSpec) else get_device(device)


def model(device: Union[str, DeviceSpec] = "h100", vidmem: Optional[SizeLike] = None,
          prefetch: bool = True, seed: int = 0, **options: Any) -> "_core.Uvm":
    """A UVM model of ``device``: its vidmem (or ``vidmem``), HBM bandwidth and host link from
    the device table; ``options`` go to :class:`gpumm._core.Uvm` (``costs={...}``,
    ``thrashing``, ``fault_batch``, ``replay``)."""
    spec = _spec(device)
    cap = parse_size(vidmem) if vidmem is not None else spec.vidmem
    return _core.Uvm(cap, spec.memory_bandwidth, spec.link.bandwidth, prefetch=prefetch,
                     seed=seed, **options)


def _add(total: Dict[str, Any], part: Dict[str, Any]) -> None:
    for k, v in part.items():
        total[k] = total.get(k, 0) + v


def benchmark(device: Union[str, DeviceSpec] = "h100", pattern: str = "streaming",
              oversubscription: float = 1.0, mode: str = "page_fault", *,
              iterations: int = 2, prefetch: bool = True, write: bool = False, seed: int = 0,
              vidmem: Optional[SizeLike] = None, costs: Optional[Dict[str, float]] = None,
              validate: bool = False) -> Dict[str, Any]:
    """One run: the totals of the GPU kernels (setup excluded: the CPU's initialization, and
    the prefetch or striping of the modes that do it, are reported apart as ``setup``), the
    effective bandwidth, and each kernel's figures. ``validate``: check every invariant after
    every fault batch and kernel (slow; for tests)."""
    if pattern not in PATTERNS:
        raise InvalidArgumentError(f"unknown pattern {pattern!r}; expected one of {PATTERNS}")
    if mode not in MODES:
        raise InvalidArgumentError(f"unknown mode {mode!r}; expected one of {MODES}")
    if not oversubscription > 0 or iterations < 1:
        raise InvalidArgumentError("oversubscription must be positive and iterations at least 1")
    spec = _spec(device)
    opts: Dict[str, Any] = {"check": True} if validate else {}
    if costs:
        opts["costs"] = costs
    m = model(spec, vidmem, prefetch=prefetch, seed=seed, **opts)
    cap = parse_size(vidmem) if vidmem is not None else spec.vidmem
    size = max(4096, int(cap * oversubscription) // 4096 * 4096)
    r = m.alloc_managed(size)
    setup: Dict[str, Any] = {}
    if mode == "zero_copy":
        m.advise(r, "zero_copy")
    else:
        _add(setup, m.run_kernel(r, "streaming", processor="cpu", write=True))
        if mode == "prefetch":
            _add(setup, m.prefetch(r, "gpu"))
        elif mode == "stripe":
            _add(setup, m.stripe(r, min(1.0, cap / size)))
    kernels: List[Dict[str, Any]] = []
    total: Dict[str, Any] = {}
    for _ in range(iterations):
        k = m.run_kernel(r, pattern, write=write)
        kernels.append(k)
        _add(total, k)
        if validate:
            m.validate()
    t = total["estimated_time_s"]
    return {
        "device": spec.name, "pattern": pattern, "mode": mode, "oversubscription": oversubscription,
        "prefetch": prefetch, "vidmem": cap, "working_set": size, "iterations": iterations,
        **total,
        "bandwidth_gbs": (total["hbm_bytes"] + total["remote_bytes"]) / t / 1e9 if t else 0.0,
        "setup": setup, "kernels": kernels,
    }


def sweep(device: Union[str, DeviceSpec] = "h100", patterns: Iterable[str] = PATTERNS,
          modes: Iterable[str] = MODES, factors: Iterable[float] = FACTORS,
          **options: Any) -> List[Dict[str, Any]]:
    """:func:`benchmark` over patterns × modes × oversubscription factors."""
    return [benchmark(device, p, f, m, **options)
            for p in patterns for m in modes for f in factors]


def summary(run: Dict[str, Any]) -> Dict[str, Any]:
    """The keys other tools read: ``estimated_time_s``, ``faults``, ``bytes_h2d``,
    ``bytes_d2h``, ``evictions``, ``thrashing_pages`` (plus what identifies the run)."""
    out = {k: run[k] for k in ("device", "pattern", "mode", "oversubscription", "prefetch")}
    out.update({k: run[k] for k in _KEYS})
    out["bandwidth_gbs"] = round(run["bandwidth_gbs"], 3)
    return out
