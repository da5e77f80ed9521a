"""Reader of PyTorch CUDA memory snapshots (``torch.cuda.memory._dump_snapshot`` pickles).

**Safety.** A pickle can run any code while it loads. Snapshots are read by gpumm's own pickle
reader (``rust/traces/pickle.rs``), which builds plain data only: ``None``, booleans, numbers,
strings, bytes, lists, tuples, dicts and sets. Every opcode that imports or calls (``GLOBAL``,
``STACK_GLOBAL``, ``REDUCE``, ``BUILD``, ``INST``, ``OBJ``, ``NEWOBJ``, ``EXT*``, ``PERSID``...)
is refused with :class:`gpumm.errors.TraceFormatError` naming it and the global it asked for,
so a file from a stranger cannot run anything. No length field may run past the end of the
file and no memo index beyond the opcodes read, the two memory bombs the fuzzer found (a
420-byte file that asks for 7.4 GB; tests/fuzz/regressions). The file is parsed with the GIL
released; trace entries are held as columns and frames interned while it loads.

What is read: ``device_traces`` (the ring buffer of ``alloc``, ``free_requested``,
``free_completed``, ``segment_alloc``, ``segment_free``, ``segment_map``, ``segment_unmap``,
``oom``, ``snapshot``, ``annotate`` entries, with stack frames), ``segments`` (the final state),
``allocator_settings`` (:attr:`Trace.settings`) and ``external_annotations``
(:attr:`Trace.annotations`). The state at the start of the ring buffer is rebuilt by
rewinding from the final segments: an ``alloc`` in the history was not live before it, a
``free_completed`` was (so a history that starts mid-step gets the blocks it frees but never
allocates into its start state), a ``segment_alloc`` did not exist before it, a
``segment_free`` did; a ``segment_map`` had not mapped its pages yet, a ``segment_unmap`` had.

Memory is freed at ``free_completed``, when the allocator gets the block back.
``free_requested`` is when the program let go; a block used on another stream
(``record_stream``) stays the allocator's until the events recorded on that stream complete,
so one whose ``free_completed`` never comes stays live to the end, as it is in the final
segments (state ``active_pending_free``). A history that holds no ``free_completed``
(recorded with ``_record_memory_history(skip_actions=["free_completed"])``) is freed at
``free_requested`` instead. An ``oom`` entry keeps its ``device_free``
(:meth:`Trace.recorded_ooms`). ``snapshot`` entries mark when a snapshot was taken and
``annotate`` entries (recent PyTorch) when metadata was attached to a live allocation;
neither changes memory.

Older layouts read too: history entries without ``time_us`` (time 0), blocks without
``address`` (each follows the one before), without ``requested_size`` (the block size),
segments without ``device`` (any device's), the block state ``active_awaiting_free`` (the
name PyTorch's documentation gives ``active_pending_free``), and a bare list of segments, as
``torch.cuda.memory_snapshot()`` returns (a state with no history). A stream that is not a
non-negative int reads as 0. Frames are kept as ``file:line:function`` text; a Windows path's
drive colon stays in ``file`` (split the text with ``rsplit(":", 2)``).
"""

from __future__ import annotations

import io
import os
import pickle
from typing import Any, Dict, List, Union

from gpumm import _core
from gpumm.errors import TraceFormatError
from gpumm.traces.base import StartState, Trace

__all__ = ["read_snapshot", "read_snapshot_devices", "snapshot_devices", "load_snapshot",
           "write_snapshot"]


def load_snapshot(path: Union[str, "os.PathLike[str]"]) -> Dict[str, Any]:
    """The snapshot dict, loaded without running code; :class:`TraceFormatError` otherwise.
    A bare list of segments is returned as ``{"segments": [...]}``."""
    name = os.fspath(path)
    data = _core.load_pickle(name)
    if isinstance(data, list) and all(isinstance(s, dict) for s in data):
        data = {"segments": data}
    if not isinstance(data, dict) or "segments" not in data:
        raise TraceFormatError(f"{name}: not a PyTorch memory snapshot (no 'segments' key)")
    return data


