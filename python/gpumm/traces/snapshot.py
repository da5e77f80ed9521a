"""Reader of PyTorch CUDA memory snapshots (``torch.cuda.memory._dump_snapshot`` pickles).

**Safety.** A pickle can run any code while it loads. Snapshots are read with an unpickler
that refuses every global (no class, no function is ever looked up), so a file from a stranger
can only be plain dicts, lists, strings and numbers; anything else is refused with
:class:`gpumm.errors.TraceFormatError` naming the global it asked for. PyTorch writes
snapshots of plain data only, so real snapshots load. Before loading, every opcode is checked
without building anything (``pickletools.genops``): imports and calls are refused there too,
and so are length fields longer than the file and memo indices beyond it, two memory bombs the
fuzzer found (a 420-byte file that asks for 7.4 GB). Loading the largest snapshot we have
(2.9 MB) takes 0.4 s.

What is read: ``device_traces`` (the ring buffer of ``alloc``, ``free_requested``,
``free_completed``, ``segment_alloc``, ``segment_free``, ``segment_map``, ``segment_unmap``,
``oom``, ``snapshot`` entries, with stack frames) and ``segments`` (the final state). The state
at the start of the ring buffer is rebuilt by rewinding from the final segments: an ``alloc``
in the history was not live before it, a ``free_completed`` was, a ``segment_alloc`` did not
exist before it, a ``segment_free`` did. Memory is freed at ``free_completed`` (when the
allocator gets it back; ``free_requested`` is when the program let go). A snapshot with state
but no history (``has_history`` False) is read for its state.
"""

from __future__ import annotations

import io
import os
import pickle
import pickletools
from typing import Any, Dict, List, Optional, Tuple, Union

from gpumm.errors import TraceFormatError
from gpumm.traces.base import Event, StartState, Trace

__all__ = ["read_snapshot", "read_snapshot_devices", "snapshot_devices", "load_snapshot",
           "write_snapshot"]

_LIVE_STATES = ("active_allocated", "active_pending_free")


_GLOBAL_OPS = {"GLOBAL", "STACK_GLOBAL", "INST", "OBJ", "REDUCE", "NEWOBJ", "NEWOBJ_EX",
               "EXT1", "EXT2", "EXT4", "BUILD", "PERSID", "BINPERSID"}
_PUT_OPS = {"PUT", "BINPUT", "LONG_BINPUT"}


def _prescan(raw: bytes) -> None:
    """Walks the opcodes without building anything (``pickletools.genops``): refuses any that
    imports or calls, any length field longer than the bytes that remain (genops checks it),
    and any memo index beyond the number of opcodes. The fuzzer found both memory bombs this
    stops: ``LONG_BINPUT 680811924`` (the C unpickler sizes its memo from it: 5 GB) and
    ``BYTEARRAY8`` of 7.4 GB in a 420-byte file (tests/fuzz/regressions)."""
    n = 0
    strings: List[str] = []
    for op, arg, _pos in pickletools.genops(io.BytesIO(raw)):
        n += 1
        if isinstance(arg, str):
            strings = (strings + [arg])[-2:]
        if op.name in _GLOBAL_OPS:
            if op.name == "GLOBAL" and isinstance(arg, str):
                what = " " + arg.replace(" ", ".")
            elif op.name == "STACK_GLOBAL" and len(strings) == 2:
                what = f" {strings[0]}.{strings[1]}"
            else:
                what = ""
            raise pickle.UnpicklingError(
                f"refused to load the global{what} ({op.name}: snapshots are plain data; a "
                "pickle that imports anything could run code)"
            )
        if op.name in _PUT_OPS and isinstance(arg, int) and arg > n:
            raise pickle.UnpicklingError(f"memo index {arg} after only {n} opcodes")


