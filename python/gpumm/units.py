"""Byte sizes as people write them: ``4096``, ``"64KiB"``, ``"2 MiB"``, ``"80GB"``.

Binary suffixes (KiB, MiB, GiB, TiB, and bare K/M/G/T) are powers of 1024; decimal ones
(kB, MB, GB, TB) powers of 1000. Parsing is done by the Rust core, so Python and Rust agree.
"""

from __future__ import annotations

from typing import Union

from gpumm._core import format_size, parse_size

SizeLike = Union[int, str]

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30
TiB = 1 << 40

__all__ = ["parse_size", "format_size", "SizeLike", "KiB", "MiB", "GiB", "TiB"]
