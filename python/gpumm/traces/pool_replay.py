"""Replays an allocation trace through a real ``gpumm.MemoryPool`` on a simulated device, with
the pool options a user gives and the pool's full ``stats()`` in the result: the measurement
behind the pool's thresholds (docs/design.md). ``gpumm.replay`` runs the same events through
the Rust engine's models (a ``gpumm`` model with the default pool among them).

``min_capacity`` with the default pool is the engine's bisection
(``_core.replay_min_capacity`` with the ``gpumm`` model: the same pool, the same answer);
with pool options, which the engine's model does not take, it bisects over ``replay_pool``.

Frees of pointers the trace never allocated (made before the log started) are skipped, as are
``alloc_failed`` events; frees are immediate, as RMM's log records them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict

from gpumm import _core
from gpumm.errors import OutOfMemoryError
from gpumm.pool import Device, MemoryPool
from gpumm.traces.base import Trace
from gpumm.traces.prepare import prepare
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
    if not pool_options:
        e = prepare(trace)
        hi = 2 * lo
        while True:
            got = _core.replay_min_capacity("gpumm", e.actions, e.ids, e.sizes, e.streams,
                                            e.addrs, e.start, peak_live=peak, hi=hi * unit,
                                            step=unit)
            if got is not None:
                return int(got)
            hi *= 2
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
