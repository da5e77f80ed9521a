"""Whether gpumm's peak reserve holds on traces its policy was not tuned on, made from the
corpus's own traces in two ways:

- **rounded**: every request (and its free) rounded up to ``R`` bytes (``--round 512,4096``):
  sizes a tensor could as well have had (PyTorch's caching allocator rounds to 512 B before
  it asks for memory), so a rule that only fits the recorded sizes shows here;
- **long run**: the trace's last step repeated ``N`` more times (``--repeat 20``), a step
  being a stretch between two points where nothing of the trace is live (the recorded
  workloads of scripts/record_workloads.py have them; traces without them get ``-``).

Prints, per trace and device: peak live, gpumm's peak reserved (MiB) as recorded, with each
rounding, and after the long run, and ``*`` beside each figure over issue 27's bound (1.02 x
that trace's peak live + 4 MiB). ``--others`` adds, for each rounding, the least any other
model (caching, caching-expandable, rmm-pool, cupy, buddy) reserves, and ``<`` where it is
less than gpumm's. ``--pool size_cache=False`` passes options to the pool
(``gpumm.MemoryPool``'s keywords), to compare two policies on the same copies.

Run: ``python scripts/robustness.py [FILE ...] [--round 512,4096] [--repeat 20] [--others]
[--pool KEY=VALUE ...] [-j N]`` from the repository root, in the venv (default: every RMM log
of the corpus, shared and recorded). The figures are deterministic.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

MiB = 1 << 20
CAPACITY = 80 << 30
OTHERS = ("caching", "caching-expandable", "rmm-pool", "cupy", "buddy")


def rounded(t: Any, r: int) -> Any:
    """``t`` with every alloc and free rounded up to a multiple of ``r`` bytes."""
    ev = [dataclasses.replace(e, size=-(-e.size // r) * r) if e.action in ("alloc", "free")
          else e for e in t.events]
    return t.replace(events=ev)


def last_step(events: Sequence[Any]) -> Optional[Tuple[int, int]]:
    """(start, end) of the last stretch of events between two points where nothing is live,
    or None when the trace has fewer than two such stretches."""
    live: Dict[int, int] = {}
    cur, ends = 0, []
    for i, e in enumerate(events):
        if e.action == "alloc":
            live[e.ptr] = e.size
            cur += e.size
        elif e.action == "free" and e.ptr in live:
            cur -= live.pop(e.ptr)
        if cur == 0 and e.action in ("alloc", "free"):
            ends.append(i + 1)
    # stretches of more than a few events (a lone alloc + free is not a step)
    cuts = [0] + ends
    steps = [(a, b) for a, b in zip(cuts, cuts[1:]) if b - a > 8]
    return steps[-1] if len(steps) >= 2 else None


def long_run(t: Any, n: int) -> Optional[Any]:
    """``t`` with its last step repeated ``n`` more times, or None (no steps)."""
    ev = list(t.events)
    s = last_step(ev)
    if s is None:
        return None
    a, b = s
    return t.replace(events=ev[:b] + ev[a:b] * n + ev[b:])


def row(path: str, rounds: List[int], repeat: int, others: bool,
        pool: Dict[str, Any]) -> List[str]:
    """The printed lines of one file, one a device."""
    from corpus import label
    from gpumm.replay import replay
    from gpumm.traces import read_traces, replay_pool

    out = []
    for t in read_traces(path):
        live = t.peak_live()

        def cell(tr: Any) -> Tuple[str, int]:
            """gpumm's cell of copy ``tr``, and its peak reserved."""
            peak = replay_pool(tr, CAPACITY, **pool).peak_reserved
            over = "*" if peak > 1.02 * tr.peak_live() + 4 * MiB else " "
            return f"{peak / MiB:9.0f}{over}", peak

        cells = [cell(t)[0]]
        for r in rounds:
            tr = rounded(t, r)
            text, mine = cell(tr)
            cells.append(text)
            if others:
                rep = replay(tr, list(OTHERS), capacity=CAPACITY, min_capacity=False,
                             planned=False)
                least = min(rep.results[m].peak_reserved for m in OTHERS)
                cells.append(f"{least / MiB:8.0f}{'<' if least < mine else ' '}")
        if repeat:
            lr = long_run(t, repeat)
            cells.append(cell(lr)[0] if lr is not None else f"{'-':>9s} ")
        out.append(f"{label(Path(path)):44s} {t.device:>3d} {live / MiB:10.1f}" + "".join(cells))
    return out


def pool_options(items: List[str]) -> Dict[str, Any]:
    """``["size_cache=False"]`` as ``{"size_cache": False}`` (values as Python literals)."""
    opts: Dict[str, Any] = {}
    for it in items:
        key, sep, value = it.partition("=")
        if not sep:
            raise SystemExit(f"--pool {it!r}: expected KEY=VALUE")
        try:
            opts[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            opts[key] = value
    return opts


def main(argv: List[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="*", help="traces (default: every RMM log of the corpus)")
    ap.add_argument("--round", default="512,4096", help="byte multiples, comma-separated")
    ap.add_argument("--repeat", type=int, default=20, help="more repetitions of the last step")
    ap.add_argument("--others", action="store_true", help="the least other model, rounded")
    ap.add_argument("--pool", nargs="*", default=[], metavar="KEY=VALUE")
    ap.add_argument("-j", type=int, default=2, help="processes (default 2; 1: in this one)")
    a = ap.parse_args(argv)
    from corpus import RMM

    rounds = [int(x) for x in a.round.split(",") if x]
    pool = pool_options(a.pool)
    files = a.files or [str(p) for p in RMM]
    head = f"{'trace':44s} {'dev':>3s} {'peak live':>10s}{'recorded':>10s} "
    for r in rounds:
        head += f"{'to ' + str(r) + ' B':>10s}" + (f"{'others':>9s}" if a.others else "")
    if a.repeat:
        head += f"{'+' + str(a.repeat) + ' steps':>10s}"
    print(head)
    if a.j <= 1:
        for f in files:
            print("\n".join(row(f, rounds, a.repeat, a.others, pool)), flush=True)
        return 0
    with ProcessPoolExecutor(a.j) as ex:
        jobs = [ex.submit(row, f, rounds, a.repeat, a.others, pool) for f in files]
        for j in jobs:
            print("\n".join(j.result()), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
