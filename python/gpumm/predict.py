"""Will it fit? A recorded run's GPU peak, from the exact model of PyTorch's allocator.

>>> from gpumm.predict import predict
>>> p = predict("step.pickle", device="a100-40")                    # doctest: +SKIP
>>> p.fits, p.peak_reserved, p.first_failure                          # doctest: +SKIP

The trace (from :func:`gpumm.record`, or any trace gpumm reads) is replayed through the
caching model (PyTorch's ``CUDACachingAllocator``, with the ``PYTORCH_CUDA_ALLOC_CONF``
given) and through gpumm's pool: once with room to spare for the peak each reserves, once at
the device's capacity less what the allocator never sees (the CUDA context) for the verdict
and the first allocation that would fail. What a CPU recording cannot see is added by name
(:data:`OVERHEADS`); ``docs/predict.md`` gives the figures and their sources.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Union

from gpumm.alloc_conf import AllocConf, parse_alloc_conf
from gpumm.arch import get_device
from gpumm.errors import InvalidArgumentError
from gpumm.traces import Event, Trace, load_snapshot, read_trace
from gpumm.units import GiB, MiB, SizeLike, parse_size

__all__ = ["Overhead", "Prediction", "predict", "fit_size", "device_capacity", "OVERHEADS",
           "MATMUL_OPS", "DIFFERENT_OPS"]

PathLike = Union[str, "os.PathLike[str]"]

#: CUDA context, outside the caching allocator: driver, kernels' code (loaded lazily by
#: default since CUDA 12.2), cuBLAS/cuDNN handles. Measured figures range 300-800 MiB.
CONTEXT = 500 * MiB
#: cuBLAS workspace per (handle, stream), through the caching allocator, never freed:
#: CUBLAS_WORKSPACE_CONFIG's default ":4096:2:16:8" (2 x 4 MiB + 8 x 16 KiB) before Hopper,
#: ":4096:8" (32 MiB) on Hopper and later
CUBLAS_WORKSPACE = {"default": 2 * 4 * MiB + 8 * 16 * 1024, "hopper": 8 * 4 * MiB,
                    "blackwell": 8 * 4 * MiB}
#: operators that run on cuBLAS (the first one allocates the workspace)
MATMUL_OPS = frozenset({"mm", "addmm", "bmm", "baddbmm", "addbmm", "matmul", "linear", "dot",
                        "mv", "addmv", "_scaled_mm", "_int_mm", "addr", "einsum"})
#: operators whose CUDA kernels allocate other than their CPU ones: name -> what differs
DIFFERENT_OPS = {
    "convolution": "cuDNN workspace (algorithm-dependent, transient) not counted",
    "convolution_backward": "cuDNN workspace (algorithm-dependent, transient) not counted",
    "cudnn_convolution": "cuDNN workspace (algorithm-dependent, transient) not counted",
    "_scaled_dot_product_flash_attention_for_cpu": "CUDA runs flash/efficient attention: "
    "outputs differ (logsumexp instead of CPU buffers)",
    "_scaled_dot_product_attention_math": "CUDA runs flash/efficient attention: no L x L "
    "matrix, so the CPU figure is an upper bound",
    "embedding_dense_backward": "CUDA sorts the indices (temporaries of ~16 B per index)",
    "_embedding_bag": "CUDA allocates index temporaries",
    "index_put": "with accumulate=True CUDA sorts the indices (temporaries)",
    "sort": "CUDA's radix sort allocates temporaries (~ input size)",
    "topk": "CUDA allocates sort temporaries",
    "unique": "data-dependent size; CUDA sort temporaries",
    "nonzero": "data-dependent size (fake tensors cannot know it)",
    "masked_select": "data-dependent size",
    "cumsum": "CUB scan temporaries on CUDA for large inputs",
}


@dataclass
class Overhead:
    """Memory the recording could not see, by name."""

    name: str
    bytes: int
    #: "context": outside the allocator, taken from the capacity; "allocator": an allocation
    #: added to the replay; "unmodelled": named, not counted
    kind: str
    source: str

    def to_json(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class Prediction:
    """A trace's predicted GPU memory on one device. Bytes."""

    trace: str
    device: str
    capacity: int
    #: capacity less the CUDA context: what the caching allocator can reserve
    usable: int
    #: PyTorch's caching allocator's peak reserved, with room to spare
    peak_reserved: int
    gpumm_peak_reserved: int
    peak_live: int
    #: the smallest capacity at which the caching model has no failure (to 16 MiB)
    min_capacity: Optional[int]
    gpumm_min_capacity: Optional[int]
    fits: bool
    gpumm_fits: bool
    #: the first allocation that fails at ``usable``: event, size, live, reserved,
    #: largest_free, op, stack
    first_failure: Optional[Dict[str, Any]]
    overheads: List[Overhead] = field(default_factory=list)
    alloc_conf: str = ""
    #: settings of the alloc conf the model does not reproduce: key -> why
    unmodelled: Dict[str, str] = field(default_factory=dict)
    #: operators seen whose CUDA kernels allocate differently: op -> (count, what)
    different_ops: Dict[str, Any] = field(default_factory=dict)
    #: live bytes at the end of the warm-up steps (weights, optimizer state), when marked
    warmup_live: Optional[int] = None
    recording: Dict[str, Any] = field(default_factory=dict)

    @property
    def headroom(self) -> int:
        """Usable capacity less the peak reserved (negative: the shortfall)."""
        return self.usable - self.peak_reserved

    def to_json(self) -> Dict[str, Any]:
        """Plain data: every field, ``headroom``, and overheads as dicts."""
        out = dataclasses.asdict(self)
        out["headroom"] = self.headroom
        out["overheads"] = [o.to_json() for o in self.overheads]
        return out


