"""Hooks that put a gpumm pool under ML frameworks: :mod:`.torch` (a pluggable allocator
served by C functions this extension exports), :mod:`.cupy` (``cupy.cuda.set_allocator``),
:mod:`.numba` (an EMM plugin). One pool may serve several frameworks in one process: memory
one frees, another reuses. The pool must be on a CUDA backend (``Device(backend="cuda")``)
for real GPU work."""

from gpumm import _core

__all__ = ["library_path"]


def library_path() -> str:
    """The shared library that exports ``gpumm_torch_alloc`` / ``gpumm_torch_free``."""
    return str(_core.__file__)
