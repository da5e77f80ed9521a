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

The rules, from ``c10/cuda/CUDAAllocatorConfig.cpp`` (``c10/core/AllocatorConfig.cpp`` in
recent releases):

- ``max_split_size_mb:N``: N must be above 20 (``kLargeBuffer``, 20 MiB); blocks of N MiB or
  more are never split.
- ``roundup_power2_divisions:N`` (N a power of two) for every size, or the per-interval form
  ``[256:1,512:2,>:4]``: each key a power of two in MiB naming the interval [key, 2·key); the
  first key's value also covers every smaller interval, ``>`` every interval after the last
  key; intervals between two keys keep 0 (no rounding); a count is 0 or a power of two. 16
  intervals: below 2 MiB, [2, 4) MiB, ... [32 GiB, and up). (PyTorch up to 2.8 lets ``>``
  overwrite the last key's own interval too; :func:`format_divisions` writes strings that
  read the same either way, and a snapshot records the table itself.)
- ``garbage_collection_threshold:F``, 0 < F < 1: the model frees cached segments once
  reserved passes F of the allowed maximum (``options["garbage_collection_threshold"]``).
- ``per_process_memory_fraction:F``, 0 < F <= 1: the allowed maximum is F of the capacity
  (``options["memory_fraction"]``; ``torch.cuda.set_per_process_memory_fraction`` sets the
  same). PyTorch runs its garbage collection only under such a fraction; the model takes
  the replay's capacity times the fraction (1 when not given) as the allowed maximum.
- ``expandable_segments``, ``release_lock_on_cudamalloc``, ``pinned_use_cuda_host_register``,
  ``pinned_use_background_threads``: ``True`` or ``False``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Union

from gpumm.errors import InvalidArgumentError

__all__ = ["AllocConf", "parse_alloc_conf", "from_environment", "format_divisions",
           "options_from_settings", "INTERVALS", "MODELLED"]

MiB = 1 << 20
#: PyTorch's ``kLargeBuffer``: max_split_size_mb must be above this many MiB
_LARGE_BUFFER_MB = 20
#: per-interval division counts: 1 MiB, 2 MiB, ... 32 GiB (``kRoundUpPowerOfTwoIntervals``)
INTERVALS = 16
#: the options gpumm's caching model acts on
MODELLED = ("expandable_segments", "max_split_size", "roundup_power2_divisions",
            "garbage_collection_threshold", "memory_fraction")

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
    #: roundup_power2_divisions per interval (below 2 MiB, 2 MiB, ... 32 GiB), when given
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
        if n and not _pow2(n):
            raise InvalidArgumentError(f"PYTORCH_CUDA_ALLOC_CONF: {key}: divisions must be 0 "
                                       f"or a power of 2, got {n} in {item!r}")
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
            conf.options[key] = _division_option(div)
        elif key == "garbage_collection_threshold":
            f = _float(key, value)
            if not 0.0 < f < 1.0:
                raise InvalidArgumentError(f"PYTORCH_CUDA_ALLOC_CONF: {key} must be between 0 "
                                           f"and 1 (exclusive), got {value}")
            conf.settings[key] = conf.options[key] = f
        elif key == "per_process_memory_fraction":
            f = _float(key, value)
            if not 0.0 < f <= 1.0:
                raise InvalidArgumentError(f"PYTORCH_CUDA_ALLOC_CONF: {key} must be in (0, 1], "
                                           f"got {value}")
            conf.settings[key] = conf.options["memory_fraction"] = f
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


def _division_option(div: List[int]) -> Union[int, List[int]]:
    """The model's ``roundup_power2_divisions``: one count when every interval has it, else
    the list of 16."""
    return div[0] if len(set(div)) == 1 else list(div)


def format_divisions(div: Union[int, Sequence[int]]) -> str:
    """``roundup_power2_divisions``'s value for a count or a list of 16 (one per interval):
    ``N`` when every interval has it, else the per-interval form: the first run's count at
    its last interval's key, then each nonzero count at its interval's key, ``>`` for a last
    run (of a nonzero count) that starts before the last interval. The
    string reads back the same (:func:`parse_alloc_conf`), in PyTorch before and after 2.9.

    >>> format_divisions([1] * 9 + [2, 4] + [8] * 5)
    '[256:1,512:2,1024:4,2048:8,>:8]'
    """
    t = [int(div)] * INTERVALS if isinstance(div, int) else [int(d) for d in div]
    if len(t) != INTERVALS:
        raise InvalidArgumentError(f"roundup_power2_divisions: {len(t)} counts given, one per "
                                   f"interval ({INTERVALS}) expected")
    bad = [d for d in t if d and not _pow2(d)]
    if bad:
        raise InvalidArgumentError(f"roundup_power2_divisions: {bad[0]} is not 0 or a power "
                                   "of 2")
    if len(set(t)) == 1:
        return str(t[0]) if t[0] else "[1:0]"  # the one-number form refuses 0
    last = max(i for i in range(INTERVALS) if i == 0 or t[i] != t[i - 1])  # the last run
    first = next(i for i in range(INTERVALS) if t[i] != t[0]) - 1  # the first run's end
    parts = [f"{1 << first}:{t[0]}"]
    parts += [f"{1 << i}:{t[i]}" for i in range(first + 1, last + 1)
              if t[i] != 0 or (i == last and last == INTERVALS - 1)]
    if last < INTERVALS - 1 and t[last]:  # a last run of 0 is what unnamed intervals keep
        parts.append(f">:{t[last]}")
    return "[" + ",".join(parts) + "]"


def options_from_settings(settings: Dict[str, Any]) -> Dict[str, Any]:
    """The model's options for what a snapshot's ``allocator_settings`` record of the GC
    threshold, the memory fraction and the division table (per interval, keyed by MiB):
    only those that differ from PyTorch's defaults."""
    out: Dict[str, Any] = {}
    gc = settings.get("garbage_collection_threshold")
    if isinstance(gc, (int, float)) and not isinstance(gc, bool) and 0 < gc < 1:
        out["garbage_collection_threshold"] = float(gc)
    frac = settings.get("per_process_memory_fraction")
    if isinstance(frac, (int, float)) and not isinstance(frac, bool) and 0 < frac < 1:
        out["memory_fraction"] = float(frac)
    div = settings.get("roundup_power2_divisions")
    if isinstance(div, dict) and len(div) == INTERVALS:
        try:
            table = [int(v) for _, v in sorted(div.items(), key=lambda kv: int(kv[0]))]
        except (TypeError, ValueError):
            return out
        if all(d == 0 or _pow2(d) for d in table):
            out["roundup_power2_divisions"] = _division_option(table)
    return out
