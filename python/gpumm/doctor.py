"""Out-of-memory diagnosis: the checklist someone who knows the driver would go through, made
automatic. ``pool.diagnose(size)`` for a live pool (every ``OutOfMemoryError`` from a pool
carries it), ``diagnose_file(path)`` / ``gpumm doctor FILE`` for a trace or a snapshot: one
diagnosis per device of a snapshot, the device that recorded an out-of-memory failure first
(``gpu=N`` / ``--gpu N`` for one).

The answer is a short list, most useful first, each line with the numbers behind it: what would
make the request fit (memory cached elsewhere, defragmentation, a smaller page size), how the
memory is split between live, cached and free, where free memory is fragmented (heap pages
held by one small allocation), and which stacks hold the most.
"""

from __future__ import annotations

from typing import Any, List, Optional, Tuple

from gpumm.diagnosis import Diagnosis, Finding, diagnose_pool
from gpumm.frames import holders
from gpumm.units import format_size as fs

__all__ = ["Finding", "Diagnosis", "diagnose_pool", "diagnose_file", "diagnose_trace"]


def diagnose_file(path: str, capacity: Optional[str] = None,
                  gpu: Optional[int] = None, planned: bool = True) -> List[Diagnosis]:
    """The diagnosis of a trace or snapshot, one per device (the device that recorded an
    out-of-memory failure first; only device ``gpu`` if given): the real allocator's state
    (snapshots), its failures, and what gpumm and the caching allocator would need for the
    same work. A model that fails in the core is named in the findings, not raised.
    ``planned``: with the offline plan's line (the bound, what a plan reserves)."""
    from gpumm.replay import read_devices

    return [diagnose_trace(t, capacity, planned) for t in read_devices(path, gpu)]


