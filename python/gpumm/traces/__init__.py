"""Allocation traces: readers of real workloads' allocation logs, and replay through a pool.

So far: RMM's logging-adaptor CSV (``Thread,Time,Action,Pointer,Size,Stream``), plain or
gzip, and :func:`replay_pool` / :func:`min_capacity` for gpumm's own pool. PyTorch snapshots,
profiler traces and models of other allocators come with the replay work.
"""

from gpumm.traces.pool_replay import PoolReplay, min_capacity, replay_pool
from gpumm.traces.rmm import Event, Trace, read_rmm_csv

__all__ = ["Event", "Trace", "read_rmm_csv", "PoolReplay", "replay_pool", "min_capacity"]
