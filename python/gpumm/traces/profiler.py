"""Reader of torch.profiler Chrome-trace JSON (``prof.export_chrome_trace``, with
``profile_memory=True``): the ``[memory]`` instant events, whose ``args`` hold ``Addr``,
``Bytes`` (negative for a free), ``Device Type`` (1: CUDA, 0: CPU) and ``Device Id`` (the
CUDA device's index; -1 for the CPU). Plain or gzip (TensorBoard's ``.pt.trace.json.gz``).
A malformed file raises :class:`gpumm.errors.TraceFormatError` naming the file and the event.

A GPU job's profile holds the CPU's allocations beside each GPU's: the CUDA devices are read
when the file has any of their events (the CPU's only when it has none), one trace each."""

from __future__ import annotations

import gzip
import json
import os
import zlib
from typing import Any, List, Optional, Tuple, Union

from gpumm.errors import TraceFormatError
from gpumm.traces.base import Event, Trace

__all__ = ["read_profiler_json", "read_profiler_devices"]

#: ``Device Type`` of CUDA memory events
CUDA = 1

#: (time, index in the file, device type, device id, address, bytes) of one memory event
_Mem = Tuple[float, int, int, int, int, int]


def read_profiler_json(
    path: Union[str, "os.PathLike[str]"], device_type: Optional[int] = None,
    device_id: Optional[int] = None,
) -> Trace:
    """The memory events of ``device_type`` (1: CUDA, 0: CPU; None: CUDA where the file has
    CUDA memory events, else the type with the most) and device ``device_id`` (None: the
    lowest of that type; the CPU's is 0), in time order. A device the file has no memory
    event of is a :class:`~gpumm.errors.TraceFormatError` naming those it has."""
    name = os.fspath(path)
    mem = _memory_events(name)
    device_type = _device_type(mem) if device_type is None else device_type
    ids = _device_ids(mem, device_type)
    if device_id is None:
        return _trace(name, mem, device_type, ids[0] if ids else 0)
    found = [did for did in ids if max(did, 0) == device_id]
    if ids and not found:
        held = ", ".join(str(max(did, 0)) for did in ids)
        raise TraceFormatError(f"{name}: no memory event of device {device_id}; it has "
                               f"device{'s' if len(ids) > 1 else ''} {held}")
    return _trace(name, mem, device_type, found[0] if found else device_id)


def read_profiler_devices(path: Union[str, "os.PathLike[str]"]) -> List[Trace]:
    """One trace per device of the file's device type (CUDA where it has CUDA memory events,
    else the type with the most), by device index; one empty trace where it has no memory
    event."""
    name = os.fspath(path)
    mem = _memory_events(name)
    dtype = _device_type(mem)
    ids = _device_ids(mem, dtype) or [0]
    return [_trace(name, mem, dtype, did) for did in ids]


def _memory_events(name: str) -> List[_Mem]:
    try:
        with open(name, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise TraceFormatError(f"{name}: cannot read: {e.strerror or e}") from None
    try:
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
        data: Any = json.loads(raw)
    except (OSError, EOFError, ValueError, zlib.error, RecursionError) as e:
        raise TraceFormatError(f"{name}: not readable JSON: {e}") from None
    items = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(items, list):
        if isinstance(data, dict) and ("device_traces" in data or "segments" in data):
            raise TraceFormatError(
                f"{name}: a PyTorch memory snapshot written as JSON, read as a snapshot where "
                "its first key is 'segments' or 'device_traces' (as json.dump of "
                "torch.cuda.memory._snapshot() writes it); this one starts with another: "
                "read it with gpumm.traces.read_snapshot, or save the snapshot with "
                "torch.cuda.memory._dump_snapshot(path)")
        raise TraceFormatError(f"{name}: no 'traceEvents' list")
    mem: List[_Mem] = []
    for i, ev in enumerate(items):
        if not isinstance(ev, dict) or ev.get("name") != "[memory]":
            continue
        args = ev.get("args")
        where = f"{name}: traceEvents[{i}]"
        if not isinstance(args, dict):
            raise TraceFormatError(f"{where}: a [memory] event without 'args'")
        try:
            addr, nbytes = int(args["Addr"]), int(args["Bytes"])
            ts = float(ev.get("ts", 0))
            dtype, did = int(args.get("Device Type", CUDA)), int(args.get("Device Id", 0))
        except (KeyError, TypeError, ValueError) as e:
            raise TraceFormatError(f"{where}: bad [memory] args: {e!r}") from None
        if addr < 0:
            raise TraceFormatError(f"{where}: negative address")
        mem.append((ts, i, dtype, did, addr, nbytes))
    return mem


def _device_type(mem: List[_Mem]) -> int:
    """CUDA where any memory event is CUDA's, else the type with the most events."""
    counts: dict = {}
    for m in mem:
        counts[m[2]] = counts.get(m[2], 0) + 1
    if CUDA in counts or not counts:
        return CUDA
    return max(counts, key=lambda k: (counts[k], -k))


def _device_ids(mem: List[_Mem], dtype: int) -> List[int]:
    return sorted({m[3] for m in mem if m[2] == dtype})


def _trace(name: str, mem: List[_Mem], dtype: int, did: int) -> Trace:
    """The events of one device, in time order (Time from its first event)."""
    mine = sorted(m for m in mem if m[2] == dtype and m[3] == did)
    t0 = mine[0][0] if mine else 0.0
    events: List[Event] = []
    for ts, _, _, _, addr, nbytes in mine:
        if nbytes == 0:
            continue
        action = "alloc" if nbytes > 0 else "free"
        events.append(Event(action, addr, abs(nbytes), 0, int(ts - t0)))
    # the CPU's id is -1: a trace's device is an index from 0
    return Trace(events, name, format="profiler", device=max(did, 0))
