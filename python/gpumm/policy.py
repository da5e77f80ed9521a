"""Where should each allocation live? The placement rule, and a planner that compares the
unified-memory modes for a workload on a device.

The rule (``place``): data the GPU accesses often goes to **vidmem**; data the CPU and the GPU
both use goes to **managed** memory; short-lived staging data (written by one side, read once
by the other) goes to **sysmem**; anything else that the GPU hardly touches stays in sysmem;
explicit overrides win. When the vidmem choices do not fit the device, the ones with the
fewest GPU accesses per byte become managed (unified memory can then page them). Every
placement comes with its reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Sequence, Union

from gpumm.arch import DeviceSpec, get_device
from gpumm.errors import InvalidArgumentError
from gpumm.units import SizeLike, format_size, parse_size
from gpumm.uvm import MODES, benchmark

__all__ = ["Usage", "Placement", "place", "plan", "Plan"]

PLACES = ("vidmem", "managed", "sysmem")


@dataclass(frozen=True)
class Usage:
    """How an allocation is used: bytes, accesses (in bytes touched, or counts: only the
    ratios matter) by the GPU and by the CPU, and whether it is short-lived staging data."""

    name: str
    size: int
    gpu_accesses: float = 0.0
    cpu_accesses: float = 0.0
    short_lived: bool = False


@dataclass(frozen=True)
class Placement:
    name: str
    where: str
    reason: str


#: the CPU's share of accesses above which data counts as shared
SHARED = 0.05


def place(usages: Sequence[Usage], device: Union[str, DeviceSpec, None] = None,
          overrides: Optional[Dict[str, str]] = None) -> List[Placement]:
    """A placement per allocation, with the reason, in the order given."""
    overrides = overrides or {}
    for name, where in overrides.items():
        if where not in PLACES:
            raise InvalidArgumentError(f"override for {name!r}: {where!r} is not one of {PLACES}")
    out: Dict[str, Placement] = {}
    for u in usages:
        if u.size < 0 or u.gpu_accesses < 0 or u.cpu_accesses < 0:
            raise InvalidArgumentError(f"{u.name}: sizes and accesses must not be negative")
        total = u.gpu_accesses + u.cpu_accesses
        if u.name in overrides:
            p = Placement(u.name, overrides[u.name], "explicit override")
        elif u.short_lived and u.cpu_accesses > 0:
            p = Placement(u.name, "sysmem", "short-lived staging data: the CPU writes it and "
                          "the GPU reads it once over the link, no migration worth making")
        elif total == 0 or u.gpu_accesses == 0:
            p = Placement(u.name, "sysmem", "the GPU does not access it")
        elif u.cpu_accesses / total >= SHARED:
            p = Placement(u.name, "managed", f"shared: the CPU makes {u.cpu_accesses / total:.0%} "
                          "of the accesses, so it should move to whoever uses it")
        else:
            p = Placement(u.name, "vidmem", "accessed mostly by the GPU "
                          f"({u.gpu_accesses / total:.0%} of accesses)")
        out[u.name] = p
    if device is not None:
        spec = device if isinstance(device, DeviceSpec) else get_device(device)
        room = spec.vidmem
        chosen = [u for u in usages if out[u.name].where == "vidmem"]
        chosen.sort(key=lambda u: -(u.gpu_accesses / u.size if u.size else 0.0))
        for u in chosen:
            if u.size <= room or out[u.name].reason == "explicit override":
                room -= min(u.size, room)
            else:
                out[u.name] = Placement(u.name, "managed", "accessed mostly by the GPU but does "
                                        f"not fit in the {format_size(room)} of vidmem left: "
                                        "managed, so unified memory pages it")
    return [out[u.name] for u in usages]


@dataclass
class Plan:
    """The modes compared for one workload, fastest first, and the one recommended."""

    device: str
    pattern: str
    oversubscription: float
    #: (mode, estimated seconds, faults, bytes moved host→device)
    options: List[tuple]
    recommended: str
    reason: str


def plan(device: Union[str, DeviceSpec] = "h100", working_set: Optional[SizeLike] = None,
         pattern: str = "streaming", *, modes: Iterable[str] = MODES, iterations: int = 2,
         vidmem: Optional[SizeLike] = None) -> Plan:
    """Runs the workload in every mode on the model and recommends the fastest."""
    spec = device if isinstance(device, DeviceSpec) else get_device(device)
    cap = parse_size(vidmem) if vidmem is not None else spec.vidmem
    ws = parse_size(working_set) if working_set is not None else cap
    factor = ws / cap
    runs = [benchmark(spec, pattern, factor, m, iterations=iterations, vidmem=cap) for m in modes]
    runs.sort(key=lambda r: r["estimated_time_s"])
    best, second = runs[0], runs[1] if len(runs) > 1 else runs[0]
    gain = second["estimated_time_s"] / best["estimated_time_s"] if best["estimated_time_s"] else 1.0
    return Plan(
        device=spec.name, pattern=pattern, oversubscription=factor,
        options=[(r["mode"], r["estimated_time_s"], r["faults"], r["bytes_h2d"]) for r in runs],
        recommended=best["mode"],
        reason=(f"{best['mode']} is estimated at {best['estimated_time_s']:.3g} s, "
                f"{gain:.2f}x faster than {second['mode']} for a {format_size(ws)} working set "
                f"({factor:.2f}x the GPU's memory) read with a {pattern} pattern"),
    )
