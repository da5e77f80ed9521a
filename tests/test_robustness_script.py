"""scripts/robustness.py: the held-out copies it makes of a trace (sizes rounded, the last
step repeated) are what it says, and its table has a line per trace."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from gpumm.traces import read_rmm_csv, replay_pool
from gpumm.units import KiB, MiB
from script_loader import load_script
from test_reserve_classes import _Gen, write_csv


@pytest.fixture(scope="module")
def rob():
    return load_script("robustness")


def steps_trace(path: Path, steps: int = 3, seed: int = 7):
    """``steps`` training-like steps, each freeing everything it made (live 0 between them);
    each step's sizes differ, so the last one is known by its sizes."""
    r, g = random.Random(seed), _Gen()
    for s in range(steps):
        made = [g.alloc(r.randrange(1, 600) * KiB + s * 1000 + 1) for _ in range(40)]
        made.append(g.alloc(3 * MiB + 4 * KiB))
        r.shuffle(made)
        for i in made:
            g.free(i)
    return read_rmm_csv(write_csv(g.events, path))


def test_rounded_rounds_every_alloc_and_free_up(rob, tmp_path):
    t = steps_trace(tmp_path / "s.csv")
    t2 = rob.rounded(t, 512)
    assert len(t2.events) == len(t.events)
    for a, b in zip(t.events, t2.events):
        if a.action in ("alloc", "free"):
            assert b.size % 512 == 0 and a.size <= b.size < a.size + 512
    assert t2.peak_live() >= t.peak_live()


def test_long_run_repeats_the_last_step(rob, tmp_path):
    t = steps_trace(tmp_path / "s.csv", steps=3)
    start, end = rob.last_step(list(t.events))
    step = [e for e in t.events][start:end]
    assert len(step) == 2 * 41 and end == len(t.events)
    # the last step's own sizes (its allocations are offset by 2 * 1000 bytes)
    assert all(e.size % 1000 != 0 for e in step if e.action == "alloc")
    lr = rob.long_run(t, 4)
    assert len(lr.events) == len(t.events) + 4 * len(step)
    assert [e.size for e in lr.events][-len(step):] == [e.size for e in step]
    assert lr.peak_live() == t.peak_live()
    # a repeated step asks for nothing new, so the pool that served it once serves it again
    assert replay_pool(lr, "1GiB").failures == 0


def test_a_trace_without_steps_has_no_long_run(rob, tmp_path):
    g = _Gen()
    keep = g.alloc(MiB)  # live to the end: no point where nothing is live
    for _ in range(20):
        g.free(g.alloc(64 * KiB))
    g.free(keep)
    t = read_rmm_csv(write_csv(g.events, tmp_path / "one.csv"))
    assert rob.last_step(list(t.events)) is None
    assert rob.long_run(t, 5) is None


def test_the_table_has_a_line_per_trace(rob, tmp_path, capsys):
    a = steps_trace(tmp_path / "a.csv")
    steps_trace(tmp_path / "b.csv", steps=2, seed=3)
    assert rob.main([str(tmp_path / "a.csv"), str(tmp_path / "b.csv"), "--round", "512",
                     "--repeat", "3", "-j", "1", "--pool", "size_cache=False"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and "to 512 B" in lines[0] and "+3 steps" in lines[0]
    cells = lines[1].split()
    assert cells[0] == "recorded/a.csv"
    # as recorded, without the cache: what replay_pool says
    want = replay_pool(a, 80 << 30, size_cache=False).peak_reserved / MiB
    assert float(cells[3].rstrip("*")) == pytest.approx(want, abs=0.5)


def test_a_pool_option_must_be_key_value(rob):
    assert rob.pool_options(["size_cache=False", "small_threshold=524288"]) == {
        "size_cache": False, "small_threshold": 524288}
    with pytest.raises(SystemExit, match="KEY=VALUE"):
        rob.pool_options(["size_cache"])
