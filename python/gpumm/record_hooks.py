"""The hooks :func:`gpumm.record` sets in torch while it records: ``torch.cuda`` answered
without a GPU, step ends, ``Module.to`` on fake parameters, the storages alive at the start,
and ``torch.compile`` recorded as compiled (``compile=True``)."""

from __future__ import annotations

import contextlib
import functools
import threading
import warnings
from typing import Any, Callable, Iterator, List

__all__ = ["stopping", "cuda_shim", "step_hooks", "fake_swap", "live_storages", "patched",
           "recording_backend", "compiled_as_recorded", "compiling", "INDUCTOR_NAMES"]


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
        # type(), not isinstance: no lazy getattr. Sparse and other storage-less layouts have
        # no StorageImpl to count (torch's own meta_utils asks `_has_storage` the same way).
        if issubclass(type(o), torch.Tensor) and torch._C._has_storage(o):
            out.add(o.untyped_storage()._cdata)
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


# -- torch.compile, recorded as compiled ------------------------------------------------
# ``gpumm.record(..., compile=True)``: the program's ``torch.compile``d code recorded as
# inductor runs it, not op by op as eager PyTorch would.
#
# What a compiled model allocates differs from its eager run in two ways, and both are
# decided before inductor generates any kernel, on any device:
#
# - AOT autograd's min-cut partitioner (with inductor's joint-graph passes) chooses which
#   activations the forward saves for the backward; the rest is recomputed there. On the
#   CS336 2.7B forward this is 3.97 GB saved where eager autograd keeps 5.65 GB.
# - inductor's decompositions and post-grad passes (in-place reuse of dead buffers among them)
#   shape the graph that runs.
#
# So the program's ``torch.compile`` calls are given a backend that is inductor's own
# ``compile_fx`` (decompositions, joint-graph passes, partitioner, post-grad passes) with the
# last step, code generation, replaced: each partitioned graph runs op by op, where the
# recording's dispatch mode sees every allocation with its size, dtype and lifetime, on real
# or on fake tensors. What remains eager is fusion: a chain of pointwise operators that
# inductor runs as one kernel allocates its intermediates here (each freed at its last use, so
# they add at most a few activations' worth to the peak, never to what is saved).
#
# Dynamo does not compile while a user's dispatch mode is active (it runs the frame eagerly);
# the recorder's mode says ``ignore_compile_internals``, which lets dynamo compile with the
# mode switched off and on again for the compiled graph's run.

#: the backends replaced by :func:`recording_backend` (inductor, named or default)
INDUCTOR_NAMES = (None, "inductor")

_state = threading.local()


def compiling() -> bool:
    """True while this thread compiles a graph: the recorder leaves its operators out (the
    backward graph is compiled at the first backward call, inside the recorded run)."""
    return bool(getattr(_state, "depth", 0))


@contextlib.contextmanager
def _compiling() -> Iterator[None]:
    _state.depth = getattr(_state, "depth", 0) + 1
    try:
        yield
    finally:
        _state.depth -= 1


def _eager_inner(gm: Any, example_inputs: Any, **kwargs: Any) -> Any:
    """inductor's ``inner_compile`` step without code generation: inductor's post-grad passes
    on the graph, then the graph itself as the compiled function (boxed, as inductor's is)."""
    from torch._functorch.aot_autograd import make_boxed_func
    from torch._inductor.compile_fx import _recursive_post_grad_passes

    from torch._guards import detect_fake_mode
    from torch._inductor.virtualized import V

    # the backward is compiled lazily, outside compile_fx's context: its fake mode is the
    # one of the graph's example inputs
    fm = detect_fake_mode(example_inputs)
    mode = V.set_fake_mode(fm) if fm is not None else contextlib.nullcontext()
    with _compiling(), mode:
        _recursive_post_grad_passes(gm, bool(kwargs.get("is_inference", False)))
        gm.recompile()
    return make_boxed_func(gm.forward)


def recording_backend(gm: Any, example_inputs: List[Any]) -> Any:
    """A ``torch.compile`` backend: inductor's graph pipeline, each graph then run op by op."""
    from torch._inductor.compile_fx import compile_fx

    with _compiling():
        return compile_fx(gm, example_inputs, inner_compile=_eager_inner)


@contextlib.contextmanager
def compiled_as_recorded(seen: List[str]) -> Iterator[None]:
    """``torch.compile`` with inductor (named or default) gets :func:`recording_backend`
    while the block runs; other backends are kept. Each call's backend is added to ``seen``.
    ``mode`` and ``options`` are inductor's code-generation settings: dropped (CUDA graphs
    of ``reduce-overhead`` are not modelled)."""
    import torch

    real = torch.compile

    @functools.wraps(real)
    def compile(model: Any = None, *args: Any, **kwargs: Any) -> Any:
        backend = kwargs.get("backend")
        if backend in INDUCTOR_NAMES:
            kwargs.pop("mode", None)
            kwargs.pop("options", None)
            kwargs["backend"] = recording_backend
            seen.append("inductor")
        else:
            seen.append(str(getattr(backend, "__name__", backend)))
        if model is None:
            return lambda m: real(m, *args, **kwargs)
        return real(model, *args, **kwargs)

    with patched(torch, "compile", compile), warnings.catch_warnings():
        # the global module hooks are the recorder's step marks, which count one forward
        # (the outermost) whether or not the module is wrapped by torch.compile
        warnings.filterwarnings("ignore", message="Using `torch.compile\\(module\\)` when there are global hooks")
        torch._dynamo.reset()  # graphs compiled before the block ran eagerly or elsewhere
        try:
            yield
        finally:
            torch._dynamo.reset()
