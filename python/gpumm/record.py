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
import sys
import time
import weakref
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

from gpumm.errors import InvalidArgumentError
from gpumm.record_hooks import cuda_shim, fake_swap, live_storages, step_hooks, stopping

__all__ = ["Recorder", "record", "recording_info", "StopRecording"]

PathLike = Union[str, "os.PathLike[str]"]
_BASE = 0x7F0000000000  # where synthetic addresses start
# frames of the machinery itself, left out of stacks
_SKIP = (os.sep + os.path.join("gpumm", "record.py"), os.path.join("torch", "_ops.py"),
         os.path.join("utils", "_python_dispatch.py"), os.path.join("torch", "overrides.py"),
         os.path.join("utils", "_stats.py"), os.path.join("_subclasses", "fake_tensor.py"),
         os.path.join("gpumm", "cli_record.py"), os.path.join("gpumm", "cli.py"),
         os.path.join("gpumm", "__main__.py"), os.sep + "runpy.py", "<frozen runpy>",
         os.path.join("bin", "gpumm"), os.sep + "contextlib.py")


class StopRecording(BaseException):
    """Raised inside the program once the steps asked for are recorded (the CLI runner
    catches it and ends the program there)."""


def _stack(limit: int = 64) -> Tuple[Tuple[str, int, str], ...]:
    f: Any = sys._getframe(2)
    out: List[Tuple[str, int, str]] = []
    while f is not None and len(out) < limit:
        name = f.f_code.co_filename
        if not name.endswith(_SKIP) and "torch/utils/_python_dispatch" not in name:
            out.append((name, f.f_lineno, f.f_code.co_name))
        f = f.f_back
    return tuple(out)


