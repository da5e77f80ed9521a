"""gpumm's exceptions: one class per error of the core, all under :class:`GpummError`.

Each also derives from the builtin that fits, so ``except MemoryError`` or
``except ValueError`` catch them too. The Rust core raises them by name (one conversion in
``rust/bindings``); an operation that raises has changed nothing.
"""

from __future__ import annotations

__all__ = [
    "GpummError",
    "OutOfMemoryError",
    "InvalidSizeError",
    "InvalidFreeError",
    "InvalidStateError",
    "InvalidHandleError",
    "InvalidArgumentError",
    "TraceFormatError",
]


class GpummError(Exception):
    """Root of every error gpumm raises on purpose."""


class OutOfMemoryError(GpummError, MemoryError):
    """A valid request found no memory. The message says what was free and where."""


class InvalidSizeError(GpummError, ValueError):
    """A size that is zero, negative, too large, malformed or not allowed here."""


class InvalidFreeError(GpummError, ValueError):
    """A free that cannot be: double free, split parent, foreign or stale handle."""


class InvalidStateError(GpummError, ValueError):
    """An operation the object's current state forbids (or a broken invariant)."""


class InvalidHandleError(GpummError, ValueError):
    """A handle that names no live object: unknown, stale, or from another manager."""


class InvalidArgumentError(GpummError, ValueError):
    """Any other argument out of range or unknown (an architecture name, a chunk type...)."""


class TraceFormatError(GpummError, ValueError):
    """A trace file that is truncated, corrupt or not of the format asked for. The message
    names the file and the line or entry."""
