"""gpumm on a real NVIDIA GPU: every hook, a PyTorch training step and a CuPy computation sharing
one pool, host-to-device copies from a pinned gpumm pool, a trace replayed on the device, and
speed against PyTorch's caching allocator and cudaMallocAsync. Prints a table. Needs the NVIDIA driver, PyTorch with CUDA, and CuPy and Numba
if their rows are wanted (missing ones are reported, not hidden).

    python benches/gpu_check.py [--steps 50] [--json out.json]

Each phase runs in a fresh process: PyTorch's allocator can only be replaced before its first
CUDA allocation.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any, Dict


def _train(steps: int) -> Dict[str, Any]:
    """A small MLP training step, `steps` times; returns the time per step."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4096, 8192), torch.nn.GELU(),
                                torch.nn.Linear(8192, 4096)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(256, 4096, device="cuda")
    for _ in range(3):
        opt.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        opt.step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
    torch.cuda.synchronize()
    return {"step_ms": (time.perf_counter() - t0) / steps * 1e3, "loss": float(loss)}


def phase_gpumm(steps: int) -> Dict[str, Any]:
    import gpumm
    from gpumm.integrations import torch as torch_hook

    dev = gpumm.Device(backend="cuda")
    pool = gpumm.MemoryPool(dev, name="shared")
    torch_hook.use(pool)
    out: Dict[str, Any] = {"device": dev.name, "arch": dev.arch.name, "capacity": dev.capacity}
    out["torch"] = _train(steps)
    try:
        import cupy

        from gpumm.integrations import cupy as cupy_hook

        cupy_hook.use(pool)
        a = cupy.random.random((4096, 4096), dtype=cupy.float32)
        b = a @ a
        cupy.cuda.Device().synchronize()
        out["cupy"] = {"ok": bool(cupy.isfinite(b).all()), "live_after": pool.stats()["live_bytes"]}
        del a, b
    except ImportError as e:
        out["cupy"] = {"skipped": str(e)}
    try:
        from numba import cuda as ncuda

        from gpumm.integrations import numba as numba_hook

        numba_hook.use(pool)
        arr = ncuda.device_array(1 << 20, dtype="f4")
        out["numba"] = {"ok": arr.size == 1 << 20}
    except ImportError as e:
        out["numba"] = {"skipped": str(e)}
    # pinned host memory from a gpumm pool: host-to-device copy speed against pageable memory
    import torch

    hpool = gpumm.MemoryPool(gpumm.Device(backend="pinned", vidmem="1GiB"), name="pinned")
    n = 256 << 20
    h = hpool.alloc(n)
    pinned = torch.frombuffer(memoryview(h), dtype=torch.uint8)
    pageable = torch.empty(n, dtype=torch.uint8)
    dst = torch.empty(n, dtype=torch.uint8, device="cuda")
    speeds = {}
    for name, src in (("pinned", pinned), ("pageable", pageable)):
        dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(5):
            dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize()
        speeds[name] = 5 * n / (time.perf_counter() - t0) / 1e9
    out["pinned"] = {"is_pinned": bool(pinned.is_pinned()), "h2d_GBps": speeds,
                     "stats": {k: hpool.stats()[k] for k in ("reserved_bytes", "live_bytes")}}
    del pinned, dst
    h.free()
    hpool.close()
    # the trace replayed on the device through the same kind of pool
    from gpumm.cli import demo_trace_path
    from gpumm.traces import read_trace

    trace = read_trace(demo_trace_path())
    rpool = gpumm.MemoryPool(dev, name="replay")
    live: Dict[int, Any] = {}
    t0 = time.perf_counter()
    for e in trace.events:
        if e.action == "alloc":
            live[e.ptr] = rpool.alloc(e.size)
        elif e.action == "free" and e.ptr in live:
            live.pop(e.ptr).free()
    s = rpool.stats()
    out["replay"] = {"events_per_s": len(trace.events) / (time.perf_counter() - t0),
                     "peak_reserved": s["peak_reserved"], "peak_live": s["peak_live"]}
    out["pool"] = pool.metrics()
    return out


def phase_torch(steps: int) -> Dict[str, Any]:
    import torch

    out: Dict[str, Any] = {"torch": _train(steps)}
    from gpumm.cli import demo_trace_path
    from gpumm.traces import read_trace

    trace = read_trace(demo_trace_path())
    live: Dict[int, Any] = {}
    t0 = time.perf_counter()
    for e in trace.events:
        if e.action == "alloc":
            live[e.ptr] = torch.empty(e.size, dtype=torch.uint8, device="cuda")
        elif e.action == "free":
            live.pop(e.ptr, None)
    torch.cuda.synchronize()
    out["replay"] = {"events_per_s": len(trace.events) / (time.perf_counter() - t0),
                     "peak_reserved": torch.cuda.max_memory_reserved()}
    return out


PHASES = {"gpumm": phase_gpumm, "torch": phase_torch}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--json")
    ap.add_argument("--phase", choices=sorted(PHASES), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.phase:
        print(json.dumps(PHASES[args.phase](args.steps)))
        return 0
    runs = {"gpumm": ("gpumm", {}), "caching": ("torch", {}),
            "cudaMallocAsync": ("torch", {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"})}
    results: Dict[str, Any] = {}
    for name, (phase, env) in runs.items():
        r = subprocess.run([sys.executable, __file__, "--phase", phase, "--steps", str(args.steps)],
                           capture_output=True, text=True, env={**os.environ, **env})
        if r.returncode != 0:
            results[name] = {"error": r.stderr.strip().splitlines()[-1:] or ["failed"]}
            continue
        results[name] = json.loads(r.stdout.strip().splitlines()[-1])
    print(f"{'allocator':18} {'train step':>12} {'replay events/s':>16} {'replay peak reserved':>22}")
    for name, r in results.items():
        if "error" in r:
            print(f"{name:18} error: {r['error']}")
            continue
        rep = r["replay"]
        print(f"{name:18} {r['torch']['step_ms']:10.2f}ms {rep['events_per_s']:16,.0f} "
              f"{rep['peak_reserved'] / 2**20:20.1f}MiB")
    g = results.get("gpumm", {})
    for hook in ("cupy", "numba", "pinned"):
        if hook in g:
            print(f"{hook}: {g[hook]}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
