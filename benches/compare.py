"""Runs the peer benchmarks (criterion and pytest-benchmark, peers in the same run) and the
fill-to-failure and churn-capacity measures, and prints one table of ratios (gpumm ÷ peer, per
scenario).

    python benches/compare.py            # a table
    python benches/compare.py --json     # the same as JSON
    python benches/compare.py --quick    # shorter measurements
    python benches/compare.py --repeat 3 # the Python suite three times, the median of each row

Needs a Rust toolchain and the test extra (pip install ".[test]"); tlsfallocator and
virtual-allocator are installed from PyPI if missing (a peer that cannot be is left out).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Tuple

ROOT = Path(__file__).resolve().parents[1]

# gpumm's rows in benches/peers.rs: the default pool (it takes pages from the device as it
# needs them), and one that reserves the whole device up front, as the peers manage it
VARIANTS = {"gpumm": "", "gpumm-80G": " (pool: 80 GiB up front)",
            # its PMM, on the stream of one of its chunk sizes
            "gpumm-pmm": " (PMM chunk)"}


def criterion(quick: bool) -> Dict[Tuple[str, str], float]:
    """Median ns per operation (a churn or fixed pair, one event of a trace) of each (group,
    allocator) of benches/peers.rs."""
    extra = ["--warm-up-time", "1", "--measurement-time", "2"] if quick else []
    subprocess.run(["cargo", "bench", "--no-default-features", "--bench", "peers", "--", *extra],
                   cwd=ROOT, check=True, capture_output=True)
    out = {}
    base = ROOT / "target" / "criterion"
    for est in base.glob("peers-*/*/new/estimates.json"):
        group, name = est.parts[-4], est.parts[-3]
        if group.startswith("peers-churn-live"):
            continue  # a GPUMM_CHURN_LIVE run's, not this run's
        # per operation: a trace iteration replays all its operations (the throughput)
        meta = json.loads((est.parent / "benchmark.json").read_text())
        ops = (meta.get("throughput") or {}).get("Elements", 1)
        out[(group, name)] = json.loads(est.read_text())["median"]["point_estimate"] / ops
    return out


def fill() -> Tuple[List[Tuple[str, float]], List[Tuple[str, float]]]:
    """benches/fill.rs's two tables (see `parse_fill`)."""
    r = subprocess.run(["cargo", "bench", "--no-default-features", "--bench", "fill"], cwd=ROOT,
                       check=True, capture_output=True, text=True)
    return parse_fill(r.stdout)


def parse_fill(text: str) -> Tuple[List[Tuple[str, float]], List[Tuple[str, float]]]:
    """(allocator, mean % of the device in use at the first failure) and (allocator, GiB of
    the smallest device that serves the churn stream; one that 80 GiB does not serve is left
    out) from benches/fill.rs's output."""
    fills, devices = [], []
    for line in text.splitlines():
        m = re.match(r"\| (.+?) \| .* \| ([0-9.]+) % \|$", line)
        if m:
            fills.append((m.group(1), float(m.group(2))))
        m = re.match(r"\| (.+?) \| ([0-9.]+) GiB \|$", line)
        if m:
            devices.append((m.group(1), float(m.group(2))))
    return fills, devices


def python_peers(quick: bool) -> Dict[Tuple[str, str], float]:
    """Median ns per operation of benches/test_peers_bench.py, by (group, allocator): a pair
    (churn, fixed), one event (trace), a batch of 1024 pairs (batch)."""
    for pkg in ("TLSFAllocator", "virtual-allocator"):
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", pkg], capture_output=True)
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "b.json"
        subprocess.run([sys.executable, "-m", "pytest", "-q", "benches/test_peers_bench.py",
                        "--benchmark-enable", f"--benchmark-json={out}", "-p", "no:randomly"],
                       cwd=ROOT, check=True, capture_output=True)
        data = json.loads(out.read_text())
    return {(b["group"], b["extra_info"]["allocator"]):
            b["stats"]["median"] * 1e9 / b["extra_info"].get("events", 1)
            for b in data["benchmarks"]}


def machine() -> str:
    """The CPU model and core count, as the results' machine (ratios move between machines:
    benches/RESULTS.md, "Machines")."""
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} cores, Python {platform.python_version()}"


