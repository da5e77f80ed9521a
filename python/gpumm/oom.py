"""A recorded out-of-memory failure explained from the state at that moment.

The caching model replays the trace up to the failed request with the recorded settings (it
puts PyTorch's allocations at PyTorch's own addresses, so its state there is the job's): what
was live, what was cached but free and its largest free block, and what the device had left.
Then each candidate fix replays the same events and the failed request on a device of the
job's size (what PyTorch held then plus what the device had free), and says whether the
request would have been served. ``gpumm doctor TRACE`` prints these findings.

A trace with no recorded failure fails in the replay when the device it is replayed on
(``gpumm doctor TRACE --capacity SIZE``) is too small for PyTorch's allocator: then each
candidate fix replays the whole trace on that device (:func:`explain_replayed_oom`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from gpumm import _core
from gpumm.diagnosis import Finding
from gpumm.errors import GpummError
from gpumm.frames import holders
from gpumm.replay import prepare, recorded_options
from gpumm.traces.base import Trace
from gpumm.units import format_size as fs
from gpumm.units import parse_size

__all__ = ["OomState", "state_at_oom", "live_at", "live_blocks_at", "recorded_reserved_at",
           "try_fix", "candidate_fixes", "explain_recorded_oom", "explain_replayed_oom"]

_HUGE = 1 << 50  # a capacity no trace reaches: the state replay must not fail on its own


@dataclass
class OomState:
    """The state when a recorded request failed: ``live`` (requested bytes live), ``reserved``
    (the model's, with the recorded settings), ``cached_free`` (reserved but not handed out),
    ``largest_free`` (its largest free block), ``recorded_reserved`` (what the snapshot's
    segment events say PyTorch held), ``device_free`` (the snapshot's, else None),
    ``capacity`` (``recorded_reserved + device_free``: the device as the job saw it, else
    None), ``stream``, ``holders`` (:func:`gpumm.frames.holders` of the live memory)."""

    index: int
    size: int
    stream: int
    live: int
    reserved: int
    cached_free: int
    largest_free: int
    recorded_reserved: int
    device_free: Optional[int]
    capacity: Optional[int]
    holders: List[Tuple[str, int, int, List[str]]]


def live_blocks_at(t: Trace, index: int) -> List[Tuple[int, int, List[str]]]:
    """The allocations live just before event ``index``: (address, requested bytes, stack)
    each, in address order (the start state's blocks have no stack)."""
    live: Dict[int, Tuple[int, int]] = {}
    if t.start is not None:
        for addr, req, _, _ in t.start.blocks:
            live[addr] = (req, -1)
    for e in t.events[:index]:
        if e.action == "alloc":
            live[e.ptr] = (e.size, e.frames)
        elif e.action == "free":
            live.pop(e.ptr, None)
    return [(a, size, t.frames[f] if 0 <= f < len(t.frames) else [])
            for a, (size, f) in sorted(live.items())]


def live_at(t: Trace, index: int) -> List[Tuple[int, List[str]]]:
    """:func:`live_blocks_at` as (requested bytes, stack) pairs."""
    return [(size, stack) for _, size, stack in live_blocks_at(t, index)]


def recorded_reserved_at(t: Trace, index: int) -> int:
    """What the real allocator held just before event ``index`` (start state and segment
    events; 0 for a trace without them)."""
    cur = t.start.reserved_bytes if t.start is not None else 0
    for e in t.events[:index]:
        if e.action in ("segment_alloc", "segment_map"):
            cur += e.size
        elif e.action in ("segment_free", "segment_unmap"):
            cur -= e.size
    return cur


def _prefix(t: Trace, index: int, size: int, stream: int) -> Tuple[List[List[int]], Any, int]:
    """The engine's arrays for the events before ``index`` and then the failed request (a new
    id, no address); the engine index of that request."""
    p = prepare(t)
    k = sum(1 for s in p.source_index if s < index)
    arrays = [[int(v) for v in a[:k]] for a in (p.actions, p.ids, p.sizes, p.streams, p.addrs)]
    new_id = max(arrays[1] + [len(p.start[1]) if p.start else 0]) + 1
    for a, v in zip(arrays, (0, new_id, size, stream, 0)):
        a.append(v)
    return arrays, p.start, k


def try_fix(t: Trace, oom: Dict[str, Any], model: str, options: Dict[str, Any],
            capacity: int) -> Optional[bool]:
    """Whether ``model`` with ``options`` serves the failed request ``oom`` (an entry of
    :meth:`Trace.recorded_ooms`) on a ``capacity``-byte device after the same events; None
    where the core failed."""
    stream = t.events[oom["index"]].stream
    (act, ids, sizes, streams, addrs), start, k = _prefix(t, oom["index"], oom["size"], stream)
    try:
        raw = _core.replay(model, capacity, act, ids, sizes, streams, addrs, start,
                           options=options, timeline_points=2)
    except GpummError:
        return None
    return not any(o["event"] == k for o in raw["ooms"])


def state_at_oom(t: Trace, oom: Dict[str, Any]) -> OomState:
    """The :class:`OomState` of a recorded failure (the caching model with the recorded
    settings)."""
    index = oom["index"]
    stream = t.events[index].stream
    arrays, start, k = _prefix(t, index, oom["size"], stream)
    # the events before the request only, the state taken after the last of them
    act, ids, sizes, streams, addrs = (a[:k] for a in arrays)
    raw = _core.replay("caching", _HUGE, act, ids, sizes, streams, addrs, start,
                       peak_event=max(k - 1, 0), options=recorded_options(t, None),
                       timeline_points=2)
    live = live_at(t, index)
    rec = recorded_reserved_at(t, index)
    free = oom.get("device_free")
    free = free if isinstance(free, int) else None
    return OomState(
        index=index, size=oom["size"], stream=stream, live=sum(s for s, _ in live),
        reserved=raw["final_reserved"], cached_free=raw["free_at_peak"] if k else 0,
        largest_free=raw["largest_free_at_peak"] if k else 0, recorded_reserved=rec,
        device_free=free, capacity=None if free is None else (rec or raw["final_reserved"]) + free,
        holders=holders(live, 5))


def _recorded_setting(t: Trace) -> Dict[str, Any]:
    """The caching options the trace ran with: PyTorch's defaults, then its recorded ones."""
    from gpumm.tune import DEFAULTS

    rec = dict(DEFAULTS)
    rec.update(recorded_options(t, None))
    return rec


def _setting_label(opts: Dict[str, Any]) -> str:
    """Caching options as the user would set them."""
    from gpumm.tune import alloc_conf_text

    conf = alloc_conf_text(opts)
    return f"PYTORCH_CUDA_ALLOC_CONF={conf}" if conf else "PyTorch's defaults"


def candidate_fixes(t: Trace) -> List[Tuple[str, str, Dict[str, Any]]]:
    """(label, model, options) of the candidate fixes that differ from the recorded setting."""
    rec = _recorded_setting(t)
    tries: List[Dict[str, Any]] = [dict(rec, expandable_segments=not rec["expandable_segments"])]
    if not rec["expandable_segments"]:
        tries += [dict(rec, max_split_size=512 << 20), dict(rec, max_split_size=128 << 20)]
    if not rec.get("roundup_power2_divisions"):
        tries.append(dict(rec, roundup_power2_divisions=4))
    out = []
    for o in tries:
        if o != rec:
            out.append((_setting_label(o), "caching", o))
    out.append(("gpumm's pool", "gpumm", {}))
    return out


def explain_recorded_oom(t: Trace, oom: Dict[str, Any],
                         capacity: Optional[str] = None) -> List[Finding]:
    """Findings for one recorded failure: the state then, who held the memory (by user
    frame), and each candidate fix replayed (see the module's docstring). ``capacity``, if
    given, is the device size used where the snapshot does not record what was free."""
    try:
        st = state_at_oom(t, oom)
    except GpummError as e:
        return [Finding("fact", f"the caching model failed replaying up to the failure: {e}")]
    where = f"device {t.device}, " if t.format == "snapshot" else ""
    own = (f" (PyTorch's own segments: {fs(st.recorded_reserved)})"
           if st.recorded_reserved else "")
    left = "" if st.device_free is None else f", the device had {fs(st.device_free)} left"
    out = [Finding("fact", f"at the failure ({where}stream {st.stream}, {fs(st.size)} requested; "
                   f"replayed with the recorded settings): live {fs(st.live)}, reserved "
                   f"{fs(st.reserved)}{own}, cached but free {fs(st.cached_free)} (largest free "
                   f"block {fs(st.largest_free)}){left}", st.size)]
    cap = st.capacity if st.capacity is not None else (
        parse_size(capacity) if capacity is not None else None)
    if cap is None:
        out.append(Finding("fact", "the snapshot does not record what the device had free at "
                           "the failure: pass --capacity to replay the candidate fixes"))
        return out
    short = st.live + st.size - cap
    if short > 0:
        out.append(Finding("remedy", f"no allocator setting serves it: live {fs(st.live)} + "
                           f"{fs(st.size)} requested > {fs(cap)} (PyTorch's reserve then plus "
                           f"the device's free memory); {fs(short)} of live memory must go "
                           f"(the holders below), or a larger device", st.size))
    for label, model, opts in candidate_fixes(t):
        ok = try_fix(t, oom, model, opts, cap)
        verdict = ("would have served it" if ok else "would also have failed" if ok is False
                   else "failed in the core")
        out.append(Finding("remedy" if ok else "fact",
                           f"replayed on a {fs(cap)} device: {label} {verdict}",
                           st.size if ok else 0))
    for key, nbytes, count, stack in st.holders[:3]:
        out.append(Finding("fact", f"held at the failure: {fs(nbytes)} from {key} "
                           f"({count} allocation(s))", nbytes))
    return out


def explain_replayed_oom(t: Trace, caching: Any, cap: int) -> List[Finding]:
    """Findings for a trace whose replay through the caching model with the recorded settings
    (``caching``, its allocator result) fails on a ``cap``-byte device: how many requests
    fail and what it needs, then each candidate fix replayed over the whole trace on that
    device, and whether it serves every request."""
    from gpumm.replay import run_model

    setting = _setting_label(_recorded_setting(t))
    first = caching.ooms[0]
    p = prepare(t)
    # its smallest capacity is above this device: search up to a device that holds it
    wide = max(4 * cap, 2 * p.peak_live)
    need = run_model("caching", p, wide, recorded_options(t, None)).min_capacity
    needs = f"it needs {fs(need)}" if need else f"it needs more than {fs(wide)}"
    out = [Finding("fact", f"on a device of {fs(cap)} PyTorch's caching allocator ({setting}) "
                   f"fails {len(caching.ooms)} request(s) of this trace (the first: "
                   f"{fs(first['size'])}); {needs}", first["size"])]
    for label, model, opts in candidate_fixes(t):
        r = run_model(model, p, cap, opts, min_capacity=False)
        if r.error:
            out.append(Finding("fact", f"replayed on a {fs(cap)} device: {label} failed in the "
                               f"core: {r.error}"))
        elif r.ooms:
            out.append(Finding("fact", f"replayed on a {fs(cap)} device: {label} would also "
                               f"fail ({len(r.ooms)} request(s))"))
        else:
            out.append(Finding("remedy", f"replayed on a {fs(cap)} device: {label} serves every "
                               f"request (peak reserved {fs(r.peak_reserved)})",
                               cap - r.peak_reserved + first["size"]))
    return out