def device_capacity(device: Optional[str], capacity: Optional[SizeLike]) -> "tuple[str, int]":
    """(label, bytes) for ``--device`` (a preset; ``a100-40gb`` is ``a100-40``) or
    ``--capacity``."""
    if capacity is not None:
        return str(capacity), parse_size(capacity)
    name = (device or "h100").strip().lower()
    if name.endswith("gb") and name[:-2] not in ("",):
        name = name[:-2]
    return name, get_device(name).vidmem


def _arch(device: str, capacity_given: bool) -> str:
    if capacity_given:
        return "default"
    try:
        return get_device(device).arch.name
    except InvalidArgumentError:
        return "default"


def _ops(path: str, trace: Trace) -> List[str]:
    """The operator of each of ``trace``'s events, from a file :func:`gpumm.record` wrote
    ('' where unknown)."""
    try:
        data = load_snapshot(path)
    except Exception:  # noqa: BLE001 - not a snapshot: no operator names
        return [""] * len(trace.events)
    hist = (data.get("device_traces") or [[]])[trace.device] or []
    ops = [e.get("op", "") if e.get("action") == "alloc" else ""
           for e in hist if isinstance(e, dict) and e.get("action") not in ("free_requested",
                                                                            "snapshot")]
    return ops if len(ops) == len(trace.events) else [""] * len(trace.events)


def _with_workspace(trace: Trace, ops: Sequence[str], size: int) -> "tuple[Trace, int]":
    """``trace`` with the cuBLAS workspace allocated before its first matmul (-1: none)."""
    first = next((i for i, op in enumerate(ops) if op in MATMUL_OPS), -1)
    if first < 0:
        return trace, -1
    ptr = max((e.ptr for e in trace.events), default=0) + (1 << 30)
    ws = Event("alloc", ptr, size, 0, trace.events[first].time_us, 0, -1)
    events = trace.events[:first] + [ws] + trace.events[first:]
    return trace.replace(events), first


def _stack(trace: Trace, index: int) -> List[str]:
    e = trace.events[index]
    return list(trace.frames[e.frames]) if 0 <= e.frames < len(trace.frames) else []