def median_rows(runs: List[Dict[Tuple[str, str], float]]) -> Dict[Tuple[str, str], float]:
    """Each row's median over several runs (rows missing from a run are left out of it)."""
    keys = {k for r in runs for k in r}
    return {k: statistics.median(r[k] for r in runs if k in r) for k in keys}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--repeat", type=int, default=1, metavar="N",
                    help="run the Python suite N times and take each row's median: a run of "
                         "it lasts seconds, and a burst of load from other tenants of a "
                         "virtual machine can move a whole row")
    args = ap.parse_args()
    rust = criterion(args.quick)
    py = median_rows([python_peers(args.quick) for _ in range(max(1, args.repeat))])
    fills, devices = fill()
    rows = []
    groups = ["peers-churn", "peers-fixed-1KiB", "peers-fixed-64KiB"] + sorted(
        {g for g, _ in rust if g.startswith("peers-trace-")})
    for group in groups:
        for variant, label in VARIANTS.items():
            g = rust.get((group, variant))
            for (grp, name), ns in sorted(rust.items()):
                if grp == group and not name.startswith("gpumm") and g:
                    rows.append({"scenario": f"Rust {group[6:]}{label}", "peer": name,
                                 "gpumm_ns": g, "peer_ns": ns, "ratio": g / ns})
    for group, label in (("peers churn", "churn"), ("peers fixed 64KiB", "fixed 64 KiB"),
                         ("peers trace bert_train", "trace bert_train, per event")):
        null = py.get((group, "null"), 0.0)
        mine = {"gpumm": py.get((group, "gpumm"))}
        if (group, "gpumm PMM chunk") in py:
            mine["gpumm PMM chunk"] = py[(group, "gpumm PMM chunk")]
        for who, g in mine.items():
            for (grp, name), ns in sorted(py.items()):
                if grp != group or name.startswith("gpumm") or name == "null" or not g:
                    continue
                rows.append({"scenario": f"Python {label} (net of the loop)"
                             + ("" if who == "gpumm" else f", {who}"), "peer": name,
                             "gpumm_ns": g - null, "peer_ns": ns - null,
                             "ratio": (g - null) / (ns - null)})
    g = py.get(("peers churn", "gpumm"))
    null = py.get(("peers churn", "null"), 0.0)
    for label, key in (("alloc_batch", "gpumm alloc_batch (1024)"),
                       ("alloc_batch(arena=True)", "gpumm alloc_batch arena (1024)")):
        batch = py.get(("peers batch", key))
        if batch and g:
            rows.append({"scenario": f"Python {label} vs single calls", "peer": "gpumm single",
                         "gpumm_ns": batch / 1024, "peer_ns": g - null,
                         "ratio": batch / 1024 / (g - null)})
    gp = dict(fills)
    for name, pct in fills:
        if not name.startswith("gpumm"):
            for gname in [g for g in gp if g.startswith("gpumm")]:
                rows.append({"scenario": f"fill to failure, % in use {gname[6:]}", "peer": name,
                             "gpumm_ns": gp[gname], "peer_ns": pct, "ratio": gp[gname] / pct})
    gd = dict(devices)
    for name, gib in devices:
        if not name.startswith("gpumm"):
            for gname in [g for g in gd if g.startswith("gpumm")]:
                rows.append({"scenario": f"smallest device for the churn stream {gname[6:]}",
                             "peer": name, "gpumm_ns": gd[gname], "peer_ns": gib,
                             "ratio": gd[gname] / gib})
    if args.json:
        print(json.dumps({"machine": machine(), "rows": rows, "rust_ns": {f"{k[0]}/{k[1]}": v for k, v in rust.items()},
                          "python_ns": {f"{k[0]}/{k[1]}": v for k, v in py.items()},
                          "fill_percent": dict(fills), "churn_device_gib": gd}, indent=2))
        return 0
    print(f"machine: {machine()}")
    print(f"{'scenario':62} {'peer':22} {'gpumm':>10} {'peer':>10} {'gpumm/peer':>10}")
    for r in rows:
        unit, places = (("%", 1) if "fill" in r["scenario"] else
                        ("GiB", 2) if "device" in r["scenario"] else ("ns", 1))
        print(f"{r['scenario']:62} {r['peer']:22} {r['gpumm_ns']:9.{places}f}{unit:3} "
              f"{r['peer_ns']:9.{places}f}{unit:3} {r['ratio']:10.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
