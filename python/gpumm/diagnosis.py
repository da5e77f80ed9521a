"""Out-of-memory diagnosis of a live pool: the checklist someone who knows the driver would go
through, made automatic (``pool.diagnose(size)``; every ``OutOfMemoryError`` from a pool
carries it). ``gpumm.doctor`` builds the diagnosis of a trace or snapshot on these types.

The answer is a short list, most useful first, each line with the numbers behind it: what would
make the request fit (memory cached elsewhere, defragmentation, a smaller page size), how the
memory is split between live, cached and free, where free memory is fragmented (heap pages
held by one small allocation), and which stacks hold the most.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Protocol, Sequence

from gpumm.observe import pools
from gpumm.units import format_size as fs

__all__ = ["Finding", "Diagnosis", "PoolLike", "diagnose_pool"]


class PoolLike(Protocol):
    """What ``diagnose_pool`` reads of a pool (``gpumm.MemoryPool`` is one)."""

    @property
    def device(self) -> Any: ...

    @property
    def max_size(self) -> Optional[int]: ...

    @property
    def is_tracking(self) -> bool: ...

    def stats(self) -> Dict[str, Any]: ...

    def snapshot(self) -> Dict[str, Any]: ...

    def leaks(self) -> Sequence[Any]: ...

    def defrag_plan(self) -> Dict[str, Any]: ...


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


def diagnose_pool(pool: PoolLike, size: Optional[int] = None) -> Diagnosis:
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
            others = [p for p in pools() if p is not pool and p.device is dev]
            cached = sum(p.stats()["pages_free"] * p.page_size for p in others)
            if cached:
                verdict = "enough" if cached >= short else "not enough"
                add(Finding("remedy", f"other pools on this device cache {fs(cached)} of free pages: "
                            f"trim() them ({verdict}: {fs(short)} is missing)", cached))
            # defragmentation, as the pool works it out without moving anything
            plan = pool.defrag_plan()
            heap = [p for p in snap["pages"] if p["kind"] == "heap"]
            gain = plan["pages_freed"] * ps
            if gain:
                verdict = "enough" if gain >= short else "not enough"
                add(Finding("remedy", f"defrag() would free {fs(gain)} of pages, moving "
                            f"{plan['moved_allocations']} allocation(s) ({fs(plan['moved_bytes'])}; "
                            f"{verdict})", gain))
            elif plan["movable_heap_pages"]:
                add(Finding("fact", f"defrag() cannot empty a heap page: the "
                            f"{plan['movable_heap_pages']} holding only movable allocations have "
                            f"no room for each other's"))
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
