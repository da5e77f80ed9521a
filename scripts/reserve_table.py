"""Prints, for every corpus trace (and every device of it) and every generated workload class
of tests/test_reserve_classes.py, gpumm's peak reserved / peak live, its smallest capacity,
and the best other model, with whether issue 27's targets hold:

- ``bound``: gpumm's peak reserved <= 1.02 x peak live + 4 MiB;
- ``least``: it is at most every other model's (caching, caching-expandable, rmm-pool, cupy,
  buddy);
- ``cap``: its smallest capacity <= 1.02 x peak live + 8 MiB.

Run: ``python scripts/reserve_table.py [--classes-only | --corpus-only] [-j N] [FILE ...]``;
``--markdown`` prints docs/reserve.md's table instead (every model,
with its smallest capacity in MiB)
(from the repository root, in the venv). Each trace is replayed as ``gpumm replay FILE
--json -`` does it (``replay(t, capacity=max(80 GiB, 2 x peak live))``); the figures are
deterministic, so two runs before and after a change compare line by line.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import List, Tuple

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

MiB = 1 << 20
OTHERS = ("caching", "caching-expandable", "rmm-pool", "cupy", "buddy")

Row = Tuple[str, str, int, float, int, str, float, str]


def rows_of(name: str, reports) -> List[Row]:
    """One row per device report."""
    out = []
    for rep in reports:
        g = rep.results["gpumm"]
        live = rep.peak_live
        best = min(OTHERS, key=lambda m: rep.results[m].peak_reserved)
        b = rep.results[best]
        flags = []
        if g.peak_reserved > 1.02 * live + 4 * MiB:
            flags.append("BOUND")
        if any(g.peak_reserved > rep.results[m].peak_reserved for m in OTHERS):
            flags.append("LEAST")
        if g.min_capacity is None or g.min_capacity > 1.02 * live + 8 * MiB:
            flags.append("CAP")
        out.append((name, str(getattr(rep, "device", 0)), live, g.ratio,
                    g.min_capacity or 0, best, b.ratio, ",".join(flags) or "ok"))
    return out


MODELS = ("gpumm",) + OTHERS + ("driver",)


def _size(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB" if n >= 1 << 30 else f"{n / MiB:.1f} MiB"


def markdown_rows(path: str) -> List[str]:
    """docs/reserve.md's rows of one corpus file, one a device."""
    from corpus import label
    from gpumm.replay import replay
    from gpumm.traces import read_traces

    out = []
    for t in read_traces(path):
        rep = replay(t, capacity=max(80 << 30, 2 * t.peak_live()))
        cells = [f"{rep.results[m].ratio:.3f} ({(rep.results[m].min_capacity or 0) / MiB:,.0f})"
                 for m in MODELS]
        name = label(Path(path)).replace(".csv.gz", "").replace(".pickle", "")
        out.append(f"| {name} | {getattr(rep, 'device', 0)} | {_size(rep.peak_live)} | "
                   + " | ".join(cells) + " |")
    return out


def corpus_rows(path: str) -> List[Row]:
    from corpus import label
    from gpumm.replay import replay
    from gpumm.traces import read_traces

    reports = []
    for t in read_traces(path):
        reports.append(replay(t, capacity=max(80 << 30, 2 * t.peak_live())))
    return rows_of(label(Path(path)), reports)


def class_rows(name: str) -> List[Row]:
    import test_reserve_classes as c

    with tempfile.TemporaryDirectory() as d:
        return rows_of(f"class/{name}", [c.measure(name, Path(d))])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="*", help="traces (default: the whole corpus)")
    ap.add_argument("--classes-only", action="store_true")
    ap.add_argument("--corpus-only", action="store_true")
    ap.add_argument("-j", type=int, default=2, help="processes (default 2)")
    ap.add_argument("--markdown", action="store_true", help="docs/reserve.md's table")
    args = ap.parse_args()
    from corpus import ALL, STATE_ONLY, label
    import test_reserve_classes as c

    if args.markdown:
        paths = sorted(args.files or [str(p) for p in ALL],
                       key=lambda p: (not label(Path(p)).startswith("recorded/"), label(Path(p))))
        print("| trace | device | peak live | " + " | ".join(MODELS) + " |")
        print("|---" * (3 + len(MODELS)) + "|")
        with ProcessPoolExecutor(args.j) as ex:
            for rows in ex.map(markdown_rows, paths):
                print("\n".join(rows), flush=True)
        return

    files = args.files or ([] if args.classes_only else
                           [str(p) for p in ALL if p.name not in STATE_ONLY])
    classes = [] if (args.corpus_only or args.files) else list(c.CLASSES)
    with ProcessPoolExecutor(args.j) as ex:
        jobs = [ex.submit(corpus_rows, f) for f in files]
        jobs += [ex.submit(class_rows, n) for n in classes]
        print(f"{'trace':44s} {'dev':>3s} {'peak live':>10s} {'gpumm':>7s} {'cap MiB':>8s}"
              f"  {'best other':>20s}  flags")
        for j in jobs:
            for name, dev, live, ratio, cap, best, bratio, flags in j.result():
                print(f"{name:44s} {dev:>3s} {live / MiB:10.1f} {ratio:7.4f} {cap / MiB:8.0f}"
                      f"  {best:>18s} {bratio:.4f}  {flags}", flush=True)


if __name__ == "__main__":
    main()
