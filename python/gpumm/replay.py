"""Replay a trace through gpumm and through models of other allocators, side by side.

>>> from gpumm.traces import read_trace
>>> from gpumm.replay import replay
>>> report = replay(read_trace("gpt2_train.csv.gz"), capacity="80GiB")   # doctest: +SKIP
>>> report.results["gpumm"].ratio                                       # doctest: +SKIP
1.0006

The engine is in Rust (``rust/replay``); the allocators and the rules each model follows are
listed in ``docs/replay.md``. Events name allocations by id: frees of pointers the trace never
allocated (and that the start state does not hold) are dropped, as are failures the real
allocator recorded.

A snapshot holds one history per device: :func:`read_devices` reads every device of a file
(the device that recorded an out-of-memory failure first) or the one asked for, and
:func:`replay_file` replays each, one :class:`Report` per device.
An error of the core for one allocator (a :class:`~gpumm.errors.GpummError`) is recorded in
that allocator's :attr:`AllocatorResult.error` and the replay goes on with the others.
"""

from __future__ import annotations

import functools
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from gpumm import _core
from gpumm.alloc_conf import options_from_settings
from gpumm.arch import get_device
from gpumm.errors import GpummError, InvalidArgumentError, TraceFormatError
from gpumm.traces import read_traces
from gpumm.traces.base import Trace
from gpumm.traces.prepare import Prepared, prepare
from gpumm.units import SizeLike, parse_size

__all__ = ["ALLOCATORS", "Prepared", "AllocatorResult", "Planned", "Report", "prepare", "replay",
           "plan_prepared",
           "read_devices", "replay_file", "devices_json", "run_model", "search_min_capacity",
           "recorded_options", "SEARCHES"]

#: Every allocator model, in report order.
ALLOCATORS: Tuple[str, ...] = tuple(_core.ALLOCATORS)
@dataclass
class AllocatorResult:
    """One allocator's replay. Bytes unless named otherwise."""

    allocator: str
    capacity: int
    peak_live: int
    peak_reserved: int
    final_reserved: int
    ooms: List[Dict[str, int]]
    #: 1 - largest free range / free held, at the peak of live memory
    fragmentation_at_peak: float
    events_per_second: float
    op_ns_mean: float
    #: (event, live, reserved) over time
    timeline: List[Tuple[int, int, int]]
    min_capacity: Optional[int] = None
    #: caching model on a snapshot: the fraction of allocations at PyTorch's own address
    address_match: Optional[float] = None
    #: held but free at the peak of live memory (what `fragmentation_at_peak` is a share of)
    free_at_peak: int = 0
    #: the core's error for this allocator (the replay or the smallest-capacity search),
    #: else None; a failed replay leaves the measures at zero and ``min_capacity`` None
    error: Optional[str] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def ran(self) -> bool:
        """Whether the replay itself ran (False: it failed in the core, ``error`` says how)."""
        return bool(self.raw)

    @property
    def ratio(self) -> float:
        """Peak reserved ÷ peak live."""
        return self.peak_reserved / self.peak_live if self.peak_live else 1.0


@dataclass
class Planned:
    """The offline plan of a trace (``rust/plan``, ``docs/plan.md``): every allocation placed
    knowing every lifetime, sizes rounded to ``align`` bytes. Bytes."""

    #: the highest address the plan uses: what an allocator serving it reserves
    peak_reserved: int
    #: the peak of live aligned bytes: no allocator can reserve less on this trace
    bound: int
    align: int
    seconds: float
    #: the planner's budget of work ran out before the part of the trace that sets the peak
    #: was placed greedily (it has the time-order plan only): a lower plan may exist
    exhausted: bool = False

    @property
    def ratio(self) -> float:
        """Peak reserved ÷ the bound (1.0: the plan is optimal)."""
        return self.peak_reserved / self.bound if self.bound else 1.0

    def to_json(self) -> Dict[str, Any]:
        """``peak_reserved``, ``bound``, ``ratio`` (to the bound), ``align``, ``seconds``,
        ``exhausted``."""
        return {"peak_reserved": self.peak_reserved, "bound": self.bound,
                "ratio": round(self.ratio, 6), "align": self.align,
                "seconds": round(self.seconds, 4), "exhausted": self.exhausted}


