"""GPU architectures (Maxwell to Blackwell) and device presets.

The architecture table follows the MMU code of NVIDIA's open GPU kernel modules
(``kernel-open/nvidia-uvm/uvm_*_mmu.c``): page sizes, big page size, virtual address bits,
page-table levels, and whether the GPU has replayable faults (Pascal on) and access counters
(Volta/Turing on). The PMM chunk sizes of each type come from here, never from constants in
the core: USER chunks are the page sizes up to 2 MiB; KERNEL chunks are the page-table
allocation sizes (256 B tables from Pascal on).

Device presets give what a capacity plan needs: vidmem (as ``nvidia-smi`` reports it for the
common SKU, rounded down to 2 MiB), memory bandwidth, and the host link with its bandwidth per
direction. They are approximate public figures; pass your own numbers where they matter.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Optional, Tuple

from gpumm.errors import InvalidArgumentError
from gpumm.units import GiB, KiB, MiB

__all__ = [
    "Arch",
    "DeviceSpec",
    "Link",
    "ARCHES",
    "DEVICES",
    "LINKS",
    "get_arch",
    "get_device",
    "arch_for_compute_capability",
]


@dataclass(frozen=True)
class Arch:
    """One GPU architecture, as the driver's MMU code describes it."""

    name: str
    compute_capability: Tuple[int, ...]
    page_sizes: Tuple[int, ...]
    big_page_sizes: Tuple[int, ...]
    va_bits: int
    page_table_levels: int
    replayable_faults: bool
    access_counters: bool
    user_chunk_sizes: Tuple[int, ...]
    kernel_chunk_sizes: Tuple[int, ...]

    @property
    def big_page_size(self) -> int:
        """The default big page size."""
        return self.big_page_sizes[0]

    @property
    def va_size(self) -> int:
        return 1 << self.va_bits


@dataclass(frozen=True)
class Link:
    """A host link: its name and bandwidth per direction in bytes per second."""

    name: str
    bandwidth: float


@dataclass(frozen=True)
class DeviceSpec:
    """A GPU part: architecture, vidmem capacity, memory bandwidth and host link."""

    name: str
    arch: Arch
    vidmem: int
    memory_bandwidth: float
    link: Link
    notes: str = field(default="", compare=False)


_K4, _K64, _K128, _M2, _M512 = 4 * KiB, 64 * KiB, 128 * KiB, 2 * MiB, 512 * MiB
_G256 = 256 * GiB

_PASCAL_ON_USER = (_K4, _K64, _M2)
_PASCAL_ON_KERNEL = (256, _K4, _K64, _M2)

ARCHES: Dict[str, Arch] = {
    a.name: a
    for a in [
        Arch("maxwell", (5, 0), (_K4, _K64, _K128), (_K128, _K64), 40, 2, False, False,
             (_K4, _K64, _K128, _M2), (_K4, _K64, _K128, _M2)),
        Arch("pascal", (6, 0), (_K4, _K64, _M2), (_K64,), 49, 5, True, False,
             _PASCAL_ON_USER, _PASCAL_ON_KERNEL),
        Arch("volta", (7, 0), (_K4, _K64, _M2), (_K64,), 49, 5, True, True,
             _PASCAL_ON_USER, _PASCAL_ON_KERNEL),
        Arch("turing", (7, 5), (_K4, _K64, _M2), (_K64,), 49, 5, True, True,
             _PASCAL_ON_USER, _PASCAL_ON_KERNEL),
        Arch("ampere", (8, 0), (_K4, _K64, _M2, _M512), (_K64,), 49, 5, True, True,
             _PASCAL_ON_USER, _PASCAL_ON_KERNEL),
        Arch("ada", (8, 9), (_K4, _K64, _M2, _M512), (_K64,), 49, 5, True, True,
             _PASCAL_ON_USER, _PASCAL_ON_KERNEL),
        Arch("hopper", (9, 0), (_K4, _K64, _M2, _M512), (_K64,), 57, 6, True, True,
             _PASCAL_ON_USER, _PASCAL_ON_KERNEL),
        Arch("blackwell", (10, 0), (_K4, _K64, _M2, _M512, _G256), (_K64,), 57, 6, True, True,
             _PASCAL_ON_USER, _PASCAL_ON_KERNEL),
    ]
}

