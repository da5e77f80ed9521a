"""The types every trace reader returns.

A reader holds a trace's events in columns (a ``gpumm._core.TraceLog``); ``Trace.events``
builds :class:`Event` objects only when asked, one at a time, and :func:`gpumm.replay.prepare`
reads the columns directly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union, overload

from gpumm import _core

__all__ = ["Event", "Trace", "StartState", "ACTIONS", "EventList"]

#: Event actions. "alloc" and "free" move live memory; "alloc_failed" and "oom" record a
#: failure of the real allocator; "segment_alloc" / "segment_free" record it taking memory
#: from the device or giving it back, "segment_map" / "segment_unmap" mapping pages into an
#: expandable segment or unmapping them (PyTorch snapshots).
ACTIONS = ("alloc", "free", "alloc_failed", "oom", "segment_alloc", "segment_free",
           "segment_map", "segment_unmap")
_CODE = {a: i for i, a in enumerate(ACTIONS)}


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


class EventList(Sequence[Event]):
    """A trace's events as a read-only sequence over its column log: ``len`` costs nothing,
    and each :class:`Event` is built when it is reached."""

    def __init__(self, log: Any) -> None:
        self._log = log

    def __len__(self) -> int:
        return len(self._log)

    @overload
    def __getitem__(self, i: int) -> Event: ...

    @overload
    def __getitem__(self, i: slice) -> List[Event]: ...

    def __getitem__(self, i: Union[int, slice]) -> Union[Event, List[Event]]:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        n = len(self._log)
        k = i + n if i < 0 else i
        t = self._log.event(k) if 0 <= k < n else None
        if t is None:
            raise IndexError("event index out of range")
        return Event(*t)

    def __iter__(self) -> Iterator[Event]:
        for t in self._log.tuples():
            yield Event(*t)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (EventList, list)):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    def __repr__(self) -> str:
        return f"<EventList of {len(self)} events>"


def log_of(events: Sequence[Event], start: Optional[StartState] = None) -> Any:
    """A column log of events built in Python (a trace a reader did not make)."""
    st = None if start is None else (list(start.segments), list(start.blocks))
    return _core.TraceLog.from_columns(
        [_CODE[e.action] for e in events], [e.ptr for e in events], [e.size for e in events],
        [e.stream for e in events], [e.time_us for e in events], [e.thread for e in events],
        [e.frames for e in events], st)


class Trace:
    """Events in order, with where they came from.

    ``events``: a list of :class:`Event`, or None with ``log`` a column log (what the readers
    return). Either way ``trace.events`` reads as a sequence of events."""

    def __init__(
        self,
        events: Optional[Sequence[Event]] = None,
        source: str = "",
        format: str = "rmm",
        start: Optional[StartState] = None,
        frames: Optional[List[List[str]]] = None,
        settings: Optional[Dict[str, Any]] = None,
        final_segments: Union[None, List[Dict[str, Any]], Callable[[], List[Dict[str, Any]]]] = None,
        has_history: bool = True,
        device: int = 0,
        *,
        log: Any = None,
        annotations: Optional[List[Dict[str, Any]]] = None,
    ) -> None:
        self._events: Optional[Sequence[Event]] = list(events) if events is not None else None
        self._log = log
        #: the start state the log was made with (a log holds its own copy)
        self._log_start = start
        self.source = source
        #: "rmm", "snapshot", "profiler"
        self.format = format
        #: the state before the first event (snapshots); None: nothing was live
        self.start = start
        #: stacks, referred to by ``Event.frames``: each a list of "file:line:function"
        self.frames: List[List[str]] = frames if frames is not None else []
        #: the real allocator's settings, when recorded (PyTorch's ``allocator_settings``)
        self.settings: Dict[str, Any] = settings if settings is not None else {}
        self._final = final_segments
        #: False for a snapshot with state but no history
        self.has_history = has_history
        #: the CUDA device index the events are of (snapshots hold one history per device)
        self.device = device
        #: PyTorch's ``external_annotations`` of this device (``time_us`` as recorded)
        self.annotations: List[Dict[str, Any]] = annotations or []

    @property
    def events(self) -> Sequence[Event]:
        if self._events is not None:
            return self._events
        return EventList(self.log)

    @events.setter
    def events(self, value: Sequence[Event]) -> None:
        self._events = list(value)
        self._log = None

    @property
    def log(self) -> Any:
        """The events in columns (a ``gpumm._core.TraceLog``), built once from ``events``
        for a trace made in Python."""
        if self._log is None or self._events is not None:
            self._log = log_of(self._events or [], self.start)
            self._log_start = self.start
            self._events = None
        return self._log

    @property
    def final_segments(self) -> List[Dict[str, Any]]:
        """The snapshot's final segments as read (for pictures of its state)."""
        if callable(self._final):
            self._final = self._final()
        return self._final or []

    @final_segments.setter
    def final_segments(self, value: List[Dict[str, Any]]) -> None:
        self._final = value

    def replace(self, events: Sequence[Event]) -> "Trace":
        """A copy of this trace with other events (the start state, stacks, settings, final
        segments and device kept)."""
        return Trace(events, self.source, self.format, self.start, self.frames, self.settings,
                     self._final, self.has_history, self.device, annotations=self.annotations)

    def __repr__(self) -> str:
        return (f"Trace(source={self.source!r}, format={self.format!r}, device={self.device}, "
                f"events={len(self.events)})")

    def recorded_ooms(self) -> List[Dict[str, Any]]:
        """The out-of-memory failures the real allocator recorded (``oom`` events of a
        snapshot, ``allocate failure`` rows of an RMM log): for each, ``index`` (into
        ``events``), ``size`` (bytes requested), ``time_us``, ``frames`` and ``device_free``
        (the bytes free on the device, as PyTorch records with an ``oom``; None otherwise)."""
        return [{"index": i, "size": s, "time_us": t, "frames": f, "device_free": free}
                for i, s, t, f, free in self.log.ooms()]

    @property
    def num_allocs(self) -> int:
        return int(self.log.num_allocs)

    def _with_start(self) -> Any:
        """The log, with this trace's start state (rebuilt if ``start`` was replaced)."""
        log = self.log
        if self.start is self._log_start:
            return log
        st = None if self.start is None else (list(self.start.segments), list(self.start.blocks))
        return _core.TraceLog.from_columns(
            log.column("action").tolist(), log.column("ptr").tolist(), log.column("size").tolist(),
            log.column("stream").tolist(), log.column("time_us").tolist(), [], [], st)

    def peak_live(self) -> int:
        """The largest sum of live requested sizes over the trace, counting what the start
        state holds. Frees of pointers not known to be live are ignored."""
        return int(self._with_start().peak_live())

    def recorded_peak_reserved(self) -> Optional[int]:
        """The peak of what the real allocator held, from the start state and the segment
        events (snapshots only; None otherwise)."""
        if self.start is None:
            return None
        return int(self._with_start().recorded_peak_reserved())
