"""gpumm predict: the verdict on both sides of a capacity, the JSON, the interpolation."""

import json

import pytest

import torch  # in the test extra: CI records a model for real

from gpumm.cli import main
from gpumm.predict import _scaled, predict
from gpumm.record import record
from gpumm.traces import read_trace

MiB = 1 << 20


def _step(batch):
    model = torch.nn.Sequential(torch.nn.Linear(256, 4096), torch.nn.GELU(),
                                torch.nn.Linear(4096, 256)).to("cuda")
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randn(batch, 256, device="cuda")
    for _ in range(2):
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    d = tmp_path_factory.mktemp("predict")
    out = {}
    for b in (2048, 4096, 8192):
        out[b] = d / f"b{b}.pickle"
        with record(out[b], fake=True, warmup=1, size=b, size_name="batch"):
            _step(b)
    return out


def test_verdict_on_both_sides_of_the_capacity(traces):
    p = predict(traces[4096], capacity="40GiB", context=0)
    assert p.fits and p.first_failure is None
    assert p.peak_live <= p.peak_reserved <= p.min_capacity + 16 * MiB
    names = [o.name for o in p.overheads]
    assert names[:2] == ["CUDA context", "cuBLAS workspace"]
    # the smallest capacity that works fits; well below it does not
    ok = predict(traces[4096], capacity=p.min_capacity, context=0)
    assert ok.fits
    bad = predict(traces[4096], capacity=p.peak_live // 2, context=0)
    assert not bad.fits and bad.headroom < 0
    f = bad.first_failure
    assert f["size"] > 0 and f["op"] and any("_step" in line for line in f["stack"])
    # the context is taken from the capacity
    tight = predict(traces[4096], capacity=p.min_capacity + 64 * MiB, context="64MiB")
    assert tight.usable == p.min_capacity and tight.fits
    assert not predict(traces[4096], capacity=p.min_capacity, context="64MiB").fits


def test_json_keys(traces, capsys):
    assert main(["predict", str(traces[2048]), "--capacity", "24GiB", "--json", "-"]) == 0
    d = json.loads(capsys.readouterr().out)
    for k in ("peak_reserved", "gpumm_peak_reserved", "fits", "first_failure"):
        assert k in d
    assert d["fits"] is True and d["first_failure"] is None
    assert d["peak_reserved"] >= d["peak_live"] > 0


def test_alloc_conf_reaches_the_model(traces, capsys):
    assert main(["predict", str(traces[2048]), "--alloc-conf", "expandable_segments:True,"
                 "max_non_split_rounding_mb:64", "--json", "-"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert "max_non_split_rounding_mb" in d["unmodelled"]
    assert main(["predict", str(traces[2048]), "--alloc-conf", "max_split_size_mb:4"]) == 2
    assert "too small" in capsys.readouterr().err


def test_two_sizes_interpolate(traces, capsys):
    cap = predict(traces[8192], capacity="40GiB", context=0).peak_reserved + 8 * MiB
    assert main(["predict", str(traces[2048]), str(traces[4096]), "--capacity", str(cap),
                 "--context", "0", "--json", "-"]) == 0
    d = json.loads(capsys.readouterr().out)
    fit = d["interpolation"]
    assert fit["sizes"] == [2048, 4096] and fit["size_name"] == "batch"
    assert fit["per_unit"] > 0 and fit["method"] == "replayed"
    # each allocation grows linearly with the batch: the trace interpolated to 8192 is the
    # third run's, and the capacity (its peak reserved + 8 MiB) fits a little more than 8192
    t = [read_trace(traces[b]) for b in (2048, 4096, 8192)]
    assert [e.size for e in _scaled(t[0], t[1], 2048, 4096, 8192).events] == \
        [e.size for e in t[2].events]
    assert 8192 <= fit["largest"] < 8192 * 1.1
    # the two peaks' line would say otherwise: the allocator's rounding bends it
    assert fit["fixed"] + fit["per_unit"] * 8192 < 0.8 * cap
    assert predict(traces[8192], capacity=cap, context=0).fits
