"""``gpumm.record(..., compile=True)``: the program's ``torch.compile``d code recorded as
inductor runs it, not op by op as eager PyTorch would.

What a compiled model allocates differs from its eager run in two ways, and both are
decided before inductor generates any kernel, on any device:

- AOT autograd's min-cut partitioner (with inductor's joint-graph passes) chooses which
  activations the forward saves for the backward; the rest is recomputed there. On the
  CS336 2.7B forward this is 3.97 GB saved where eager autograd keeps 5.65 GB.
- inductor's decompositions and post-grad passes (in-place reuse of dead buffers among them)
  shape the graph that runs.

So the program's ``torch.compile`` calls are given a backend that is inductor's own
``compile_fx`` (decompositions, joint-graph passes, partitioner, post-grad passes) with the
last step, code generation, replaced: each partitioned graph runs op by op, where the
recording's dispatch mode sees every allocation with its size, dtype and lifetime, on real
or on fake tensors. What remains eager is fusion: a chain of pointwise operators that
inductor runs as one kernel allocates its intermediates here (each freed at its last use, so
they add at most a few activations' worth to the peak, never to what is saved).

Dynamo does not compile while a user's dispatch mode is active (it runs the frame eagerly);
the recorder's mode says ``ignore_compile_internals``, which lets dynamo compile with the
mode switched off and on again for the compiled graph's run.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import warnings
from typing import Any, Iterator, List

__all__ = ["recording_backend", "compiled_as_recorded", "compiling", "INDUCTOR_NAMES"]

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

#: the backends replaced by :func:`recording_backend` (inductor, named or default)
INDUCTOR_NAMES = (None, "inductor")


def _eager_inner(gm: Any, example_inputs: Any, **kwargs: Any) -> Any:
    """inductor's ``inner_compile`` step without code generation: inductor's post-grad passes
    on the graph, then the graph itself as the compiled function (boxed, as inductor's is)."""
    from torch._functorch.aot_autograd import make_boxed_func
    from torch._inductor.compile_fx import _recursive_post_grad_passes

    with _compiling():
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

    from gpumm.record_hooks import patched

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
