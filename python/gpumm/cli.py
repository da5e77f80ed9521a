"""The ``gpumm`` command line."""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from typing import Any, List, Optional, Sequence

from rich.console import Console
from rich import box
from rich.table import Table

from gpumm.arch import ARCHES, DEVICES, get_device
from gpumm.errors import GpummError, OutOfMemoryError
from gpumm.pmm import Pmm
from gpumm.units import MiB, format_size, parse_size

__all__ = ["main"]


def _short(size: int) -> str:
    """4096 -> '4K', 2 MiB -> '2M': the driver's own way of naming page sizes."""
    for unit, suffix in ((1 << 30, "G"), (1 << 20, "M"), (1 << 10, "K")):
        if size >= unit and size % unit == 0:
            return f"{size // unit}{suffix}"
    return str(size)


def _sizes(sizes: Sequence[int]) -> str:
    return " ".join(_short(s) for s in sizes)


def cmd_info(args: argparse.Namespace, out: Console) -> int:
    """Prints the architecture table and the device presets."""
    out = Console(width=max(out.width, 100), file=out.file)
    t = Table(box=box.SIMPLE_HEAD, title="Architectures, from the driver's MMU code (K/M/G are binary)")
    for col in ("arch", "CC", "page sizes", "big page", "VA", "levels", "faults", "counters"):
        t.add_column(col, no_wrap=True)
    for a in ARCHES.values():
        t.add_row(a.name, ".".join(map(str, a.compute_capability)), _sizes(a.page_sizes),
                  _sizes(a.big_page_sizes), str(a.va_bits), str(a.page_table_levels),
                  "replay" if a.replayable_faults else "-",
                  "yes" if a.access_counters else "-")
    out.print(t)
    c = Table(box=box.SIMPLE_HEAD, title="PMM chunk sizes by type")
    for col in ("arch", "USER chunks", "KERNEL chunks"):
        c.add_column(col, no_wrap=True)
    for a in ARCHES.values():
        c.add_row(a.name, _sizes(a.user_chunk_sizes), _sizes(a.kernel_chunk_sizes))
    out.print(c)
    d = Table(box=box.SIMPLE_HEAD, title="Device presets")
    for col in ("device", "arch", "vidmem", "HBM/GDDR", "host link", "per direction"):
        d.add_column(col, no_wrap=True)
    for dev in DEVICES.values():
        d.add_row(dev.name, dev.arch.name, format_size(dev.vidmem),
                  f"{dev.memory_bandwidth / 1e12:.2f} TB/s", dev.link.name,
                  f"{dev.link.bandwidth / 1e9:.1f} GB/s")
    out.print(d)
    return 0


def _stats_table(pmm: Pmm, title: str) -> Table:
    s = pmm.stats()
    t = Table(box=box.SIMPLE_HEAD, title=title)
    t.add_column("measure")
    t.add_column("value", justify="right")
    rows = [
        ("reserved from the device", format_size(s["reserved_bytes"])),
        ("allocated", format_size(s["allocated_bytes"])),
        ("  of which temp-pinned", format_size(s["pinned_bytes"])),
        ("free in taken roots", format_size(s["free_bytes"])),
        ("largest free chunk", format_size(s["largest_free_chunk"])),
        ("roots: device / free / total", f"{s['roots_pma_owned']} / {s['roots_free']} / {s['num_roots']}"),
        ("LRU lists unused / discarded / used",
         " / ".join(str(s["root_lists"][k]) for k in ("unused", "discarded", "used"))),
    ]
    rows += [(k.replace("_", " "), str(v)) for k, v in s["counters"].items()]
    for k, v in rows:
        t.add_row(k, v)
    return t


DEMO_TRACE = "transformer_step.csv.gz"


def demo_trace_path() -> str:
    """The trace shipped with the package (scripts/make_demo_trace.py says how it was made)."""
    from importlib.resources import files

    return str(files("gpumm") / "data" / DEMO_TRACE)


