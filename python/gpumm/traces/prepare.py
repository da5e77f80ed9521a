"""A trace as the replay engine reads it: allocation ids instead of pointers, in arrays.

:func:`prepare` runs in Rust over the trace's column log (``rust/traces/prepare.rs``): no
Python object is made per event, and the arrays it returns are what ``_core.replay`` takes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional, Tuple

from gpumm.traces.base import Trace

__all__ = ["Prepared", "prepare"]


@dataclass
class Prepared:
    """A trace as the engine reads it: parallel uint64 arrays and the start state, by id."""

    actions: Any
    ids: Any
    sizes: Any
    streams: Any
    addrs: Any
    start: Optional[Tuple[List[Tuple[int, int, int]], List[Tuple[int, int, int, int, int]]]]
    peak_live: int
    #: index of the event after which live memory first reaches its peak (-1: the start)
    peak_event: int
    #: the trace index of each engine event
    source_index: Any


def prepare(trace: Trace) -> Prepared:
    """Turns a trace's pointers into allocation ids and its events into arrays (codes 0
    alloc, 1 free, 2 segment_alloc, 3 segment_free, 4 segment_map, 5 segment_unmap; failures
    are left out, and so are frees of pointers neither the trace nor its start holds)."""
    d = trace._with_start().prepare(trace.format == "snapshot")
    start = None
    if trace.start is not None:
        start = (list(trace.start.segments), d["start_blocks"])
    return Prepared(d["actions"], d["ids"], d["sizes"], d["streams"], d["addrs"], start,
                    d["peak_live"], d["peak_event"], d["source"])