#: the planner's alignment: PyTorch's and gpumm's smallest block (512 bytes)
PLAN_ALIGN = 512


def plan_prepared(p: Prepared, align: int = PLAN_ALIGN) -> Planned:
    """The offline plan of a prepared trace: each allocation lives from its event to its free
    (``free_completed`` in a snapshot), the start state's from the start, those never freed
    to the end. The core releases the GIL while it plans."""
    blocks = p.start
    raw = _core.plan_trace(p.actions, p.ids, p.sizes, p.streams, p.addrs, blocks, align=align)
    return Planned(raw["peak"], raw["bound"], align, raw["seconds"], raw["exhausted"])


@dataclass
class Report:
    """A trace replayed through several allocators."""

    source: str
    format: str
    events: int
    allocations: int
    peak_live: int
    capacity: int
    has_history: bool
    #: the real allocator's recorded peak reserved (PyTorch snapshots), else None
    recorded_peak_reserved: Optional[int]
    results: Dict[str, AllocatorResult]
    seconds: float
    #: the CUDA device index of the trace (snapshots hold one history per device)
    device: int = 0
    #: the out-of-memory failures the real allocator recorded on this device
    #: (:meth:`Trace.recorded_ooms`: ``index``, ``size``, ``time_us``, ``frames``, and
    #: ``device_free`` where the snapshot has it)
    recorded_ooms: List[Dict[str, Any]] = field(default_factory=list)
    #: the time of the trace's first event, in µs (for times relative to it)
    start_us: int = 0
    #: the offline plan's peak and the bound (None: not asked for, or the planner failed)
    planned: Optional[Planned] = None

    def to_json(self) -> Dict[str, Any]:
        """Plain data: ``trace``, ``format``, ``device``, ``events``, ``allocations``,
        ``peak_live``, ``capacity``, ``has_history``, ``recorded_peak_reserved``,
        ``recorded_ooms`` (each ``index`` into the events, ``size``, ``time_us``,
        ``device_free`` or null) and ``allocators``: per allocator the keys ``peak_live``,
        ``peak_reserved``, ``ooms`` (a count), ``min_capacity`` (bytes, or null), ``ratio``,
        ``free_at_peak`` (bytes held but free at the peak of live memory),
        ``fragmentation_at_peak`` (of that free memory), ``events_per_second``, ``op_ns_mean``
        (an allocation's mean time, sampled), ``first_oom``, ``error`` (the core's message
        when this allocator failed, else null), and ``address_match`` for the caching model
        on a snapshot; ``planned``: the offline plan (:meth:`Planned.to_json`) or null.
        Several devices: :func:`devices_json`."""
        out: Dict[str, Any] = {
            "trace": self.source,
            "format": self.format,
            "events": self.events,
            "allocations": self.allocations,
            "peak_live": self.peak_live,
            "capacity": self.capacity,
            "has_history": self.has_history,
            "recorded_peak_reserved": self.recorded_peak_reserved,
            "device": self.device,
            "recorded_ooms": [{"index": o["index"], "size": o["size"], "time_us": o["time_us"],
                               "device_free": o.get("device_free")}
                              for o in self.recorded_ooms],
            "allocators": {},
            "planned": self.planned.to_json() if self.planned else None,
        }
        for name, r in self.results.items():
            entry: Dict[str, Any] = {
                "peak_live": r.peak_live,
                "peak_reserved": r.peak_reserved,
                "ratio": round(r.ratio, 6),
                "ooms": len(r.ooms),
                "min_capacity": r.min_capacity,
                "free_at_peak": r.free_at_peak,
                "fragmentation_at_peak": round(r.fragmentation_at_peak, 6),
                "events_per_second": round(r.events_per_second),
                "op_ns_mean": round(r.op_ns_mean, 1),
                "first_oom": r.ooms[0] if r.ooms else None,
                "error": r.error,
            }
            if not r.ran:  # the replay itself failed: no measure to give
                entry.update({k: None for k in entry if k not in ("peak_live", "error")})
            if r.address_match is not None:
                entry["address_match"] = round(r.address_match, 6)
            if self.recorded_peak_reserved and r.ran:
                entry["reserved_vs_recorded"] = round(
                    r.peak_reserved / self.recorded_peak_reserved - 1, 6
                )
            out["allocators"][name] = entry
        return out