def cmd_demo(args: argparse.Namespace, out: Console) -> int:
    """The main job on the shipped trace, then a pool beating fragmentation on real memory;
    with --pmm, the PMM underneath at work."""
    if args.pmm:
        return cmd_demo_pmm(args, out)
    from gpumm.replay import replay
    from gpumm.report import table
    from gpumm.traces import read_trace

    path = demo_trace_path()
    out.print("[bold]gpumm demo[/bold]: one training step of a GPT-2-small-sized model (12 layers, "
              "batch 4 x 512 tokens, fp32, AdamW), as an allocation trace shipped with gpumm, "
              f"replayed through gpumm and models of other allocators on a simulated {args.device}.")
    trace = read_trace(path)
    report = replay(trace, device=args.device)
    out.print(table(report))
    g, c = report.results["gpumm"], report.results["caching"]
    out.print(f"gpumm holds {format_size(g.peak_reserved)} at the peak, {g.ratio:.3f} x what is "
              f"live; PyTorch's caching allocator (model) {format_size(c.peak_reserved)}, "
              f"{c.ratio:.3f} x. The smallest device that runs the step: gpumm "
              f"{format_size(g.min_capacity or 0)}, caching {format_size(c.min_capacity or 0)}.")
    out.print(f"Your own job: [bold]gpumm replay TRACE[/bold] (RMM logs, PyTorch snapshots, "
              f"profiler JSON), with --html report.html for the timeline and chunk maps.")
    _demo_pool(args, out, number="")
    return 0


def cmd_demo_pmm(args: argparse.Namespace, out: Console) -> int:
    """Shows the PMM at work on a simulated device."""
    dev = get_device(args.device)
    pmm = Pmm(device=dev, vidmem=args.vidmem)
    out.print(f"[bold]gpumm demo[/bold]: the PMM of a simulated {dev.notes or dev.name} "
              f"({dev.arch.name}), {format_size(pmm.vidmem)} in {pmm.num_roots} root chunks of 2 MiB")
    out.print(f"USER chunk sizes {_sizes(pmm.user_sizes)}; KERNEL chunk sizes {_sizes(pmm.kernel_sizes)}")

    # 1. Lazy split, one level at a time: one 4 KiB chunk splits a root and a 64 KiB chunk.
    c = pmm.alloc_chunk("4KiB")
    st = pmm.stats()["chunks"]["user"]
    out.print(f"\n1. alloc 4 KiB -> {c!r}: the root split into 32 x 64 KiB "
              f"({st[64 * 1024]['free']} free) and one 64 KiB into 16 x 4 KiB ({st[4096]['free']} free)")
    pmm.free(c)
    out.print(f"   free it -> eager merge back to {pmm.stats()['roots_free']} free root")

    # 2. A churn of mixed chunks, like page tables and managed memory.
    rng = random.Random(args.seed)
    live: List = []
    t0 = time.perf_counter()
    ops = 0
    for _ in range(args.ops):
        if live and rng.random() < 0.45:
            pmm.free(live.pop(rng.randrange(len(live))))
        else:
            kind = "kernel" if rng.random() < 0.2 else "user"
            sizes = pmm.kernel_sizes if kind == "kernel" else pmm.user_sizes
            live.append(pmm.alloc_chunk(rng.choice(sizes[:-1] or sizes), kind))
        ops += 1
    dt = time.perf_counter() - t0
    out.print(f"\n2. {ops} random chunk alloc/free calls from Python: {dt / ops * 1e9:.0f} ns a call, "
              f"{len(live)} chunks live")
    for ch in live:
        if ch.state == "temp_pinned":
            pmm.unpin(ch)
    pmm.validate()

    # 3. Oversubscription: fill the rest with 2 MiB user chunks, then allocate with eviction.
    filled = 0
    while True:
        try:
            ch = pmm.alloc_chunk("2MiB")
        except OutOfMemoryError as e:
            out.print(f"\n3. filled the device with {filled} more 2 MiB chunks; next one: "
                      f"[red]{type(e).__name__}[/red]: {e}")
            break
        pmm.unpin(ch)
        live.append(ch)
        filled += 1
    victim = live[0]
    victim_text = repr(victim)
    pmm.mark_root_unused(victim)
    ch = pmm.alloc_chunk("2MiB", evict=True)
    evicted = pmm.take_evicted()
    out.print(f"   marked the root of {victim_text} unused, then asked again with evict=True:\n"
              f"   evicted that root (the UNUSED list head): {len(evicted)} chunk(s), "
              f"{format_size(sum(e.size for e in evicted))} whose data would move to sysmem; "
              f"got {ch!r}")
    pmm.validate()
    out.print(_stats_table(pmm, "PMM statistics"))
    return 0


