"""Reader of RMM log CSV files (``rmm::mr::logging_resource_adaptor``).

Layout: a header ``Thread,Time,Action,Pointer,Size,Stream``, then one line per event; Time is
``HH:MM:SS.ffffff``; Action is ``allocate``, ``free`` or ``allocate failure``; Pointer and
Stream are hex. Files may be gzip-compressed. Any malformed line raises
:class:`gpumm.errors.TraceFormatError` naming the file and line; nothing is half-read.
"""

from __future__ import annotations

import csv
import gzip
import io
import os
import zlib
from typing import Iterator, List, Tuple, Union

from gpumm.errors import TraceFormatError
from gpumm.traces.base import Event, Trace

__all__ = ["read_rmm_csv", "write_rmm_csv"]

HEADER = ["Thread", "Time", "Action", "Pointer", "Size", "Stream"]
ACTIONS = ("allocate", "free", "allocate failure")


def _time_us(text: str) -> int:
    """``HH:MM:SS[.ffffff]`` to microseconds."""
    hms, _, frac = text.partition(".")
    h, m, s = hms.split(":")
    if frac and not frac.isdigit():
        raise ValueError(f"bad time {text!r}")
    return ((int(h) * 60 + int(m)) * 60 + int(s)) * 1_000_000 + int(frac.ljust(6, "0")[:6] or 0)


def _open_text(path: Union[str, "os.PathLike[str]"]) -> io.TextIOBase:
    with open(path, "rb") as f:
        magic = f.read(2)
    if magic == b"\x1f\x8b":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", newline="")
    return open(path, encoding="utf-8", newline="")  # noqa: SIM115


def _rows(path: Union[str, "os.PathLike[str]"]) -> Iterator[Tuple[int, List[str]]]:
    name = os.fspath(path)
    try:
        with _open_text(path) as f:
            reader = csv.reader(f)
            for row in reader:
                yield reader.line_num, row
    except (OSError, EOFError, UnicodeDecodeError, csv.Error, zlib.error) as e:
        raise TraceFormatError(f"{name}: cannot read as an RMM log ({type(e).__name__}: {e})") from None


def read_rmm_csv(path: Union[str, "os.PathLike[str]"]) -> Trace:
    """Reads an RMM log CSV (plain or gzip) into a :class:`Trace`."""
    name = os.fspath(path)
    events: List[Event] = []
    rows = _rows(path)
    first = next(rows, None)
    if first is None or [c.strip() for c in first[1]] != HEADER:
        raise TraceFormatError(f"{name}: line 1: expected the header {','.join(HEADER)}")
    action_names = {"allocate": "alloc", "free": "free", "allocate failure": "alloc_failed"}
    for line, row in rows:
        if not row:
            continue
        if len(row) != len(HEADER):
            raise TraceFormatError(f"{name}: line {line}: expected 6 fields, got {len(row)}")
        thread, time, action, ptr, size, stream = (c.strip() for c in row)
        if action not in action_names:
            raise TraceFormatError(f"{name}: line {line}: unknown action {action!r}; expected one of {ACTIONS}")
        try:
            ev = Event(action_names[action], int(ptr, 16), int(size), int(stream, 16),
                       _time_us(time), int(thread))
        except ValueError as e:
            raise TraceFormatError(f"{name}: line {line}: {e}") from None
        if ev.size < 0 or ev.ptr < 0:
            raise TraceFormatError(f"{name}: line {line}: negative size or pointer")
        events.append(ev)
    return Trace(events, name, format="rmm")


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
