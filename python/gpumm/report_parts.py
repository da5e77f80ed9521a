"""The HTML report's parts that read the trace itself: the memory timeline against time (drawn
by a script in the page: the wheel zooms, a drag pans, a double click resets), the live
allocations at the peak as blocks (hover one for its size and stack), the largest holders of
memory at the peak and at each recorded out-of-memory failure grouped by user frame, the
doctor's findings and ``gpumm tune``'s best settings. Everything is inline: the page loads
nothing."""

from __future__ import annotations

import html
import json
from typing import Any, Dict, List, Optional, Sequence, Tuple

from gpumm.frames import holders
from gpumm.oom import live_blocks_at
from gpumm.replay import Report, prepare
from gpumm.units import format_size

__all__ = ["timeline_block", "blocks_svg", "holders_table", "findings_block", "tune_block",
           "SCRIPT", "peak_index"]

#: the page's one script: draws every ``.tl`` timeline from its JSON, zooms and pans it
SCRIPT = r"""
function fmtB(n){const u=['B','KiB','MiB','GiB','TiB'];let i=0;while(n>=1024&&i<4){n/=1024;i++}
 return (i?n.toFixed(n<10?2:1):n)+' '+u[i]}
function draw(el){const d=el._d,W=960,H=340,L=70,R=10,T=10,B=34;
 const x0=el._x0,x1=el._x1,sx=(W-L-R)/Math.max(x1-x0,1e-9);let top=1;
 for(const s of d.series)for(const p of s.pts)if(p[0]>=x0&&p[0]<=x1)top=Math.max(top,p[1]);
 const sy=(H-T-B)/top,X=t=>L+(t-x0)*sx,Y=v=>H-B-v*sy;
 let o=`<rect x="0" y="0" width="${W}" height="${H}" fill="white"/>`;
 for(let k=0;k<=4;k++){const y=H-B-(H-T-B)*k/4;o+=`<line x1="${L}" y1="${y}" x2="${W-R}" y2="${y}" stroke="#ddd"/><text x="${L-6}" y="${y+4}" font-size="11" text-anchor="end">${fmtB(top*k/4)}</text>`}
 for(let k=0;k<=6;k++){const t=x0+(x1-x0)*k/6;o+=`<text x="${X(t)}" y="${H-B+14}" font-size="11" text-anchor="middle">${t.toFixed(x1-x0<1?3:1)}</text>`}
 o+=`<text x="${(L+W)/2}" y="${H-4}" font-size="11" text-anchor="middle">time (s)</text>`;
 o+=`<clipPath id="c${el.id}"><rect x="${L}" y="0" width="${W-L-R}" height="${H}"/></clipPath><g clip-path="url(#c${el.id})">`;
 for(const s of d.series){const pts=s.pts.map(p=>X(p[0]).toFixed(1)+','+Y(p[1]).toFixed(1)).join(' ');
  o+=`<polyline fill="none" stroke="${s.color}" stroke-width="${s.dash?2:1.5}" ${s.dash?'stroke-dasharray="5,3"':''} points="${pts}"><title>${s.name}</title></polyline>`}
 for(const m of d.marks)o+=`<line x1="${X(m[0])}" y1="${T}" x2="${X(m[0])}" y2="${H-B}" stroke="#c00" stroke-dasharray="2,2"><title>${m[1]}</title></line>`;
 el.innerHTML=o+'</g>'}
for(const el of document.querySelectorAll('svg.tl')){
 el._d=JSON.parse(document.getElementById(el.dataset.src).textContent);
 el._x0=el._d.t0;el._x1=el._d.t1;draw(el);
 el.addEventListener('wheel',e=>{e.preventDefault();const r=el.getBoundingClientRect();
  const f=Math.min(Math.max((e.clientX-r.left)/r.width*960,70),950),t=el._x0+(f-70)/880*(el._x1-el._x0);
  const z=e.deltaY<0?0.8:1.25;el._x0=t-(t-el._x0)*z;el._x1=t+(el._x1-t)*z;
  el._x0=Math.max(el._x0,el._d.t0);el._x1=Math.min(el._x1,el._d.t1);draw(el)},{passive:false});
 let drag=null;el.addEventListener('mousedown',e=>{drag=[e.clientX,el._x0,el._x1]});
 window.addEventListener('mouseup',()=>{drag=null});
 el.addEventListener('mousemove',e=>{if(!drag)return;const r=el.getBoundingClientRect();
  let dt=-(e.clientX-drag[0])/r.width*960/880*(drag[2]-drag[1]);
  dt=Math.max(el._d.t0-drag[1],Math.min(el._d.t1-drag[2],dt));el._x0=drag[1]+dt;el._x1=drag[2]+dt;draw(el)});
 el.addEventListener('dblclick',()=>{el._x0=el._d.t0;el._x1=el._d.t1;draw(el)})}
"""


