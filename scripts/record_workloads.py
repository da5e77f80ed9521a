"""Records the allocation traces of real model workloads on a CPU, as RMM logs, for the corpus
that tests and benchmarks replay (tests/corpus.py picks them up from the cache folder).

Each workload builds a Hugging Face ``transformers`` (or ``diffusers``) model from a
configuration in code (random weights: nothing is downloaded), runs its warm-up steps, then
runs its recorded steps under ``torch.profiler.profile(profile_memory=True)``. The profiler's
allocation events on the CPU (address, bytes: positive for an allocation, negative for a free)
become the rows of an RMM ``logging_resource_adaptor`` log in the order they happened, Time
from the first event, written by :func:`gpumm.traces.write_rmm_csv`. Sizes are the exact
byte counts the CPU allocator was asked for (``check_exact_sizes`` shows it on tensors of known
size before anything is recorded). Memory allocated before recording began (weights,
optimizer state, the warm-up's leftovers) is not in the log: frees of it are left out, as
RMM would never have seen the allocation; allocations still live at the end have no free.

    pip install torch transformers diffusers
    python scripts/record_workloads.py [--out DIR] [--only NAME ...] [--force] [--list]

The output folder is ``--out``, else ``$GPUMM_TRACE_CACHE``, else ``~/.cache/gpumm/traces``;
each workload writes ``<name>.csv.gz`` there. A file already there is kept unless ``--force``.
Each workload is recorded in a process of its own: one the kernel kills (its out-of-memory
killer sends SIGKILL, which no Python code sees) is reported by name, leaves no file, and the
others are still recorded; the script then exits 1.
The workloads are defined in scripts/workloads.py and listed in docs/replay.md, "Recorded
workloads".
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

from gpumm.traces import Event, Trace, write_rmm_csv
from gpumm.units import format_size

sys.path.insert(0, str(Path(__file__).resolve().parent))
from workloads import WORKLOADS, Workload  # noqa: E402  (scripts/workloads.py, beside this file)


def cache_dir() -> Path:
    """The folder recorded traces go to: ``$GPUMM_TRACE_CACHE`` or ``~/.cache/gpumm/traces``."""
    env = os.environ.get("GPUMM_TRACE_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "gpumm" / "traces"


def _allocation_events(prof) -> List[Tuple[int, int, int, int]]:
    """(time ns, thread, address, bytes) of every CPU allocation event the profiler saw, in
    the order they happened (bytes < 0: a free)."""
    from torch._C._profiler import _EventType

    out = []
    stack = list(reversed(prof.profiler.kineto_results.experimental_event_tree()))
    while stack:  # pre-order: children in the order they happened
        node = stack.pop()
        stack.extend(reversed(node.children))
        if node.tag != _EventType.Allocation:
            continue
        f = node.extra_fields
        if f.device.type != "cpu" or f.alloc_size == 0:
            continue
        out.append((node.start_time_ns, node.start_tid, f.ptr, f.alloc_size))
    out.sort(key=lambda e: e[0])  # stable: events of the same nanosecond keep their order
    return out


def _profile(fn: Callable[[], None]) -> List[Tuple[int, int, int, int]]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=False) as prof:
        fn()
    return _allocation_events(prof)


def to_trace(events: List[Tuple[int, int, int, int]], source: str) -> Trace:
    """The profiler's allocation events as a trace, Time from its first row: frees of
    addresses not allocated in the recording are left out (their allocation came before it),
    and each free carries the size of its allocation."""
    live: Dict[int, int] = {}
    rows: List[Tuple[str, int, int, int, int]] = []
    for ns, tid, ptr, nbytes in events:
        if nbytes > 0:
            if ptr in live:
                raise RuntimeError(f"{source}: {ptr:#x} allocated again while live")
            live[ptr] = nbytes
            rows.append(("alloc", ptr, nbytes, ns, tid))
        elif ptr in live:
            size = live.pop(ptr)
            if size != -nbytes:
                raise RuntimeError(f"{source}: {ptr:#x} freed with {-nbytes} B, allocated {size} B")
            rows.append(("free", ptr, size, ns, tid))
    t0 = rows[0][3] if rows else 0
    out = [Event(a, ptr, size, 0, (ns - t0) // 1000, tid) for a, ptr, size, ns, tid in rows]
    return Trace(out, source, format="rmm")


def check_exact_sizes() -> None:
    """The profiler reports the bytes asked for, not a rounded block: tensors of 1, 3, 1000
    and 12345 floats show up as 4, 12, 4000 and 49380 B."""
    import torch

    wanted = [1, 3, 1000, 12345]

    def make():
        keep = [torch.empty(n, dtype=torch.float32) for n in wanted]
        del keep

    seen = [b for _, _, _, b in _profile(make) if b > 0]
    if seen != [4 * n for n in wanted]:
        raise RuntimeError(f"the profiler's sizes are not exact tensor bytes: {seen}")


def record(w: Workload, path: Path) -> Trace:
    """Builds, warms up and records one workload; writes it to ``path``."""
    step = w.build()
    for _ in range(w.warmup):
        step()

    def run():
        for _ in range(w.steps):
            step()

    trace = to_trace(_profile(run), path.name)
    # a hidden name that still ends in .gz (write_rmm_csv compresses by the name): a reader of
    # the folder never sees half a file
    tmp = path.with_name("." + path.name)
    try:
        write_rmm_csv(trace, tmp)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    return trace


def how_it_ended(returncode: int) -> str:
    """What a child's exit status says, in words: negative is the signal that killed it."""
    if returncode >= 0:
        return f"exit status {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f"signal {-returncode}"
    if -returncode == signal.SIGKILL:
        return (f"killed by {name}, most likely by the kernel's out-of-memory killer (`dmesg` "
                f"says so): record it alone, with less else running")
    return f"killed by {name}"


