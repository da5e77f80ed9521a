"""Reports of a replay: a table for the terminal and a self-contained HTML page (inline SVG
and one inline script, nothing loaded from the network) with the memory timeline of every
allocator and its chunk map at the peak of live memory; given the traces, also the live
allocations and their largest holders by user frame at the peak and at each recorded OOM,
the doctor's findings and ``gpumm tune``'s best settings (:mod:`gpumm.report_parts`)."""

from __future__ import annotations

import html
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from gpumm.errors import InvalidArgumentError
from gpumm.replay import AllocatorResult, Report
from gpumm.units import format_size

__all__ = ["table", "explain_ooms", "recorded_oom_text", "recorded_oom_lines", "html_report"]

COLORS = {
    "gpumm": "#1b9e77",
    "caching": "#d95f02",
    "caching-expandable": "#e7298a",
    "rmm-pool": "#7570b3",
    "cupy": "#66a61e",
    "buddy": "#e6ab02",
    "driver": "#a6761d",
}


def _gib(n: Optional[int]) -> str:
    return "–" if n is None else format_size(n)


def _short(n: int) -> str:
    """A size to about three significant figures ("48.1 MiB", "284 MiB"), for a narrow
    column."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            v = n / scale
            return f"{v:.3g} {unit}" if v < 1000 else f"{v:.0f} {unit}"
    return f"{n} B"


#: What the terminal table's columns are (printed under it).
LEGEND = ("reserved: peak reserved; min cap.: smallest device with no OOM; free: held but not "
          "handed out at the peak of live memory; frag.: the share of that outside its largest "
          "free range.")


def table(report: Report) -> Group:
    """For the terminal: one row per allocator (peak reserved, ratio, OOMs, smallest
    capacity, free memory and its fragmentation at the peak, replay speed), the legend, and
    for a snapshot that recorded PyTorch's reserve, a second table: each allocator's reserve
    against it and the caching model's address match. (Two tables, so each fits 80 columns.)"""
    # the trace's file name (a long path left the line no room and rich cut its words)
    title = (f"{os.path.basename(report.source)}: {report.allocations} allocations, peak live "
             f"{format_size(report.peak_live)}, device {format_size(report.capacity)}")
    # sizes to three figures (the ratio has the precision) so the table fits 80 columns
    rows = [[name, _short(r.peak_reserved), f"{r.ratio:.4f}", str(len(r.ooms)),
             "–" if r.min_capacity is None else _short(r.min_capacity), _short(r.free_at_peak),
             f"{r.fragmentation_at_peak:.0%}",
             f"{r.events_per_second / 1e6:.1f} M"] if r.ran else [name, "error"] + ["–"] * 6
            for name, r in report.results.items()]
    pl = report.planned
    if pl is not None:
        rows.append(["planned", _short(pl.peak_reserved),
                     f"{pl.peak_reserved / report.peak_live:.4f}" if report.peak_live else "–",
                     "0", _short(pl.peak_reserved), "–", "–", "–"])
    parts: List[Any] = [
        _rich_table(title, ["allocator", "reserved", "÷ live", "OOMs", "min cap.", "free",
                            "frag.", "ev/s"], rows),
        Text(LEGEND, style="dim"),
    ]
    if pl is not None:
        parts.append(Text(planned_text(report), style="dim"))
    pages = page_text(report)
    if pages:
        parts.append(Text(pages, style="dim"))
    rec = report.recorded_peak_reserved
    if rec:
        rows = [[name, f"{r.peak_reserved / rec - 1:+.2%}" if r.ran else "error",
                 "–" if r.address_match is None else f"{r.address_match:.2%}"]
                for name, r in report.results.items()]
        parts.append(_rich_table(
            f"Against PyTorch's own run: it reserved {format_size(rec)} at its peak",
            ["allocator", "reserve vs PyTorch's", "same address as PyTorch"], rows))
    return Group(*parts)


