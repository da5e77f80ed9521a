"""The types every trace reader returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

__all__ = ["Event", "Trace", "StartState", "ACTIONS"]

#: Event actions. "alloc" and "free" move live memory; "alloc_failed" and "oom" record a
#: failure of the real allocator; "segment_alloc" / "segment_free" record it taking memory
#: from the device or giving it back, "segment_map" / "segment_unmap" mapping pages into an
#: expandable segment or unmapping them (PyTorch snapshots).
ACTIONS = ("alloc", "free", "alloc_failed", "oom", "segment_alloc", "segment_free",
           "segment_map", "segment_unmap")


@dataclass(frozen=True)
class Event:
    """One allocator event. ``size`` is the requested size for allocations and frees, the
    segment size for segment events."""

    action: str
    ptr: int
    size: int
    stream: int
    time_us: int
    thread: int = 0
    #: index into ``Trace.frames`` of the Python/C++ stack that made it (-1: none)
    frames: int = -1


@dataclass
class StartState:
    """What the real allocator held when the trace begins (a snapshot's history is a ring
    buffer: its first event is not the program's first)."""

    #: (address, size, stream) of segments
    segments: List[Tuple[int, int, int]] = field(default_factory=list)
    #: (address, requested size, block size, stream) of live allocations
    blocks: List[Tuple[int, int, int, int]] = field(default_factory=list)

    @property
    def live_bytes(self) -> int:
        return sum(b[1] for b in self.blocks)

    @property
    def reserved_bytes(self) -> int:
        return sum(s[1] for s in self.segments)


@dataclass
class Trace:
    """Events in order, with where they came from."""

    events: List[Event]
    source: str
    #: "rmm", "snapshot", "profiler"
    format: str = "rmm"
    #: the state before the first event (snapshots); None: nothing was live
    start: Optional[StartState] = None
    #: stacks, referred to by ``Event.frames``: each a list of "file:line:function"
    frames: List[List[str]] = field(default_factory=list)
    #: the real allocator's settings, when recorded (PyTorch's ``allocator_settings``)
    settings: Dict[str, Any] = field(default_factory=dict)
    #: the snapshot's final segments as read (for pictures of its state)
    final_segments: List[Dict[str, Any]] = field(default_factory=list)
    #: False for a snapshot with state but no history
    has_history: bool = True
    #: the CUDA device index the events are of (snapshots hold one history per device)
    device: int = 0

    def recorded_ooms(self) -> List[Dict[str, Any]]:
        """The out-of-memory failures the real allocator recorded (``oom`` events of a
        snapshot, ``allocate failure`` rows of an RMM log): for each, ``index`` (into
        ``events``), ``size`` (bytes requested), ``time_us`` and ``frames``."""
        return [{"index": i, "size": e.size, "time_us": e.time_us, "frames": e.frames}
                for i, e in enumerate(self.events) if e.action in ("oom", "alloc_failed")]

    @property
    def num_allocs(self) -> int:
        return sum(1 for e in self.events if e.action == "alloc")

    def peak_live(self) -> int:
        """The largest sum of live requested sizes over the trace, counting what the start
        state holds. Frees of pointers not known to be live are ignored."""
        live: Dict[int, int] = {}
        cur = 0
        if self.start is not None:
            for addr, req, _, _ in self.start.blocks:
                live[addr] = req
                cur += req
        peak = cur
        for e in self.events:
            if e.action == "alloc":
                live[e.ptr] = e.size
                cur += e.size
                peak = max(peak, cur)
            elif e.action == "free":
                cur -= live.pop(e.ptr, 0)
        return peak

    def recorded_peak_reserved(self) -> Optional[int]:
        """The peak of what the real allocator held, from the start state and the segment
        events (snapshots only; None otherwise)."""
        if self.start is None:
            return None
        cur = peak = self.start.reserved_bytes
        for e in self.events:
            if e.action in ("segment_alloc", "segment_map"):
                cur += e.size
                peak = max(peak, cur)
            elif e.action in ("segment_free", "segment_unmap"):
                cur -= e.size
        return peak
