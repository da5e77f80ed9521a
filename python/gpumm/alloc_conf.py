"""PyTorch's ``PYTORCH_CUDA_ALLOC_CONF`` string, read the way PyTorch reads it.

>>> conf = parse_alloc_conf("expandable_segments:True,max_split_size_mb:512")
>>> conf.options
{'expandable_segments': True, 'max_split_size': 536870912}

``options`` is what :func:`gpumm.replay.replay` takes as ``caching_options``. What PyTorch
accepts but gpumm's caching model does not act on is kept, by name, in ``unmodelled`` (with
why), never dropped: a prediction made under such a setting says so. A string PyTorch would
refuse (an unknown key, a size that is not a power of two, a threshold outside (0, 1)) raises
:class:`gpumm.errors.InvalidArgumentError` naming the part at fault, as PyTorch's own
``CUDAAllocatorConfig`` parser refuses it at start-up.

The rules, from ``c10/cuda/CUDAAllocatorConfig.cpp``:

- ``max_split_size_mb:N``: N must be above 20 (``kLargeBuffer``, 20 MiB); blocks of N MiB or
  more are never split.
- ``roundup_power2_divisions:N`` (N a power of two) for every size, or the per-interval form
  ``[256:1,512:2,>:4]``: each key a power of two in MiB naming the interval [key, 2·key); the
  first key's value also covers every smaller interval, ``>`` every interval after the last
  key; intervals between two keys keep 0 (no rounding). 16 intervals, 1 MiB to 32 GiB.
- ``garbage_collection_threshold:F``, 0 < F < 1.
- ``expandable_segments``, ``release_lock_on_cudamalloc``, ``pinned_use_cuda_host_register``,
  ``pinned_use_background_threads``: ``True`` or ``False``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Union

from gpumm.errors import InvalidArgumentError

__all__ = ["AllocConf", "parse_alloc_conf", "from_environment", "INTERVALS", "MODELLED"]

MiB = 1 << 20
#: PyTorch's ``kLargeBuffer``: max_split_size_mb must be above this many MiB
_LARGE_BUFFER_MB = 20
#: per-interval division counts: 1 MiB, 2 MiB, ... 32 GiB (``kRoundUpPowerOfTwoIntervals``)
INTERVALS = 16
#: the options gpumm's caching model acts on
MODELLED = ("expandable_segments", "max_split_size", "roundup_power2_divisions")

# Keys PyTorch accepts that change nothing on the device's memory (host pinning, locking).
_HOST_ONLY = {
    "release_lock_on_cudamalloc": "bool",
    "pinned_use_cuda_host_register": "bool",
    "pinned_use_background_threads": "bool",
    "pinned_num_register_threads": "int",
    "pinned_reserve_segment_size_mb": "int",
    "graph_capture_record_stream_reuse": "bool",
}
_KNOWN = {"max_split_size_mb", "max_non_split_rounding_mb", "garbage_collection_threshold",
          "roundup_power2_divisions", "expandable_segments", "backend",
          "per_process_memory_fraction"} | set(_HOST_ONLY)


@dataclass
class AllocConf:
    """A parsed ``PYTORCH_CUDA_ALLOC_CONF``."""

    text: str
    #: what :func:`gpumm.replay.replay` takes as ``caching_options``
    options: Dict[str, Any] = field(default_factory=dict)
    #: every setting read, by PyTorch's key, with its parsed value
    settings: Dict[str, Any] = field(default_factory=dict)
    #: settings gpumm's caching model does not act on: key -> why it matters (or not)
    unmodelled: Dict[str, str] = field(default_factory=dict)
    #: roundup_power2_divisions per interval (1 MiB, 2 MiB, ... 32 GiB), when given
    divisions: Optional[List[int]] = None

    def describe(self) -> List[str]:
        """One line per setting that gpumm's model does not reproduce."""
        return [f"{k}: {why}" for k, why in self.unmodelled.items()]


def _bool(key: str, value: str) -> bool:
    if value not in ("True", "False"):
        raise InvalidArgumentError(f"PYTORCH_CUDA_ALLOC_CONF: {key} expects True or False, "
                                   f"got {value!r}")
    return value == "True"


def _int(key: str, value: str) -> int:
    if not re.fullmatch(r"\d+", value):
        raise InvalidArgumentError(f"PYTORCH_CUDA_ALLOC_CONF: {key} expects a whole number, "
                                   f"got {value!r}")
    return int(value)


