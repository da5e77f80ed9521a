"""PyTorch's caching-allocator settings, searched by exact replay (``gpumm tune TRACE``).

Each candidate is a ``PYTORCH_CUDA_ALLOC_CONF`` string; its numbers are the caching model's
replay of the trace with those settings (the settings not named take PyTorch's defaults, as
the variable does in PyTorch), through :func:`gpumm.replay.run_model`, the routine
``gpumm replay TRACE --allocator caching --alloc-conf CONF`` uses: the same peak reserved and
smallest device, byte for byte. The replays run on a thread pool over every core (the core
releases the GIL).

Searched: ``expandable_segments``, ``max_split_size_mb``, ``roundup_power2_divisions`` (one
count for every size, and a few per-interval tables), and ``garbage_collection_threshold``
(0.6 and 0.8). The threshold acts at a share of PyTorch's allowed maximum, so its rows mean
something only at a known capacity: they are searched when ``capacity`` is given (the rows
take it as the allowed maximum: in PyTorch, the memory fraction times the device's memory,
``torch.cuda.set_per_process_memory_fraction``, which PyTorch needs before it collects), and
left out, with a note in :attr:`TuneResult.skipped`, when it is not (a trace does not record
its device's size).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from gpumm.alloc_conf import format_divisions
from gpumm.arch import get_device
from gpumm.replay import prepare, recorded_options, run_model
from gpumm.traces.base import Trace
from gpumm.units import MiB, SizeLike, parse_size

__all__ = ["DEFAULTS", "Candidate", "alloc_conf_text", "options_from_conf", "candidates", "tune",
           "BAD_COMBINATION"]

#: PyTorch's defaults for the settings the caching model follows (max_split_size 0: none;
#: garbage_collection_threshold 0: off; memory_fraction 1: all of the capacity)
DEFAULTS: Dict[str, Any] = {"expandable_segments": False, "max_split_size": 0,
                            "roundup_power2_divisions": 0, "garbage_collection_threshold": 0.0,
                            "memory_fraction": 1.0}

#: why a candidate is flagged (max_split_size_mb with expandable segments)
BAD_COMBINATION = ("max_split_size_mb with expandable_segments: PyTorch's reserve can grow "
                   "without bound (pytorch/pytorch#123548)")

_SPLITS_MB = (0, 64, 128, 256, 512, 1024, 2048)
#: (1 is no rounding, as 0: PyTorch rounds only with more than one division)
_DIVISIONS = (0, 2, 4, 8, 16, 32)
#: per-interval tables (below 2 MiB, 2 MiB, ... 32 GiB and up): PyTorch's documented shape
#: (coarser steps for larger sizes), finer steps below 64 MiB, rounding only below 16 MiB,
#: rounding only from 16 MiB
_TABLES: Tuple[List[int], ...] = ([1] * 9 + [2, 4] + [8] * 5, [8] * 6 + [4] * 3 + [2] * 7,
                                  [4] * 4 + [0] * 12, [0] * 4 + [4] * 12)
_GC_THRESHOLDS = (0.6, 0.8)
#: split sizes the GC thresholds are tried with (MiB; 0: none)
_GC_SPLITS_MB = (0, 256, 512)


def options_from_conf(text: str) -> Dict[str, Any]:
    """The caching model's options for a ``PYTORCH_CUDA_ALLOC_CONF`` string: PyTorch's
    defaults, then what the string sets (parsed by :func:`gpumm.alloc_conf.parse_alloc_conf`).
    An empty string is the defaults."""
    opts = dict(DEFAULTS)
    if text.strip():
        from gpumm.alloc_conf import parse_alloc_conf

        opts.update(parse_alloc_conf(text).options)
    return opts


def alloc_conf_text(opts: Dict[str, Any]) -> str:
    """The ``PYTORCH_CUDA_ALLOC_CONF`` string for caching options (defaults left out; "" when
    all are defaults); :func:`options_from_conf` reads it back to the same options."""
    parts = []
    if opts.get("expandable_segments"):
        parts.append("expandable_segments:True")
    split = opts.get("max_split_size") or 0
    if 0 < split < (1 << 62):
        parts.append(f"max_split_size_mb:{split // MiB}")
    div = opts.get("roundup_power2_divisions") or 0
    if div:
        parts.append(f"roundup_power2_divisions:{format_divisions(div)}")
    gc = opts.get("garbage_collection_threshold") or 0.0
    if gc:
        parts.append(f"garbage_collection_threshold:{float(gc)!r}")
    frac = opts.get("memory_fraction", 1.0)
    if frac < 1.0:
        parts.append(f"per_process_memory_fraction:{float(frac)!r}")
    return ",".join(parts)


def candidates(gc: bool = True) -> List[Dict[str, Any]]:
    """The settings searched (68 option dicts; 62 with ``gc`` False): without expandable
    segments every ``max_split_size_mb`` (none, 64 ... 2048) with every
    ``roundup_power2_divisions`` (none, 2 ... 32); with them every division count, and each
    split size once (the known-bad combination, flagged); each per-interval table with and
    without them; and, with ``gc``, ``garbage_collection_threshold`` 0.6 and 0.8 with no split
    size, 256 and 512 MiB."""
    base = dict(DEFAULTS)
    out = [dict(base, max_split_size=m * MiB, roundup_power2_divisions=d)
           for m in _SPLITS_MB for d in _DIVISIONS]
    out += [dict(base, expandable_segments=True, roundup_power2_divisions=d) for d in _DIVISIONS]
    out += [dict(base, expandable_segments=True, max_split_size=m * MiB)
            for m in _SPLITS_MB if m]
    out += [dict(base, expandable_segments=e, roundup_power2_divisions=list(t))
            for t in _TABLES for e in (False, True)]
    if gc:
        out += [dict(base, max_split_size=m * MiB, garbage_collection_threshold=g)
                for g in _GC_THRESHOLDS for m in _GC_SPLITS_MB]
    return out


@dataclass
class Candidate:
    """One setting's replay: ``alloc_conf`` (the string to export), ``peak_reserved``,
    ``min_capacity`` (the smallest device with no OOM, to the search step; None where none up
    to the capacity), ``ooms`` (failures at the capacity), ``flag`` (why it is known to be bad,
    else ""), ``recorded`` (the setting the trace recorded), ``error`` (the core's, else None)."""

    alloc_conf: str
    options: Dict[str, Any]
    peak_reserved: int
    min_capacity: Optional[int]
    ooms: int
    flag: str = ""
    recorded: bool = False
    error: Optional[str] = None

    def to_json(self) -> Dict[str, Any]:
        """``alloc_conf``, ``peak_reserved``, ``min_capacity``, ``ooms``, ``flag``,
        ``recorded``, ``error``."""
        return {"alloc_conf": self.alloc_conf, "peak_reserved": self.peak_reserved,
                "min_capacity": self.min_capacity, "ooms": self.ooms, "flag": self.flag,
                "recorded": self.recorded, "error": self.error}


def _rank_key(c: Candidate) -> Tuple[int, int, int, int, int, int]:
    """Working before failing, unflagged before flagged, fewer OOMs, a smaller device, a lower
    peak, then the shorter setting (of equal results, the one that changes least)."""
    return (c.error is not None, bool(c.flag), c.ooms,
            c.min_capacity if c.min_capacity is not None else 1 << 62, c.peak_reserved,
            len(c.alloc_conf))


@dataclass
class TuneResult:
    """Candidates best first (errors and flagged ones last); ``recorded`` the trace's own
    setting's row; ``gpumm`` gpumm's pool on the same trace (an :class:`AllocatorResult`)."""

    candidates: List[Candidate]
    recorded: Candidate
    gpumm: Any
    capacity: int
    peak_live: int
    device: int
    #: settings left out of the search, each with why
    skipped: List[str] = field(default_factory=list)

    @property
    def best(self) -> Candidate:
        return self.candidates[0]


def _largest_block(p: Any) -> int:
    """An upper bound of every request's and segment's size the caching model sees (the
    allocation rounding: 20 MiB for mid-sized requests, 2 MiB steps above)."""
    sizes = [int(s) for a, s in zip(p.actions, p.sizes) if a in (0, 2, 4)]
    if p.start:
        sizes += [int(seg[1]) for seg in p.start[0]]
    top = max(sizes, default=0)
    return max(20 * MiB, -(-top // (2 * MiB)) * 2 * MiB)


def tune(trace: Trace, capacity: Optional[SizeLike] = None, device: str = "h100",
         step: Optional[SizeLike] = None, workers: Optional[int] = None,
         settings: Optional[Sequence[Dict[str, Any]]] = None) -> TuneResult:
    """Replays ``trace`` through the caching model with each of ``settings`` (default
    :func:`candidates`, plus the trace's recorded setting) at ``capacity`` (default
    ``device``'s), on ``workers`` threads (default: every core). With no ``capacity`` the
    default settings leave out the GC thresholds (see the module's docs) and say so in
    ``skipped``."""
    cap = parse_size(capacity) if capacity is not None else get_device(device).vidmem
    skipped = [] if capacity is not None or settings is not None else [
        "garbage_collection_threshold: it acts at a share of the allowed maximum, and the "
        "trace does not record its device's size; give the capacity (--capacity) to search it"]
    unit = parse_size(step) if step is not None else None  # None: replay's default
    p = prepare(trace)
    rec_opts = dict(DEFAULTS)
    rec_opts.update(recorded_options(trace, None))
    if rec_opts.get("max_split_size", 0) < 0:
        rec_opts["max_split_size"] = 0
    todo = [dict(DEFAULTS, **o) for o in (settings if settings is not None
                                          else candidates(gc=capacity is not None))]
    if rec_opts not in todo:
        todo.append(rec_opts)

    bound = _largest_block(p)

    def key(opts: Dict[str, Any]) -> Tuple[Any, ...]:
        """Settings the model cannot tell apart share a key: without expandable segments, a
        split size above every request and segment compares as none does."""
        split = opts["max_split_size"] or 0
        if not opts["expandable_segments"] and split > bound:
            split = 0
        div = opts["roundup_power2_divisions"]
        return (opts["expandable_segments"], split,
                tuple(div) if isinstance(div, list) else div,
                opts["garbage_collection_threshold"], opts["memory_fraction"])

    distinct: Dict[Tuple[Any, ...], Dict[str, Any]] = {}
    for o in todo:
        distinct.setdefault(key(o), o)
    n = workers or os.cpu_count() or 1
    with ThreadPoolExecutor(max_workers=n) as ex:
        fut_g = ex.submit(run_model, "gpumm", p, cap, {}, unit)
        runs = dict(zip(distinct, ex.map(lambda o: run_model("caching", p, cap, o, unit),
                                         distinct.values())))

    def one(opts: Dict[str, Any]) -> Candidate:
        r = runs[key(opts)]
        flag = BAD_COMBINATION if opts["expandable_segments"] and opts["max_split_size"] else ""
        return Candidate(alloc_conf_text(opts), opts, r.peak_reserved, r.min_capacity,
                         len(r.ooms), flag, opts == rec_opts, r.error)

    done = [one(o) for o in todo]
    ranked = sorted(done, key=_rank_key)
    recorded = next(c for c in ranked if c.recorded)
    return TuneResult(ranked, recorded, fut_g.result(), cap, p.peak_live, trace.device, skipped)