def planned_text(report: Report) -> str:
    """The offline plan against the bound, and gpumm's pool against the plan, in one line."""
    pl = report.planned
    if pl is None:
        return ""
    g = report.results.get("gpumm")
    line = (f"planned: every lifetime known in advance, a plan reserves "
            f"{format_size(pl.peak_reserved)}, {pl.ratio:.4f} × the bound "
            f"{format_size(pl.bound)} (the peak of live bytes in 512-byte blocks; no allocator "
            f"can reserve less)")
    if pl.exhausted:
        line += f"; {EXHAUSTED}"
    if g is not None and g.ran and pl.peak_reserved:
        line += f"; gpumm reserves {g.peak_reserved / pl.peak_reserved:.4f} × the plan"
    return line


#: what a plan whose budget ran out is, in words (``Planned.exhausted``)
EXHAUSTED = ("the planner's budget of work ran out before it placed the part of the trace "
             "that sets this peak by its greedy orders, so a lower plan may exist")


#: the page of gpumm's pool in a replay (CUDA's VMM granularity, ``cuMemGetAllocationGranularity``)
PAGE = 2 << 20


def page_floor(peak_live: int) -> int:
    """``peak_live`` bytes rounded up to whole pages: the least a pool of ``PAGE`` pages can
    reserve."""
    return -(-peak_live // PAGE) * PAGE


def page_text(report: Report) -> str:
    """Names the models that reserve less than the pages the peak live fills (none: ""): no
    allocator that maps memory in whole pages, gpumm's pool included, can match them, as
    they count the bytes they ask the device for (docs/reserve.md, "Page granularity").
    ``driver``, the lower bound, is left out."""
    floor = page_floor(report.peak_live)
    under = [name for name, r in report.results.items()
             if name not in ("gpumm", "driver") and r.ran and r.peak_reserved < floor]
    if not under:
        return ""
    return (f"{', '.join(under)} reserve{'s' if len(under) == 1 else ''} less than the 2 MiB "
            f"pages that the peak live fills ({floor >> 20:,} MiB): no allocator that maps "
            f"whole pages (gpumm's pool, CUDA's VMM granularity) can reserve less than that; "
            f"{'it counts' if len(under) == 1 else 'they count'} the bytes asked of the "
            f"device, not the pages those take.")


def _rich_table(title: str, heads: List[str], rows: List[List[str]]) -> Table:
    t = Table(title=title, box=box.SIMPLE_HEAD, padding=(0, 1), collapse_padding=True)
    for i, col in enumerate(heads):
        width = max([len(col)] + [len(r[i]) for r in rows])
        t.add_column(col, justify="left" if i == 0 else "right", no_wrap=True, min_width=width)
    for row in rows:
        t.add_row(*row)
    return t


def explain_ooms(r: AllocatorResult, limit: int = 3) -> List[str]:
    """Why each of the first OOMs happened, in words."""
    out = []
    for o in r.ooms[:limit]:
        cached = o["reserved"] - o["live"]
        why = ("the device is full of live memory" if cached < o["size"] else
               f"{format_size(cached)} is held but free, in pieces of at most "
               f"{format_size(o['largest_free'])}: fragmentation")
        out.append(
            f"event {o.get('trace_event', o['event'])}: {format_size(o['size'])} requested; live "
            f"{format_size(o['live'])}, reserved {format_size(o['reserved'])}, cached free "
            f"{format_size(cached)}, largest free run {format_size(o['largest_free'])} — {why}"
        )
    if len(r.ooms) > limit:
        out.append(f"... and {len(r.ooms) - limit} more")
    return out


def recorded_oom_text(oom: Dict[str, Any], events: int, device: Optional[int] = None,
                      start_us: int = 0) -> str:
    """One out-of-memory failure the real allocator recorded (an entry of
    :meth:`Trace.recorded_ooms`), in words: the request, what the device had free when the
    snapshot says, where in the trace (the event index, 0-based, and the time since the
    trace's first event)."""
    where = "" if device is None else f" on device {device}"
    free = oom.get("device_free")
    free_text = ("free on the device not recorded" if not isinstance(free, int) else
                 f"{format_size(free)} free on the device (per the snapshot)")
    at = max(0, oom.get("time_us", start_us) - start_us) / 1e6
    return (f"the job's allocator ran out of memory{where}: {format_size(oom['size'])} "
            f"requested, {free_text}; at event {oom['index']} of {events}, {at:.3f} s into "
            f"the trace")


def recorded_oom_lines(report: Report, limit: int = 3) -> List[str]:
    """:func:`recorded_oom_text` of the report's first recorded failures, then how many more."""
    device = report.device if report.format == "snapshot" else None
    out = [recorded_oom_text(o, report.events, device, report.start_us)
           for o in report.recorded_ooms[:limit]]
    if len(report.recorded_ooms) > limit:
        out.append(f"... and {len(report.recorded_ooms) - limit} more")
    return out


def _timeline_svg(report: Report, w: int = 960, h: int = 340) -> str:
    pad_l, pad_b, pad_t, pad_r = 70, 30, 10, 10
    n = max(report.events, 1)
    top = max([r.peak_reserved for r in report.results.values()] + [report.peak_live, 1])
    sx = (w - pad_l - pad_r) / n
    sy = (h - pad_t - pad_b) / top

    def pts(series: Sequence[Tuple[int, int]]) -> str:
        return " ".join(f"{pad_l + x * sx:.1f},{h - pad_b - y * sy:.1f}" for x, y in series)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
             f'viewBox="0 0 {w} {h}" role="img" aria-label="memory timeline">',
             f'<rect x="0" y="0" width="{w}" height="{h}" fill="white"/>']
    for k in range(5):
        y = h - pad_b - (h - pad_t - pad_b) * k / 4
        parts.append(f'<line x1="{pad_l}" y1="{y:.1f}" x2="{w - pad_r}" y2="{y:.1f}" '
                     f'stroke="#ddd"/><text x="{pad_l - 6}" y="{y + 4:.1f}" font-size="11" '
                     f'text-anchor="end">{html.escape(format_size(int(top * k / 4)))}</text>')
    parts.append(f'<text x="{w / 2:.0f}" y="{h - 6}" font-size="11" text-anchor="middle">'
                 f'event</text>')
    first = next((r for r in report.results.values() if r.ran), None)
    if first is not None:
        live = [(e, lv) for e, lv, _ in first.timeline]
        parts.append(f'<polyline fill="none" stroke="#222" stroke-width="2" '
                     f'stroke-dasharray="5,3" points="{pts(live)}"><title>live</title></polyline>')
    for name, r in report.results.items():
        color = COLORS.get(name, "#888")
        res = [(e, rv) for e, _, rv in r.timeline]
        parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.5" '
                     f'points="{pts(res)}"><title>{html.escape(name)} reserved</title></polyline>')
    parts.append("</svg>")
    return "".join(parts)


