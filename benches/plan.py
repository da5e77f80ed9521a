"""The offline planner on every corpus trace: the bound (the peak of live bytes in 512-byte
blocks), the plan's peak reserved and its ratio to the bound, gpumm's online pool and
PyTorch's caching model replayed in the same run, and the planner's time.

    python benches/plan.py            # a Markdown table (what docs/plan.md shows)
    python benches/plan.py --json -   # the same as JSON
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

from gpumm.replay import plan_prepared, prepare, read_devices, run_model

HERE = Path(__file__).resolve().parent
SHARED = HERE.parent.parent / "shared" / "traces"
SUFFIXES = (".csv", ".csv.gz", ".pickle", ".json", ".json.gz")


def corpus() -> List[Path]:
    """Every shared trace, wild/, and the recorded workloads in the trace cache."""
    cache = Path(os.environ.get("GPUMM_TRACE_CACHE", Path.home() / ".cache" / "gpumm" / "traces"))
    out: List[Path] = []
    for folder, suffixes in ((SHARED, SUFFIXES), (SHARED / "wild", SUFFIXES), (cache, (".csv.gz",))):
        if folder.is_dir():
            out += sorted(p for p in folder.iterdir() if p.name.endswith(suffixes)
                          and not p.name.startswith("."))
    return out


def measure(path: Path) -> List[Dict[str, Any]]:
    """One row per device of ``path``."""
    rows = []
    for t in read_devices(path):
        p = prepare(t)
        t0 = time.perf_counter()
        pl = plan_prepared(p)
        secs = time.perf_counter() - t0
        cap = 1 << 46
        g = run_model("gpumm", p, cap, {}, min_capacity=False)
        c = run_model("caching", p, cap, {}, min_capacity=False)
        rows.append({
            "trace": path.name, "device": t.device, "allocations": t.num_allocs,
            "peak_live": p.peak_live, "bound": pl.bound, "planned": pl.peak_reserved,
            "planned_ratio": pl.ratio, "gpumm": g.peak_reserved, "caching": c.peak_reserved,
            "plan_seconds": secs,
        })
    return rows


def main(argv: Any = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write JSON here ('-': stdout)")
    args = ap.parse_args(argv)
    rows = [r for path in corpus() for r in measure(path)]
    if args.json:
        text = json.dumps(rows, indent=2)
        if args.json == "-":
            print(text)
        else:
            Path(args.json).write_text(text + "\n")
        return 0
    mib = 1 << 20
    print("| trace | dev | allocs | peak live MiB | plan ÷ bound | gpumm ÷ bound | caching ÷ bound "
          "| plan s |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        b = r["bound"] or 1
        print(f"| {r['trace']} | {r['device']} | {r['allocations']} | {r['peak_live'] / mib:.1f} "
              f"| {r['planned'] / b:.4f} | {r['gpumm'] / b:.4f} | {r['caching'] / b:.4f} "
              f"| {r['plan_seconds']:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
