"""PyTorch's caching-allocator settings, searched by exact replay (``gpumm tune TRACE``).

Each candidate is a ``PYTORCH_CUDA_ALLOC_CONF`` string; its numbers are the caching model's
replay of the trace with those settings (the settings not named take PyTorch's defaults, as
the variable does in PyTorch), through :func:`gpumm.replay.run_model`, the routine
``gpumm replay TRACE --allocator caching --alloc-conf CONF`` uses: the same peak reserved and
smallest device, byte for byte. The replays run on a thread pool over every core (the core
releases the GIL).

Searched: ``expandable_segments``, ``max_split_size_mb`` and ``roundup_power2_divisions`` (one
division count for every size). The caching model does not follow
``garbage_collection_threshold`` or the per-interval form of ``roundup_power2_divisions``;
they are not searched.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

from gpumm.arch import get_device
from gpumm.replay import prepare, recorded_options, run_model
from gpumm.traces.base import Trace
from gpumm.units import MiB, SizeLike, parse_size

__all__ = ["DEFAULTS", "Candidate", "alloc_conf_text", "options_from_conf", "candidates", "tune",
           "BAD_COMBINATION"]

#: PyTorch's defaults for the settings the caching model follows (max_split_size 0: none)
DEFAULTS: Dict[str, Any] = {"expandable_segments": False, "max_split_size": 0,
                            "roundup_power2_divisions": 0}

#: why a candidate is flagged (max_split_size_mb with expandable segments)
BAD_COMBINATION = ("max_split_size_mb with expandable_segments: PyTorch's reserve can grow "
                   "without bound (pytorch/pytorch#123548)")

_SPLITS_MB = (0, 64, 128, 256, 512, 1024, 2048)
#: (1 is no rounding, as 0: PyTorch rounds only with more than one division)
_DIVISIONS = (0, 2, 4, 8, 16, 32)


def options_from_conf(text: str) -> Dict[str, Any]:
    """The caching model's options for a ``PYTORCH_CUDA_ALLOC_CONF`` string: PyTorch's
    defaults, then what the string sets (parsed by :func:`gpumm.alloc_conf.parse_alloc_conf`).
    An empty string is the defaults."""
    opts = dict(DEFAULTS)
    if text.strip():
        from gpumm.alloc_conf import parse_alloc_conf

        got = parse_alloc_conf(text)  # an AllocConf: its ``options`` are the model's
        opts.update(getattr(got, "options", got))
    return opts


def alloc_conf_text(opts: Dict[str, Any]) -> str:
    """The ``PYTORCH_CUDA_ALLOC_CONF`` string for caching options (defaults left out; "" when
    all are defaults)."""
    parts = []
    if opts.get("expandable_segments"):
        parts.append("expandable_segments:True")
    split = opts.get("max_split_size") or 0
    if 0 < split < (1 << 62):
        parts.append(f"max_split_size_mb:{split // MiB}")
    div = opts.get("roundup_power2_divisions") or 0
    if div:
        parts.append(f"roundup_power2_divisions:{div}")
    return ",".join(parts)


def candidates() -> List[Dict[str, Any]]:
    """The settings searched (54 option dicts): without expandable segments every
    ``max_split_size_mb`` (none, 64 ... 2048) with every ``roundup_power2_divisions`` (none, 2
    ... 32); with them every division count, and each split size once (the known-bad
    combination, flagged)."""
    out = [{"expandable_segments": False, "max_split_size": m * MiB, "roundup_power2_divisions": d}
           for m in _SPLITS_MB for d in _DIVISIONS]
    out += [{"expandable_segments": True, "max_split_size": 0, "roundup_power2_divisions": d}
            for d in _DIVISIONS]
    out += [{"expandable_segments": True, "max_split_size": m * MiB, "roundup_power2_divisions": 0}
            for m in _SPLITS_MB if m]
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
    ``device``'s), on ``workers`` threads (default: every core)."""
    cap = parse_size(capacity) if capacity is not None else get_device(device).vidmem
    unit = parse_size(step) if step is not None else None  # None: replay's default
    p = prepare(trace)
    rec_opts = dict(DEFAULTS)
    rec_opts.update(recorded_options(trace, None))
    if rec_opts.get("max_split_size", 0) < 0:
        rec_opts["max_split_size"] = 0
    todo = [dict(s) for s in (settings if settings is not None else candidates())]
    if rec_opts not in todo:
        todo.append(rec_opts)

    bound = _largest_block(p)

    def key(opts: Dict[str, Any]) -> Tuple[bool, int, int]:
        """Settings the model cannot tell apart share a key: without expandable segments, a
        split size above every request and segment compares as none does."""
        split = opts["max_split_size"] or 0
        if not opts["expandable_segments"] and split > bound:
            split = 0
        return (opts["expandable_segments"], split, opts["roundup_power2_divisions"])

    distinct: Dict[Tuple[bool, int, int], Dict[str, Any]] = {}
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
    return TuneResult(ranked, recorded, fut_g.result(), cap, p.peak_live, trace.device)