def _merge_ranges(layout: Sequence[Tuple[int, int, bool]]) -> List[Tuple[int, int, bool, int]]:
    """Adjacent ranges of the same kind as one (start, size, used, how many): at a page's
    width a thousand allocations side by side are one band, and drawn one by one their
    sub-pixel rectangles left seams that paled the whole map."""
    out: List[Tuple[int, int, bool, int]] = []
    for a, s, used in layout:
        if out and out[-1][2] == used and out[-1][0] + out[-1][1] == a:
            b, t, _, n = out[-1]
            out[-1] = (b, t + s, used, n + 1)
        else:
            out.append((a, s, used, 1))
    return out


def _map_svg(layout: Sequence[Tuple[int, int, bool]], w: int = 960, h: int = 26) -> str:
    """Ranges in address order, side by side, width by size: used dark, free light, a gap
    where two ranges are not adjacent in memory. Each range starts where the bytes before it
    end (so the map never runs past its width) and is at least half a pixel wide (so a small
    free range still shows)."""
    ranges = _merge_ranges(layout)
    total = sum(s for _, s, _, _ in ranges) or 1
    gaps = sum(1 for (a, s, _, _), (b, _, _, _) in zip(ranges, ranges[1:]) if a + s != b)
    gap = 2.0 if 2 * gaps <= w // 4 else w / 4 / gaps
    usable = w - gap * gaps
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
             f'viewBox="0 0 {w} {h}" role="img" aria-label="chunk map">']
    done, gaps_before, prev_end = 0, 0, None
    for a, s, used, n in ranges:
        if prev_end is not None and a != prev_end:
            gaps_before += 1
        x = usable * done / total + gap * gaps_before
        width = max(usable * s / total, 0.5)
        what = f"{n} allocations" if used and n > 1 else ("used" if used else "free")
        parts.append(f'<rect x="{x:.2f}" y="2" width="{width:.2f}" height="{h - 4}" '
                     f'fill="{"#2c5d8f" if used else "#f2b36f"}"><title>{a:#x} '
                     f'{html.escape(format_size(s))} {what}</title></rect>')
        done += s
        prev_end = a + s
    parts.append("</svg>")
    return "".join(parts)