def peak_index(trace: Any) -> int:
    """The trace index just after the event at which live memory first peaks."""
    p = prepare(trace)
    n = len(p.source_index)
    return int(p.source_index[p.peak_event]) + 1 if 0 <= p.peak_event < n else 0


def timeline_block(report: Report, trace: Any, colors: Dict[str, str]) -> str:
    """The timeline's data (JSON) and its SVG, drawn by :data:`SCRIPT`: live and each
    allocator's reserve against seconds since the first event, recorded OOMs marked."""
    p = prepare(trace)
    t0 = trace.events[0].time_us if trace.events else 0

    def sec(engine_event: int) -> float:  # timeline points count engine events from 1
        n = len(p.source_index)
        i = int(p.source_index[min(max(engine_event - 1, 0), n - 1)]) if n else 0
        return (trace.events[i].time_us - t0) / 1e6 if trace.events else 0.0

    series: List[Dict[str, Any]] = []
    first = next((r for r in report.results.values() if r.ran), None)
    if first is not None:
        series.append({"name": "live", "color": "#222", "dash": True,
                       "pts": [[round(sec(e), 6), lv] for e, lv, _ in first.timeline]})
    for name, r in report.results.items():
        if r.ran:
            series.append({"name": f"{name} reserved", "color": colors.get(name, "#888"),
                           "dash": False, "pts": [[round(sec(e), 6), rv] for e, _, rv in r.timeline]})
    end = (trace.events[-1].time_us - t0) / 1e6 if trace.events else 1.0
    marks = [[(o["time_us"] - t0) / 1e6, f"OOM: {format_size(o['size'])} requested"]
             for o in report.recorded_ooms]
    data = {"t0": 0.0, "t1": max(end, 1e-6), "series": series, "marks": marks}
    ident = f"tl-{report.device}"
    text = json.dumps(data).replace("</", "<\\/")
    return (f'<script type="application/json" id="{ident}-data">{text}</script>'
            f'<svg class="tl" id="{ident}" data-src="{ident}-data" width="960" height="340" '
            f'viewBox="0 0 960 340" role="img" aria-label="memory timeline">'
            f'{_static_timeline(data)}</svg>'
            f'<p class="small">Wheel: zoom; drag: pan; double click: the whole trace. Red '
            f'lines: recorded out-of-memory failures.</p>')


def _static_timeline(data: Dict[str, Any], w: int = 960, h: int = 340) -> str:
    """The whole trace as :data:`SCRIPT` first draws it (the page without its script shows
    this)."""
    pad_l, pad_r, pad_t, pad_b = 70, 10, 10, 34
    t1 = data["t1"] or 1.0
    top = max([v for s in data["series"] for _, v in s["pts"]] + [1])
    sx, sy = (w - pad_l - pad_r) / t1, (h - pad_t - pad_b) / top
    out = [f'<rect x="0" y="0" width="{w}" height="{h}" fill="white"/>']
    for k in range(5):
        y = h - pad_b - (h - pad_t - pad_b) * k / 4
        out.append(f'<line x1="{pad_l}" y1="{y:.1f}" x2="{w - pad_r}" y2="{y:.1f}" stroke="#ddd"/>'
                   f'<text x="{pad_l - 6}" y="{y + 4:.1f}" font-size="11" text-anchor="end">'
                   f'{html.escape(format_size(int(top * k / 4)))}</text>')
    for k in range(7):
        t = t1 * k / 6
        out.append(f'<text x="{pad_l + t * sx:.1f}" y="{h - pad_b + 14}" font-size="11" '
                   f'text-anchor="middle">{t:.{3 if t1 < 1 else 1}f}</text>')
    out.append(f'<text x="{(pad_l + w) / 2:.0f}" y="{h - 4}" font-size="11" '
               f'text-anchor="middle">time (s)</text>')
    for s in data["series"]:
        pts = " ".join(f"{pad_l + t * sx:.1f},{h - pad_b - v * sy:.1f}" for t, v in s["pts"])
        dash = ' stroke-dasharray="5,3"' if s["dash"] else ""
        out.append(f'<polyline fill="none" stroke="{s["color"]}" stroke-width="'
                   f'{2 if s["dash"] else 1.5}"{dash} points="{pts}"><title>'
                   f'{html.escape(s["name"])}</title></polyline>')
    return "".join(out)


_PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
            "#17becf")