def _float(key: str, value: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise InvalidArgumentError(f"PYTORCH_CUDA_ALLOC_CONF: {key} expects a number, got "
                                   f"{value!r}") from None


def _pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def _tokens(text: str) -> List[str]:
    """Splits on commas outside brackets: ``a:1,b:[1:2,>:4]`` -> ``['a:1', 'b:[1:2,>:4]']``."""
    parts: List[str] = []
    depth, cur = 0, ""
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise InvalidArgumentError(f"PYTORCH_CUDA_ALLOC_CONF: unbalanced ']' in {text!r}")
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if depth:
        raise InvalidArgumentError(f"PYTORCH_CUDA_ALLOC_CONF: unclosed '[' in {text!r}")
    parts.append(cur)
    return [p.strip() for p in parts if p.strip()]


def _divisions(value: str) -> List[int]:
    """``N`` or ``[size_mb:N,...,>:N]`` to 16 per-interval division counts."""
    key = "roundup_power2_divisions"
    out = [0] * INTERVALS
    if not value.startswith("["):
        n = _int(key, value)
        if not _pow2(n):
            raise InvalidArgumentError(f"PYTORCH_CUDA_ALLOC_CONF: {key} must be a power of 2, "
                                       f"got {n}")
        return [n] * INTERVALS
    if not value.endswith("]"):
        raise InvalidArgumentError(f"PYTORCH_CUDA_ALLOC_CONF: {key}: expected ']' at the end "
                                   f"of {value!r}")
    first, last = True, 0
    for item in _tokens(value[1:-1]):
        size, sep, n_text = item.partition(":")
        if not sep:
            raise InvalidArgumentError(f"PYTORCH_CUDA_ALLOC_CONF: {key}: expected "
                                       f"'size_mb:divisions' or '>:divisions', got {item!r}")
        n = _int(key, n_text.strip())
        if not _pow2(n):
            raise InvalidArgumentError(f"PYTORCH_CUDA_ALLOC_CONF: {key}: divisions must be a "
                                       f"power of 2, got {n} in {item!r}")
        size = size.strip()
        if size == ">":
            for i in range(last + 1, INTERVALS):
                out[i] = n
            continue
        mb = _int(key, size)
        if not _pow2(mb):
            raise InvalidArgumentError(f"PYTORCH_CUDA_ALLOC_CONF: {key}: interval sizes must be "
                                       f"powers of 2 (MiB), got {mb} in {item!r}")
        index = min(mb.bit_length() - 1, INTERVALS - 1)
        if first:
            for i in range(index):
                out[i] = n
            first = False
        out[index] = n
        last = index
    return out


def parse_alloc_conf(text: Optional[str]) -> AllocConf:
    """Reads a ``PYTORCH_CUDA_ALLOC_CONF`` string (None or empty: PyTorch's defaults)."""
    conf = AllocConf(text=text or "")
    for item in _tokens(text or ""):
        key, sep, value = item.partition(":")
        key, value = key.strip(), value.strip()
        if not sep or not value:
            raise InvalidArgumentError(f"PYTORCH_CUDA_ALLOC_CONF: expected 'key:value', got "
                                       f"{item!r}")
        if key not in _KNOWN:
            raise InvalidArgumentError(
                f"PYTORCH_CUDA_ALLOC_CONF: unknown option {key!r} (PyTorch refuses it too); "
                f"known: {', '.join(sorted(_KNOWN))}"
            )
        if key in conf.settings:
            raise InvalidArgumentError(f"PYTORCH_CUDA_ALLOC_CONF: {key} given twice")
        if key == "max_split_size_mb":
            mb = _int(key, value)
            if mb <= _LARGE_BUFFER_MB:
                raise InvalidArgumentError(f"PYTORCH_CUDA_ALLOC_CONF: max_split_size_mb too "
                                           f"small, must be > {_LARGE_BUFFER_MB}, got {mb}")
            conf.settings[key] = mb
            conf.options["max_split_size"] = mb * MiB
        elif key == "expandable_segments":
            conf.settings[key] = conf.options[key] = _bool(key, value)
        elif key == "roundup_power2_divisions":
            div = _divisions(value)
            conf.settings[key] = value
            conf.divisions = div
            if len(set(div)) == 1:
                conf.options[key] = div[0]
            else:
                conf.unmodelled[key] = (
                    f"{value}: the model takes one division count for every size; per-interval "
                    "counts are not replayed (sizes are rounded in 512 B steps instead)"
                )
        elif key == "garbage_collection_threshold":
            f = _float(key, value)
            if not 0.0 < f < 1.0:
                raise InvalidArgumentError(f"PYTORCH_CUDA_ALLOC_CONF: {key} must be between 0 "
                                           f"and 1 (exclusive), got {value}")
            conf.settings[key] = f
            conf.unmodelled[key] = (
                f"{f:g}: PyTorch frees cached blocks once reserved passes {f:.0%} of the memory "
                "fraction; the model does not, so its peak reserved is an upper bound"
            )
        elif key == "per_process_memory_fraction":
            f = _float(key, value)
            if not 0.0 < f <= 1.0:
                raise InvalidArgumentError(f"PYTORCH_CUDA_ALLOC_CONF: {key} must be in (0, 1], "
                                           f"got {value}")
            conf.settings[key] = f
            conf.unmodelled[key] = (f"{f:g}: caps what PyTorch may reserve at that share of the "
                                    "device; pass the capacity it leaves (--capacity) instead")
        elif key == "max_non_split_rounding_mb":
            conf.settings[key] = _int(key, value)
            conf.unmodelled[key] = (f"{value} MiB: how far above a request an unsplittable "
                                    "cached block may serve it; the model keeps the default (20)")
        elif key == "backend":
            if value not in ("native", "cudaMallocAsync"):
                raise InvalidArgumentError(f"PYTORCH_CUDA_ALLOC_CONF: backend expects native or "
                                           f"cudaMallocAsync, got {value!r}")
            conf.settings[key] = value
            if value == "cudaMallocAsync":
                conf.unmodelled[key] = ("cudaMallocAsync: CUDA's stream-ordered pool, not the "
                                        "caching allocator the model replays")
        else:
            kind = _HOST_ONLY[key]
            conf.settings[key] = _bool(key, value) if kind == "bool" else _int(key, value)
            conf.unmodelled[key] = f"{value}: host-side only, no effect on device memory"
    return conf


def from_environment(env: Optional[Dict[str, str]] = None) -> AllocConf:
    """``PYTORCH_CUDA_ALLOC_CONF`` (or, as PyTorch also reads it, ``PYTORCH_ALLOC_CONF``)
    from ``env`` (default: this process's environment)."""
    e: Union[Dict[str, str], "os._Environ[str]"] = os.environ if env is None else env
    text = e.get("PYTORCH_CUDA_ALLOC_CONF") or e.get("PYTORCH_ALLOC_CONF") or ""
    return parse_alloc_conf(text)