def _trace_parts(report: Report, trace: Any, diagnosis: Any, tuned: Any, lv: int) -> Dict[str, str]:
    """The parts of a device's section that read its trace (see :mod:`gpumm.report_parts`)."""
    from gpumm.oom import live_at
    from gpumm.report_parts import (blocks_svg, findings_block, holders_table, peak_index,
                                    timeline_block, tune_block)

    if trace is None:
        return {"timeline": _timeline_svg(report), "before": "", "after": ""}
    peak = peak_index(trace)
    held = [holders_table(live_at(trace, peak), f"At the peak of live memory "
                          f"({format_size(report.peak_live)})")]
    for o in report.recorded_ooms[:3]:
        held.append(holders_table(live_at(trace, o["index"]), f"At the out-of-memory failure "
                                  f"(event {o['index']}, {format_size(o['size'])} requested)"))
    doctor = findings_block(diagnosis)
    tuned_html = tune_block(tuned)
    before = (f"<h{lv}>The doctor's findings</h{lv}>{doctor}" if doctor else "") + (
        f"<h{lv}>PyTorch's settings by replay (gpumm tune)</h{lv}>{tuned_html}"
        if tuned_html else "")
    after = (f"<h{lv}>Live allocations at the peak</h{lv}><p>In address order, colored by "
             f"the first frame in the user's code; hover a block for its size and stack.</p>"
             f"{blocks_svg(trace, peak)}<h{lv}>Who holds the memory</h{lv}>{''.join(held)}")
    return {"timeline": timeline_block(report, trace, COLORS), "before": before, "after": after}