def _demo_pool(args: argparse.Namespace, out: Console, number: str = "4. ") -> None:
    """Part 4: a memory pool on real host memory, where fragmentation cannot cause an OOM."""
    import numpy as np

    from gpumm.pool import Device, MemoryPool

    vidmem = min(parse_size(args.vidmem), 256 * MiB)
    pool = MemoryPool(Device(args.device, vidmem=vidmem, backend="host"))
    rng = random.Random(args.seed)
    held = []
    while True:
        try:
            held.append(pool.alloc(rng.randrange(MiB, 3 * MiB)))
        except OutOfMemoryError:
            break
    for a in held[::3]:
        a.free()
    s = pool.stats()
    out.print(f"\n{number}A pool on {format_size(vidmem)} of real host memory (memfd pages): filled with "
              f"1-3 MiB tensors, every third freed: {format_size(s['free_bytes'])} free "
              f"({s['free_bytes'] / s['reserved_bytes']:.0%}) in holes of at most "
              f"{format_size(s['largest_free_run'])} (fragmentation {s['fragmentation']:.0%})")
    want = s["free_bytes"] * 9 // 10
    big = pool.alloc(want)
    view = np.asarray(big)
    view[:] = 7
    ok = bool((view == 7).all())
    del view
    out.print(f"   a contiguous allocator fails a {format_size(want)} request here; gpumm maps free "
              f"{format_size(pool.page_size)} pages from all over the pool back to back into one "
              f"range at {big.ptr:#x}, and numpy writes all of it through a zero-copy view: "
              f"{'ok' if ok else 'MISMATCH'}")
    big.free()
    pool.validate()
    out.print(_pool_table(pool.stats(), "pool statistics"))
    pool.close()


def _pool_table(s: dict, title: str) -> Table:
    t = Table(box=box.SIMPLE_HEAD, title=title)
    t.add_column("measure")
    t.add_column("value", justify="right")
    rows = [
        ("live / peak live", f"{format_size(s['live_bytes'])} / {format_size(s['peak_live'])}"),
        ("reserved / peak reserved",
         f"{format_size(s['reserved_bytes'])} / {format_size(s['peak_reserved'])}"),
        ("free, largest free run", f"{format_size(s['free_bytes'])}, {format_size(s['largest_free_run'])}"),
        ("fragmentation", f"{s['fragmentation']:.1%}"),
        ("allocations / frees / failures", f"{s['allocs']} / {s['frees']} / {s['failures']}"),
        ("stitched allocations", str(s["stitched"])),
        ("served by the size cache / waiting there", f"{s['cache_hits']} / {s['cached_allocs']}"),
        ("pages heap / large / full / free",
         f"{s['pages_heap']} / {s['pages_large']} / {s['pages_full']} / {s['pages_free']}"),
        ("alloc latency mean / p99",
         f"{s['latency_mean_ns']:.0f} ns / {s['latency_p99_ns']:.0f} ns"),
    ]
    for k, v in rows:
        t.add_row(k, v)
    return t


def _devices_note(traces: Sequence[Any], out: Console, what: str) -> None:
    """Before a multi-device report: which devices it has, in its order, and how to pick one."""
    if len(traces) < 2:
        return
    devs = ", ".join(f"{t.device}" + (" (recorded an out-of-memory failure)"
                                      if t.recorded_ooms() else "") for t in traces)
    out.print(f"{os.path.basename(traces[0].source)} holds {len(traces)} devices; {what} each, "
              f"in this order: {devs}. --gpu N for one.", highlight=False)


def _device_heading(trace: Any, out: Console) -> None:
    """A snapshot's devices each under a heading; an RMM log or profiler trace has none."""
    if trace.format == "snapshot":
        out.rule(f"[bold]device {trace.device}[/bold]")