def snapshot_devices(data: Dict[str, Any]) -> List[int]:
    """The devices a loaded snapshot holds history or segments for: those with a recorded
    ``oom`` first, then by index."""
    traces = data.get("device_traces") or []
    found = set()
    if isinstance(traces, list):
        found.update(d for d, h in enumerate(traces) if isinstance(h, list) and h)
    for seg in data.get("segments") or []:
        if isinstance(seg, dict):
            d = seg.get("device", 0)
            if isinstance(d, int) and not isinstance(d, bool) and d >= 0:
                found.add(d)

    def had_oom(d: int) -> bool:
        h = traces[d] if isinstance(traces, list) and d < len(traces) else []
        return isinstance(h, list) and any(isinstance(e, dict) and e.get("action") == "oom" for e in h)

    return sorted(found or {0}, key=lambda d: (not had_oom(d), d))


def _open(name: str) -> Any:
    return _core.read_snapshot(name)


def read_snapshot_devices(path: Union[str, "os.PathLike[str]"]) -> List[Trace]:
    """One :class:`Trace` per device of the snapshot (see :func:`snapshot_devices` for the
    order), read from one load of the file."""
    name = os.fspath(path)
    snap = _open(name)
    return [_read_device(snap, name, d) for d in snap.devices()]


def read_snapshot(path: Union[str, "os.PathLike[str]"], device: int = 0) -> Trace:
    """Reads a snapshot's history for ``device`` (and its start state) as a :class:`Trace`."""
    name = os.fspath(path)
    return _read_device(_open(name), name, device)


def first_device(path: Union[str, "os.PathLike[str]"]) -> Trace:
    """The trace of the first device of :func:`snapshot_devices`'s order."""
    name = os.fspath(path)
    snap = _open(name)
    return _read_device(snap, name, snap.devices()[0])


def _read_device(snap: Any, name: str, device: int) -> Trace:
    if not isinstance(device, int) or isinstance(device, bool) or device < 0:
        raise TraceFormatError(f"{name}: no device_traces for device {device!r}")
    log, segs, blocks, frames, final, has_history, t0 = snap.device(device)
    settings = snap.get("allocator_settings")
    notes = snap.get("external_annotations")
    annotations = [a for a in notes if isinstance(a, dict) and a.get("device", device) == device] \
        if isinstance(notes, list) else []
    start = StartState(segments=segs, blocks=blocks)
    return Trace(
        None,
        source=name,
        format="snapshot",
        start=start,
        frames=frames,
        settings=settings if isinstance(settings, dict) else {},
        final_segments=lambda: snap.segments(final),
        has_history=has_history,
        device=device,
        log=log,
        annotations=annotations,
    )


def write_snapshot(pool_snapshot: Dict[str, Any], path: Union[str, "os.PathLike[str]"]) -> None:
    """Writes a gpumm pool's ``snapshot()`` in PyTorch's snapshot layout (plain data only,
    so pytorch.org/memory_viz and :func:`read_snapshot` open it): each page is a segment and
    each block a block, in the direct map's addresses."""
    segments = []
    for page in pool_snapshot["pages"]:
        blocks = []
        allocated = 0
        for off, size, owner in page["blocks"]:
            used = owner is not None
            allocated += size if used else 0
            blocks.append({"address": page["address"] + off, "size": size,
                           "requested_size": size if used else 0,
                           "state": "active_allocated" if used else "inactive", "frames": []})
        total = sum(b["size"] for b in blocks)
        segments.append({"device": 0, "address": page["address"], "total_size": total,
                         "stream": 0, "segment_type": "small" if page["kind"] == "heap" else "large",
                         "allocated_size": allocated, "active_size": allocated,
                         "requested_size": allocated, "blocks": blocks})
    data = {"segments": segments, "device_traces": [[]],
            "allocator_settings": {"allocator": "gpumm"}}
    buf = io.BytesIO()
    pickle.dump(data, buf, protocol=4)
    with open(os.fspath(path), "wb") as f:
        f.write(buf.getvalue())