def predict(
    source: Union[PathLike, Trace],
    device: Optional[str] = "h100",
    capacity: Optional[SizeLike] = None,
    alloc_conf: Union[None, str, AllocConf] = None,
    context: Optional[SizeLike] = None,
    workspace: Optional[SizeLike] = None,
) -> Prediction:
    """Predicts ``source``'s GPU memory on ``device`` (or a device of ``capacity`` bytes).

    ``alloc_conf``: a ``PYTORCH_CUDA_ALLOC_CONF`` string (default: none; the CLI passes the
    environment's). ``context``: the CUDA context's size (default :data:`CONTEXT`).
    ``workspace``: the cuBLAS workspace (default: by the device's architecture; added only
    to CPU recordings, whose trace has operator names; a GPU snapshot holds the real one)."""
    from gpumm.record import recording_info
    from gpumm.replay import prepare, replay

    path = os.fspath(source) if not isinstance(source, Trace) else source.source
    trace = source if isinstance(source, Trace) else read_trace(path)
    info = recording_info(path) if not isinstance(source, Trace) else {}
    conf = alloc_conf if isinstance(alloc_conf, AllocConf) else parse_alloc_conf(alloc_conf)
    label, cap = device_capacity(device, capacity)
    ctx = CONTEXT if context is None else parse_size(context)
    usable = cap - ctx
    if usable <= 0:
        raise InvalidArgumentError(f"the CUDA context ({ctx:,} B) leaves nothing of {label}")
    overheads = [Overhead("CUDA context", ctx, "context",
                          "driver, kernel code and library handles outside the allocator; "
                          "override with --context")]
    ops = _ops(path, trace) if info else [""] * len(trace.events)
    cpu_recorded = info.get("mode") in ("cpu", "fake")
    if cpu_recorded:
        ws = (CUBLAS_WORKSPACE.get(_arch(label, capacity is not None), CUBLAS_WORKSPACE["default"])
              if workspace is None else parse_size(workspace))
        trace, at = _with_workspace(trace, ops, ws)
        if at >= 0:
            ops = list(ops[:at]) + ["cublas_workspace"] + list(ops[at:])
            overheads.append(Overhead("cuBLAS workspace", ws, "allocator",
                                      "PyTorch's default CUBLAS_WORKSPACE_CONFIG for the "
                                      "architecture, allocated at the first matmul"))
    different: Dict[str, Any] = {}
    for op in ops:
        if op in DIFFERENT_OPS:
            n = different.get(op, [0, DIFFERENT_OPS[op]])
            n[0] += 1
            different[op] = n
    for op, (n, what) in different.items():
        overheads.append(Overhead(f"{op} ({n}x)", 0, "unmodelled", what))
    opts = conf.options
    p = prepare(trace)
    room = max(usable, 2 * p.peak_live + GiB)
    free_run = replay(trace, ["caching", "gpumm"], capacity=room, min_capacity=True,
                      step=16 * MiB, caching_options=opts)
    at_cap = replay(trace, ["caching", "gpumm"], capacity=usable, min_capacity=False,
                    caching_options=opts)
    c, g = at_cap.results["caching"], at_cap.results["gpumm"]
    failure = None
    if c.ooms:
        o: Dict[str, Any] = dict(c.ooms[0])
        i = p.source_index[o["event"]] if o["event"] < len(p.source_index) else -1
        o["op"] = ops[i] if 0 <= i < len(ops) else ""
        o["stack"] = _stack(trace, i) if i >= 0 else []
        o["trace_index"] = i
        failure = o
    warm_live = None
    if info.get("warmup_end") is not None:
        warm_live = _live_at(path, int(info["warmup_end"]))
    return Prediction(
        trace=path, device=label, capacity=cap, usable=usable,
        peak_reserved=free_run.results["caching"].peak_reserved,
        gpumm_peak_reserved=free_run.results["gpumm"].peak_reserved,
        peak_live=p.peak_live,
        min_capacity=free_run.results["caching"].min_capacity,
        gpumm_min_capacity=free_run.results["gpumm"].min_capacity,
        fits=not c.ooms, gpumm_fits=not g.ooms, first_failure=failure,
        overheads=overheads, alloc_conf=conf.text, unmodelled=dict(conf.unmodelled),
        different_ops={k: v[0] for k, v in different.items()}, warmup_live=warm_live,
        recording={k: v for k, v in info.items() if k != "step_ends"},
    )