def recorded_options(trace: Trace, overrides: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """The real allocator's settings from the snapshot, then the caller's."""
    opts: Dict[str, Any] = {}
    s = trace.settings or {}
    if isinstance(s.get("expandable_segments"), bool):
        opts["expandable_segments"] = s["expandable_segments"]
    if isinstance(s.get("max_split_size"), int):
        opts["max_split_size"] = s["max_split_size"]
    div = s.get("roundup_power2_divisions")
    if isinstance(div, int):
        opts["roundup_power2_divisions"] = div
    elif isinstance(div, dict) and div:
        vals = {v for v in div.values() if isinstance(v, int)}
        if len(vals) == 1:
            opts["roundup_power2_divisions"] = vals.pop()
    opts.update(options_from_settings(s))  # GC threshold, memory fraction, per-interval table
    opts.update(overrides or {})
    return opts


def _core_failure(e: BaseException) -> bool:
    """Whether ``e`` is a model's failure in the core: a GpummError, or a Rust panic that
    reached Python (a BaseException PyO3 names PanicException) so the other models go on."""
    return isinstance(e, GpummError) or type(e).__name__ == "PanicException"


def run_model(name: str, p: Prepared, cap: int, opts: Dict[str, Any],
              step: Optional[int] = None, min_capacity: bool = True) -> AllocatorResult:
    """One allocator's replay of a prepared trace at ``cap`` bytes with caching-model options
    ``opts`` (what :func:`replay` does per allocator; ``gpumm tune`` calls it per setting, so
    both give the same numbers); the smallest capacity to ``step`` bytes (None: 1 % of peak
    live or 2 MiB, whichever is larger, in whole 2 MiB pages). The core releases the GIL:
    threads run models in parallel. A :class:`~gpumm.errors.GpummError` of the core is
    recorded in ``error``."""
    arrays = (p.actions, p.ids, p.sizes, p.streams, p.addrs)
    try:
        raw = _core.replay(name, cap, *arrays, p.start, peak_event=max(p.peak_event, 0),
                           options=opts)
    except BaseException as e:  # noqa: B036 - re-raised unless the core failed
        if not _core_failure(e):
            raise
        return AllocatorResult(
            allocator=name, capacity=cap, peak_live=p.peak_live, peak_reserved=0,
            final_reserved=0, ooms=[], fragmentation_at_peak=0.0, events_per_second=0.0,
            op_ns_mean=0.0, timeline=[], error=f"replay failed: {e}")
    for o in raw["ooms"]:  # the engine counts its own events; say which of the trace's
        if 0 <= o["event"] < len(p.source_index):
            o["trace_event"] = int(p.source_index[o["event"]])
    r = AllocatorResult(
        allocator=name,
        capacity=cap,
        peak_live=raw["peak_live"],
        peak_reserved=raw["peak_reserved"],
        final_reserved=raw["final_reserved"],
        ooms=raw["ooms"],
        fragmentation_at_peak=raw["fragmentation_at_peak"],
        events_per_second=raw["events_per_second"],
        op_ns_mean=raw["op_ns_mean"],
        timeline=raw["timeline"],
        free_at_peak=raw["free_at_peak"],
        raw=raw,
    )
    if name.startswith("caching") and raw["addressed_allocs"]:
        r.address_match = raw["address_matches"] / raw["addressed_allocs"]
    if min_capacity:
        search_min_capacity(r, p, opts, step)
    return r


def search_min_capacity(r: AllocatorResult, p: Prepared, opts: Dict[str, Any],
                        step: Optional[int] = None) -> None:
    """Sets ``r.min_capacity``: the smallest capacity, to ``step`` bytes, on which ``r``'s
    allocator replays the prepared trace ``p`` with no out-of-memory failure (``r`` is its
    replay at ``r.capacity``, from :func:`run_model`). A failure of the core is recorded in
    ``r.error``. The core releases the GIL: threads search in parallel."""
    if not r.ran:
        return
    raw = r.raw or {}
    cap = r.capacity
    # A run that never failed mostly fits on a device of its own peak reserve (the caching
    # models always: they ask the device for memory only to grow, so they make the same
    # choices there), so the search runs up to that first, a few steps, and up to ``cap``
    # only where the model does not fit there (a buddy arena's layout, and gpumm's pool
    # under pressure, depend on the capacity).
    search = functools.partial(_core.replay_min_capacity, r.allocator, p.actions, p.ids,
                               p.sizes, p.streams, p.addrs, p.start,
                               peak_live=p.peak_live, step=step, options=opts)
    try:
        got = None
        if not r.ooms and not raw.get("preload_failed") and 0 < r.peak_reserved < cap:
            got = search(hi=r.peak_reserved)
        r.min_capacity = got if got is not None else search(hi=cap)
    except BaseException as e:  # noqa: B036 - re-raised unless the core failed
        if not _core_failure(e):
            raise
        r.error = f"smallest-capacity search failed: {e}"


#: what :func:`replay` passes its ``progress`` callback before the searches and the plan
SEARCHES = "the smallest capacities and the plan"


def replay(
    trace: Trace,
    allocators: Sequence[str] = ALLOCATORS,
    capacity: Optional[SizeLike] = None,
    device: str = "h100",
    min_capacity: bool = True,
    step: Optional[SizeLike] = None,
    caching_options: Optional[Dict[str, Any]] = None,
    progress: Optional[Callable[[str], None]] = None,
    planned: bool = True,
) -> Report:
    """Replays ``trace`` through each allocator at ``capacity`` (default: ``device``'s), and
    finds each one's smallest capacity with no out-of-memory failure, to ``step`` (default:
    1 % of the trace's peak live bytes or 2 MiB, whichever is larger, in whole 2 MiB pages);
    ``planned``: plan the trace offline too (:attr:`Report.planned`). ``progress(what)`` is
    called before each allocator's replay (``what``: its name) and, where there are searches
    or a plan, once more before them (``what``: :data:`SEARCHES`)."""
    names = list(allocators)
    unknown = [n for n in names if n not in ALLOCATORS]
    if unknown:
        raise InvalidArgumentError(
            f"unknown allocator {unknown[0]!r}; known: {', '.join(ALLOCATORS)}"
        )
    cap = parse_size(capacity) if capacity is not None else get_device(device).vidmem
    unit = parse_size(step) if step is not None else None
    p = prepare(trace)
    opts = recorded_options(trace, caching_options)
    t0 = time.perf_counter()
    results: Dict[str, AllocatorResult] = {}
    # each model's replay alone, so that its events per second are its own; then the
    # smallest-capacity searches and the plan side by side, one thread each (the core
    # releases the GIL), which is most of the time on a large trace
    for name in names:
        if progress:
            progress(name)
        results[name] = run_model(name, p, cap, opts, unit, min_capacity=False)

    def plan_it() -> Optional[Planned]:
        try:
            return plan_prepared(p)
        except GpummError:
            return None

    if progress and (planned or min_capacity):
        progress(SEARCHES)
    with ThreadPoolExecutor(max_workers=max(1, min(os.cpu_count() or 1, len(names) + 1))) as ex:
        plan_job = ex.submit(plan_it) if planned else None
        searches = [ex.submit(search_min_capacity, r, p, opts, unit)
                    for r in results.values()] if min_capacity else []
        for job in searches:
            job.result()
        plan = plan_job.result() if plan_job else None
    return Report(
        source=trace.source,
        format=trace.format,
        events=len(trace.events),
        allocations=trace.num_allocs,
        peak_live=p.peak_live,
        capacity=cap,
        has_history=trace.has_history,
        recorded_peak_reserved=trace.recorded_peak_reserved(),
        results=results,
        seconds=time.perf_counter() - t0,
        device=trace.device,
        recorded_ooms=trace.recorded_ooms(),
        start_us=trace.events[0].time_us if trace.events else 0,
        planned=plan,
    )


#: Why a file of a known format holds nothing to replay, and what records something.
_NOTHING_TO_REPLAY = {
    "rmm": "no allocation in this RMM log (its rows hold no 'allocate'): nothing to replay",
    "snapshot": ("no allocation in this snapshot's history and no live block in its state: "
                 "nothing to replay (call torch.cuda.memory._record_memory_history() before "
                 "the run, then torch.cuda.memory._dump_snapshot(); with record_cuda=False "
                 "only pinned host memory is recorded, which gpumm does not replay)"),
    "profiler": ("no memory event in this profiler trace: nothing to replay (profile with "
                 "profile_memory=True)"),
}


def read_devices(path: Union[str, "os.PathLike[str]"], gpu: Optional[int] = None) -> List[Trace]:
    """The traces of ``path`` to replay: every device (the device that recorded an
    out-of-memory failure first, then by index; one for an RMM log or a profiler trace), or
    only device ``gpu``. A device the file does not hold is an
    :class:`~gpumm.errors.InvalidArgumentError` that lists the ones it holds; a file that
    holds no allocation on any device (a snapshot taken without its history, a profiler
    trace without memory events) a :class:`~gpumm.errors.TraceFormatError` that says what
    records one."""
    if gpu is not None and (not isinstance(gpu, int) or isinstance(gpu, bool)):
        raise InvalidArgumentError(f"gpu must be a device index (an int), not {gpu!r}")
    traces = read_traces(path)
    if all(t.num_allocs == 0 and not (t.start and t.start.blocks) for t in traces):
        raise TraceFormatError(f"{os.fspath(path)}: {_NOTHING_TO_REPLAY[traces[0].format]}")
    if gpu is None:
        return traces
    chosen = [t for t in traces if t.device == gpu]
    if not chosen:
        held = ", ".join(str(d) for d in sorted(t.device for t in traces))
        raise InvalidArgumentError(
            f"{os.fspath(path)}: no device {gpu} in this trace; it holds "
            f"{'device' if len(traces) == 1 else 'devices'} {held}")
    return chosen


def replay_file(
    path: Union[str, "os.PathLike[str]"],
    allocators: Sequence[str] = ALLOCATORS,
    gpu: Optional[int] = None,
    **options: Any,
) -> List[Report]:
    """:func:`replay` of each device of ``path`` (see :func:`read_devices`), one
    :class:`Report` per device in that order; ``options`` are :func:`replay`'s."""
    return [replay(t, allocators, **options) for t in read_devices(path, gpu)]


def devices_json(reports: Sequence[Report]) -> Dict[str, Any]:
    """The JSON of several devices' reports (``gpumm replay --json``): the first report's
    :meth:`Report.to_json` keys at the top level, as for a single device, and ``devices``, a
    list with each report's :meth:`Report.to_json` (its ``device`` key says which)."""
    if not reports:
        raise InvalidArgumentError("no report to write")
    entries = [r.to_json() for r in reports]
    out = dict(entries[0])
    out["devices"] = entries
    return out
