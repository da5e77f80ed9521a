"""Record a PyTorch program's tensor allocations on the CPU, to predict its GPU memory.

>>> import gpumm
>>> with gpumm.record("step.pickle", fake=True):           # doctest: +SKIP
...     loss = model(batch).sum(); loss.backward(); opt.step()

Every storage an ATen operator creates is an allocation, of ``storage.nbytes()`` bytes (what
the program asks PyTorch's CUDA caching allocator for on a GPU), with the Python stack that
made it; its death (a weakref finalizer on the storage) is the free. A
``TorchDispatchMode`` sees each operator after autograd and composite decompositions, so the
backward pass and the optimizer step are seen too. With ``fake=True`` the program runs on
``FakeTensorMode`` tensors: shapes, dtypes and lifetimes are real, data is not, so a model
larger than the machine's memory records in seconds (``.item()`` answers 0).

A program written for CUDA runs unchanged: ``cuda`` devices are mapped to the CPU and the
``torch.cuda`` calls a CPU machine cannot make (``synchronize``, ``empty_cache``, memory
statistics, ``_record_memory_history``) answer from the recording. Only storages the program
puts on the GPU are recorded (made with a CUDA device, or from GPU tensors); a program that
never names CUDA has all its storages recorded. On a machine with a GPU and ``fake=False``
the real allocator is recorded instead (``torch.cuda.memory._record_memory_history``), its
history starting after the warm-up steps so that their allocations are the snapshot's start
state.

The file is a PyTorch memory snapshot (plain data; ``gpumm.traces.read_trace`` and
pytorch.org/memory_viz read it) with one extra key, ``gpumm_record`` (see
:func:`recording_info`); a name ending in ``.csv`` or ``.csv.gz`` gives an RMM log instead
(no stacks, no step marks). Steps end at each ``optimizer.step()``, or, for a program with no
optimizer, at the end of each outermost ``nn.Module`` forward.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import pickle
import weakref
from typing import Any, Callable, Dict, Iterator, Optional, Tuple

from gpumm.record_cuda import record_cuda as _record_cuda
from gpumm.record_hooks import (compiled_as_recorded, compiling, cuda_shim, fake_swap,
                                live_storages, step_hooks, stopping)
from gpumm.recorder import PathLike, Recorder, StopRecording

__all__ = ["Recorder", "record", "recording_info", "StopRecording"]

def recording_info(path: PathLike) -> Dict[str, Any]:
    """The ``gpumm_record`` entry of a file :func:`record` wrote ({} for any other trace):
    ``mode`` (fake, cpu or cuda), ``step_on``, ``steps``, ``warmup_steps``, ``warmup_end``
    and ``step_ends`` (indices into ``device_traces[0]``), ``gpu_only``, ``peak_live``, and
    ``size`` / ``size_name`` when given."""
    from gpumm.traces import load_snapshot
    from gpumm.traces import _format

    if _format(os.fspath(path)) != "snapshot":
        return {}
    got = load_snapshot(path).get("gpumm_record")
    return got if isinstance(got, dict) else {}


# -- hooks into torch ------------------------------------------------------------------------

def _is_cuda(x: Any) -> bool:
    import torch

    if isinstance(x, torch.device):
        return x.type == "cuda"
    return isinstance(x, str) and (x == "cuda" or x.startswith("cuda:"))


def _to_cpu(x: Any) -> Any:
    import torch

    if _is_cuda(x):
        return torch.device("cpu")
    return x


def _modes(rec: Recorder, fake: bool, remap: bool, compiled: bool = False) -> Tuple[Any, Any]:
    """The dispatch mode that logs storages and the function mode that maps CUDA to the CPU.
    ``compiled``: the dispatch mode lets dynamo compile (see :func:`gpumm.record_hooks.compiled_as_recorded`)."""
    import torch
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten, tree_map

    state = {"gpu_call": False}
    keep = (torch.device, torch._C._nn._parse_to)
    scalar = torch.ops.aten._local_scalar_dense.default

    class DeviceMode(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            if func in keep:  # a device stays what it says; what uses it moves
                return func(*args, **kwargs)
            name = getattr(func, "__name__", "")
            flat, _ = tree_flatten((args, kwargs))
            cuda = name == "cuda" or any(_is_cuda(a) for a in flat)
            if cuda and remap:
                if name == "cuda":
                    func, args = torch.Tensor.to, (args[0], "cpu")
                else:
                    args, kwargs = tree_map(_to_cpu, (args, kwargs))
            before = state["gpu_call"]
            state["gpu_call"] = before or cuda
            try:
                out = func(*args, **kwargs)
            finally:
                state["gpu_call"] = before
            if cuda:  # x.to("cuda") of a tensor already where it goes returns x: x is on the GPU
                for t in tree_flatten(out)[0]:
                    if isinstance(t, torch.Tensor):
                        i = ident(t.untyped_storage())
                        if i is not None:
                            rec.mark_gpu(i)
            return out

    fake_cls: Any = None
    if fake:
        from torch._subclasses.fake_tensor import FakeTensor as fake_cls
    # a storage's identity: its StorageImpl address while the same Python object holds it
    # (an address comes back for a new storage, sometimes before the old one's finalizer ran)
    tracked: Dict[int, Tuple[int, Any]] = {}
    before = live_storages()
    counter = itertools.count(1)

    def ident(st: Any) -> Optional[int]:
        got = tracked.get(st._cdata)
        return got[0] if got is not None and got[1]() is st else None

    def track(st: Any) -> int:
        k = st._cdata
        old = tracked.get(k)
        if old is not None:
            rec.free(old[0])
        i = next(counter)
        tracked[k] = (i, weakref.ref(st))
        weakref.finalize(st, died, k, i)
        return i

    def died(k: int, i: int) -> None:
        got = tracked.get(k)
        if got is not None and got[0] == i:
            del tracked[k]
        rec.free(i)

    class StorageMode(TorchDispatchMode):
        @classmethod
        def ignore_compile_internals(cls) -> bool:
            return compiled

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            if compiled and compiling():
                return func(*args, **kwargs)
            inputs, _ = tree_flatten((args, kwargs))
            gpu = state["gpu_call"]
            for t in inputs:
                if not isinstance(t, torch.Tensor):
                    continue
                st = t.untyped_storage()
                i = ident(st)
                if i is None:
                    if fake_cls is not None and not isinstance(t, fake_cls):
                        continue  # host data the fake mode is about to lift
                    if t.dim() == 0:
                        continue  # a Python number wrapped for the call: a kernel argument
                    i = track(st)
                    on_gpu = gpu or t.device.type == "cuda"
                    if st._cdata in before:
                        rec.adopt(i, st.nbytes(), on_gpu)
                    else:  # made outside any operator (torch.tensor, from_numpy): now
                        rec.alloc(i, st.nbytes(), on_gpu, "", None)
                if i in rec.gpu_keys:
                    gpu = True
            if fake and func is scalar:  # no data: False (ends `while x.any()` loops), else 1
                dtype = inputs[0].dtype
                return False if dtype == torch.bool else (1.0 if dtype.is_floating_point else 1)
            out = func(*args, **kwargs)
            stack = None
            for t in tree_flatten(out)[0]:
                if not isinstance(t, torch.Tensor):
                    continue
                st = t.untyped_storage()
                size = st.nbytes()
                i = ident(st)
                if i is not None:
                    got = rec.live.get(i)
                    if got is None or got[0] == size:
                        continue
                    rec.free(i)  # resized in place: a new block on a GPU
                if stack is None:
                    stack = rec._stack_id()
                rec.alloc(track(st), size, gpu, str(func.overloadpacket.__name__), stack)
            return out

    return StorageMode(), DeviceMode()


@contextlib.contextmanager
def record(path: Optional[PathLike] = None, steps: Optional[int] = None, warmup: int = 0,
           fake: bool = False, stacks: bool = True, step_on: str = "auto",
           progress: Optional[Callable[[str], None]] = None, stop: bool = False,
           size: Optional[int] = None, size_name: str = "size",
           compile: bool = False) -> Iterator[Recorder]:
    """Records the tensor allocations of the code in the ``with`` block and writes them to
    ``path`` at its end (None: keep them in the returned :class:`Recorder` only).

    ``steps``: record this many steps after ``warmup`` steps, then stop recording (with
    ``stop``, also raise :class:`StopRecording` to end the program). ``fake``: run on fake
    tensors. ``size``: the batch size or sequence length of this run, kept in the file for
    ``gpumm predict``'s interpolation between two runs. ``compile``: code the program
    compiles with ``torch.compile`` (inductor) is recorded as compiled: the activations AOT
    autograd's partitioner saves, inductor's graph passes (see :func:`gpumm.record_hooks.compiled_as_recorded`);
    without it, compiled code runs eagerly (on a GPU the real allocator records the compiled
    program as it runs, with or without it). Storages alive when the block starts are
    allocated at its start (the state the block begins from)."""
    import torch

    on_gpu = not fake and torch.cuda.is_available()
    if on_gpu:
        with _record_cuda(path, steps, warmup, step_on, progress, stop, size, size_name) as rec:
            yield rec
        return
    rec = Recorder(steps, warmup, stacks, step_on, progress, stop, "fake" if fake else "cpu")
    rec.compiled = compile
    remap = fake or not torch.cuda.is_available()
    storage_mode, device_mode = _modes(rec, fake, remap, compile)
    with contextlib.ExitStack() as es:
        if compile:
            es.enter_context(compiled_as_recorded(rec.compile_backends))
        if fake:
            from torch._subclasses.fake_tensor import FakeTensorMode

            fm = FakeTensorMode(allow_non_fake_inputs=True)
            es.enter_context(fake_swap(fm))
            es.enter_context(fm)
        if remap:
            es.enter_context(cuda_shim(rec))
        es.enter_context(step_hooks(rec))
        es.enter_context(device_mode)
        es.enter_context(storage_mode)
        try:
            with stopping(stop):
                yield rec
        finally:
            es.close()
            rec.recording = False
            if path is not None:
                rec.write(path)
                if size is not None:
                    _add_size(path, size, size_name)


def _add_size(path: PathLike, size: int, size_name: str) -> None:
    name = os.fspath(path)
    if name.endswith((".csv", ".csv.gz")):
        return
    with open(name, "rb") as f:
        data = pickle.load(f)  # noqa: S301 - the file this process just wrote
    data["gpumm_record"].update(size=size, size_name=size_name)
    with open(name, "wb") as f:
        pickle.dump(data, f, protocol=4)


