"""Allocation traces: readers and writers of real workloads' allocation logs.

- RMM log CSV (:func:`read_rmm_csv`, :func:`write_rmm_csv`), plain or gzip;
- PyTorch memory snapshots (:func:`read_snapshot`), loaded with an unpickler that refuses
  every global, and :func:`write_snapshot` of a gpumm pool in PyTorch's layout;
- torch.profiler Chrome-trace JSON (:func:`read_profiler_json`);
- :func:`read_trace` picks the reader from the file;
- :func:`replay_pool` / :func:`min_capacity` for one gpumm pool (the full comparison is
  :mod:`gpumm.replay`).
"""

import os
from typing import Union

from gpumm.errors import TraceFormatError
from gpumm.traces.base import ACTIONS, Event, StartState, Trace
from gpumm.traces.pool_replay import PoolReplay, min_capacity, replay_pool
from gpumm.traces.profiler import read_profiler_json
from gpumm.traces.rmm import read_rmm_csv, write_rmm_csv
from gpumm.traces.snapshot import load_snapshot, read_snapshot, write_snapshot

__all__ = [
    "ACTIONS",
    "Event",
    "StartState",
    "Trace",
    "read_trace",
    "read_rmm_csv",
    "write_rmm_csv",
    "read_snapshot",
    "load_snapshot",
    "write_snapshot",
    "read_profiler_json",
    "PoolReplay",
    "replay_pool",
    "min_capacity",
]


def read_trace(path: Union[str, "os.PathLike[str]"]) -> Trace:
    """Reads an RMM CSV, a PyTorch snapshot pickle or a profiler JSON, by its first bytes."""
    name = os.fspath(path)
    try:
        with open(name, "rb") as f:
            head = f.read(4096)
    except OSError as e:
        raise TraceFormatError(f"{name}: cannot read: {e.strerror or e}") from None
    if head[:2] == b"\x1f\x8b":
        import gzip
        import zlib

        try:
            with gzip.open(name, "rb") as g:
                head = g.read(4096)
        except (OSError, EOFError, zlib.error) as e:
            raise TraceFormatError(f"{name}: corrupt gzip data: {e}") from None
    text = head.lstrip()
    if head[:1] == b"\x80":
        return read_snapshot(name)
    if text[:1] in (b"{", b"["):
        return read_profiler_json(name)
    if text.startswith(b"Thread,"):
        return read_rmm_csv(name)
    raise TraceFormatError(
        f"{name}: not a known trace format (RMM CSV, PyTorch snapshot pickle, profiler JSON)"
    )
