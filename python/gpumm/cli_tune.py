"""``gpumm tune TRACE``: PyTorch's caching-allocator settings ranked by exact replay
(:mod:`gpumm.tune`)."""

from __future__ import annotations

import argparse
import json
from typing import Any, List

from rich import box
from rich.console import Console
from rich.table import Table

from gpumm.units import format_size

__all__ = ["register", "cmd_tune", "INSTALL_GPUMM"]

#: how to put gpumm's pool under PyTorch (gpumm.integrations.torch)
INSTALL_GPUMM = ("import gpumm, gpumm.integrations.torch as gt; "
                 "gt.use(gpumm.MemoryPool(gpumm.Device(backend=\"cuda\")))  "
                 "# before the first CUDA tensor")


def register(subparsers: Any) -> None:
    """Adds the ``tune`` subcommand to ``gpumm``'s parser."""
    tp = subparsers.add_parser("tune", help="rank PyTorch's allocator settings for a trace by "
                               "exact replay (PYTORCH_CUDA_ALLOC_CONF)")
    tp.add_argument("trace", help="PyTorch snapshot (pickle, or JSON), RMM log CSV, or profiler JSON")
    tp.add_argument("--capacity", help="device capacity, e.g. 24GiB (default: an H100's); "
                    "garbage_collection_threshold is searched only with it (PyTorch's allowed "
                    "maximum: the memory fraction times the device's memory)")
    tp.add_argument("--gpu", type=int, metavar="N", help="device N of a snapshot only "
                    "(default: every device, the one with a recorded OOM first)")
    tp.add_argument("--top", type=int, default=12, help="rows of the table (default 12)")
    tp.add_argument("--json", metavar="OUT", help="write the candidates as JSON ('-' for "
                    "stdout only)")
    tp.set_defaults(func=cmd_tune)


def _size(n: Any) -> str:
    return "–" if n is None else format_size(n)


def cmd_tune(args: argparse.Namespace, out: Console) -> int:
    """Replays the trace with every candidate setting; a ranked table per device."""
    from gpumm.replay import read_devices
    from gpumm.tune import tune

    traces = read_devices(args.trace, args.gpu)
    results = [tune(t, capacity=args.capacity) for t in traces]
    if args.json:
        data: List[Any] = [{"device": r.device, "capacity": r.capacity,
                            "candidates": [c.to_json() for c in r.candidates],
                            "gpumm": {"peak_reserved": r.gpumm.peak_reserved,
                                      "min_capacity": r.gpumm.min_capacity,
                                      "ooms": len(r.gpumm.ooms)}} for r in results]
        text = json.dumps(data[0]["candidates"] if len(data) == 1 else data, indent=2)
        if args.json == "-":
            print(text)
            return 0
        with open(args.json, "w") as f:
            f.write(text + "\n")
    for t, r in zip(traces, results):
        if t.format == "snapshot":
            out.rule(f"[bold]device {t.device}[/bold]")
        tab = Table(box=box.SIMPLE_HEAD, title=f"caching model, {len(r.candidates)} settings, "
                    f"peak live {format_size(r.peak_live)}, device {format_size(r.capacity)}")
        for col in ("#", "PYTORCH_CUDA_ALLOC_CONF", "peak reserved", "smallest device",
                    f"OOMs at {format_size(r.capacity)}", "note"):
            tab.add_column(col, justify="left" if col in ("PYTORCH_CUDA_ALLOC_CONF", "note")
                           else "right", overflow="fold")
        shown = r.candidates[:args.top]
        if r.recorded not in shown:
            shown = shown + [r.recorded]
        for c in shown:
            note = "recorded" if c.recorded else ""
            if c.flag:
                note = (note + "; " if note else "") + "known bad (pytorch/pytorch#123548)"
            if c.error:
                note = c.error
            tab.add_row(str(r.candidates.index(c) + 1), c.alloc_conf or "(defaults)",
                        _size(c.peak_reserved), _size(c.min_capacity), str(c.ooms), note)
        g = r.gpumm
        tab.add_row("–", "gpumm's pool", _size(g.peak_reserved), _size(g.min_capacity),
                    str(len(g.ooms)), g.error or "see below")
        out.print(tab)
        best, rec = r.best, r.recorded
        out.print(f"best: [bold]PYTORCH_CUDA_ALLOC_CONF={best.alloc_conf}[/bold]"
                  if best.alloc_conf else "best: PyTorch's defaults (unset PYTORCH_CUDA_ALLOC_CONF)",
                  highlight=False)
        if best is not rec:
            out.print(f"  against the recorded setting ({rec.alloc_conf or 'defaults'}): peak "
                      f"reserved {_size(best.peak_reserved)} vs {_size(rec.peak_reserved)}, "
                      f"smallest device {_size(best.min_capacity)} vs {_size(rec.min_capacity)}",
                      highlight=False)
        if "garbage_collection_threshold" in best.alloc_conf:
            out.print("  PyTorch collects only under a memory fraction: call torch.cuda."
                      "set_per_process_memory_fraction(F) so that F x the device's memory is "
                      f"{format_size(r.capacity)} (or add per_process_memory_fraction:F, "
                      "PyTorch 2.9 and later, F below 1)", highlight=False)
        for why in r.skipped:
            out.print(f"  not searched: {why}", highlight=False)
        if any(c.flag for c in r.candidates):
            out.print("  flagged: max_split_size_mb with expandable_segments can grow PyTorch's "
                      "reserve without bound (pytorch/pytorch#123548); ranked last.",
                      highlight=False)
        out.print(f"  gpumm's pool in PyTorch: {INSTALL_GPUMM}", highlight=False)
        out.print(f"  check a row: gpumm replay {args.trace} --allocator caching --alloc-conf "
                  f"'{best.alloc_conf}'", highlight=False)
    if args.json and args.json != "-":
        out.print(f"JSON written to {args.json}")
    return 0
