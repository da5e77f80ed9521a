"""``gpumm record`` and ``gpumm predict``: record a PyTorch program on the CPU, predict its GPU
peak. :func:`register` adds both to the ``gpumm`` parser; :func:`dispatch` runs them."""

from __future__ import annotations

import argparse
import json
import os
import runpy
import sys
from typing import Any, List, Optional

from rich.console import Console

from gpumm.errors import InvalidArgumentError
from gpumm.units import format_size

__all__ = ["register", "dispatch", "run_program"]


def register(sub: Any) -> None:
    """Adds the ``record`` and ``predict`` subcommands to ``sub`` (argparse subparsers)."""
    rc = sub.add_parser("record", help="record a PyTorch program's allocations (CPU, fake "
                        "tensors, or the GPU's own allocator)",
                        description="gpumm record -o trace.pickle [--steps N] [--fake] -- "
                        "python train.py ARGS")
    rc.add_argument("-o", "--output", required=True,
                    help="the trace to write: .pickle (a PyTorch snapshot with stacks and step "
                    "marks) or .csv / .csv.gz (RMM log, no stacks)")
    rc.add_argument("--steps", type=int, help="record this many steps after the warm-up, then "
                    "end the program")
    rc.add_argument("--warmup", type=int, default=1, help="warm-up steps, marked in the trace "
                    "(default 1)")
    rc.add_argument("--fake", action="store_true", help="run on fake tensors: no memory, "
                    "no data, any model size")
    rc.add_argument("--step-on", choices=("auto", "optimizer", "forward"), default="auto",
                    help="what ends a step (default: optimizer.step(), or the outermost "
                    "forward for a program without an optimizer)")
    rc.add_argument("--compile", action="store_true", help="record torch.compile'd code as "
                    "compiled: the activations AOT autograd's partitioner saves and inductor's "
                    "graph passes (default: compiled code runs eagerly)")
    rc.add_argument("--size", type=int, help="this run's batch size or sequence length, for "
                    "predict's interpolation")
    rc.add_argument("--size-name", default="batch", help="what --size counts (default batch)")
    rc.add_argument("--no-stacks", action="store_true", help="leave the Python stacks out")
    rc.add_argument("program", nargs=argparse.REMAINDER,
                    help="-- python script.py ARGS (or -m module ARGS)")
    pr = sub.add_parser("predict", help="will it fit? a trace's GPU peak on a device",
                        description="The peak PyTorch's caching allocator reserves, gpumm's "
                        "pool's, and the verdict at the device's capacity.")
    pr.add_argument("trace", nargs="+", help="one trace, or two of different --sizes")
    where = pr.add_mutually_exclusive_group()
    where.add_argument("--device", default="h100", help="device preset (gpumm info; "
                       "default h100)")
    where.add_argument("--capacity", help="device memory instead, e.g. 24GiB")
    pr.add_argument("--alloc-conf", help="PYTORCH_CUDA_ALLOC_CONF to model (default: this "
                    "environment's)")
    pr.add_argument("--context", help="CUDA context size (default 500MiB)")
    pr.add_argument("--workspace", help="cuBLAS workspace (default by architecture)")
    pr.add_argument("--sizes", help="the two traces' sizes, e.g. 8,16 (default: as recorded)")
    pr.add_argument("--json", metavar="OUT", help="write the prediction as JSON ('-': stdout "
                    "only)")


def dispatch(args: argparse.Namespace, out: Console) -> Optional[int]:
    """Runs ``args`` if it is one of these commands; None otherwise."""
    if args.command == "record":
        return cmd_record(args, out)
    if args.command == "predict":
        return cmd_predict(args, out)
    return None


def run_program(argv: List[str]) -> None:
    """Runs ``python script.py ARGS`` / ``python -m module ARGS`` in this process, as
    ``__main__``."""
    argv = list(argv)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if argv and os.path.basename(argv[0]).startswith("python"):
        argv = argv[1:]
    if not argv:
        raise InvalidArgumentError("no program to record: gpumm record -o OUT -- python "
                                   "script.py ARGS")
    old_argv, old_path = sys.argv[:], sys.path[:]
    try:
        if argv[0] == "-m":
            if len(argv) < 2:
                raise InvalidArgumentError("-m needs a module name")
            sys.argv = [argv[1]] + argv[2:]
            sys.path.insert(0, os.getcwd())
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            if not os.path.exists(argv[0]):
                raise InvalidArgumentError(f"{argv[0]}: no such script")
            sys.argv = argv
            sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
            runpy.run_path(argv[0], run_name="__main__")
    finally:
        sys.argv, sys.path[:] = old_argv, old_path


def cmd_record(args: argparse.Namespace, out: Console) -> int:
    """Records the program given after ``--``."""
    from gpumm.record import record

    err = Console(stderr=True)
    last = {"n": 0}

    def progress(line: str) -> None:
        last["n"] += 1
        err.print(f"[dim]gpumm record:[/dim] {line}", highlight=False)

    code = 0
    with record(args.output, steps=args.steps, warmup=args.warmup, fake=args.fake,
                stacks=not args.no_stacks, step_on=args.step_on, progress=progress,
                stop=True, size=args.size, size_name=args.size_name,
                compile=args.compile) as rec:
        try:
            run_program(args.program)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    n = sum(1 for e in rec.all_events() if e[0] == "alloc")
    out.print(f"recorded {n:,} allocations ({rec.mode}), peak live "
              f"{format_size(rec.peak_bytes)}, {len(rec._counted() or [])} steps, to "
              f"{args.output}", highlight=False)
    return code


