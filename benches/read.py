"""Reading a trace, against Python's own readers of the same bytes, in one run.

    python benches/read.py [--events N] [--corpus] [--json OUT]

On generated files of N events (default 10^6): a PyTorch snapshot (pickle protocol 4, six
fields an entry and one of a few shared stacks, as PyTorch writes) and a gzipped RMM log.
For each: the time of a replay through the gpumm model alone (what ``gpumm replay FILE
--allocator gpumm --no-min-capacity`` runs after the interpreter starts: read, prepare,
replay) and the time of the peer, as a ratio: the bare ``pickle.load`` of the snapshot,
Python's ``csv.reader`` over the gzipped log (rows read, nothing converted). Memory per event:
the column log's own bytes (``TraceLog.nbytes``) plus what tracemalloc sees Python allocate
while reading, and, in a fresh process, the growth of peak RSS over reading (VmHWM), each
divided by the events. ``--corpus`` adds the same ratios for every trace in ../shared/traces.
Times are the best of 3.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import io
import json
import os
import pickle
import random
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any, Callable, Dict, List

from gpumm.replay import replay
from gpumm.traces import read_trace

HERE = Path(__file__).resolve().parent
CORPUS = HERE.parents[1] / "shared" / "traces"


def make_snapshot(path: Path, n: int, seed: int = 1) -> None:
    """A snapshot of ``n`` history entries: allocations and their frees, live set ~1000."""
    rng = random.Random(seed)
    files = [f"/src/model/layer{i}.py" for i in range(40)]
    stacks = [[{"filename": rng.choice(files), "line": rng.randrange(1, 900), "name": f"fn{j}"}
               for j in range(rng.randrange(4, 12))] for _ in range(64)]
    base = 0x7F0000000000
    entries: List[Dict[str, Any]] = []
    live: List[int] = []
    t = 1_700_000_000_000_000
    nxt = 0
    while len(entries) < n:
        t += rng.randrange(1, 50)
        if live and (len(live) > 1000 or rng.random() < 0.5):
            a = live.pop(rng.randrange(len(live)))
            size = (a >> 4) & 0xFFFF or 512
            entries.append({"action": "free_requested", "addr": a, "size": size, "stream": 0,
                            "time_us": t, "frames": rng.choice(stacks)})
            entries.append({"action": "free_completed", "addr": a, "size": size, "stream": 0,
                            "time_us": t, "frames": rng.choice(stacks)})
        else:
            nxt += 1
            a = base + (nxt << 20)
            size = (a >> 4) & 0xFFFF or 512
            live.append(a)
            entries.append({"action": "alloc", "addr": a, "size": size, "stream": 0,
                            "time_us": t, "frames": rng.choice(stacks)})
    data = {"segments": [], "device_traces": [entries[:n]],
            "allocator_settings": {"expandable_segments": False}}
    with open(path, "wb") as f:
        pickle.dump(data, f, protocol=4)


def make_rmm(path: Path, n: int, seed: int = 2) -> None:
    """A gzipped RMM log of ``n`` rows, two threads, live set ~1000."""
    rng = random.Random(seed)
    out = io.StringIO()
    out.write("Thread,Time,Action,Pointer,Size,Stream\n")
    live: List[int] = []
    us = 0
    nxt = 0
    for _ in range(n):
        us += rng.randrange(1, 50)
        tm = f"{us // 3_600_000_000 % 24:02d}:{us // 60_000_000 % 60:02d}:{us // 1_000_000 % 60:02d}.{us % 1_000_000:06d}"
        th = rng.choice((140213, 140388))
        if live and (len(live) > 1000 or rng.random() < 0.5):
            a = live.pop(rng.randrange(len(live)))
            out.write(f"{th},{tm},free,{a:#x},{(a >> 4) & 0xFFFF},0x0\n")
        else:
            nxt += 1
            a = 0x7F0000000000 + (nxt << 20)
            live.append(a)
            out.write(f"{th},{tm},allocate,{a:#x},{(a >> 4) & 0xFFFF},0x0\n")
    path.write_bytes(gzip.compress(out.getvalue().encode(), compresslevel=6))


def best(fn: Callable[[], Any], repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def gpumm_replay(path: Path) -> None:
    replay(read_trace(path), allocators=["gpumm"], min_capacity=False)


def pickle_load(path: Path) -> None:
    with open(path, "rb") as f:
        pickle.load(f)


def csv_rows(path: Path) -> None:
    with gzip.open(path, "rt", newline="") as f:
        for _row in csv.reader(f):
            pass


def memory(path: Path) -> Dict[str, float]:
    """Bytes per event: held (the log's nbytes + Python's allocations while reading, by
    tracemalloc) and the peak RSS growth of a fresh process over reading (Linux)."""
    tracemalloc.start()
    t = read_trace(path)
    py_bytes, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    n = max(len(t.events), 1)
    held = (t.log.nbytes + py_bytes) / n
    # VmHWM (peak resident set of this address space) starts afresh at exec, unlike
    # ru_maxrss, which a child inherits from the process that forked it
    code = ("import sys;from gpumm.traces import read_trace\n"
            "def hwm():\n"
            " return int([l for l in open('/proc/self/status') if l.startswith('VmHWM')][0].split()[1])\n"
            "a=hwm();t=read_trace(sys.argv[1]);b=hwm();print((b-a)*1024/max(len(t.events),1))")
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=True)
    return {"events": n, "held_bytes_per_event": round(held, 1),
            "peak_rss_growth_per_event": round(float(out.stdout.strip()), 1)}


def measure(path: Path, peer: Callable[[Path], None], peer_name: str, repeat: int) -> Dict[str, Any]:
    ours = best(lambda: gpumm_replay(path), repeat)
    theirs = best(lambda: peer(path), repeat)
    return {"file": path.name, "peer": peer_name, "gpumm_replay_s": round(ours, 4),
            "peer_s": round(theirs, 4), "ratio": round(ours / theirs, 3), **memory(path)}


def main(argv: List[str] | None = None) -> Dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--corpus", action="store_true")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as d:
        snap, log = Path(d) / "gen.pickle", Path(d) / "gen.csv.gz"
        make_snapshot(snap, args.events)
        make_rmm(log, args.events)
        rows.append(measure(snap, pickle_load, "pickle.load", args.repeat))
        rows.append(measure(log, csv_rows, "csv.reader", args.repeat))
    if args.corpus and CORPUS.is_dir():
        for p in sorted(CORPUS.glob("*")) + sorted((CORPUS / "wild").glob("*")):
            if p.suffix == ".pickle":
                rows.append(measure(p, pickle_load, "pickle.load", args.repeat))
            elif p.name.endswith(".csv.gz"):
                rows.append(measure(p, csv_rows, "csv.reader", args.repeat))
    print(f"{'file':42} {'peer':12} {'gpumm s':>8} {'peer s':>8} {'ratio':>6} {'held B/ev':>9} {'RSS B/ev':>9}")
    for r in rows:
        print(f"{r['file'][:42]:42} {r['peer']:12} {r['gpumm_replay_s']:8.3f} {r['peer_s']:8.3f} "
              f"{r['ratio']:6.2f} {r['held_bytes_per_event']:9.1f} {r['peak_rss_growth_per_event']:9.1f}")
    out = {"events": args.events, "rows": rows}
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    main()
