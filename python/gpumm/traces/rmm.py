"""Reader of RMM log CSV files (``rmm::mr::logging_resource_adaptor``).

Layout: a header ``Thread,Time,Action,Pointer,Size,Stream``, then one line per event. Time is
``HH:MM:SS.ffffff`` (RMM's logger pattern) or a plain number: seconds when it has a fraction
or is below 10^11, else microseconds below 10^17, else nanoseconds. Action is ``allocate``,
``free`` (``deallocate`` reads as ``free``) or ``allocate failure``, whose pointer may be
null (``(nil)``, glibc's ``%p``, or empty). Pointer and Stream are hex with ``0x``, hex
without it when they hold a letter a–f, decimal otherwise; Thread is decimal. Several
threads and streams keep their ids. Files may be gzip-compressed. The file is parsed in Rust
(``rust/traces/rmm.rs``, on the ``csv`` and ``flate2`` crates) with the GIL released into
columns. Any malformed line raises :class:`gpumm.errors.TraceFormatError` naming the file and
line; nothing is half-read.
"""

from __future__ import annotations

import csv
import gzip
import io
import os
from typing import Union

from gpumm import _core
from gpumm.traces.base import Trace

__all__ = ["read_rmm_csv", "write_rmm_csv"]

HEADER = ["Thread", "Time", "Action", "Pointer", "Size", "Stream"]
ACTIONS = ("allocate", "free", "allocate failure")


def read_rmm_csv(path: Union[str, "os.PathLike[str]"]) -> Trace:
    """Reads an RMM log CSV (plain or gzip) into a :class:`Trace`."""
    name = os.fspath(path)
    return Trace(None, name, format="rmm", log=_core.read_rmm(name))


def _hms(us: int) -> str:
    s, us = divmod(max(0, us), 1_000_000)
    m, s = divmod(s, 60)
    h, m = divmod(m, 60)
    return f"{h:02d}:{m:02d}:{s:02d}.{us:06d}"


def write_rmm_csv(trace: Trace, path: Union[str, "os.PathLike[str]"]) -> None:
    """Writes a trace's allocations, frees and failures in RMM's log layout (gzip when the
    name ends in .gz). Segment events have no RMM form and are left out."""
    names = {"alloc": "allocate", "free": "free", "alloc_failed": "allocate failure"}
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(HEADER)
    for e in trace.events:
        if e.action in names:
            w.writerow([e.thread, _hms(e.time_us), names[e.action], f"{e.ptr:#x}", e.size,
                        f"{e.stream:#x}"])
    data = out.getvalue().encode()
    name = os.fspath(path)
    with open(name, "wb") as f:
        f.write(gzip.compress(data, mtime=0) if name.endswith(".gz") else data)