def diagnose_trace(t: Any, capacity: Optional[str] = None, planned: bool = True) -> Diagnosis:
    """The diagnosis of one device's :class:`~gpumm.traces.Trace` (see :func:`diagnose_file`);
    ``planned=False`` leaves the offline planner out."""
    from gpumm.replay import replay
    from gpumm.report import recorded_oom_text

    d = Diagnosis(numbers={"format": t.format}, device=t.device)
    add = d.findings.append
    if t.format == "snapshot":
        _snapshot_state(t, d)
    fails = t.recorded_ooms()
    oom_findings: List[Finding] = []
    if fails:
        first = recorded_oom_text(fails[0], len(t.events),
                                  t.device if t.format == "snapshot" else None,
                                  t.events[0].time_us)
        add(Finding("fact", f"{first} ({len(fails)} allocation failure(s) recorded in all)",
                    fails[0]["size"]))
        from gpumm.oom import explain_recorded_oom

        oom_findings = [d.findings.pop()] + explain_recorded_oom(t, fails[0], capacity)
    rep = replay(t, ["gpumm", "caching", "driver"], capacity=capacity, planned=planned)
    for name, r in rep.results.items():
        if r.error:
            add(Finding("fact", f"the {name} model failed on this trace, so the figures below "
                        f"leave it out: {r.error}"))
    g, c, drv = (rep.results[k] for k in ("gpumm", "caching", "driver"))
    rec = rep.recorded_peak_reserved
    if g.ran and rec and rec - g.peak_reserved > max(64 << 20, rec // 100):
        add(Finding("remedy", f"gpumm would have peaked at {fs(g.peak_reserved)} where the recorded "
                    f"allocator held {fs(rec)}: {fs(rec - g.peak_reserved)} less", rec - g.peak_reserved))
    if not fails and c.ran and c.ooms:
        # no failure recorded, but the job would fail on this device with PyTorch's allocator
        from gpumm.oom import explain_replayed_oom

        oom_findings = explain_replayed_oom(t, c, rep.capacity)
    elif g.ran and c.ran and c.peak_reserved - g.peak_reserved > max(64 << 20, c.peak_reserved // 100):
        add(Finding("remedy", f"replayed: PyTorch's caching allocator needs {_fs(c.min_capacity)} "
                    f"of device, gpumm {_fs(g.min_capacity)} (peak reserved {fs(c.peak_reserved)} "
                    f"vs {fs(g.peak_reserved)})", c.peak_reserved - g.peak_reserved))
    # the driver model holds each live request rounded to 512 B and nothing else: its peak is
    # the least any allocator needs (its smallest capacity is that rounded up to the search's
    # step, 2 MiB or 1 % of peak live, which overstates it); an OOM in it cuts its peak short
    need = drv.peak_reserved if drv.ran and not drv.ooms else 0
    add(Finding("fact", f"peak live {fs(rep.peak_live)}; no allocator can need less than "
                f"{fs(max(need, rep.peak_live))} of device for this trace"))
    if g.ran and g.ooms:
        # the replay's peak stops short of what the trace needs: say so, not that peak
        needs = (f"it needs {fs(g.min_capacity)}" if g.min_capacity else
                 f"it needs more than {fs(rep.capacity)}")
        add(Finding("fact", f"on a device of {fs(rep.capacity)} gpumm's pool fails "
                    f"{len(g.ooms)} request(s) of this trace (the first: {fs(g.ooms[0]['size'])}); "
                    f"{needs}", g.ooms[0]["size"]))
    pl = rep.planned
    if pl is not None:
        add(Finding("fact", planned_line(pl, g if g.ran and not g.ooms else None)))
    d.rank()
    d.findings = oom_findings + d.findings  # the recorded failure first: it is the question
    return d


def planned_line(pl: Any, g: Any = None) -> str:
    """The bound and the offline plan in words, and gpumm's pool ``g`` (an allocator result,
    or None) against both."""
    line = (f"no allocator can reserve less than {fs(pl.bound)} on this trace (its peak of live "
            f"bytes in 512-byte blocks); a plan made offline with every lifetime known reserves "
            f"{fs(pl.peak_reserved)} ({pl.ratio:.4f} × that bound)")
    if pl.exhausted:
        from gpumm.report import EXHAUSTED

        line += f" ({EXHAUSTED})"
    if g is None:
        return line
    b = pl.bound or 1
    rel = ("the same as the plan" if g.peak_reserved == pl.peak_reserved else
           f"{fs(abs(g.peak_reserved - pl.peak_reserved))} "
           f"{'above' if g.peak_reserved > pl.peak_reserved else 'below'} the plan")
    return line + (f"; gpumm's pool reserves {fs(g.peak_reserved)} "
                   f"({g.peak_reserved / b:.4f} × the bound, {rel})")


def _fs(n: Optional[int]) -> str:
    """A size, or "an unknown amount" where a search gave none."""
    return "an unknown amount" if n is None else fs(n)


def _snapshot_state(t: Any, d: Diagnosis) -> None:
    add = d.findings.append
    segs = t.final_segments
    reserved = sum(s.get("total_size", 0) for s in segs)
    live = free = largest = 0
    lone_small = 0
    held: List[Tuple[int, List[str]]] = []
    for s in segs:
        blocks = s.get("blocks") or []
        live_blocks = [b for b in blocks if b.get("state") in ("active_allocated", "active_pending_free")]
        for b in blocks:
            size = b.get("size", 0)
            if b.get("state") in ("active_allocated", "active_pending_free"):
                live += size
                frames = [f for f in (b.get("frames") or []) if isinstance(f, dict)]
                held.append((size, [f"{f.get('filename', '?')}:{f.get('line', 0)}:"
                                    f"{f.get('name', '?')}" for f in frames]))
            else:
                free += size
                largest = max(largest, size)
        if s.get("segment_type") == "small" and len(live_blocks) == 1:
            lone_small += 1
    d.numbers.update(reserved=reserved, live=live, free=free, largest_free_run=largest)
    frag = 1 - largest / free if free else 0.0
    add(Finding("fact", f"at the snapshot: reserved {fs(reserved)} in {len(segs)} segments, "
                f"allocated {fs(live)}, cached free {fs(free)} (largest free block {fs(largest)}, "
                f"fragmentation {frag:.0%})", free))
    if free > largest:
        stitch = ("gpumm" if t.settings.get("expandable_segments") is True
                  else "gpumm, or PyTorch with expandable_segments:True")
        add(Finding("remedy", f"{fs(free)} is cached but free in pieces of at most {fs(largest)}: "
                    f"an allocator that stitches pages ({stitch}) could use it for one large "
                    f"request", free - largest))
    if lone_small:
        add(Finding("fact", f"{lone_small} small 2 MiB segment(s) are held by a single block each"))
    for key, nbytes, count, _ in holders(held, 3):
        if key != "(no Python frame)":
            add(Finding("fact", f"{fs(nbytes)} allocated from {key} ({count} block(s), at the "
                        f"snapshot)", nbytes))
