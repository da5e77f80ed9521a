"""Replay through gpumm and the models of other allocators: every real trace, the caching
model checked against what PyTorch did, the CLI with its JSON and HTML outputs."""

import html.parser
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpumm.cli import demo_trace_path, main
from gpumm import _core
from gpumm.errors import InvalidArgumentError, InvalidStateError
from gpumm.replay import ALLOCATORS, prepare, replay
from gpumm.report import _map_svg, explain_ooms, html_report
from gpumm.traces import read_rmm_csv, read_trace, read_traces
from gpumm.units import MiB

import corpus
from shared_traces import TRACES, needs_shared
ALL = corpus.params(corpus.ALL)  # every shared trace (wild/ too) and every recorded one
HISTORY = corpus.params(corpus.HISTORY)


@pytest.mark.parametrize("name", ALL)
def test_every_allocator_on_every_trace(name):
    """Every device of every trace through every model, at a capacity that holds the job."""
    for trace in read_traces(TRACES / name):
        cap = max(80 << 30, 2 * trace.peak_live())
        report = replay(trace, capacity=cap)
        assert list(report.results) == list(ALLOCATORS)
        for r in report.results.values():
            assert r.error is None, r.error
            assert not r.ooms and r.peak_live == report.peak_live
            assert r.peak_reserved >= r.peak_live or r.allocator == "driver"
            assert r.min_capacity is not None and r.min_capacity % search_step(report.peak_live) == 0
            assert r.min_capacity >= report.peak_live
            assert r.events_per_second > 0 or not report.events  # state-only: nothing to time
        g = report.results["gpumm"]
        if corpus.label(TRACES / name) not in corpus.RESERVE_OPEN:
            assert g.peak_reserved <= 1.02 * report.peak_live + 4 * MiB, g.ratio
            assert g.min_capacity <= 1.02 * report.peak_live + 8 * MiB, g.min_capacity
        assert report.results["driver"].peak_reserved <= g.peak_reserved


