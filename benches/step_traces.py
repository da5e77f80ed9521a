"""Steps served from a plan on the corpus traces that repeat a training step (the RMM CSVs of
../shared/traces/): ``python benches/step_traces.py [--record 1 2]``.

Step boundaries: the traces mark none, so they are found from the requests' sizes. A step is
the period ``P`` (in allocations) at which the size sequence repeats best: the fraction of
``i`` with ``size[i] == size[i + P]``, for ``P`` from an eighth of the allocations to all but
the last eighth; the smallest ``P`` scoring within 2 % of the best (a multiple of the period
scores as well). The trace starts at a step's start (it was recorded from one), so step ``k``
opens at allocation ``k * P``; a free between two allocations belongs to the step of the
first. Each trace is replayed through a pool on an 80 GiB simulated device with
``with pool.step():`` around each step; printed per trace: the period and its score, the
share of the served steps' requests served from the plan, the arena against the planner's
bound, the peak reserved over the served steps against the trace's peak live (issue 29's
target: at most 1.005 × + 2 MiB), and the normal pool's peak reserved on the same trace."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

import gpumm
from gpumm.traces import read_rmm_csv

MiB = 1 << 20
TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"


def period(sizes: np.ndarray) -> tuple[int, float]:
    n = len(sizes)
    scores = {p: float((sizes[:-p] == sizes[p:]).mean()) for p in range(n // 8, n - n // 8)}
    best = max(scores.values())
    p = min(q for q, s in scores.items() if s >= best - 0.02)
    return p, scores[p]


def replay(events, p: int, record: int | None, trim: bool = False):
    pool = gpumm.MemoryPool(gpumm.Device(vidmem="80GiB"))
    if record:
        pool.set_step_recording(record)
    live, n_alloc, step = {}, 0, -1
    served_reqs, peak_reserved, live_bytes, peak_live = 0, 0, 0, 0
    for e in events:
        if e.action == "alloc":
            if record and n_alloc % p == 0 and n_alloc // p != step:
                if step >= 0:
                    pool._step_end()
                    if trim and step + 1 == record:
                        pool.trim()  # what the recorded steps held beyond the plan goes back
                step = n_alloc // p
                pool._step_begin()
            live[e.ptr] = pool.alloc(e.size, e.stream)
            n_alloc += 1
            live_bytes += e.size
            peak_live = max(peak_live, live_bytes)
            if record and step >= record:
                served_reqs += 1
        elif e.action == "free":
            a = live.pop(e.ptr, None)
            if a is not None:
                live_bytes -= a.size
                a.free()
        if not record or step >= record:
            peak_reserved = max(peak_reserved, pool.stats()["reserved_bytes"])
    if record and step >= 0:
        pool._step_end()
    st = pool.stats()
    pool.validate()
    return st, served_reqs, peak_reserved, peak_live, pool


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--record", type=int, nargs="+", default=[1, 2])
    args = ap.parse_args()
    paths = sorted(TRACES.glob("*.csv.gz"))
    if not paths:
        sys.exit(f"no traces in {TRACES}")
    for path in paths:
        tr = read_rmm_csv(path)
        events = [e for e in tr.events if e.action in ("alloc", "free")]
        sizes = np.array([e.size for e in events if e.action == "alloc"])
        p, score = period(sizes)
        steps = -(-len(sizes) // p)
        normal, _, normal_peak, peak_live, _ = replay(events, p, None)
        print(f"{path.name}: {len(sizes)} allocations, period {p} (score {score:.3f}), "
              f"{steps} steps; peak live {peak_live / MiB:.1f} MiB; normal pool peak reserved "
              f"{normal['peak_reserved'] / peak_live:.4f} x")
        for record in args.record:
            if record >= steps:
                print(f"  record {record}: no step left to serve")
                continue
            st, served, peak, _, _ = replay(events, p, record)
            _, _, peak_trim, _, _ = replay(events, p, record, trim=True)
            share = st["plan_hits"] / served if served else 0.0
            target = 1.005 * peak_live + 2 * MiB
            print(f"  record {record}: served {st['plan_hits']} of {served} requests "
                  f"({share:.1%}), misses {st['plan_misses']}, rebuilds {st['plan_rebuilds']}; "
                  f"arena {st['plan_arena_bytes'] / MiB:.1f} MiB (bound {st['plan_bound_bytes'] / MiB:.1f}); peak reserved over served "
                  f"steps {peak / peak_live:.4f} x peak live (target {target / peak_live:.4f} x: "
                  f"{'met' if peak <= target else 'NOT met'}); with pool.trim() once planned "
                  f"{peak_trim / peak_live:.4f} x ({'met' if peak_trim <= target else 'NOT met'})")


if __name__ == "__main__":
    main()
