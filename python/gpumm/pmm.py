"""The Python face of the physical memory manager."""

from __future__ import annotations

from typing import Optional, Union

from gpumm import _core
from gpumm.arch import Arch, DeviceSpec, arch_of, get_device
from gpumm.errors import InvalidSizeError
from gpumm.units import SizeLike, parse_size

ROOT_CHUNK_SIZE = _core.ROOT_CHUNK_SIZE

__all__ = ["Pmm"]


class Pmm(_core.Pmm):
    """The physical memory manager of one simulated device.

    Vidmem is an array of 2 MiB root chunks, taken from the device as needed and split into
    the chunk sizes of the architecture (``gpumm.arch``). Operations are thread-safe and
    release the GIL.

    >>> pmm = Pmm(arch="hopper", vidmem="8GiB")
    >>> c = pmm.alloc_chunk("64KiB")
    >>> c.size, c.state
    (65536, 'temp_pinned')
    >>> pmm.free(c)

    Args:
        arch: an architecture name or :class:`gpumm.arch.Arch` (ignored if ``device`` is given).
        vidmem: capacity, an int or a string like ``"80GiB"`` (default: the device's, else 8 GiB),
            rounded down to whole 2 MiB root chunks.
        device: a device preset name or :class:`gpumm.arch.DeviceSpec`.
        release_free_roots: after a free that empties a root chunk, give it back to the device.
        check: run ``validate()`` after every operation (slow; for tests).
    """

    def __new__(
        cls,
        arch: Union[str, Arch, None] = "hopper",
        vidmem: Optional[SizeLike] = None,
        *,
        device: Union[str, DeviceSpec, None] = None,
        release_free_roots: bool = False,
        check: bool = False,
    ) -> "Pmm":
        if device is not None:
            dev = device if isinstance(device, DeviceSpec) else get_device(device)
            a = dev.arch
            if vidmem is None:
                vidmem = dev.vidmem
        else:
            a = arch_of(arch)
        if vidmem is None:
            vidmem = "8GiB"
        nbytes = parse_size(vidmem)
        # The PMM manages whole root chunks: "80GB" (decimal) keeps its 38146 whole 2 MiB roots.
        whole = nbytes - nbytes % ROOT_CHUNK_SIZE
        if nbytes > 0 and whole == 0:
            raise InvalidSizeError(f"vidmem {nbytes} B is less than one 2 MiB root chunk")
        self = super().__new__(
            cls,
            whole,
            a.user_chunk_sizes,
            a.kernel_chunk_sizes,
            release_free_roots=release_free_roots,
            check=check,
        )
        self._arch = a  # type: ignore[attr-defined]
        return self

    @property
    def arch(self) -> Arch:
        """The architecture whose chunk sizes this PMM uses."""
        return self._arch  # type: ignore[attr-defined,no-any-return]