def blocks_svg(trace: Any, index: int, limit: int = 4000, w: int = 960, h: int = 40) -> str:
    """The allocations live before trace event ``index`` side by side in address order
    (width by size, a gap where they are not adjacent), colored by their user frame (the
    eight largest holders); hover a block for its size, address and stack."""
    blocks = live_blocks_at(trace, index)
    if not blocks:
        return "<p>No live allocation.</p>"
    if len(blocks) > limit:  # the largest, kept in address order
        keep = set(sorted(range(len(blocks)), key=lambda i: -blocks[i][1])[:limit])
        blocks = [b for i, b in enumerate(blocks) if i in keep]
    top = [k for k, _, _, _ in holders([(s, st) for _, s, st in blocks], len(_PALETTE))]
    color = {k: _PALETTE[i] for i, k in enumerate(top)}
    from gpumm.frames import group_key, useful_frames

    total = sum(s for _, s, _ in blocks) or 1
    gaps = sum(1 for a, b in zip(blocks, blocks[1:]) if a[0] + a[1] != b[0])
    gap = min(2.0, w / 4 / max(gaps, 1))
    usable = w - gap * gaps
    parts = [f'<svg class="blocks" xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
             f'viewBox="0 0 {w} {h}" role="img" aria-label="live allocations">']
    done, gaps_before, prev = 0, 0, None
    for a, s, st in blocks:
        if prev is not None and a != prev:
            gaps_before += 1
        x = usable * done / total + gap * gaps_before
        key = group_key(st)
        frames = "\n".join(str(f) for f in useful_frames(st)[:8]) or "(no Python frame)"
        parts.append(f'<rect x="{x:.2f}" y="2" width="{max(usable * s / total, 0.5):.2f}" '
                     f'height="{h - 4}" fill="{color.get(key, "#999")}"><title>'
                     f'{html.escape(format_size(s))} at {a:#x}\n{html.escape(frames)}'
                     f'</title></rect>')
        done += s
        prev = a + s
    parts.append("</svg>")
    legend = "".join(f'<span><span class="sw" style="background:{c}"></span>{html.escape(k)}'
                     f'</span>' for k, c in color.items())
    return "".join(parts) + f'<p class="legend small">{legend}</p>'


def holders_table(items: Sequence[Tuple[int, Sequence[str]]], caption: str,
                  limit: int = 8) -> str:
    """The largest holders of ``items`` ((bytes, stack) pairs) by user frame: bytes,
    allocations, the frame and the stack under it."""
    rows = []
    for key, nbytes, count, stack in holders(items, limit):
        rest = " ← ".join(stack[1:4])
        rows.append(f"<tr><td>{html.escape(key)}</td><td>{html.escape(format_size(nbytes))}"
                    f"</td><td>{count}</td><td class=stack>{html.escape(rest)}</td></tr>")
    if not rows:
        return ""
    return (f"<table class=holders><caption>{html.escape(caption)}</caption><tr><th>first "
            f"frame in the user's code</th><th>bytes</th><th>allocations</th><th>called from"
            f"</th></tr>{''.join(rows)}</table>")


def findings_block(diagnosis: Optional[Any]) -> str:
    """The doctor's findings, remedies marked."""
    if diagnosis is None or not diagnosis.findings:
        return ""
    items = "".join(f"<li{' class=remedy' if f.kind == 'remedy' else ''}>"
                    f"{html.escape(f.text)}</li>" for f in diagnosis.findings)
    return f"<ol class=findings>{items}</ol>"


def tune_block(result: Optional[Any], rows: int = 6) -> str:
    """``gpumm tune``'s best settings, the recorded one and gpumm's pool."""
    if result is None:
        return ""
    fs = format_size

    def size(n: Optional[int]) -> str:
        return "–" if n is None else fs(n)

    shown = result.candidates[:rows]
    if result.recorded not in shown:
        shown = shown + [result.recorded]
    out = []
    for c in shown:
        note = "recorded" if c.recorded else ""
        if c.flag:
            note += " known bad (pytorch/pytorch#123548)"
        conf = html.escape(c.alloc_conf or "(defaults)")
        out.append(f"<tr><td style='white-space:normal;overflow-wrap:anywhere'>{conf}</td>"
                   f"<td>{size(c.peak_reserved)}</td><td>{size(c.min_capacity)}</td>"
                   f"<td>{c.ooms}</td><td>{html.escape(note or c.error or '')}</td></tr>")
    g = result.gpumm
    out.append(f"<tr><td>gpumm's pool</td><td>{size(g.peak_reserved)}</td>"
               f"<td>{size(g.min_capacity)}</td><td>{len(g.ooms)}</td><td></td></tr>")
    best = result.best.alloc_conf
    line = (f"PYTORCH_CUDA_ALLOC_CONF={best}" if best else "PyTorch's defaults")
    return (f"<p>Best by replay: <code>{html.escape(line)}</code></p><p class=small>Each row "
            f"replays the events the job made with that setting (a request that failed is not "
            f"among them: the doctor's findings replay it); gpumm replay TRACE --allocator "
            f"caching --alloc-conf CONF gives the same figures.</p><table><tr><th>"
            f"PYTORCH_CUDA_ALLOC_CONF</th><th>peak reserved</th><th>smallest device</th><th>"
            f"OOMs at {fs(result.capacity)}</th><th></th></tr>{''.join(out)}</table>")
