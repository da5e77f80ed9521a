"""Reader of torch.profiler Chrome-trace JSON (``prof.export_chrome_trace``, with
``profile_memory=True``): the ``[memory]`` instant events, whose ``args`` hold ``Addr``,
``Bytes`` (negative for a free), ``Device Type`` (1: CUDA, 0: CPU) and ``Device Id``.
Plain or gzip. A malformed file raises :class:`gpumm.errors.TraceFormatError` naming the file
and the event."""

from __future__ import annotations

import gzip
import json
import os
import zlib
from typing import Any, List, Optional, Union

from gpumm.errors import TraceFormatError
from gpumm.traces.base import Event, Trace

__all__ = ["read_profiler_json"]


def read_profiler_json(
    path: Union[str, "os.PathLike[str]"], device_type: Optional[int] = None, device_id: int = 0
) -> Trace:
    """The memory events of ``device_type`` (1: CUDA, 0: CPU; None: the one with the most
    events) and ``device_id``, in time order."""
    name = os.fspath(path)
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
        raise TraceFormatError(f"{name}: no 'traceEvents' list")
    mem = []
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
            dtype, did = int(args.get("Device Type", 1)), int(args.get("Device Id", 0))
        except (KeyError, TypeError, ValueError) as e:
            raise TraceFormatError(f"{where}: bad [memory] args: {e!r}") from None
        if addr < 0:
            raise TraceFormatError(f"{where}: negative address")
        mem.append((ts, i, dtype, did, addr, nbytes))
    if device_type is None and mem:
        counts = {}
        for m in mem:
            counts[m[2]] = counts.get(m[2], 0) + 1
        device_type = max(counts, key=lambda k: counts[k])
    mem = sorted(m for m in mem if m[2] == device_type and m[3] == device_id)
    t0 = mem[0][0] if mem else 0.0
    events: List[Event] = []
    for ts, _, _, _, addr, nbytes in mem:
        if nbytes == 0:
            continue
        action = "alloc" if nbytes > 0 else "free"
        events.append(Event(action, addr, abs(nbytes), 0, int(ts - t0)))
    return Trace(events, name, format="profiler")
