"""`gpumm tune`: every candidate's numbers are a replay's (the same peak reserved and smallest
device as `gpumm replay --allocator caching` with that setting), the known-bad combination is
flagged and ranked last, the recorded setting has its row, and the JSON lists the candidates."""

import json

import pytest

from gpumm.cli import main
from gpumm.replay import replay
from gpumm.traces import read_trace, read_traces
from gpumm.tune import BAD_COMBINATION, DEFAULTS, alloc_conf_text, candidates, tune

from shared_traces import TRACES, needs_shared

SOME = [dict(DEFAULTS), dict(DEFAULTS, max_split_size=256 << 20, roundup_power2_divisions=4),
        dict(DEFAULTS, expandable_segments=True),
        dict(DEFAULTS, expandable_segments=True, max_split_size=512 << 20),
        # above every request of these traces: tune replays it once with the defaults' key,
        # and the test replays it on its own
        dict(DEFAULTS, max_split_size=2048 << 20, roundup_power2_divisions=8),
        dict(DEFAULTS, roundup_power2_divisions=8)]


def test_grid_has_at_least_fifty_distinct_settings():
    grid = candidates()
    assert len(grid) >= 50
    assert len({alloc_conf_text(o) for o in grid}) == len(grid)


def test_alloc_conf_text():
    assert alloc_conf_text(DEFAULTS) == ""
    assert alloc_conf_text(SOME[1]) == "max_split_size_mb:256,roundup_power2_divisions:4"
    assert alloc_conf_text(SOME[3]) == "expandable_segments:True,max_split_size_mb:512"


@needs_shared
@pytest.mark.parametrize("name", ["cs336_ctx128_forward.pickle", "resnet50_train.csv.gz"])
def test_each_candidate_is_a_replay(name):
    t = read_traces(TRACES / name)[0]
    r = tune(t, capacity="80GiB", settings=SOME, workers=2)
    assert len(r.candidates) >= len(SOME)
    for c in r.candidates:
        rep = replay(t, ["caching"], capacity="80GiB", caching_options=c.options)
        got = rep.results["caching"]
        assert (c.peak_reserved, c.min_capacity, c.ooms) == (
            got.peak_reserved, got.min_capacity, len(got.ooms))


@needs_shared
def test_flagged_combination_ranks_last():
    t = read_trace(TRACES / "resnet50_train.csv.gz")
    r = tune(t, capacity="80GiB", settings=SOME, workers=2)
    flagged = [c for c in r.candidates if c.flag]
    assert [c.alloc_conf for c in flagged] == ["expandable_segments:True,max_split_size_mb:512"]
    assert flagged[0].flag == BAD_COMBINATION
    assert r.candidates[-1].flag and not r.best.flag


@needs_shared
def test_recorded_setting_has_its_row():
    """The 3-GPU snapshot recorded expandable_segments:True: that is its recorded row."""
    t = read_traces(TRACES / "wild" / "code_location_qwen3_train.pickle")[1]
    r = tune(t, settings=SOME[:2], workers=2)  # the recorded setting is added
    assert r.recorded.alloc_conf == "expandable_segments:True"
    assert r.recorded.options["expandable_segments"] is True


@needs_shared
def test_json_candidates(capsys):
    path = str(TRACES / "resnet50_train.csv.gz")
    assert main(["tune", path, "--capacity", "80GiB", "--json", "-"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert len(data) >= 50
    for c in data:
        assert {"alloc_conf", "peak_reserved", "min_capacity", "ooms"} <= set(c)


@needs_shared
def test_table_names_best_and_gpumm(capsys):
    path = str(TRACES / "resnet50_train.csv.gz")
    assert main(["tune", path, "--capacity", "80GiB", "--top", "5"]) == 0
    out = capsys.readouterr().out
    assert "best:" in out and "gpumm's pool" in out and "gpumm.integrations.torch" in out


@needs_shared
@pytest.mark.parametrize("name", ["resnet50_train.csv.gz", "cs336_ctx128_forward.pickle"])
def test_numbers_reproduce_in_gpumm_replay(name, capsys):
    """`gpumm replay TRACE --allocator caching --alloc-conf CONF` gives each candidate's peak
    reserved, smallest device and OOMs byte for byte."""
    path = str(TRACES / name)
    assert main(["tune", path, "--capacity", "80GiB", "--json", "-"]) == 0
    data = json.loads(capsys.readouterr().out)
    for c in data[:3] + data[-2:]:
        assert main(["replay", path, "--allocator", "caching", "--capacity", "80GiB",
                     "--alloc-conf", c["alloc_conf"], "--json", "-"]) == 0
        got = json.loads(capsys.readouterr().out)["allocators"]["caching"]
        assert (got["peak_reserved"], got["min_capacity"], got["ooms"]) == (
            c["peak_reserved"], c["min_capacity"], c["ooms"]), c["alloc_conf"]


@needs_shared
def test_tune_smoke_of_the_benchmark():
    """benches/tune.py runs (on a short trace): the benchmark measures, this only checks it
    works."""
    import importlib.util
    import pathlib

    spec = importlib.util.spec_from_file_location(
        "bench_tune", pathlib.Path(__file__).parents[1] / "benches" / "tune.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    t = mod.long_trace(3000)
    assert len(t.events) == 3000
    r = tune(t, capacity="80GiB", settings=SOME[:2], workers=2)
    assert r.best.peak_reserved > 0
