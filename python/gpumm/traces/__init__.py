"""Allocation traces: readers of real workloads' allocation logs.

So far: RMM's logging-adaptor CSV (``Thread,Time,Action,Pointer,Size,Stream``), plain or
gzip. PyTorch snapshots and profiler traces come with the replay work.
"""

from gpumm.traces.rmm import Event, Trace, read_rmm_csv

__all__ = ["Event", "Trace", "read_rmm_csv"]
