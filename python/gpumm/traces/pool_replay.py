"""Replays an allocation trace through a gpumm pool on a simulated device: the measurement
behind the pool's thresholds (docs/design.md). The replay issue builds the full engine, with
models of other allocators; this is the small version for one pool.

Frees of pointers the trace never allocated (made before the log started) are skipped, as are
``alloc_failed`` events; frees are immediate, as RMM's log records them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict

from gpumm.errors import OutOfMemoryError
from gpumm.traces.rmm import Trace
from gpumm.units import MiB, SizeLike, parse_size

__all__ = ["PoolReplay", "replay_pool", "min_capacity"]


@dataclass(frozen=True)
class PoolReplay:
    """What a replay measured. Bytes."""

    capacity: int
    peak_live: int
    peak_reserved: int
    failures: int
    stitched: int
    stats: Dict[str, Any]

    @property
    def reserve_ratio(self) -> float:
        """Peak reserved ÷ peak live."""
        return self.peak_reserved / self.peak_live if self.peak_live else 1.0


def replay_pool(trace: Trace, capacity: SizeLike = "80GiB", **pool_options: Any) -> PoolReplay:
    """Runs every event of ``trace`` through a new pool on a simulated device of
    ``capacity``; ``pool_options`` go to :class:`gpumm.MemoryPool`."""
    from gpumm.pool import Device, MemoryPool

    dev = Device(vidmem=capacity)
    pool = MemoryPool(dev, **pool_options)
    live: Dict[int, Any] = {}
    failures = 0
    alloc, free = pool.alloc, pool.free
    for e in trace.events:
        if e.action == "alloc":
            try:
                live[e.ptr] = alloc(e.size, e.stream)
            except OutOfMemoryError:
                failures += 1
        elif e.action == "free":
            a = live.pop(e.ptr, None)
            if a is not None:
                free(a)
    stats = pool.stats()
    pool.close()
    return PoolReplay(
        capacity=dev.capacity,
        peak_live=stats["peak_live"],
        peak_reserved=stats["peak_reserved"],
        failures=failures,
        stitched=stats["stitched"],
        stats=stats,
    )


def min_capacity(trace: Trace, step: SizeLike = 2 * MiB, **pool_options: Any) -> int:
    """The smallest device capacity (a multiple of ``step``) on which ``trace`` replays with no
    out-of-memory failure, by bisection from the trace's peak live bytes."""
    unit = parse_size(step)
    peak = trace.peak_live()
    lo = max(1, -(-peak // unit))
    hi = lo
    while replay_pool(trace, hi * unit, **pool_options).failures:
        hi = hi + max(1, (hi - lo + 1))  # gallop up
    while lo < hi:
        mid = (lo + hi) // 2
        if replay_pool(trace, mid * unit, **pool_options).failures:
            lo = mid + 1
        else:
            hi = mid
    return lo * unit