def search_step(peak_live):
    """What the smallest-capacity search resolves: 1 % of peak live or 2 MiB, whichever is
    larger, in whole 2 MiB pages."""
    one_percent = -(-peak_live // 100)
    return max(1, -(-one_percent // (2 * MiB))) * 2 * MiB


@pytest.mark.parametrize("name", HISTORY)
def test_caching_model_matches_pytorch(name):
    """On every device, from the state rebuilt at the ring buffer's start, the model puts at
    least 99 % of allocations where PyTorch did and peaks within 0.5 % of PyTorch's recorded
    reserve."""
    for trace in read_traces(TRACES / name):
        report = replay(trace, ["caching"], capacity="200GiB", min_capacity=False)
        c = report.results["caching"]
        assert c.address_match >= 0.99, trace.device
        assert abs(c.peak_reserved / report.recorded_peak_reserved - 1) <= 0.005, trace.device


def small_trace(tmp_path, n=200):
    rows = ["Thread,Time,Action,Pointer,Size,Stream"]
    for i in range(n):  # 5 MiB and 300 KiB tensors, three alive at a time
        size = 5 * MiB if i % 2 else 300 * 1024
        rows.append(f"1,00:00:00.{2 * i:06d},allocate,{0x1000 * (i + 1):#x},{size},0x0")
        if i >= 2:
            rows.append(f"1,00:00:00.{2 * i + 1:06d},free,{0x1000 * (i - 1):#x},0,0x0")
    p = tmp_path / "small.csv"
    p.write_text("\n".join(rows) + "\n")
    return p


def test_replay_of_a_small_trace(tmp_path):
    t = read_rmm_csv(small_trace(tmp_path))
    p = prepare(t)
    assert p.peak_live == 2 * 5 * MiB + 300 * 1024
    report = replay(t, capacity="1GiB")
    assert report.results["gpumm"].peak_reserved == 12 * MiB  # 6 pages: page ends shared
    assert report.results["caching"].peak_reserved == 22 * MiB  # a 20 MiB and a 2 MiB segment
    # the search resolves 2 MiB here (1 % of 10.3 MiB is less): the driver needs the peak live
    # rounded up to it, gpumm the 6 pages it reserves
    assert report.results["driver"].min_capacity == 12 * MiB
    assert report.results["gpumm"].min_capacity == 12 * MiB
    j = report.to_json()
    for name in ALLOCATORS:
        entry = j["allocators"][name]
        assert all(isinstance(entry[k], int) for k in ("peak_live", "peak_reserved", "ooms", "min_capacity"))
        # free memory held at the peak of live memory: at most what is reserved beyond it
        assert 0 <= entry["free_at_peak"] <= entry["peak_reserved"] - entry["peak_live"], name
    assert j["allocators"]["driver"]["free_at_peak"] == 0
    # gpumm's 6 pages hold two 5 MiB allocations and 300 KiB at the peak
    assert j["allocators"]["gpumm"]["free_at_peak"] == 12 * MiB - p.peak_live


def test_min_capacity_resolves_one_percent_of_a_large_trace(tmp_path):
    """On a trace of 1 GiB of live memory the search resolves 1 % of it (in whole 2 MiB pages:
    12 MiB), not 64 MiB: the driver needs the peak live rounded up to that, and no model
    needs more than it reserved with the whole device."""
    rows = ["Thread,Time,Action,Pointer,Size,Stream"]
    for i in range(64):  # 64 live tensors of 16 MiB + 1 KiB: 1,024.06 MiB, then all freed
        rows.append(f"1,00:00:00.{i:06d},allocate,{0x1000000 * (i + 1):#x},{16 * MiB + 1024},0x0")
    for i in range(64):
        rows.append(f"1,00:00:01.{i:06d},free,{0x1000000 * (i + 1):#x},0,0x0")
    (tmp_path / "big.csv").write_text("\n".join(rows) + "\n")
    report = replay(read_rmm_csv(tmp_path / "big.csv"), capacity="80GiB")
    step = search_step(report.peak_live)
    assert step == 12 * MiB
    assert report.results["driver"].min_capacity == 1032 * MiB  # 1,024.06 MiB up to 86 steps
    for r in report.results.values():
        assert r.min_capacity % step == 0
        assert report.peak_live <= r.min_capacity < max(r.peak_reserved, report.peak_live) + step
    explicit = replay(read_rmm_csv(tmp_path / "big.csv"), ["driver"], capacity="80GiB",
                      step="64MiB")
    assert explicit.results["driver"].min_capacity == 1088 * MiB  # the old resolution


def _terminal(report):
    from rich.console import Console

    from gpumm.report import table

    console = Console(width=80, record=True)
    console.print(table(report))
    return console.export_text()


def test_demo_table_fits_80_columns_and_shows_free_memory():
    report = replay(read_rmm_csv(demo_trace_path()), min_capacity=False)
    text = _terminal(report)
    lines = text.splitlines()
    assert all(len(line.rstrip()) <= 80 for line in lines)
    head = next(line for line in lines if "allocator" in line)
    assert head.split() == ["allocator", "reserved", "÷", "live", "OOMs", "min", "cap.", "free",
                            "frag.", "ev/s"]
    assert "transformer_step.csv.gz: 2944 allocations, peak live" in text


@needs_shared
def test_snapshot_tables_fit_80_columns():
    # a snapshot that recorded PyTorch's reserve: the comparison goes in a second table, and
    # neither table loses a column or a name at 80 columns
    report = replay(read_trace(TRACES / "forward_bf16.pickle"), min_capacity=False)
    text = _terminal(report)
    assert all(len(line.rstrip()) <= 80 for line in text.splitlines())
    assert "caching-expandable" in text and "…" not in text
    assert "ev/s" in text and "same address as PyTorch" in text
    caching = [line for line in text.splitlines() if line.split()[:1] == ["caching"]]
    assert len(caching) == 2 and caching[1].split()[-1] == "100.00%"


def test_ooms_are_explained(tmp_path):
    t = read_rmm_csv(small_trace(tmp_path))
    report = replay(t, ["caching", "buddy"], capacity="16MiB", min_capacity=False)
    c = report.results["caching"]
    assert c.ooms and c.ooms[0]["size"] == 5 * MiB
    text = explain_ooms(c)[0]
    assert "5 MiB requested" in text and "live" in text and "largest free run" in text


def _failing(monkeypatch, fn, model):
    """Makes ``_core.<fn>`` raise for ``model`` as the core does when a model breaks."""
    real = getattr(_core, fn)

    def fake(name, *args, **kwargs):
        if name == model:
            raise InvalidStateError(f"{name}: bookkeeping broken at event 7")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(_core, fn, fake)


def test_a_model_failing_in_the_core_is_reported_and_the_others_go_on(tmp_path, monkeypatch):
    t = read_rmm_csv(small_trace(tmp_path))
    _failing(monkeypatch, "replay", "caching")
    _failing(monkeypatch, "replay_min_capacity", "cupy")
    report = replay(t, capacity="1GiB")
    assert list(report.results) == list(ALLOCATORS)
    c, cupy = report.results["caching"], report.results["cupy"]
    assert "replay failed" in c.error and "event 7" in c.error
    assert not c.ran and c.peak_reserved == 0 and c.min_capacity is None and not c.timeline
    # the replay of cupy ran; its smallest-capacity search failed
    assert cupy.ran and cupy.peak_reserved > 0 and cupy.min_capacity is None
    assert "smallest-capacity search failed" in cupy.error
    for name in set(ALLOCATORS) - {"caching", "cupy"}:
        r = report.results[name]
        assert r.error is None and r.peak_reserved > 0 and r.min_capacity is not None
    j = report.to_json()["allocators"]
    assert "event 7" in j["caching"]["error"] and j["caching"]["peak_reserved"] is None
    assert j["cupy"]["min_capacity"] is None and j["cupy"]["peak_reserved"] > 0
    assert j["gpumm"]["error"] is None
    text = _terminal(report)
    assert next(l for l in text.splitlines() if l.split()[:1] == ["caching"]).split()[1] == "error"
    page = html_report(report)
    assert "bookkeeping broken at event 7" in page


def test_cli_goes_on_after_a_model_fails(tmp_path, monkeypatch, capsys):
    path = str(small_trace(tmp_path))
    _failing(monkeypatch, "replay", "caching")
    assert main(["replay", path, "--capacity", "1GiB", "--html", str(tmp_path / "r.html")]) == 0
    out = capsys.readouterr().out
    rows = {l.split()[0]: l.split()[1:] for l in out.splitlines() if l.split()[:1] in
            [[n] for n in ALLOCATORS]}
    assert rows["caching"][0] == "error" and rows["gpumm"][0] != "error"
    assert "error caching: replay failed: caching: bookkeeping broken at event 7" in " ".join(out.split())
    assert main(["replay", path, "--capacity", "1GiB", "--json", "-"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert "event 7" in data["allocators"]["caching"]["error"]
    assert data["allocators"]["buddy"]["error"] is None
    # the doctor replays gpumm, caching and driver: it names the failure and goes on
    _failing(monkeypatch, "replay", "gpumm")
    assert main(["doctor", path, "--capacity", "1GiB"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "the gpumm model failed on this trace" in out and "peak live" in out


def test_a_capacity_with_decimals_is_read_to_the_nearest_byte(tmp_path, capsys):
    """A capacity read off nvidia-smi or a spec sheet ("3.12GiB", "79.6GB") is taken to the
    nearest byte, not refused as a fraction of a byte; a fraction of a byte still is."""
    path = str(small_trace(tmp_path))
    assert main(["replay", path, "--capacity", "0.75GiB", "--no-min-capacity", "--json", "-"]) == 0
    assert json.loads(capsys.readouterr().out)["capacity"] == 805_306_368
    assert main(["doctor", path, "--capacity", "0.01GiB"]) == 0  # 10.24 MiB: some fail
    assert "on a device of 10.24 MiB" in " ".join(capsys.readouterr().out.split())
    assert main(["replay", path, "--capacity", "1000000.5B"]) == 2
    assert "not a whole number of bytes" in capsys.readouterr().err


def test_unknown_allocator():
    with pytest.raises(InvalidArgumentError, match="unknown allocator 'tcmalloc'"):
        replay(read_rmm_csv(demo_trace_path()), ["tcmalloc"])


def test_cli_json_to_stdout(tmp_path, capsys):
    assert main(["replay", str(small_trace(tmp_path)), "--capacity", "1GiB", "--json", "-"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data["allocators"]) == set(ALLOCATORS)
    for v in data["allocators"].values():
        assert {"peak_live", "peak_reserved", "ooms", "min_capacity"} <= set(v)


def test_cli_errors(tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text("Thread,Time,Action,Pointer,Size,Stream\n1,xx,allocate,0x1,5,0x0\n")
    assert main(["replay", str(bad)]) == 2
    assert "line 2" in capsys.readouterr().err
    assert main(["replay", str(tmp_path / "missing.csv")]) == 2
    assert main(["replay", demo_trace_path(), "--allocator", "nope"]) == 2
    assert "unknown allocator" in capsys.readouterr().err


class _Parser(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags = {}
        self.stack = []

    def handle_starttag(self, tag, attrs):
        self.tags[tag] = self.tags.get(tag, 0) + 1


def test_html_report(tmp_path):
    out = tmp_path / "r.html"
    assert main(["replay", demo_trace_path(), "--html", str(out), "--no-min-capacity"]) == 0
    text = out.read_text()
    p = _Parser()
    p.feed(text)
    assert p.tags["svg"] >= 2 and p.tags["polyline"] >= len(ALLOCATORS) + 1
    assert p.tags["rect"] > 10 and p.tags["table"] >= 1
    for name in ALLOCATORS:
        assert name in text
    # the page's one script is inline; nothing is loaded
    assert "<script src" not in text and "http" not in text.replace("http://www.w3.org/2000/svg", "")


def test_chunk_map_merges_neighbours_and_stays_in_its_width():
    import re

    # 3,000 used pages side by side, a free page after every 40th, then a range elsewhere
    layout, a = [], 0
    for i in range(3000):
        layout.append((a, 2 * MiB, True))
        a += 2 * MiB
        if i % 40 == 39:
            layout.append((a, 2 * MiB, False))
            a += 2 * MiB
    layout.append((a + 64 * MiB, 2 * MiB, True))
    svg = _map_svg(layout, w=960)
    rects = [(float(x), float(w), fill) for x, w, fill in
             re.findall(r'<rect x="([\d.]+)" y="2" width="([\d.]+)" height="22" fill="(#\w+)"', svg)]
    # 75 times a band of 40 used pages and a free page, then the range across a gap
    assert len(rects) == 2 * 75 + 1
    assert [f for _, _, f in rects[:3]] == ["#2c5d8f", "#f2b36f", "#2c5d8f"]
    assert "40 allocations" in svg
    assert all(x + w <= 960.5 for x, w, _ in rects)
    # in address order; a range widened to half a pixel overlaps the next by less than that
    assert all(b[0] >= a[0] + a[1] - 0.5 for a, b in zip(rects, rects[1:]))


def _chromium():
    """How this machine can run headless Chromium: Debian's ``chromium`` binary, else Qt
    WebEngine's Chromium (PyPI's PyQt6-WebEngine, in the test extra); None without either."""
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe:
        return exe
    try:
        import PyQt6.QtWebEngineWidgets  # noqa: F401
    except ImportError:
        return None
    return "qtwebengine"


@pytest.mark.skipif(_chromium() is None,
                    reason="no headless Chromium: neither Debian's chromium package nor "
                           "PyQt6-WebEngine (pip install '.[test]') is installed")
@pytest.mark.parametrize("trace", ["demo", pytest.param("forward_bf16.pickle", marks=needs_shared),
                                   pytest.param("wild/code_location_qwen3_train.pickle",
                                                marks=needs_shared)])
def test_html_report_renders_in_chromium(tmp_path, trace):
    # the demo (an RMM log), a snapshot that recorded PyTorch's reserve (more tables) and one
    # of three devices (a section each)
    path = demo_trace_path() if trace == "demo" else str(TRACES / trace)
    out = tmp_path / "r.html"
    main(["replay", path, "--html", str(out), "--no-min-capacity"])
    engine = _chromium()
    shot = tmp_path / "shot.png"
    if engine != "qtwebengine":
        subprocess.run([engine, "--headless", "--no-sandbox", "--disable-gpu",
                        f"--screenshot={shot}", "--window-size=1100,1400", out.as_uri()],
                       check=True, capture_output=True, timeout=120)
        assert shot.stat().st_size > 10_000
        dom = subprocess.run([engine, "--headless", "--no-sandbox", "--disable-gpu",
                              "--dump-dom", out.as_uri()],
                             check=True, capture_output=True, timeout=120, text=True)
        assert dom.stdout.count("<polyline") >= len(ALLOCATORS) + 1
        return
    r = subprocess.run([sys.executable, str(Path(__file__).with_name("chromium_render.py")),
                        str(out), str(shot)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    page = json.loads(r.stdout.strip().splitlines()[-1])
    assert page["loaded"] and "Chrome/" in page["engine"], page
    assert page["console"] == []  # no script errors, nothing refused
    # a line per allocator's reserve plus the live line, and every chart laid out with a size
    assert page["polylines"] >= len(ALLOCATORS) + 1
    assert page["svgs"] and all(w > 100 and h > 10 for w, h in page["svgs"]), page["svgs"]
    # the screenshot holds the whole page, and something is drawn on it
    assert page["height"] > 900 and shot.stat().st_size > 10_000
    assert page["ink"] > 0.02, page["ink"]
    assert page["width"] <= 1100, "the page overflows sideways"


def test_console_script_replay(tmp_path):
    r = subprocess.run([sys.executable, "-m", "gpumm", "replay", str(small_trace(tmp_path)),
                        "--capacity", "1GiB", "--no-min-capacity"],
                       capture_output=True, text=True)
    assert r.returncode == 0 and "gpumm" in r.stdout and "caching" in r.stdout


def test_the_searches_side_by_side_give_what_each_alone_gives():
    """`replay` runs the smallest-capacity searches and the plan on threads after each model's
    own replay: every figure is what `run_model` gives for that model alone, on a device
    where some models fail (their search then goes past the device) and on one where none
    does."""
    from gpumm.replay import plan_prepared, recorded_options, run_model

    t = read_rmm_csv(demo_trace_path())
    p = prepare(t)
    for cap in (4500 * MiB, 80 << 30):
        rep = replay(t, capacity=cap)
        assert set(rep.results) == set(ALLOCATORS)
        for name, r in rep.results.items():
            alone = run_model(name, p, cap, recorded_options(t, None))
            assert (r.peak_reserved, len(r.ooms), r.min_capacity, r.error) == \
                (alone.peak_reserved, len(alone.ooms), alone.min_capacity, alone.error), name
        assert rep.planned.peak_reserved == plan_prepared(p).peak_reserved


def test_progress_names_each_replay_then_the_searches():
    """The progress callback hears of each model's replay, then once of the searches and the
    plan that run side by side (what `gpumm replay`'s bar shows), and not of them where
    there are none."""
    from gpumm.replay import SEARCHES

    t = read_rmm_csv(demo_trace_path())
    heard = []
    replay(t, ["gpumm", "caching"], progress=heard.append)
    assert heard == ["gpumm", "caching", SEARCHES]
    heard.clear()
    replay(t, ["gpumm"], progress=heard.append, min_capacity=False, planned=False)
    assert heard == ["gpumm"]
