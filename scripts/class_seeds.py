"""Prints each model's peak reserved (MiB) on a generated workload class of
tests/test_reserve_classes.py over several seeds, and the sum over them; then, for gpumm,
issue 27's targets seed by seed: the bound (1.02 x peak live + 4 MiB) and on how many
seeds gpumm is over it, and on how many another model holds less.

One seed is not enough to rank two placement rules: on the interleaved class a change of
fit moves a seed's peak by a page either way (docs/reserve.md, "Heap pages"). The sum over
the class's own seed and seeds 10-17 tells a rule that saves memory on the class from one
that happens to save a page on its seed.

Run: ``python scripts/class_seeds.py CLASS [--seeds 10-17] [--models gpumm,caching]`` from the
repository root, in the venv (``CLASS`` is a key of ``CLASSES``; the class's own seed is
always included, first). The verdict lines count the seeds of ``--seeds`` only (the class's
own seed left out, as the class's test checks it), so they read as the class's figures on
streams the policy was not tuned on.
"""

from __future__ import annotations

import argparse
import inspect
import sys
import tempfile
from pathlib import Path
from typing import Dict, List

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

MiB = 1 << 20


def seeds_of(text: str) -> List[int]:
    """``"10-17"`` or ``"1,4,9"`` as a list of seeds."""
    out: List[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def main(argv: List[str]) -> int:
    import test_reserve_classes as t
    from gpumm.replay import replay
    from gpumm.report import page_floor
    from gpumm.traces import read_rmm_csv

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("name", choices=sorted(t.CLASSES))
    ap.add_argument("--seeds", default="10-17")
    ap.add_argument("--models", default="gpumm,caching,caching-expandable,rmm-pool,cupy,buddy")
    a = ap.parse_args(argv)
    gen = t.CLASSES[a.name]
    own = inspect.signature(gen).parameters["seed"].default
    seeds = [own] + [s for s in seeds_of(a.seeds) if s != own]
    models = a.models.split(",")
    rows: Dict[str, List[float]] = {m: [] for m in models}
    bounds: List[float] = []
    floors: List[float] = []
    with tempfile.TemporaryDirectory() as d:
        for s in seeds:
            trace = read_rmm_csv(t.write_csv(gen(s), Path(d) / f"{a.name}-{s}.csv"))
            rep = replay(trace, models, capacity="80GiB", min_capacity=False, planned=False)
            bounds.append(1.02 * rep.peak_live / MiB + 4)
            floors.append(page_floor(rep.peak_live) / MiB)
            for m in models:
                rows[m].append(rep.results[m].peak_reserved / MiB)
    print(f"{'seed':20s}" + "".join(f"{s:>8d}" for s in seeds) + f"{'sum':>9s}")
    for m in models:
        print(f"{m:20s}" + "".join(f"{v:8.1f}" for v in rows[m]) + f"{sum(rows[m]):9.1f}")
    print(f"{'bound':20s}" + "".join(f"{v:8.1f}" for v in bounds) + f"{sum(bounds):9.1f}")
    if "gpumm" in rows:
        print(verdict(rows, bounds, floors, seeds.index(own)))
    return 0


def verdict(rows: Dict[str, List[float]], bounds: List[float], floors: List[float],
            own: int) -> str:
    """gpumm against the targets on every seed but the class's own (index ``own``);
    ``floors``: each seed's peak live rounded up to whole pages."""
    keep = [i for i in range(len(bounds)) if i != own]
    g = rows["gpumm"]
    over = sum(g[i] > bounds[i] for i in keep)
    others = [m for m in rows if m != "gpumm"]
    behind = [i for i in keep if any(rows[m][i] < g[i] for m in others)]
    sub_page = sum(any(rows[m][i] < min(g[i], floors[i]) for m in others) for i in behind)
    text = f"gpumm over the bound on {over} of {len(keep)} seeds"
    if others:
        text += (f"; another model ({', '.join(others)}) holds less on {len(behind)}, "
                 f"on {sub_page} of them less than the pages the peak live fills")
    return text


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