def _live_at(path: str, n: int) -> int:
    """Live bytes after the first ``n`` entries of the file's history."""
    hist = (load_snapshot(path).get("device_traces") or [[]])[0]
    live: Dict[int, int] = {}
    for e in hist[:n]:
        if e.get("action") == "alloc":
            live[e["addr"]] = e["size"]
        elif e.get("action") == "free_completed":
            live.pop(e["addr"], None)
    return sum(live.values())


@dataclass
class SizeFit:
    """The largest batch size (or sequence length) that fits, from two recorded sizes."""

    sizes: List[int]
    peaks: List[int]
    #: bytes of peak reserved per unit of size, between the two runs
    per_unit: float
    #: the peak's part that does not grow with the size (the line's value at 0)
    fixed: float
    usable: int
    largest: Optional[int]
    size_name: str = "size"
    #: "replayed": each event's size interpolated between the two runs (same events in the
    #: same order), the trace at each candidate size replayed through the caching model;
    #: "linear": the two peaks' line (the runs' events differ)
    method: str = "linear"

    def to_json(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)


def _scaled(t1: Trace, t2: Trace, s1: int, s2: int, s: int) -> Trace:
    f = (s - s1) / (s2 - s1)
    events = [dataclasses.replace(a, size=max(1, round(a.size + (b.size - a.size) * f)))
              if a.size != b.size else a for a, b in zip(t1.events, t2.events)]
    return t1.replace(events)


def _same_events(t1: Trace, t2: Trace) -> bool:
    return len(t1.events) == len(t2.events) and all(
        a.action == b.action for a, b in zip(t1.events, t2.events))


def fit_size(preds: Sequence[Prediction], sizes: Sequence[int], size_name: str = "size",
             traces: Optional[Sequence[Trace]] = None, alloc_conf: Optional[str] = None) -> SizeFit:
    """The largest size whose run fits in the usable capacity, from two runs of ``sizes``.

    With ``traces`` holding the same events in the same order (a model's step at two batch
    sizes), each event's size is interpolated linearly and the trace of each candidate size
    is replayed through the caching model (bisection): the allocator's rounding and cache
    are those of that size. Otherwise the two peaks' line is used."""
    from gpumm.replay import replay

    if len(preds) != 2 or len(sizes) != 2:
        raise InvalidArgumentError("interpolation needs exactly two recordings and two sizes")
    (s1, s2), (p1, p2) = sizes, (preds[0].peak_reserved, preds[1].peak_reserved)
    if s1 == s2 or s1 <= 0 or s2 <= 0:
        raise InvalidArgumentError(f"the two sizes must be positive and differ, got {s1} and {s2}")
    slope = (p2 - p1) / (s2 - s1)
    fixed = p1 - slope * s1
    usable = min(p.usable for p in preds)
    if traces is not None and len(traces) == 2 and _same_events(*traces):
        opts = parse_alloc_conf(alloc_conf).options

        def fits(s: int) -> bool:
            t = _scaled(traces[0], traces[1], s1, s2, s)
            r = replay(t, ["caching"], capacity=usable, min_capacity=False, caching_options=opts)
            return not r.results["caching"].ooms

        lo, hi = 0, max(s1, s2)
        while fits(hi) and hi < (1 << 40):
            lo, hi = hi, hi * 2
        while hi - lo > 1:  # fits(lo) (or lo == 0), not fits(hi)
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if fits(mid) else (lo, mid)
        return SizeFit(list(sizes), [p1, p2], slope, fixed, usable, lo, size_name, "replayed")
    largest = None if slope <= 0 else max(0, int((usable - fixed) // slope))
    return SizeFit(list(sizes), [p1, p2], slope, fixed, usable, largest, size_name, "linear")