def _env_conf(args: argparse.Namespace) -> Optional[str]:
    if args.alloc_conf is not None:
        return str(args.alloc_conf)
    return os.environ.get("PYTORCH_CUDA_ALLOC_CONF") or os.environ.get("PYTORCH_ALLOC_CONF")


def cmd_predict(args: argparse.Namespace, out: Console) -> int:
    """Prints (or writes as JSON) the prediction of one trace, or of two and the largest
    size that fits."""
    from gpumm.predict import fit_size, predict
    from gpumm.record import recording_info
    from gpumm.traces import read_trace

    if len(args.trace) > 2:
        raise InvalidArgumentError("give one trace, or two recorded at different sizes")
    conf = _env_conf(args)
    preds = [predict(t, device=args.device, capacity=args.capacity, alloc_conf=conf,
                     context=args.context, workspace=args.workspace) for t in args.trace]
    fit = None
    if len(preds) == 2:
        if args.sizes:
            try:
                sizes = [int(s) for s in args.sizes.split(",")]
            except ValueError:
                raise InvalidArgumentError(f"--sizes expects two whole numbers, got "
                                           f"{args.sizes!r}") from None
        else:
            infos = [recording_info(t) for t in args.trace]
            if any("size" not in i for i in infos):
                raise InvalidArgumentError("two traces: give --sizes A,B (or record each with "
                                           "--size)")
            sizes = [int(i["size"]) for i in infos]
        name = (recording_info(args.trace[0]).get("size_name") or "size") if not args.sizes else "size"
        fit = fit_size(preds, sizes, name, traces=[read_trace(t) for t in args.trace],
                       alloc_conf=conf)
    data: Any = preds[0].to_json() if fit is None else {
        "predictions": [p.to_json() for p in preds], "interpolation": fit.to_json(),
        **{k: preds[-1].to_json()[k] for k in ("peak_reserved", "gpumm_peak_reserved", "fits",
                                                "first_failure")}}
    if args.json:
        text = json.dumps(data, indent=2)
        if args.json == "-":
            print(text)
            return 0
        with open(args.json, "w") as f:
            f.write(text + "\n")
    for p in preds:
        _print(p, out)
    if fit is not None:
        how = ("each allocation's size interpolated between the two runs, each candidate "
               "replayed" if fit.method == "replayed" else "the two peaks' line; the runs' "
               "allocations differ, so the allocator's rounding at other sizes is not replayed")
        out.print(f"[bold]interpolated[/bold] between {fit.size_name} {fit.sizes[0]} and "
                  f"{fit.sizes[1]} ({how}): {format_size(int(fit.per_unit))} per "
                  f"{fit.size_name} between them; largest {fit.size_name} that fits: "
                  f"{fit.largest if fit.largest is not None else 'any'}", highlight=False)
    return 0


def _print(p: Any, out: Console) -> None:
    verdict = "[green]fits[/green]" if p.fits else "[red]does not fit[/red]"
    out.print(f"[bold]gpumm predict[/bold] {p.trace} on {p.device} "
              f"({format_size(p.capacity)}, {format_size(p.usable)} usable): {verdict}",
              highlight=False)
    rows = [("peak live (tensors)", p.peak_live),
            ("PyTorch caching allocator, peak reserved", p.peak_reserved),
            ("  smallest capacity with no failure", p.min_capacity),
            ("gpumm pool, peak reserved", p.gpumm_peak_reserved)]
    if p.warmup_live is not None:
        rows.insert(1, ("live after warm-up (weights, optimizer state)", p.warmup_live))
    for name, v in rows:
        out.print(f"  {name:48} {format_size(v) if v is not None else '-':>12}", highlight=False)
    sign = "headroom" if p.headroom >= 0 else "shortfall"
    out.print(f"  {sign:48} {format_size(abs(p.headroom)):>12}", highlight=False)
    out.print("  counted besides the trace:", highlight=False)
    for o in p.overheads:
        size = format_size(o.bytes) if o.kind != "unmodelled" else "not counted"
        out.print(f"    {o.name:30} {size:>12}  {o.source}", highlight=False)
    for k, why in p.unmodelled.items():
        out.print(f"  [yellow]not modelled[/yellow] {k}: {why}", highlight=False)
    f = p.first_failure
    if f:
        out.print(f"  [red]first failure[/red]: {format_size(f['size'])} ({f.get('op') or '?'}) "
                  f"with {format_size(f['live'])} live, {format_size(f['reserved'])} reserved, "
                  f"largest free {format_size(f['largest_free'])}", highlight=False)
        stack = f.get("stack", [])
        sep = os.sep + "torch" + os.sep
        mine = [line for line in stack if sep not in line and "<frozen" not in line]
        for line in (mine or stack)[:8]:  # the program's own frames first
            out.print(f"      {line}", highlight=False, emoji=False, markup=False)
