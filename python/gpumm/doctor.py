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

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from gpumm.units import format_size as fs

__all__ = ["Finding", "Diagnosis", "diagnose_pool", "diagnose_file", "diagnose_trace"]


@dataclass
class Finding:
    """One line of a diagnosis: ``kind`` is "remedy" (something that would help) or "fact";
    ``bytes`` is the amount it is about (the ranking key within its kind)."""

    kind: str
    text: str
    bytes: int = 0


@dataclass
class Diagnosis:
    """Findings, remedies first (largest first), then facts; ``numbers`` the figures behind
    them; ``device`` the CUDA device index a file's diagnosis is of."""

    findings: List[Finding] = field(default_factory=list)
    numbers: Dict[str, Any] = field(default_factory=dict)
    device: int = 0

    def lines(self) -> List[str]:
        return [f.text for f in self.findings]

    def __str__(self) -> str:
        return "\n".join(f"{i}. {f.text}" for i, f in enumerate(self.findings, 1))

    def rank(self) -> "Diagnosis":
        remedies = sorted((f for f in self.findings if f.kind == "remedy"), key=lambda f: -f.bytes)
        facts = [f for f in self.findings if f.kind != "remedy"]
        self.findings = remedies + facts
        return self


def diagnose_pool(pool: Any, size: Optional[int] = None) -> Diagnosis:
    """The diagnosis of a pool, for a request of ``size`` bytes if given."""
    s = pool.stats()
    snap = pool.snapshot()
    dev = pool.device
    pmm = dev.pmm.stats()
    device_free = pmm["vidmem"] - pmm["allocated_bytes"]
    ps = s["page_size"]
    limit = pool.max_size if pool.max_size is not None else dev.capacity
    headroom = max(0, min(device_free, limit - s["reserved_bytes"]))
    d = Diagnosis(numbers={
        "requested": size, "live": s["live_bytes"], "reserved": s["reserved_bytes"],
        "free": s["free_bytes"], "largest_free_run": s["largest_free_run"],
        "fragmentation": s["fragmentation"], "largest_request": s["largest_request"],
        "device_free": device_free,
    })
    add = d.findings.append
    servable = s["largest_request"] + headroom
    if size is not None:
        short = size - servable
        if short <= 0:
            add(Finding("fact", f"{fs(size)} fits now: the pool can serve {fs(s['largest_request'])} "
                        f"from what it holds and take {fs(headroom)} more from the device", size))
        else:
            # memory cached by other pools of the same device
            from gpumm.observe import pools

            others = [p for p in pools() if p is not pool and p.device is dev]
            cached = sum(p.stats()["pages_free"] * p.page_size for p in others)
            if cached:
                verdict = "enough" if cached >= short else "not enough"
                add(Finding("remedy", f"other pools on this device cache {fs(cached)} of free pages: "
                            f"trim() them ({verdict}: {fs(short)} is missing)", cached))
            # defragmentation: heap pages whose allocations may all move
            movable = {a["ptr"] for a in snap["allocations"] if a["movable"]}
            heap = [p for p in snap["pages"] if p["kind"] == "heap"]
            used_movable = [sum(sz for _, sz, o in p["blocks"] if o is not None) for p in heap
                            if all(o is None or o in movable for _, _, o in p["blocks"])]
            gain = max(0, len(used_movable) - -(-sum(used_movable) // ps)) * ps if used_movable else 0
            if gain:
                verdict = "enough" if gain >= short else "not enough"
                add(Finding("remedy", f"defrag() would empty about {fs(gain)} of heap pages holding "
                            f"only movable allocations ({verdict})", gain))
            elif used_movable:
                add(Finding("fact", f"defrag() cannot empty a heap page: the {len(used_movable)} "
                            f"holding only movable allocations have no room for each other's"))
            elif heap:
                add(Finding("fact", f"defrag() cannot help: no heap page holds only movable "
                            f"allocations (alloc(..., movable=True) lets it move them)"))
            # a smaller page size: free space inside partly used pages
            inside = s["large_free_bytes"] + s["heap_free_bytes"] - (s["largest_request"] - s["pages_free"] * ps)
            if inside > 0 and ps > 64 * 1024:
                verdict = "enough" if inside >= short else "not enough"
                add(Finding("remedy", f"{fs(max(inside, 0))} is free inside partly used {fs(ps)} pages: "
                            f"a pool with smaller pages (64 KiB where the backend maps them) could "
                            f"stitch most of it ({verdict})", inside))
            if s["live_bytes"] + size > dev.capacity:
                add(Finding("remedy", f"the device cannot hold it: live {fs(s['live_bytes'])} + "
                            f"{fs(size)} > capacity {fs(dev.capacity)}: free memory (see the "
                            f"stacks below) or use unified memory", size))
            add(Finding("fact", f"{fs(size)} does not fit: the pool can serve at most "
                        f"{fs(s['largest_request'])} from what it holds, and may take {fs(headroom)} "
                        f"more (device free {fs(device_free)}, pool limit {fs(limit)})", short))
    ratio = s["reserved_bytes"] / s["live_bytes"] if s["live_bytes"] else 0.0
    add(Finding("fact", f"live {fs(s['live_bytes'])}, reserved {fs(s['reserved_bytes'])} "
                f"({ratio:.3f} x live), free in the pool {fs(s['free_bytes'])}, of which "
                f"{fs(s['pages_free'] * ps)} in whole free pages"))
    if s["free_bytes"]:
        add(Finding("fact", f"largest free run {fs(s['largest_free_run'])} of {fs(s['free_bytes'])} free "
                    f"(fragmentation {s['fragmentation']:.0%}); stitching serves up to "
                    f"{fs(s['largest_request'])} in one request"))
    lone = [p for p in snap["pages"] if p["kind"] == "heap"
            and sum(1 for _, _, o in p["blocks"] if o is not None) == 1]
    if lone:
        held = sum(sz for p in lone for _, sz, o in p["blocks"] if o is not None)
        add(Finding("fact", f"{len(lone)} heap page(s) ({fs(len(lone) * ps)}) are each held by a "
                    f"single small allocation ({fs(held)} in all)", len(lone) * ps))
    groups = pool.leaks()[:3] if pool.is_tracking else []
    for g in groups:
        add(Finding("fact", f"stack holding the most: {g}", g.bytes))
    if not pool.is_tracking:
        add(Finding("fact", "turn on pool.tracking(True) to see which stacks hold the memory"))
    return d.rank()


def diagnose_file(path: str, capacity: Optional[str] = None,
                  gpu: Optional[int] = None) -> List[Diagnosis]:
    """The diagnosis of a trace or snapshot, one per device (the device that recorded an
    out-of-memory failure first; only device ``gpu`` if given): the real allocator's state
    (snapshots), its failures, and what gpumm and the caching allocator would need for the
    same work. A model that fails in the core is named in the findings, not raised."""
    from gpumm.replay import read_devices

    return [diagnose_trace(t, capacity) for t in read_devices(path, gpu)]


def diagnose_trace(t: Any, capacity: Optional[str] = None) -> Diagnosis:
    """The diagnosis of one device's :class:`~gpumm.traces.Trace` (see :func:`diagnose_file`)."""
    from gpumm.replay import replay
    from gpumm.report import recorded_oom_text

    d = Diagnosis(numbers={"format": t.format}, device=t.device)
    add = d.findings.append
    if t.format == "snapshot":
        _snapshot_state(t, d)
    fails = t.recorded_ooms()
    if fails:
        first = recorded_oom_text(fails[0], len(t.events),
                                  t.device if t.format == "snapshot" else None,
                                  t.events[0].time_us)
        add(Finding("fact", f"{first} ({len(fails)} allocation failure(s) recorded in all)",
                    fails[0]["size"]))
    rep = replay(t, ["gpumm", "caching", "driver"], capacity=capacity)
    for name, r in rep.results.items():
        if r.error:
            add(Finding("fact", f"the {name} model failed on this trace, so the figures below "
                        f"leave it out: {r.error}"))
    g, c, drv = (rep.results[k] for k in ("gpumm", "caching", "driver"))
    rec = rep.recorded_peak_reserved
    if g.ran and rec and rec - g.peak_reserved > max(64 << 20, rec // 100):
        add(Finding("remedy", f"gpumm would have peaked at {fs(g.peak_reserved)} where the recorded "
                    f"allocator held {fs(rec)}: {fs(rec - g.peak_reserved)} less", rec - g.peak_reserved))
    if g.ran and c.ran and c.peak_reserved - g.peak_reserved > max(64 << 20, c.peak_reserved // 100):
        add(Finding("remedy", f"replayed: PyTorch's caching allocator needs {_fs(c.min_capacity)} "
                    f"of device, gpumm {_fs(g.min_capacity)} (peak reserved {fs(c.peak_reserved)} "
                    f"vs {fs(g.peak_reserved)})", c.peak_reserved - g.peak_reserved))
    add(Finding("fact", f"peak live {fs(rep.peak_live)}; no allocator can need less than "
                f"{fs(drv.min_capacity or rep.peak_live)} of device for this trace"))
    return d.rank()


def _fs(n: Optional[int]) -> str:
    """A size, or "an unknown amount" where a search gave none."""
    return "an unknown amount" if n is None else fs(n)


def _snapshot_state(t: Any, d: Diagnosis) -> None:
    add = d.findings.append
    segs = t.final_segments
    reserved = sum(s.get("total_size", 0) for s in segs)
    live = free = largest = 0
    lone_small = 0
    by_stack: Dict[str, int] = {}
    for s in segs:
        blocks = s.get("blocks") or []
        live_blocks = [b for b in blocks if b.get("state") in ("active_allocated", "active_pending_free")]
        for b in blocks:
            size = b.get("size", 0)
            if b.get("state") in ("active_allocated", "active_pending_free"):
                live += size
                frames = [f for f in (b.get("frames") or []) if isinstance(f, dict)]
                py = [f for f in frames if str(f.get("filename", "")).endswith(".py")]
                key = " <- ".join(f"{str(f.get('filename', '?')).split('/')[-1]}:{f.get('line', 0)} "
                                  f"{f.get('name', '?')}" for f in (py or frames)[:3])
                if key:
                    by_stack[key] = by_stack.get(key, 0) + size
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
        add(Finding("remedy", f"{fs(free)} is cached but free in pieces of at most {fs(largest)}: "
                    f"an allocator that stitches pages (gpumm, or PyTorch with "
                    f"expandable_segments) could use it for one large request", free - largest))
    if lone_small:
        add(Finding("fact", f"{lone_small} small 2 MiB segment(s) are held by a single block each"))
    for stack, nbytes in sorted(by_stack.items(), key=lambda kv: -kv[1])[:3]:
        add(Finding("fact", f"{fs(nbytes)} allocated from {stack}", nbytes))
