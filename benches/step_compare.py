"""Steps served from a plan through Python, against the normal pool, in one process:
``python benches/step_compare.py [--repeat 7]``.

One step is 512 requests of log-uniform sizes (256 B – 8 MiB), request ``i`` freed once
request ``i + 8`` is made, as in benches/step.rs. Rows, each per alloc + free pair, the median
of ``--repeat`` alternated rounds of 20 steps: the loop with two trivial C calls in place of
alloc and free (``null``); the normal pool with ``Allocation`` objects and with int pointers
(``alloc_raw``/``free_raw``); the same requests served from the plan (``with pool.step()``,
its begin and end in the time); and the served step with every tenth request departing (256 B
larger). ``net`` subtracts the null loop; ``ratio`` is a row's net over the normal pair's."""

from __future__ import annotations

import argparse
import collections
import statistics
import time

import numpy as np

import gpumm

GiB = 1 << 30
N, LIVE, STEPS = 512, 8, 20


def sizes(seed: int = 7) -> list[int]:
    rng = np.random.default_rng(seed)
    return [int(x) for x in (2.0 ** rng.uniform(8.0, 23.0, N))]


def pool() -> gpumm.MemoryPool:
    return gpumm.MemoryPool(gpumm.Device(vidmem=80 * GiB))


def objects(p, seq):
    alloc, live = p.alloc, collections.deque()
    push, pop = live.append, live.popleft
    for s in seq:
        push(alloc(s))
        if len(live) > LIVE:
            pop().free()
    while live:
        pop().free()


def raw(p, seq):
    alloc, free, live = p.alloc_raw, p.free_raw, collections.deque()
    push, pop = live.append, live.popleft
    for s in seq:
        push(alloc(s))
        if len(live) > LIVE:
            free(pop())
    while live:
        free(pop())


def null(_p, seq):
    nop, live = len, collections.deque()
    push, pop = live.append, live.popleft
    for s in seq:
        push(nop(seq))
        if len(live) > LIVE:
            nop(seq) and pop()
    while live:
        nop(seq) and pop()


def stepped(body):
    def run(p, seq):
        with p.step():
            body(p, seq)
    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    seq = sizes()
    departing = [s + 256 if i % 10 == 9 else s for i, s in enumerate(seq)]
    rows = {
        "null": (pool(), null, seq),
        "normal pair (Allocation)": (pool(), objects, seq),
        "normal pair (int pointers)": (pool(), raw, seq),
        "served pair (Allocation)": (pool(), stepped(objects), seq),
        "served pair (int pointers)": (pool(), stepped(raw), seq),
        "served, 10 % departing (int pointers)": (pool(), stepped(raw), departing),
    }
    for name, (p, fn, s) in rows.items():
        p.set_step_recording(1)
        for _ in range(3):  # warm: recorded, planned, served once
            fn(p, seq if "departing" in name else s)
    times: dict[str, list[float]] = {k: [] for k in rows}
    for _ in range(args.repeat):
        for name, (p, fn, s) in rows.items():
            t0 = time.perf_counter_ns()
            for _ in range(STEPS):
                fn(p, s)
            times[name].append((time.perf_counter_ns() - t0) / (STEPS * N))
    med = {k: statistics.median(v) for k, v in times.items()}
    base = med["null"]
    normal = med["normal pair (Allocation)"] - base
    normal_raw = med["normal pair (int pointers)"] - base
    print(f"{'row':42} {'ns/pair':>8} {'net':>8} {'/normal':>8} {'/normal raw':>11}")
    for k, v in med.items():
        net = v - base
        print(f"{k:42} {v:8.1f} {net:8.1f} {net / normal:8.3f} {net / normal_raw:11.3f}")
    for name, (p, _, _) in rows.items():
        st = p.stats()
        if "served" in name:
            print(f"{name}: plan_hits {st['plan_hits']}, plan_misses {st['plan_misses']}, "
                  f"rebuilds {st['plan_rebuilds']}")
        p.validate()


if __name__ == "__main__":
    main()