class _RefusingUnpickler(pickle.Unpickler):
    """Refuses every global: the loaded object can only be built-in plain data."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(
            f"refused to load the global {module}.{name} (snapshots are plain data; "
            "a pickle that imports anything could run code)"
        )


def load_snapshot(path: Union[str, "os.PathLike[str]"]) -> Dict[str, Any]:
    """The snapshot dict, loaded without running code; :class:`TraceFormatError` otherwise."""
    name = os.fspath(path)
    try:
        with open(name, "rb") as f:
            raw = f.read()
        _prescan(raw)
        data = _RefusingUnpickler(io.BytesIO(raw)).load()
    except OSError as e:
        raise TraceFormatError(f"{name}: cannot read: {e.strerror or e}") from None
    except Exception as e:  # noqa: BLE001 - untrusted bytes: any failure of the unpickler
        # (UnpicklingError, EOFError, SystemError from a malformed buffer, MemoryError...)
        # means "not a snapshot", never a crash
        raise TraceFormatError(f"{name}: not a readable snapshot pickle: {e}") from None
    if not isinstance(data, dict) or "segments" not in data:
        raise TraceFormatError(f"{name}: not a PyTorch memory snapshot (no 'segments' key)")
    return data


def _int(d: Dict[str, Any], key: str, where: str) -> int:
    v = d.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise TraceFormatError(f"{where}: {key!r} must be a non-negative int, got {v!r}")
    return v


def _frames(entry: Dict[str, Any], table: List[List[str]], index: Dict[Tuple[str, ...], int]) -> int:
    frames = entry.get("frames") or []
    if not isinstance(frames, list):
        return -1
    text = tuple(
        f"{f.get('filename', '?')}:{f.get('line', 0)}:{f.get('name', '?')}"
        for f in frames if isinstance(f, dict)
    )
    if not text:
        return -1
    i = index.get(text)
    if i is None:
        i = index[text] = len(table)
        table.append(list(text))
    return i


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


def read_snapshot_devices(path: Union[str, "os.PathLike[str]"]) -> List[Trace]:
    """One :class:`Trace` per device of the snapshot (see :func:`snapshot_devices` for the
    order), read from one load of the file."""
    name = os.fspath(path)
    data = load_snapshot(name)
    return [_read_device(data, name, d) for d in snapshot_devices(data)]


def read_snapshot(path: Union[str, "os.PathLike[str]"], device: int = 0) -> Trace:
    """Reads a snapshot's history for ``device`` (and its start state) as a :class:`Trace`."""
    name = os.fspath(path)
    return _read_device(load_snapshot(name), name, device)


