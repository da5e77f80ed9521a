"""The HTML report of the 3-GPU snapshot in Chromium (Qt WebEngine): it loads nothing but
itself, its text holds the stacks' user functions and the doctor's and tune's sections, its
timeline zooms, and its holder tables name the job's own code."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpumm.cli import main
from gpumm.frames import user_frame
from gpumm.traces import read_traces

from shared_traces import TRACES, needs_shared

QWEN3 = TRACES / "wild" / "code_location_qwen3_train.pickle"


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    out = tmp_path_factory.mktemp("html") / "r.html"
    assert main(["replay", str(QWEN3), "--html", str(out), "--capacity", "80GB",
                 "--allocator", "gpumm,caching"]) == 0
    return out


@needs_shared
def test_page_sections(page):
    text = page.read_text()
    for what in ("The doctor's findings", "gpumm tune", "Who holds the memory",
                 "Live allocations at the peak", "At the out-of-memory failure", "Best by replay"):
        assert what in text, what
    assert "http://" not in text.replace("http://www.w3.org/2000/svg", "")
    assert "https://" not in text


@needs_shared
def test_rendered_in_chromium(page, tmp_path):
    shot = tmp_path / "shot.png"
    r = subprocess.run([sys.executable, str(Path(__file__).with_name("chromium_render.py")),
                        str(page), str(shot)], capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["loaded"] and got["console"] == [], got["console"]
    # nothing loaded but the page's own file
    assert [u for u in got["requests"] if not u.startswith("file://")] == []
    # the stacks' user functions are in the page's text (tables and block tooltips)
    names = {user_frame(s).name for t in read_traces(QWEN3) for s in t.frames
             if user_frame(s) is not None and user_frame(s).kind == "user"}
    assert names and all(n in got["text"] for n in names), names
    # the wheel zooms the timeline into a narrower time range
    (b0, b1), (a0, a1) = got["zoomed"]
    assert b0 <= a0 < a1 <= b1 and (a1 - a0) < (b1 - b0)
    assert got["ink"] > 0.02 and got["width"] <= 1100
