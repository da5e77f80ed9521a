"""``gpumm tune``'s speed: every candidate setting (see gpumm.tune.candidates) replayed with
its smallest-device search on a 10^5-event trace, against one setting's replay alone.

The trace is gpt2_train.csv.gz's three training steps played over and over (each pass frees
what the one before left live, under new pointers) until it holds 10^5 events.

    python benches/tune.py            # prints the figures
    python benches/tune.py --json -   # the same as JSON
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import replace
from typing import Any, Dict

from gpumm.replay import prepare, run_model
from gpumm.traces import read_trace
from gpumm.traces.base import Trace
from gpumm.tune import candidates, tune

HERE = os.path.dirname(os.path.abspath(__file__))
GPT2 = os.path.join(HERE, "..", "..", "shared", "traces", "gpt2_train.csv.gz")


def long_trace(events: int = 100_000, path: str = GPT2) -> Trace:
    """``path``'s events repeated to ``events`` events, each pass under fresh pointers and
    ending with frees of what it left live."""
    base = read_trace(path)
    span = 1 << 44
    out = []
    n = 0
    while len(out) < events:
        off = (n + 1) * span
        live: Dict[int, Any] = {}
        for e in base.events:
            if e.action not in ("alloc", "free"):
                continue
            ev = replace(e, ptr=e.ptr + off)
            out.append(ev)
            if e.action == "alloc":
                live[ev.ptr] = ev
            else:
                live.pop(ev.ptr, None)
        out.extend(replace(e, action="free") for e in live.values())
        n += 1
    return Trace(events=out[:events], source=f"{os.path.basename(path)} x{n}", format="rmm")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--json", metavar="OUT")
    args = ap.parse_args()
    if not os.path.exists(GPT2):
        print(f"{GPT2} not found", file=sys.stderr)
        return 2
    t = long_trace(args.events)
    p = prepare(t)
    t0 = time.perf_counter()
    run_model("caching", p, 80 << 30, {}, 64 << 20, min_capacity=False)
    one = time.perf_counter() - t0
    t0 = time.perf_counter()
    r = tune(t, capacity="80GiB")
    wall = time.perf_counter() - t0
    out = {"events": len(t.events), "settings": len(r.candidates), "cores": os.cpu_count(),
           "tune_s": round(wall, 3), "one_replay_s": round(one, 4),
           "tune_over_one_replay": round(wall / one, 1), "best": r.best.alloc_conf,
           "grid": len(candidates())}
    if args.json:
        text = json.dumps(out, indent=2)
        if args.json == "-":
            print(text)
        else:
            with open(args.json, "w") as f:
                f.write(text + "\n")
    if args.json != "-":
        print(f"{out['settings']} settings on {out['events']:,} events ({out['cores']} cores): "
              f"{wall:.2f} s; one replay {one:.3f} s ({out['tune_over_one_replay']}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