class Recorder:
    """The events of one recording. Sizes in bytes, times in µs from the start."""

    def __init__(self, steps: Optional[int] = None, warmup: int = 0, stacks: bool = True,
                 step_on: str = "auto", progress: Optional[Callable[[str], None]] = None,
                 stop: bool = False, mode: str = "cpu") -> None:
        if step_on not in ("auto", "optimizer", "forward"):
            raise InvalidArgumentError(f"step_on must be auto, optimizer or forward, got {step_on!r}")
        if steps is not None and steps < 1:
            raise InvalidArgumentError(f"steps must be at least 1, got {steps}")
        if warmup < 0:
            raise InvalidArgumentError(f"warmup must be >= 0, got {warmup}")
        self.steps, self.warmup, self.stacks, self.step_on = steps, warmup, stacks, step_on
        self.progress, self.stop, self.mode = progress, stop, mode
        #: (action, key, size, time_us, stack index, op, gpu)
        self.events: List[Tuple[str, int, int, int, int, str, bool]] = []
        self.stack_table: List[Tuple[Tuple[str, int, str], ...]] = []
        self._stack_index: Dict[Tuple[Tuple[str, int, str], ...], int] = {}
        self.live: Dict[int, Tuple[int, bool]] = {}  # storage key -> (size, gpu)
        self.gpu_keys: "set[int]" = set()
        self.step_ends: List[int] = []  # event counts at each step's end
        self.forward_ends: List[int] = []
        self.warmup_end: Optional[int] = None
        self.live_bytes = self.peak_bytes = 0
        self.allocs = 0
        #: storages alive before the first event (first seen as inputs): allocated at time 0
        self.head: List[Tuple[str, int, int, int, int, str, bool]] = []
        self.has_optimizer = False
        #: where each live storage's alloc event is: (list, index)
        self._where: Dict[int, Tuple[List[Any], int]] = {}
        self.recording = True
        self.t0 = time.perf_counter_ns()
        self._last_progress = 0.0

    # -- events -----------------------------------------------------------------------------
    def _stack_id(self) -> int:
        if not self.stacks:
            return -1
        s = _stack()
        i = self._stack_index.get(s)
        if i is None:
            i = self._stack_index[s] = len(self.stack_table)
            self.stack_table.append(s)
        return i

    def alloc(self, key: int, size: int, gpu: bool, op: str, stack: Optional[int] = None) -> None:
        """A storage of ``size`` bytes was born."""
        if not self.recording or size <= 0:
            return
        t = (time.perf_counter_ns() - self.t0) // 1000
        self._where[key] = (self.events, len(self.events))
        self.events.append(("alloc", key, size, t, self._stack_id() if stack is None else stack,
                            op, gpu))
        self.live[key] = (size, gpu)
        if gpu:
            self.gpu_keys.add(key)
        self.allocs += 1
        self.live_bytes += size
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        self._tick()

    def mark_gpu(self, key: int) -> None:
        """A live storage turns out to be on the GPU (moved there where it already was)."""
        got = self.live.get(key)
        if got is None or got[1]:
            return
        self.live[key] = (got[0], True)
        self.gpu_keys.add(key)
        where = self._where.get(key)
        if where is not None:
            evs, n = where
            evs[n] = evs[n][:6] + (True,)

    def adopt(self, key: int, size: int, gpu: bool) -> None:
        """A storage alive before the first event (seen first as an operator's input)."""
        if not self.recording or size <= 0:
            return
        self._where[key] = (self.head, len(self.head))
        self.head.append(("alloc", key, size, 0, -1, "", gpu))
        self.live[key] = (size, gpu)
        if gpu:
            self.gpu_keys.add(key)
        self.live_bytes += size
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)

    def free(self, key: int) -> None:
        """The storage died."""
        got = self.live.pop(key, None)
        self._where.pop(key, None)
        if got is None or not self.recording:
            return
        t = (time.perf_counter_ns() - self.t0) // 1000
        self.events.append(("free", key, got[0], t, -1, "", got[1]))
        self.live_bytes -= got[0]

    def step_end(self, kind: str) -> None:
        """An optimizer step or an outermost forward ended."""
        if not self.recording:
            return
        (self.forward_ends if kind == "forward" else self.step_ends).append(len(self.events))
        counts = self._counted()
        if counts is None or kind != self._kind():
            return
        if self.warmup and len(counts) == self.warmup and self.warmup_end is None:
            self.warmup_end = counts[-1]
        self._tick(force=True)
        if self.steps is not None and len(counts) >= self.warmup + self.steps:
            self.recording = False
            if self.stop:
                raise StopRecording()

    def _kind(self) -> str:
        if self.step_on != "auto":
            return self.step_on
        return "optimizer" if self.has_optimizer or self.step_ends else "forward"

    def _counted(self) -> Optional[List[int]]:
        return self.step_ends if self._kind() == "optimizer" else self.forward_ends

    def _tick(self, force: bool = False) -> None:
        if self.progress is None:
            return
        now = time.perf_counter()
        if force or now - self._last_progress > 0.5:
            self._last_progress = now
            from gpumm.units import format_size

            done = len(self._counted() or [])
            total = f"/{self.warmup + self.steps}" if self.steps else ""
            self.progress(f"step {done}{total} ({self._kind()}), "
                          f"{self.allocs:,} allocations, live "
                          f"{format_size(self.live_bytes)}, peak {format_size(self.peak_bytes)}")

    # -- output -----------------------------------------------------------------------------
    def gpu_only(self) -> bool:
        """True when the program put storages on the GPU: only those are written."""
        return bool(self.gpu_keys)

    def info(self) -> Dict[str, Any]:
        """What ``gpumm_record`` holds (see :func:`recording_info`)."""
        import torch

        keep = self._kept()
        # written history entries before each event (a free is written as two)
        before = [0] * (len(self.all_events()) + 1)
        kept = set(keep)
        for i, e in enumerate(self.all_events()):
            before[i + 1] = before[i] + ((2 if e[0] == "free" else 1) if i in kept else 0)
        shift = len(self.head)

        def at(count: Optional[int]) -> Optional[int]:
            return None if count is None else before[count + shift]

        kind = self._kind()
        ends = self.step_ends if kind == "optimizer" else self.forward_ends
        return {"version": 1, "mode": self.mode, "torch": str(torch.__version__),
                "step_on": kind, "warmup_steps": self.warmup,
                "steps": len(ends), "warmup_end": at(self.warmup_end),
                "step_ends": [at(c) for c in ends],
                "gpu_only": self.gpu_only(), "peak_live": self._peak_kept(keep)}

    def all_events(self) -> List[Tuple[str, int, int, int, int, str, bool]]:
        """The storages alive at the start, then the events in order."""
        return self.head + self.events

    def _kept(self) -> List[int]:
        only = self.gpu_only()
        return [i for i, e in enumerate(self.all_events()) if not only or e[6]]

    def _peak_kept(self, keep: Sequence[int]) -> int:
        cur = peak = 0
        evs = self.all_events()
        for i in keep:
            e = evs[i]
            cur += e[2] if e[0] == "alloc" else -e[2]
            peak = max(peak, cur)
        return peak

    def history(self) -> List[Dict[str, Any]]:
        """The events as a PyTorch snapshot's ``device_traces[0]``."""
        frames_cache: Dict[int, List[Dict[str, Any]]] = {}

        def frames(i: int) -> List[Dict[str, Any]]:
            if i < 0:
                return []
            got = frames_cache.get(i)
            if got is None:
                got = frames_cache[i] = [{"filename": f, "line": n, "name": name}
                                         for f, n, name in self.stack_table[i]]
            return got

        addrs: Dict[int, int] = {}
        nxt = _BASE
        out: List[Dict[str, Any]] = []
        evs = self.all_events()
        for i in self._kept():
            action, key, size, t, stack, op, _ = evs[i]
            if action == "alloc":
                addrs[key] = addr = nxt
                nxt += -(-size // 512) * 512 + 512
                e = {"action": "alloc", "addr": addr, "size": size, "stream": 0,
                     "time_us": t, "frames": frames(stack)}
                if op:
                    e["op"] = op
                out.append(e)
            else:
                addr = addrs.pop(key)
                for act in ("free_requested", "free_completed"):
                    out.append({"action": act, "addr": addr, "size": size, "stream": 0,
                                "time_us": t, "frames": []})
        return out

    def write(self, path: PathLike) -> None:
        """Writes the recording: a snapshot pickle, or an RMM CSV for .csv / .csv.gz names."""
        name = os.fspath(path)
        hist = self.history()
        if name.endswith((".csv", ".csv.gz")):
            from gpumm.traces import Event, Trace, write_rmm_csv

            evs = [Event("alloc" if h["action"] == "alloc" else "free", h["addr"], h["size"], 0,
                         h["time_us"]) for h in hist if h["action"] in ("alloc", "free_completed")]
            write_rmm_csv(Trace(evs, name), name)
            return
        data = {"segments": [], "device_traces": [hist], "allocator_settings": {},
                "gpumm_record": self.info()}
        with open(name, "wb") as f:
            pickle.dump(data, f, protocol=4)


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


def _modes(rec: Recorder, fake: bool, remap: bool) -> Tuple[Any, Any]:
    """The dispatch mode that logs storages and the function mode that maps CUDA to the CPU."""
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
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
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
           size: Optional[int] = None, size_name: str = "size") -> Iterator[Recorder]:
    """Records the tensor allocations of the code in the ``with`` block and writes them to
    ``path`` at its end (None: keep them in the returned :class:`Recorder` only).

    ``steps``: record this many steps after ``warmup`` steps, then stop recording (with
    ``stop``, also raise :class:`StopRecording` to end the program). ``fake``: run on fake
    tensors. ``size``: the batch size or sequence length of this run, kept in the file for
    ``gpumm predict``'s interpolation between two runs. Storages alive when the block starts
    are allocated at its start (the state the block begins from)."""
    import torch

    on_gpu = not fake and torch.cuda.is_available()
    if on_gpu:
        with _record_cuda(path, steps, warmup, step_on, progress, stop, size, size_name) as rec:
            yield rec
        return
    rec = Recorder(steps, warmup, stacks, step_on, progress, stop, "fake" if fake else "cpu")
    remap = fake or not torch.cuda.is_available()
    storage_mode, device_mode = _modes(rec, fake, remap)
    with contextlib.ExitStack() as es:
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


from gpumm.record_cuda import record_cuda as _record_cuda  # noqa: E402