def _device_section(report: Report, heading: bool, trace: Any = None, diagnosis: Any = None,
                    tuned: Any = None) -> str:
    """One device's part of the page: its summary, recorded failures, the tables, the
    timeline, the chunk maps and the replays' out-of-memory failures (and with its trace
    the parts of :func:`_trace_parts`)."""
    esc = html.escape
    lv = 3 if heading else 2  # the level of the section's own headings
    rec = report.recorded_peak_reserved
    rows, against = [], []
    for name, r in report.results.items():
        swatch = (f'<td><span class="sw" style="background:{COLORS.get(name, "#888")}"></span>'
                  f'{esc(name)}</td>')
        if not r.ran:  # the replay failed: its error is listed below the table
            rows.append(f"<tr>{swatch}<td>error</td>" + "<td>–</td>" * 6 + "</tr>")
            if rec:
                against.append(f"<tr>{swatch}<td>error</td><td>–</td></tr>")
            continue
        cells = [swatch, f"<td>{esc(format_size(r.peak_reserved))}</td>",
                 f"<td>{r.ratio:.4f}</td>", f"<td>{len(r.ooms)}</td>",
                 f"<td>{esc(_gib(r.min_capacity))}</td>",
                 f"<td>{esc(format_size(r.free_at_peak))}</td>",
                 f"<td>{r.fragmentation_at_peak:.0%}</td>",
                 f"<td>{r.events_per_second / 1e6:.1f} M</td>"]
        rows.append("<tr>" + "".join(cells) + "</tr>")
        if rec:
            match = "–" if r.address_match is None else f"{r.address_match:.2%}"
            against.append(f"<tr>{swatch}<td>{r.peak_reserved / rec - 1:+.2%}</td>"
                           f"<td>{match}</td></tr>")
    pl = report.planned
    if pl is not None:
        live = f"{pl.peak_reserved / report.peak_live:.4f}" if report.peak_live else "–"
        rows.append(f'<tr><td><span class="sw" style="background:#666"></span>planned</td>'
                    f"<td>{esc(format_size(pl.peak_reserved))}</td><td>{live}</td><td>0</td>"
                    f"<td>{esc(_gib(pl.peak_reserved))}</td>" + "<td>–</td>" * 3 + "</tr>")
    head = ["allocator", "peak reserved", "÷ peak live", "OOMs", "min capacity",
            "free at peak", "fragmentation", "events/s"]
    # (a table of its own, as in the terminal: ten columns did not fit the page)
    against_table = "" if not rec else (
        f"<h{lv}>Against PyTorch's own run</h{lv}>"
        "<table><tr><th>allocator</th><th>peak reserved vs "
        "PyTorch's recorded reserve</th><th>same address as PyTorch</th></tr>"
        + "".join(against) + "</table>")
    errors = "".join(f"<li><b>{esc(name)}</b>: {esc(r.error)}</li>"
                     for name, r in report.results.items() if r.error)
    errors = f"<p class=note>Failed in the core:</p><ul>{errors}</ul>" if errors else ""
    maps = []
    for name, r in report.results.items():
        layout = r.raw.get("layout_at_peak") or []
        if layout:
            maps.append(f"<h{lv + 1}>{esc(name)}</h{lv + 1}>{_map_svg(layout)}")
    ooms = []
    for name, r in report.results.items():
        for line in explain_ooms(r):
            ooms.append(f"<li><b>{esc(name)}</b>: {esc(line)}</li>")
    recorded_ooms = "".join(f"<p class=note>{esc(line)}</p>" for line in recorded_oom_lines(report))
    state = "" if report.has_history else (
        "<p class=note>This snapshot has state but no history: the replay is of its live "
        "blocks only (what each allocator needs to hold that state).</p>")
    recorded = (f"<p>PyTorch's caching allocator, recorded in the snapshot, held "
                f"{esc(format_size(rec))} at its peak ({rec / report.peak_live:.4f} × peak "
                f"live).</p>") if rec and report.peak_live else ""
    title = f"<h2>device {report.device}</h2>" if heading else ""
    planned = f"<p class=note>{esc(planned_text(report))}</p>" if pl is not None else ""
    pages = page_text(report)
    if pages:
        planned += f"<p class=note>{esc(pages)}</p>"
    extra = _trace_parts(report, trace, diagnosis, tuned, lv)
    return f"""<section id="device-{report.device}">{title}
<p>{esc(report.format)} trace: {report.events} events, {report.allocations} allocations, peak
live {esc(format_size(report.peak_live))}; device capacity {esc(format_size(report.capacity))}.</p>
{recorded_ooms}{recorded}{state}
<table><tr>{"".join(f"<th>{esc(h)}</th>" for h in head)}</tr>
{"".join(rows)}</table>
<p class="small">Free at peak: memory the allocator holds but has not handed out, at the
peak of live memory; fragmentation: the share of it outside its largest free range.</p>
{planned}{errors}{against_table}
{extra["before"]}
<h{lv}>Memory over the trace</h{lv}>
<p class="legend"><span>- - - live</span>{"".join(
        f'<span><span class="sw" style="background:{COLORS.get(n, "#888")}"></span>{esc(n)} reserved</span>'
        for n in report.results)}</p>
{extra["timeline"]}
{extra["after"]}
<h{lv}>Chunk maps at the peak of live memory</h{lv}>
<p>Each allocator's memory in address order: <span class="sw" style="background:#2c5d8f">
</span>used, <span class="sw" style="background:#f2b36f"></span>free; a gap separates ranges
that are not adjacent.</p>
{"".join(maps) or "<p>No allocator gave a map.</p>"}
<h{lv}>Out-of-memory failures in the replays</h{lv}>
{"<ul>" + "".join(ooms) + "</ul>" if ooms else "<p>None.</p>"}
</section>
"""


