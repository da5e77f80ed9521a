"""The offline planner (``rust/plan``) from Python: plans of generated streams checked whole,
and the ``planned`` row of every corpus trace against its bound and against the replays."""

from __future__ import annotations

import json
import random

import pytest

from corpus import ALL, params
from gpumm import _core
from gpumm.cli import demo_trace_path, main
from gpumm.errors import InvalidArgumentError
from gpumm.replay import devices_json, plan_prepared, prepare, read_devices, replay
from gpumm.report import planned_text
from gpumm.traces import read_rmm_csv

ALIGN = 512


def _round(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def _check(sizes, starts, ends, got) -> None:
    """No two items overlap in both lifetime and addresses; offsets aligned; the peak is the
    highest end; the bound is the live peak (computed here at every start)."""
    offs = got["offsets"]
    spans = [(s, e if e > s else s + 1) for s, e in zip(starts, ends)]
    top = max((o + _round(z) for o, z in zip(offs, sizes) if z), default=0)
    assert got["peak"] == top
    live = max((sum(_round(z) for z, (s2, e2) in zip(sizes, spans) if s2 <= s < e2)
                for s, _ in spans), default=0)
    assert got["bound"] == live <= got["peak"]
    order = sorted(range(len(sizes)), key=lambda i: offs[i])
    for a in order:
        assert offs[a] % ALIGN == 0
        for b in order:
            if a < b and sizes[a] and sizes[b]:
                time = spans[a][0] < spans[b][1] and spans[b][0] < spans[a][1]
                space = offs[a] < offs[b] + _round(sizes[b]) and offs[b] < offs[a] + _round(sizes[a])
                assert not (time and space), (a, b)


def _stream(seed: int, n: int):
    """A generated training-like stream: a few long-lived tensors and many short ones."""
    rng = random.Random(seed)
    sizes, starts, ends = [], [], []
    for i in range(n):
        sizes.append(rng.choice([0, 1, 511, 4096, 1 << 20, rng.randrange(1, 1 << 24)]))
        s = rng.randrange(0, 4 * n)
        starts.append(s)
        ends.append(s + (rng.randrange(1, 8) if rng.random() < 0.8 else rng.randrange(1, 4 * n)))
    return sizes, starts, ends


@pytest.mark.parametrize("seed", range(6))
def test_generated_streams_plan_valid_and_deterministic(seed):
    sizes, starts, ends = _stream(seed, 300)
    got = _core.plan_items(sizes, starts, ends, ALIGN)
    _check(sizes, starts, ends, got)
    again = _core.plan_items(sizes, starts, ends, ALIGN)
    assert (again["offsets"], again["peak"]) == (got["offsets"], got["peak"])


def test_no_budget_still_plans():
    sizes, starts, ends = _stream(7, 200)
    _check(sizes, starts, ends, _core.plan_items(sizes, starts, ends, ALIGN, budget=0))


def test_bad_input_is_a_clear_error():
    with pytest.raises(InvalidArgumentError):
        _core.plan_items([1, 2], [0], [1], ALIGN)
    with pytest.raises(InvalidArgumentError):
        _core.plan_items([1], [0], [1], 24)
    assert _core.plan_items([], [], [], ALIGN) == {"peak": 0, "bound": 0, "offsets": [],
                                                   "exhausted": False,
                                                   "seconds": pytest.approx(0, abs=1)}


def test_a_plan_whose_budget_ran_out_says_so():
    """With no budget the steps keep their time-order plans: the plan says the budget ran out
    (a lower plan may exist), and the replay's line says it to the user; with the default
    budget it does not."""
    sizes, starts, ends = _stream(7, 200)
    assert _core.plan_items(sizes, starts, ends, ALIGN, budget=0)["exhausted"] is True
    assert _core.plan_items(sizes, starts, ends, ALIGN)["exhausted"] is False
    rep = replay(read_rmm_csv(demo_trace_path()), ["gpumm"], min_capacity=False)
    assert rep.planned is not None and not rep.planned.exhausted
    assert "budget" not in planned_text(rep)
    rep.planned.exhausted = True
    assert "budget of work ran out" in planned_text(rep)
    assert rep.planned.to_json()["exhausted"] is True


@pytest.mark.parametrize("path", params(ALL))
def test_corpus_plan_is_between_the_bound_and_the_online_pools(path):
    for t in read_devices(path):
        p = prepare(t)
        pl = plan_prepared(p)
        # the bound is the live peak in 512-byte blocks: at least the requested live peak
        assert pl.bound >= p.peak_live
        assert pl.peak_reserved >= pl.bound
        rep = replay(t, ["gpumm", "caching"], min_capacity=False)
        assert rep.planned is not None and rep.planned.peak_reserved == pl.peak_reserved
        for r in rep.results.values():
            # an online allocator cannot beat the bound in whole blocks (it may the plan)
            assert r.peak_reserved + 2 * ALIGN * max(t.num_allocs, 1) >= pl.bound or not r.ran
        js = devices_json([rep])["planned"]
        assert js["peak_reserved"] == pl.peak_reserved and js["bound"] == pl.bound
        assert js["ratio"] == pytest.approx(pl.ratio, abs=1e-6)


def _no_planner(monkeypatch):
    """The planner raising an error no caller catches: a test fails if anything plans."""
    def plan_trace(*args, **kwargs):
        raise AssertionError("the planner was asked for")

    monkeypatch.setattr(_core, "plan_trace", plan_trace)


def test_replay_without_the_plan(monkeypatch):
    t = read_rmm_csv(demo_trace_path())
    assert replay(t, ["gpumm"], min_capacity=False).planned is not None
    _no_planner(monkeypatch)
    rep = replay(t, ["gpumm"], min_capacity=False, planned=False)
    assert rep.planned is None and rep.to_json()["planned"] is None
    assert "planned" not in planned_text(rep) and rep.results["gpumm"].ran


def test_cli_no_plan(monkeypatch, capsys, tmp_path):
    path = demo_trace_path()
    args = ["replay", path, "--capacity", "1GiB", "--no-min-capacity", "--allocator", "gpumm"]
    assert main(args + ["--json", "-"]) == 0
    assert json.loads(capsys.readouterr().out)["planned"]["bound"] > 0
    assert main(["doctor", path]) == 0
    assert "no allocator can reserve less than" in " ".join(capsys.readouterr().out.split())
    _no_planner(monkeypatch)
    assert main(args + ["--no-plan", "--json", "-"]) == 0
    assert json.loads(capsys.readouterr().out)["planned"] is None
    page = tmp_path / "r.html"
    assert main(args + ["--no-plan", "--html", str(page)]) == 0
    assert "planned" not in page.read_text()
    assert main(["doctor", path, "--no-plan"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "peak live" in out and "no allocator can reserve less than" not in out