_GBs = 1e9
LINKS: Dict[str, Link] = {
    "pcie3": Link("PCIe Gen3 x16", 15.75 * _GBs),
    "pcie4": Link("PCIe Gen4 x16", 31.5 * _GBs),
    "pcie5": Link("PCIe Gen5 x16", 63.0 * _GBs),
    "nvlink-c2c": Link("NVLink-C2C", 450.0 * _GBs),
}


def _dev(name: str, arch: str, mib: int, tbs: float, link: str, notes: str = "") -> DeviceSpec:
    return DeviceSpec(name, ARCHES[arch], (mib // 2) * 2 * MiB, tbs * 1e12, LINKS[link], notes)


DEVICES: Dict[str, DeviceSpec] = {
    d.name: d
    for d in [
        _dev("p100", "pascal", 16280, 0.732, "pcie3", "P100 16 GB (PCIe)"),
        _dev("v100", "volta", 32510, 0.900, "pcie3", "V100 32 GB"),
        _dev("t4", "turing", 15360, 0.320, "pcie3", "T4 16 GB GDDR6"),
        _dev("a100-40", "ampere", 40960, 1.555, "pcie4", "A100 40 GB"),
        _dev("a100-80", "ampere", 81920, 2.039, "pcie4", "A100 80 GB SXM"),
        _dev("l40s", "ada", 46068, 0.864, "pcie4", "L40S 48 GB GDDR6"),
        _dev("h100", "hopper", 81559, 3.35, "pcie5", "H100 80 GB SXM"),
        _dev("h200", "hopper", 143771, 4.8, "pcie5", "H200 141 GB SXM"),
        _dev("gh200", "hopper", 97871, 4.0, "nvlink-c2c", "GH200 96 GB, Grace over NVLink-C2C"),
        _dev("b200", "blackwell", 183359, 8.0, "pcie5", "B200 180 GB (HGX)"),
    ]
}


def _lookup(table: Dict[str, object], name: str, what: str) -> object:
    if not isinstance(name, str):
        raise TypeError(f"{what} name must be a string, not {type(name).__name__}")
    key = name.strip().lower()
    if key == "a100":
        key = "a100-80"
    try:
        return table[key]
    except KeyError:
        known = ", ".join(table)
        raise InvalidArgumentError(f"unknown {what} {name!r}; known: {known}") from None


def get_arch(name: str) -> Arch:
    """The architecture called ``name`` (case-insensitive); raises with the known names."""
    return _lookup(ARCHES, name, "architecture")  # type: ignore[return-value]


def get_device(name: str) -> DeviceSpec:
    """The device preset called ``name`` (``"h100"``, ``"A100-80"``...)."""
    return _lookup(DEVICES, name, "device")  # type: ignore[return-value]


def arch_of(name_or_arch: "Optional[str | Arch]") -> Arch:
    if isinstance(name_or_arch, Arch):
        return name_or_arch
    return get_arch(name_or_arch if name_or_arch is not None else "hopper")


def arch_for_compute_capability(cc: "tuple[int, int]") -> Arch:
    """The architecture of a CUDA compute capability (as the driver reports it)."""
    major, minor = cc
    name = {5: "maxwell", 6: "pascal", 7: "volta", 8: "ampere", 9: "hopper"}.get(major)
    if major == 7 and minor >= 5:
        name = "turing"
    if major == 8 and minor >= 9:
        name = "ada"
    if major >= 10:
        name = "blackwell"
    if name is None:
        raise InvalidArgumentError(f"no architecture for compute capability {major}.{minor}")
    return ARCHES[name]