def html_report(reports: Union[Report, Sequence[Report]], traces: Optional[Sequence[Any]] = None,
                diagnoses: Optional[Sequence[Any]] = None,
                tuned: Optional[Sequence[Any]] = None) -> str:
    """One self-contained page for a trace: per device (a section each, ``id="device-N"``,
    in the order given; a snapshot's sections have a "device N" heading) its summary table,
    memory timeline, chunk maps and OOMs. With ``traces`` (one per report, same order) the
    timeline is against time and zooms, and the page shows the live allocations at the peak
    and who holds memory there and at each recorded OOM; ``diagnoses``
    (:class:`~gpumm.diagnosis.Diagnosis`) and ``tuned`` (:class:`~gpumm.tune.TuneResult`),
    one per report, add the doctor's findings and the best settings."""
    esc = html.escape
    reps = [reports] if isinstance(reports, Report) else list(reports)
    n = len(reps)
    trs = list(traces) if traces is not None else [None] * n
    dgs = list(diagnoses) if diagnoses is not None else [None] * n
    tns = list(tuned) if tuned is not None else [None] * n
    if not (len(trs) == len(dgs) == len(tns) == n):
        raise InvalidArgumentError("traces, diagnoses and tuned need one entry per report")
    if not reps:
        raise InvalidArgumentError("no report to write")
    first = reps[0]
    heading = first.format == "snapshot"
    from gpumm.report_parts import SCRIPT

    script = f"<script>{SCRIPT}</script>" if any(t is not None for t in trs) else ""
    contents = "" if len(reps) < 2 else (
        f"<p>{len(reps)} devices, the one with a recorded out-of-memory failure first: "
        + ", ".join(f'<a href="#device-{r.device}">device {r.device}</a>' for r in reps)
        + ".</p>")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>gpumm replay: {esc(first.source)}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em; color: #222; max-width: 1000px; }}
table {{ border-collapse: collapse; }} td, th {{ padding: 4px 10px; text-align: right; }}
th {{ border-bottom: 1px solid #999; }} td:first-child, th:first-child {{ text-align: left; }}
td {{ white-space: nowrap; }}
.sw {{ display: inline-block; width: 12px; height: 12px; margin-right: 6px; }}
.note {{ color: #a33; }} .legend span {{ margin-right: 1.5em; }} .small {{ font-size: 90%; }}
section {{ margin-bottom: 2.5em; }} h1 {{ overflow-wrap: anywhere; }}
caption {{ text-align: left; font-weight: bold; padding: 6px 0; }}
td.stack {{ white-space: normal; text-align: left; font-size: 85%; color: #555; }}
.findings li {{ margin: 3px 0; }} .findings li.remedy {{ color: #155724; }}
svg.tl {{ cursor: grab; }} svg.blocks rect:hover {{ stroke: #000; stroke-width: 1; }}
</style></head><body>
<h1>Replay of {esc(first.source)}</h1>
{contents}
{"".join(_device_section(r, heading, t, d, u) for r, t, d, u in zip(reps, trs, dgs, tns))}
<p><small>gpumm replay; allocator models and their rules: docs/replay.md.</small></p>
{script}
</body></html>
"""
