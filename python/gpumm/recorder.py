"""The recorder behind :func:`gpumm.record`: each storage's birth and death with its stack,
the step marks, and the file it writes (a PyTorch snapshot pickle, or an RMM log)."""

from __future__ import annotations

import os
import pickle
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from gpumm.errors import InvalidArgumentError

__all__ = ["Recorder", "StopRecording"]

PathLike = Union[str, "os.PathLike[str]"]
_BASE = 0x7F0000000000  # where synthetic addresses start
# frames of the machinery itself, left out of stacks
_SKIP = (os.sep + os.path.join("gpumm", "record.py"), os.sep + os.path.join("gpumm", "recorder.py"), os.path.join("torch", "_ops.py"),
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
        #: recorded as compiled (record_hooks.compiled_as_recorded), and the backend of each torch.compile
        self.compiled = False
        self.compile_backends: List[str] = []
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
                "gpu_only": self.gpu_only(), "peak_live": self._peak_kept(keep),
                "compile": self.compiled, "compile_backends": list(self.compile_backends)}

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