def run_child(cmd: List[str], head: str) -> bool:
    """Runs one recording's process; on failure says how it ended. True if it exited 0."""
    rc = subprocess.run(cmd).returncode
    if rc != 0:
        print(f"{head}: not recorded: {how_it_ended(rc)}", flush=True)
    return rc == 0


def _record_here(w: Workload, path: Path, head: str) -> int:
    """Records one workload in this process (the child's side of :func:`main`)."""
    import torch

    torch.set_num_threads(min(2, os.cpu_count() or 1))
    t0 = time.perf_counter()
    try:
        trace = record(w, path)
    except Exception as e:  # a model the installed library cannot build: say so
        print(f"{head}: not recorded: {type(e).__name__}: {e}", flush=True)
        return 1
    print(f"{head}: {path}: {trace.num_allocs:,} allocations, peak live "
          f"{format_size(trace.peak_live())}, {time.perf_counter() - t0:.0f} s", flush=True)
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, help="output folder (default: $GPUMM_TRACE_CACHE or ~/.cache/gpumm/traces)")
    ap.add_argument("--only", nargs="+", choices=list(WORKLOADS), metavar="NAME",
                    help=f"record only these ({', '.join(WORKLOADS)})")
    ap.add_argument("--force", action="store_true", help="record again files already there")
    ap.add_argument("--list", action="store_true", help="list the workloads and exit")
    ap.add_argument("--child", nargs=2, metavar=("NAME", "HEAD"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.list:
        for w in WORKLOADS.values():
            print(f"{w.name:20} {w.summary}")
        return 0
    try:
        import torch
    except ImportError:
        print("record_workloads.py needs torch and transformers: pip install torch transformers diffusers",
              file=sys.stderr)
        return 2
    out = (args.out or cache_dir()).expanduser()
    if args.child:  # one recording, in the process main started for it
        name, head = args.child
        return _record_here(WORKLOADS[name], out / f"{name}.csv.gz", head)
    out.mkdir(parents=True, exist_ok=True)
    check_exact_sizes()
    todo = [WORKLOADS[n] for n in (args.only or WORKLOADS)]
    failed = 0
    for i, w in enumerate(todo, 1):
        path = out / f"{w.name}.csv.gz"
        head = f"[{i}/{len(todo)}] {w.name}"
        if path.exists() and not args.force:
            print(f"{head}: {path} is there, kept (--force records it again)", flush=True)
            continue
        print(f"{head}: {w.summary}: {w.warmup} warm-up + {w.steps} recorded steps ...", flush=True)
        child = [sys.executable, str(Path(__file__).resolve()), "--out", str(out), "--child", w.name, head]
        failed += not run_child(child, head)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