def cmd_replay(args: argparse.Namespace, out: Console) -> int:
    """Replays a trace through gpumm and models of other allocators, each device of a
    snapshot in turn (the one with a recorded out-of-memory failure first)."""
    import json

    from rich.progress import Progress

    from gpumm.report import explain_ooms, html_report, recorded_oom_lines, table
    from gpumm.replay import ALLOCATORS, SEARCHES, devices_json, read_devices, replay
    from gpumm.tune import options_from_conf

    traces = read_devices(args.trace, args.gpu)
    conf = None if args.alloc_conf is None else options_from_conf(args.alloc_conf)
    names = [n.strip() for n in args.allocator.split(",") if n.strip()] if args.allocator else list(ALLOCATORS)
    quiet = args.json == "-"
    events = sum(len(t.events) for t in traces)
    reports = []
    with Progress(transient=True, disable=quiet or events < 50_000, console=out) as bar:
        # each model's replay, then its smallest capacity and the plan side by side
        per_device = len(names) + (0 if args.no_min_capacity and args.no_plan else 1)
        task = bar.add_task("replaying", total=per_device * len(traces))
        for t in traces:
            where = f"device {t.device}: " if len(traces) > 1 else ""

            def step(name: str, where: str = where) -> None:
                what = name if name == SEARCHES else f"replaying through {name}"
                bar.update(task, advance=1, description=f"{where}{what}")

            reports.append(replay(t, names, capacity=args.capacity, device=args.device,
                                  min_capacity=not args.no_min_capacity, progress=step,
                                  caching_options=conf, planned=not args.no_plan))
    if args.json:
        text = json.dumps(devices_json(reports), indent=2)
        if args.json == "-":
            print(text)
        else:
            with open(args.json, "w") as f:
                f.write(text + "\n")
    if args.html:
        from gpumm.doctor import diagnose_trace
        from gpumm.tune import tune

        diags = [diagnose_trace(t, args.capacity, not args.no_plan) for t in traces]
        tuned = [tune(t, capacity=args.capacity) for t in traces]
        with open(args.html, "w") as f:
            f.write(html_report(reports, traces, diags, tuned))
    if quiet:
        return 0
    _devices_note(traces, out, "replayed")
    for t, report in zip(traces, reports):
        _device_heading(t, out)
        for line in recorded_oom_lines(report):
            out.print(f"[red]OOM recorded:[/red] {line}", highlight=False)
        if not t.has_history:
            out.print("[yellow]This snapshot has state but no history:[/yellow] the replay "
                      "allocates its live blocks only, to show what each allocator needs to "
                      "hold that state.")
        out.print(table(report))
        for name, r in report.results.items():
            if r.error:
                out.print(f"[red]error[/red] {name}: {r.error}", highlight=False)
        for name, r in report.results.items():
            for line in explain_ooms(r):
                out.print(f"[red]OOM[/red] {name}: {line}")
    for what, path in (("JSON", args.json), ("HTML", args.html)):
        if path and path != "-":
            out.print(f"{what} written to {path}")
    return 0


def cmd_uvm(args: argparse.Namespace, out: Console) -> int:
    """Unified memory under oversubscription, on the model of the UVM driver."""
    import json

    from gpumm.uvm import FACTORS, MODES, PATTERNS, benchmark, summary

    if args.sweep:
        patterns = [args.pattern] if args.pattern_given else list(PATTERNS)
        modes = [args.mode] if args.mode_given else list(MODES)
        factors = [args.oversubscription] if args.factor_given else list(FACTORS)
    else:
        patterns, modes, factors = [args.pattern], [args.mode], [args.oversubscription]
    runs = []
    quiet = args.json == "-"
    t0 = time.perf_counter()
    for p in patterns:
        for m in modes:
            for f in factors:
                r = benchmark(args.device, p, f, m, iterations=args.iterations,
                              prefetch=not args.no_prefetch, vidmem=args.vidmem, seed=args.seed)
                runs.append(r)
                if not quiet and args.sweep:
                    out.print(f"  {p} {m} {f}: {r['estimated_time_s']:.3g} s", highlight=False)
    wall = time.perf_counter() - t0
    rows = [summary(r) for r in runs]
    if args.json:
        text = json.dumps(rows if args.sweep else rows[0], indent=2)
        if args.json == "-":
            print(text)
        else:
            with open(args.json, "w") as f:
                f.write(text + "\n")
    if quiet:
        return 0
    r0 = runs[0]
    t = Table(box=box.SIMPLE_HEAD, title=f"unified memory on a {r0['device']} model "
              f"({format_size(r0['vidmem'])} vidmem, prefetch {'on' if r0['prefetch'] else 'off'}, "
              f"{r0['iterations']} kernels each)")
    for col in ("pattern", "mode", "oversub.", "time", "GB/s", "faults", "H→D", "D→H",
                "evictions", "thrashing pages", "throttles", "pins"):
        t.add_column(col, justify="left" if col in ("pattern", "mode") else "right", no_wrap=True)
    for r in runs:
        t.add_row(r["pattern"], r["mode"], f"{r['oversubscription']:g}x",
                  f"{r['estimated_time_s']:.3g} s", f"{r['bandwidth_gbs']:.1f}",
                  f"{r['faults']:,}", format_size(r["bytes_h2d"]), format_size(r["bytes_d2h"]),
                  f"{r['evictions']:,}", f"{r['thrashing_pages']:,}", f"{r['throttles']:,}",
                  f"{r['pins']:,}")
    out.print(t)
    out.print(f"simulated {sum(r['accesses'] for r in runs):,} page accesses and "
              f"{sum(r['faults'] for r in runs):,} faults in {wall:.1f} s")
    return 0


