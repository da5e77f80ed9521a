"""Allocation traces: readers and writers of real workloads' allocation logs.

- RMM log CSV (:func:`read_rmm_csv`, :func:`write_rmm_csv`), plain or gzip;
- PyTorch memory snapshots (:func:`read_snapshot`), loaded by a pickle reader of plain data
  that refuses every global and call, and :func:`write_snapshot` of a gpumm pool in PyTorch's layout;
- torch.profiler Chrome-trace JSON (:func:`read_profiler_json`, every device:
  :func:`read_profiler_devices`);
- :func:`read_trace` picks the reader from the file;
- :func:`replay_pool` / :func:`min_capacity` for one gpumm pool (the full comparison is
  :mod:`gpumm.replay`).
"""

import os
import re
from typing import List, Optional, Union

from gpumm.errors import TraceFormatError
from gpumm.traces.base import ACTIONS, Event, StartState, Trace
from gpumm.traces.pool_replay import PoolReplay, min_capacity, replay_pool
from gpumm.traces.profiler import read_profiler_devices, read_profiler_json
from gpumm.traces.rmm import read_rmm_csv, write_rmm_csv
from gpumm.traces.snapshot import (first_device, load_snapshot, read_snapshot, read_snapshot_devices,
                                   snapshot_devices, write_snapshot)

__all__ = [
    "ACTIONS",
    "Event",
    "StartState",
    "Trace",
    "read_trace",
    "read_traces",
    "read_rmm_csv",
    "write_rmm_csv",
    "read_snapshot",
    "read_snapshot_devices",
    "snapshot_devices",
    "load_snapshot",
    "write_snapshot",
    "read_profiler_json",
    "read_profiler_devices",
    "PoolReplay",
    "replay_pool",
    "min_capacity",
]


def read_traces(path: Union[str, "os.PathLike[str]"]) -> List[Trace]:
    """Every device's trace in the file: one per device of a snapshot (a recorded
    out-of-memory failure's device first) or of a profiler trace (its CUDA devices, else the
    CPU), one for an RMM log."""
    name = os.fspath(path)
    fmt = _format(name)
    if fmt == "snapshot":
        return read_snapshot_devices(name)
    if fmt == "profiler":
        return read_profiler_devices(name)
    return [read_trace(name)]


def read_trace(path: Union[str, "os.PathLike[str]"], device: Optional[int] = None) -> Trace:
    """Reads an RMM CSV, a PyTorch snapshot (a pickle: plain, gzipped, or saved with
    ``torch.save``; or its dict written as JSON, plain or gzipped) or a profiler JSON (plain
    or gzipped), by its first bytes.
    ``device``: which device of a snapshot or a profiler trace (default: the first of
    :func:`read_traces`'s order, so the device of a recorded out-of-memory failure)."""
    name = os.fspath(path)
    fmt = _format(name)
    if fmt == "snapshot":
        if device is None:
            return first_device(name)
        return read_snapshot(name, device)
    if fmt == "profiler":
        return read_profiler_json(name, device_id=device)
    if device not in (None, 0):
        raise TraceFormatError(f"{name}: a {fmt} trace has one device (0), not {device}")
    return read_rmm_csv(name)


#: a snapshot's dict written as JSON: its first key one of those ``_snapshot()`` returns
_SNAPSHOT_JSON = re.compile(rb'\{\s*"(segments|device_traces|allocator_settings)"')


def _format(name: str) -> str:
    """"snapshot", "profiler" or "rmm", from the file's first bytes."""
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
    if head[:1] == b"\x80" or head[:4] == b"PK\x03\x04":  # a pickle, or torch.save's zip of one
        return "snapshot"
    if _SNAPSHOT_JSON.match(text):  # json.dump(torch.cuda.memory._snapshot(), f)
        return "snapshot"
    if text[:1] in (b"{", b"["):
        return "profiler"
    if text.startswith(b"Thread,"):
        return "rmm"
    raise TraceFormatError(
        f"{name}: not a known trace format (RMM CSV, PyTorch snapshot pickle, profiler JSON)"
    )
