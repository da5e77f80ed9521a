"""`gpumm tune`: every candidate's numbers are a replay's (the same peak reserved and smallest
device as `gpumm replay --allocator caching` with that setting), the known-bad combination is
flagged and ranked last, the recorded setting has its row, and the JSON lists the candidates."""

import json

import pytest

from gpumm.cli import main
from gpumm.replay import replay
from gpumm.traces import read_trace, read_traces
from gpumm.tune import (BAD_COMBINATION, DEFAULTS, alloc_conf_text, candidates, options_from_conf,
                        tune)

from shared_traces import TRACES, needs_shared

SOME = [dict(DEFAULTS), dict(DEFAULTS, max_split_size=256 << 20, roundup_power2_divisions=4),
        dict(DEFAULTS, expandable_segments=True),
        dict(DEFAULTS, expandable_segments=True, max_split_size=512 << 20),
        # above every request of these traces: tune replays it once with the defaults' key,
        # and the test replays it on its own
        dict(DEFAULTS, max_split_size=2048 << 20, roundup_power2_divisions=8),
        dict(DEFAULTS, roundup_power2_divisions=8),
        # the per-interval form and the GC threshold
        dict(DEFAULTS, roundup_power2_divisions=[1] * 9 + [2, 4] + [8] * 5),
        dict(DEFAULTS, expandable_segments=True, roundup_power2_divisions=[4] * 4 + [0] * 12),
        dict(DEFAULTS, garbage_collection_threshold=0.6),
        dict(DEFAULTS, garbage_collection_threshold=0.8, max_split_size=256 << 20)]


def test_grid_has_at_least_fifty_distinct_settings():
    grid = candidates()
    assert len(grid) >= 50
    assert len({alloc_conf_text(o) for o in grid}) == len(grid)
    texts = [alloc_conf_text(o) for o in grid]
    assert sum("garbage_collection_threshold" in t for t in texts) == 6
    assert sum("roundup_power2_divisions:[" in t for t in texts) == 8
    # without a capacity the GC rows go, the rest stay
    assert [o for o in grid if not o["garbage_collection_threshold"]] == candidates(gc=False)


def test_alloc_conf_text():
    assert alloc_conf_text(DEFAULTS) == ""
    assert alloc_conf_text(SOME[1]) == "max_split_size_mb:256,roundup_power2_divisions:4"
    assert alloc_conf_text(SOME[3]) == "expandable_segments:True,max_split_size_mb:512"
    assert alloc_conf_text(SOME[6]) == "roundup_power2_divisions:[256:1,512:2,1024:4,2048:8,>:8]"
    assert alloc_conf_text(SOME[9]) == ("max_split_size_mb:256,"
                                        "garbage_collection_threshold:0.8")
    assert alloc_conf_text(dict(DEFAULTS, memory_fraction=0.5)) == (
        "per_process_memory_fraction:0.5")


def test_every_candidate_reads_back_to_its_options():
    """The string tune prints is what `gpumm replay --alloc-conf` reads: the same options."""
    for o in candidates():
        assert options_from_conf(alloc_conf_text(o)) == o, alloc_conf_text(o)


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
def test_gc_rows_need_a_capacity():
    """With no capacity the GC thresholds are left out and the result says why; with one
    they are searched, at that capacity."""
    t = read_traces(TRACES / "wild" / "octnca_train3d_my_snapshot.pickle")[0]
    r = tune(t, workers=2)
    assert not any(c.options["garbage_collection_threshold"] for c in r.candidates)
    assert len(r.skipped) == 1 and "--capacity" in r.skipped[0]
    r = tune(t, capacity="20GiB", workers=2)
    gc = [c for c in r.candidates if c.options["garbage_collection_threshold"]]
    assert len(gc) == 6 and r.skipped == []
    # at 20 GiB a threshold of 0.6 (12 GiB) frees cached segments: a lower peak
    plain = next(c for c in r.candidates if c.alloc_conf == "")
    low = next(c for c in gc if c.alloc_conf == "garbage_collection_threshold:0.6")
    assert low.peak_reserved < plain.peak_reserved


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
@pytest.mark.parametrize("name", ["resnet50_train.csv.gz", "cs336_ctx128_forward.pickle",
                                  "wild/octnca_train3d_my_snapshot.pickle"])
def test_numbers_reproduce_in_gpumm_replay(name, capsys):
    """`gpumm replay TRACE --allocator caching --alloc-conf CONF` gives each candidate's peak
    reserved, smallest device and OOMs byte for byte."""
    path = str(TRACES / name)
    assert main(["tune", path, "--capacity", "20GiB", "--json", "-"]) == 0
    data = json.loads(capsys.readouterr().out)
    gc = [c for c in data if "garbage_collection_threshold" in c["alloc_conf"]]
    tables = [c for c in data if "roundup_power2_divisions:[" in c["alloc_conf"]]
    assert len(gc) == 6 and len(tables) == 8
    for c in data[:3] + data[-2:] + gc[:3] + tables[:3]:
        assert main(["replay", path, "--allocator", "caching", "--capacity", "20GiB",
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
