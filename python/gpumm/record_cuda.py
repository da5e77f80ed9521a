""":func:`gpumm.record` on a machine with a GPU: PyTorch's own allocator history.

``torch.cuda.memory._record_memory_history`` starts when the warm-up steps end (at once with
no warm-up), so the allocations of the warm-up (weights, optimizer state, the cache they
left) are the snapshot's start state, read back from its ``segments``; the snapshot is
written with ``torch.cuda.memory._snapshot()`` plus the ``gpumm_record`` entry.
"""

from __future__ import annotations

import contextlib
import os
import pickle
from typing import Any, Callable, Dict, Iterator, Optional, Union

__all__ = ["record_cuda"]


@contextlib.contextmanager
def record_cuda(path: Optional[Union[str, "os.PathLike[str]"]], steps: Optional[int],
                warmup: int, step_on: str, progress: Optional[Callable[[str], None]],
                stop: bool, size: Optional[int], size_name: str) -> Iterator[Any]:
    """Records the block's CUDA allocations with PyTorch's allocator history."""
    import torch

    from gpumm.recorder import Recorder
    from gpumm.record_hooks import step_hooks, stopping

    rec = Recorder(steps, warmup, False, step_on, progress, stop, "cuda")
    started = {"on": False}

    def start() -> None:
        if not started["on"]:
            torch.cuda.memory._record_memory_history(max_entries=10_000_000)
            started["on"] = True

    counted = rec.step_end

    def step_end(kind: str) -> None:
        counted(kind)
        done = rec._counted() or []
        if kind == rec._kind() and len(done) >= warmup:
            start()

    rec.step_end = step_end  # type: ignore[method-assign]
    if warmup == 0:
        start()
    try:
        with step_hooks(rec), stopping(stop):
            yield rec
    finally:
        torch.cuda.synchronize()
        snap: Dict[str, Any] = torch.cuda.memory._snapshot() if started["on"] else {}
        torch.cuda.memory._record_memory_history(enabled=None)
        if path is not None and snap:
            info = {"version": 1, "mode": "cuda", "torch": str(torch.__version__),
                    "step_on": rec._kind(), "warmup_steps": warmup, "steps": len(rec._counted() or []),
                    "warmup_end": 0 if warmup else None, "step_ends": [], "gpu_only": True}
            if size is not None:
                info.update(size=size, size_name=size_name)
            snap["gpumm_record"] = info
            with open(os.fspath(path), "wb") as f:
                pickle.dump(snap, f, protocol=4)