def cmd_doctor(args: argparse.Namespace, out: Console) -> int:
    """The out-of-memory checklist for a trace or a snapshot, per device."""
    from gpumm.doctor import diagnose_trace
    from gpumm.replay import read_devices

    traces = read_devices(args.trace, args.gpu)
    out.print(f"[bold]gpumm doctor[/bold] {args.trace}")
    _devices_note(traces, out, "diagnosed")
    for t in traces:
        _device_heading(t, out)
        d = diagnose_trace(t, args.capacity, not args.no_plan)
        for i, f in enumerate(d.findings, 1):
            mark = "[green]→[/green]" if f.kind == "remedy" else " "
            out.print(f"{i:2d}. {mark} {f.text}", highlight=False)
    return 0


def cmd_top(args: argparse.Namespace, out: Console) -> int:
    """A live view of a process's pools, from the file gpumm.publish(path) writes."""
    import json
    import os

    from rich.live import Live

    def view() -> Table:
        try:
            with open(args.file) as f:
                data = json.load(f)
        except (OSError, ValueError) as e:
            raise GpummError(f"cannot read {args.file}: {e}") from None
        age = time.time() - data.get("time", 0)
        heads = ["pool", "device", "live", "peak", "reserved", "free", "frag.", "allocs",
                 "fails", "p99"]
        rows = [[str(p["name"]), str(p["device"]), format_size(p["live_bytes"]),
                 format_size(p["peak_live"]), format_size(p["reserved_bytes"]),
                 format_size(p["free_bytes"]), f"{p['fragmentation']:.0%}", f"{p['allocs']:,}",
                 f"{p['failures']:,}", f"{p['latency_p99_ns'] / 1e3:.1f}µs"]
                for p in data.get("pools", [])]
        t = Table(box=box.SIMPLE_HEAD, padding=(0, 1), title=f"gpumm top: pid {data.get('pid')} "
                  f"({age:.1f} s ago)", caption="Ctrl-C to quit")
        for i, col in enumerate(heads):
            width = max([len(col)] + [len(r[i]) for r in rows])
            t.add_column(col, justify="left" if i < 2 else "right", no_wrap=True, min_width=width)
        for r in rows:
            t.add_row(*r)
        return t

    if not os.path.exists(args.file):
        raise GpummError(f"{args.file} does not exist: call gpumm.publish({args.file!r}) in the "
                         "process to watch")
    if args.once:
        out.print(view())
        return 0
    try:
        with Live(view(), console=out, refresh_per_second=2) as live:
            for _ in range(args.seconds) if args.seconds else iter(int, 1):
                time.sleep(1.0)
                live.update(view())
    except KeyboardInterrupt:
        pass
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpumm", description="GPU memory manager: tools and demos")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="architecture table and device presets")
    demo = sub.add_parser("demo", help="replay a shipped training-step trace; a pool at work")
    demo.add_argument("--pmm", action="store_true", help="instead, the PMM underneath at work")
    demo.add_argument("--device", default="h100", help="device preset (default h100)")
    demo.add_argument("--vidmem", default="1GiB", help="capacity to simulate (default 1GiB)")
    demo.add_argument("--ops", type=int, default=20000, help="random operations (default 20000)")
    demo.add_argument("--seed", type=int, default=0)
    rp = sub.add_parser("replay", help="replay a trace through gpumm and models of other allocators")
    rp.add_argument("trace", help="RMM log CSV (.csv/.csv.gz), PyTorch snapshot (pickle, or JSON), or profiler JSON")
    where = rp.add_mutually_exclusive_group()
    where.add_argument("--device", default="h100", help="device preset whose capacity to use (default h100)")
    where.add_argument("--capacity", help="device capacity, e.g. 80GiB (overrides --device)")
    rp.add_argument("--allocator", help="comma-separated allocators (default: all): "
                    "gpumm, caching, caching-expandable, rmm-pool, cupy, buddy, driver")
    rp.add_argument("--json", metavar="OUT", help="write the results as JSON ('-' for stdout only)")
    rp.add_argument("--html", metavar="OUT", help="write a self-contained HTML report")
    rp.add_argument("--no-min-capacity", action="store_true", help="skip the smallest-capacity search")
    rp.add_argument("--no-plan", action="store_true", help="leave the offline planner out (no "
                    "planned row; JSON planned: null)")
    rp.add_argument("--alloc-conf", metavar="CONF", help="the caching models' settings as a "
                    "PYTORCH_CUDA_ALLOC_CONF string, in place of the recorded ones (settings "
                    "not named take PyTorch's defaults), e.g. expandable_segments:True")
    rp.add_argument("--gpu", type=int, metavar="N", help="replay device N of a snapshot only "
                    "(default: every device, the one with a recorded OOM first)")
    uv = sub.add_parser("uvm", help="unified memory under oversubscription (a model of the UVM driver)")
    uv.add_argument("--device", default="h100", help="device preset (default h100)")
    uv.add_argument("--vidmem", help="GPU memory to model instead of the preset's (e.g. 8GiB)")
    uv.add_argument("--pattern", default=None, help="streaming, block_streaming or random_warp (default streaming)")
    uv.add_argument("--mode", default=None, help="page_fault, zero_copy, prefetch or stripe (default page_fault)")
    uv.add_argument("--oversubscription", type=float, default=None,
                    help="working set / GPU memory (default 1.0)")
    uv.add_argument("--iterations", type=int, default=2, help="kernels per run (default 2)")
    uv.add_argument("--no-prefetch", action="store_true", help="turn the driver's prefetcher off")
    uv.add_argument("--sweep", action="store_true",
                    help="every pattern x mode x oversubscription 0.5, 0.9, 1.1, 1.25, 1.5 "
                         "(fix any of them with its option)")
    uv.add_argument("--seed", type=int, default=0)
    uv.add_argument("--json", metavar="OUT", help="write results as JSON ('-' for stdout only)")
    dr = sub.add_parser("doctor", help="why a job ran out of memory (or reserved too much): a trace or snapshot")
    dr.add_argument("trace", help="RMM log CSV, PyTorch snapshot (pickle, or JSON), or profiler JSON")
    dr.add_argument("--capacity", help="the device to replay on: whether the job fits it with PyTorch's allocator, and which setting makes it fit (default: an H100's)")
    dr.add_argument("--gpu", type=int, metavar="N", help="diagnose device N of a snapshot only "
                    "(default: every device, the one with a recorded OOM first)")
    dr.add_argument("--no-plan", action="store_true", help="leave the offline planner out (no "
                    "line on the plan and its bound)")
    from gpumm.cli_tune import register as register_tune
    register_tune(sub)
    tp = sub.add_parser("top", help="a live view of a process's pools (it calls gpumm.publish(FILE))")
    tp.add_argument("file", help="the metrics file the process publishes")
    tp.add_argument("--once", action="store_true", help="print one view and exit")
    tp.add_argument("--seconds", type=int, default=0, help="stop after this many seconds")
    __import__("gpumm.cli_record").cli_record.register(sub)
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "uvm":
        args.pattern_given = args.pattern is not None
        args.mode_given = args.mode is not None
        args.factor_given = args.oversubscription is not None
        args.pattern = args.pattern or "streaming"
        args.mode = args.mode or "page_fault"
        args.oversubscription = args.oversubscription if args.factor_given else 1.0
    out = Console()
    try:
        if args.command in ("record", "predict"):
            return __import__("gpumm.cli_record").cli_record.dispatch(args, out)
        commands = {"info": cmd_info, "demo": cmd_demo, "replay": cmd_replay, "uvm": cmd_uvm,
                    "doctor": cmd_doctor, "top": cmd_top}
        if hasattr(args, "func"):
            return args.func(args, out)
        return commands[args.command](args, out)
    except (GpummError, OSError) as e:
        Console(stderr=True).print(f"[red]error:[/red] {e}")
        return 2


if __name__ == "__main__":
    sys.exit(main())
