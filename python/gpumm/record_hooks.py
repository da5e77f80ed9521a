"""The hooks :func:`gpumm.record` sets in torch while it records: ``torch.cuda`` answered
without a GPU, step ends, ``Module.to`` on fake parameters, the storages alive at the start."""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

__all__ = ["stopping", "cuda_shim", "step_hooks", "fake_swap", "live_storages", "patched"]


@contextlib.contextmanager
def stopping(stop: bool) -> Iterator[None]:
    """Ends the block quietly at :class:`gpumm.recorder.StopRecording` when ``stop``."""
    from gpumm.recorder import StopRecording

    try:
        yield
    except StopRecording:
        if not stop:
            raise


def live_storages() -> "set[int]":
    """The StorageImpl addresses of every tensor alive now."""
    import gc

    import torch

    out = set()
    for o in gc.get_objects():
        if issubclass(type(o), torch.Tensor):  # type(), not isinstance: no lazy getattr
            try:
                out.add(o.untyped_storage()._cdata)
            except (RuntimeError, NotImplementedError):
                continue  # a tensor without storage (sparse, nested, functional wrapper)
    return out


@contextlib.contextmanager
def patched(obj: Any, name: str, value: Any) -> Iterator[None]:
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


def _copy(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A distinct function object doing what ``fn`` does."""
    return lambda *a, **k: fn(*a, **k)


@contextlib.contextmanager
def cuda_shim(rec: Any) -> Iterator[None]:
    """``torch.cuda`` calls answered without a GPU; autocast on CUDA becomes CPU autocast."""
    import torch
    import torch._dynamo  # noqa: F401 - its rule tables read torch.cuda: build them unpatched

    def nothing(*a: Any, **k: Any) -> None:
        return None

    stats = {"memory_allocated": lambda *a, **k: rec.live_bytes,
             "max_memory_allocated": lambda *a, **k: rec.peak_bytes,
             "memory_reserved": lambda *a, **k: rec.live_bytes,
             "max_memory_reserved": lambda *a, **k: rec.peak_bytes}
    real_autocast = torch.autocast

    class autocast(real_autocast):  # type: ignore[misc,valid-type]
        def __init__(self, device_type: str = "cuda", *a: Any, **k: Any) -> None:
            if device_type == "cuda":
                device_type = "cpu"
                if not a:  # CUDA autocast's default dtype, not the CPU's bfloat16
                    k.setdefault("dtype", torch.float16)
            super().__init__(device_type, *a, **k)

    with contextlib.ExitStack() as es:
        for n in ("synchronize", "empty_cache", "reset_peak_memory_stats", "manual_seed",
                  "manual_seed_all", "set_device", "reset_max_memory_allocated"):
            es.enter_context(patched(torch.cuda, n, _copy(nothing)))
        for n, fn in stats.items():
            es.enter_context(patched(torch.cuda, n, fn))
        es.enter_context(patched(torch.cuda, "is_bf16_supported", lambda *a, **k: True))
        es.enter_context(patched(torch.cuda.memory, "_record_memory_history", _copy(nothing)))
        es.enter_context(patched(torch.cuda.memory, "_dump_snapshot", _copy(nothing)))
        for n in ("range_push", "range_pop", "mark"):
            es.enter_context(patched(torch.cuda.nvtx, n, _copy(nothing)))
        es.enter_context(patched(torch.cuda.nvtx, "range", lambda *a, **k: contextlib.nullcontext()))
        es.enter_context(patched(torch, "autocast", autocast))
        es.enter_context(patched(torch.amp, "autocast", autocast))
        yield


@contextlib.contextmanager
def step_hooks(rec: Any) -> Iterator[None]:
    import torch
    import torch.optim.optimizer as optim_mod
    from torch.nn.modules import module as mod

    depth = [0]

    def pre(m: Any, args: Any) -> None:
        depth[0] += 1

    def post(m: Any, args: Any, out: Any) -> None:
        depth[0] -= 1
        if depth[0] == 0:
            rec.step_end("forward")

    init = torch.optim.Optimizer.__init__

    def opt_init(self: Any, *a: Any, **k: Any) -> None:
        rec.has_optimizer = True
        init(self, *a, **k)

    hooks = [mod.register_module_forward_pre_hook(pre), mod.register_module_forward_hook(post),
             optim_mod.register_optimizer_step_post_hook(
                 lambda *a, **k: rec.step_end("optimizer"))]
    try:
        with patched(torch.optim.Optimizer, "__init__", opt_init):
            yield
    finally:
        for h in hooks:
            h.remove()


@contextlib.contextmanager
def fake_swap(fake_mode: Any) -> Iterator[None]:
    """``Module.to`` swaps fake parameters with ``torch.utils.swap_tensors``, which refuses a
    tensor with a weakref, and the fake mode's memo holds one to each tensor it made: drop
    the two tensors' memo entries first (they only speed up converting real tensors)."""
    import torch

    orig = torch.utils.swap_tensors

    def swap(t1: Any, t2: Any) -> Any:
        memo = fake_mode.fake_tensor_converter.tensor_memo
        for k in [k for k, v in list(memo.items()) if v is t1 or v is t2]:
            del memo[k]
        return orig(t1, t2)

    with patched(torch.utils, "swap_tensors", swap):
        yield