def _read_device(data: Dict[str, Any], name: str, device: int) -> Trace:
    segments = data["segments"]
    if not isinstance(segments, list):
        raise TraceFormatError(f"{name}: 'segments' must be a list")
    traces = data.get("device_traces") or []
    if not isinstance(traces, list) or (traces and device >= len(traces)):
        raise TraceFormatError(f"{name}: no device_traces for device {device}")
    history = traces[device] if traces else []
    if not isinstance(history, list):
        raise TraceFormatError(f"{name}: device_traces[{device}] must be a list")

    # The final state: segments and the blocks live in them.
    segs: Dict[int, Tuple[int, int]] = {}
    live: Dict[int, Tuple[int, int, int]] = {}  # addr -> (requested, block size, stream)
    final: List[Dict[str, Any]] = []
    for i, seg in enumerate(segments):
        where = f"{name}: segments[{i}]"
        if not isinstance(seg, dict):
            raise TraceFormatError(f"{where}: must be a dict")
        if seg.get("device", device) != device:
            continue
        addr, total = _int(seg, "address", where), _int(seg, "total_size", where)
        stream = seg.get("stream", 0) if isinstance(seg.get("stream", 0), int) else 0
        segs[addr] = (total, stream)
        final.append(seg)
        at = addr
        blocks = seg.get("blocks") or []
        if not isinstance(blocks, list):
            raise TraceFormatError(f"{where}: 'blocks' must be a list")
        for j, b in enumerate(blocks):
            bw = f"{where}.blocks[{j}]"
            if not isinstance(b, dict):
                raise TraceFormatError(f"{bw}: must be a dict")
            size = _int(b, "size", bw)
            baddr = _int(b, "address", bw) if "address" in b else at
            if b.get("state") in _LIVE_STATES:
                req = b.get("requested_size", size)
                live[baddr] = (req if isinstance(req, int) and req >= 0 else size, size, stream)
            at = baddr + size
        if at > addr + total:
            raise TraceFormatError(f"{where}: blocks overrun the segment")

    # The history, in order, then rewound to get the start.
    events: List[Event] = []
    frames: List[List[str]] = []
    frame_index: Dict[Tuple[str, ...], int] = {}
    t0 = None
    for i, e in enumerate(history):
        where = f"{name}: device_traces[{device}][{i}]"
        if not isinstance(e, dict) or not isinstance(e.get("action"), str):
            raise TraceFormatError(f"{where}: must be a dict with an 'action'")
        act = e["action"]
        if act in ("free_requested", "snapshot"):
            continue  # frees happen at free_completed
        kind = {"alloc": "alloc", "free_completed": "free", "segment_alloc": "segment_alloc",
                "segment_free": "segment_free", "segment_map": "segment_map",
                "segment_unmap": "segment_unmap", "oom": "oom"}.get(act)
        if kind is None:
            raise TraceFormatError(f"{where}: unknown action {act!r}")
        t = e.get("time_us", 0)
        t = t if isinstance(t, int) else 0
        t0 = t if t0 is None else t0
        stream = e.get("stream", 0)
        # an ``oom`` entry has no address (it carries ``device_free`` instead)
        addr = 0 if kind == "oom" and e.get("addr") is None else _int(e, "addr", where)
        events.append(Event(kind, addr, _int(e, "size", where),
                            stream if isinstance(stream, int) else 0, t - t0, 0,
                            _frames(e, frames, frame_index) if kind == "alloc" else -1))

    start_live = dict(live)
    start_segs = dict(segs)
    for e in reversed(events):
        if e.action == "alloc":
            start_live.pop(e.ptr, None)
        elif e.action == "free":
            start_live[e.ptr] = (e.size, _block_size(e.size), e.stream)
        elif e.action == "segment_alloc":
            start_segs.pop(e.ptr, None)
        elif e.action == "segment_free":
            start_segs[e.ptr] = (e.size, e.stream)
        elif e.action == "segment_map":
            _unmap(start_segs, e.ptr, e.size)
        elif e.action == "segment_unmap":
            _map(start_segs, e.ptr, e.size, e.stream)
    start = StartState(
        segments=sorted((a, s, st) for a, (s, st) in start_segs.items()),
        blocks=sorted((a, req, bs, st) for a, (req, bs, st) in start_live.items()),
    )
    settings = data.get("allocator_settings")
    return Trace(
        events=events,
        source=name,
        format="snapshot",
        start=start,
        frames=frames,
        settings=settings if isinstance(settings, dict) else {},
        final_segments=final,
        has_history=any(e.action == "alloc" for e in events),
        device=device,
    )


def _containing(segs: Dict[int, Tuple[int, int]], addr: int) -> Optional[int]:
    """The start address of the segment in ``segs`` that holds ``addr`` (or ends at it)."""
    for a, (size, _) in segs.items():
        if a <= addr <= a + size:
            return a
    return None


def _unmap(segs: Dict[int, Tuple[int, int]], addr: int, size: int) -> None:
    """Rewinds a ``segment_map``: the pages at ``addr`` were not mapped before it. An
    expandable segment is one address range whose mapped pages grow at its end."""
    a = _containing(segs, addr)
    if a is None:
        return
    total, stream = segs.pop(a)
    before = addr - a  # mapped below the pages
    after = a + total - (addr + size)  # mapped above them
    if before > 0:
        segs[a] = (before, stream)
    if after > 0:
        segs[addr + size] = (after, stream)


def _map(segs: Dict[int, Tuple[int, int]], addr: int, size: int, stream: int) -> None:
    """Rewinds a ``segment_unmap``: the pages at ``addr`` were mapped before it, joined to
    the mapped range they touch."""
    a = _containing(segs, addr)
    if a is not None and a + segs[a][0] == addr:
        total, st = segs.pop(a)
        segs[a] = (total + size, st)
    else:
        segs[addr] = (size, stream)
    nxt = addr + size
    if nxt in segs and a is not None:
        more, _ = segs.pop(nxt)
        total, st = segs.pop(a)
        segs[a] = (total + more, st)


def _block_size(requested: int) -> int:
    """The caching allocator's block for a request (512 B steps): the size of a block whose
    free the history shows but whose allocation it does not."""
    return max(512, -(-requested // 512) * 512)


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
