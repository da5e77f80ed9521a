"""PYTORCH_CUDA_ALLOC_CONF as PyTorch's CUDAAllocatorConfig reads it."""

import pytest

import random

from gpumm.alloc_conf import (INTERVALS, format_divisions, from_environment,
                              options_from_settings, parse_alloc_conf)
from gpumm.errors import InvalidArgumentError

from shared_traces import TRACES, needs_shared

MiB = 1 << 20


def test_the_example_string():
    c = parse_alloc_conf("expandable_segments:True,max_split_size_mb:512,"
                         "roundup_power2_divisions:[256:1,512:2,>:4],"
                         "garbage_collection_threshold:0.6")
    assert c.options["expandable_segments"] is True
    assert c.options["max_split_size"] == 512 * MiB
    # 1..128 MiB take the first key's 1; 256 MiB: 1; 512 MiB: 2; above: 4
    assert c.divisions == [1] * 9 + [2] + [4] * (INTERVALS - 10)
    # the model follows both: the table per interval, the GC threshold
    assert c.options["roundup_power2_divisions"] == c.divisions
    assert c.options["garbage_collection_threshold"] == 0.6
    assert c.unmodelled == {}
    assert c.settings["garbage_collection_threshold"] == 0.6


def test_memory_fraction_reaches_the_model():
    c = parse_alloc_conf("garbage_collection_threshold:0.8,per_process_memory_fraction:0.5")
    assert c.options == {"garbage_collection_threshold": 0.8, "memory_fraction": 0.5}


def test_gaps_between_keys_keep_no_rounding():
    c = parse_alloc_conf("roundup_power2_divisions:[2:8,64:4]")
    assert c.divisions[:2] == [8, 8] and c.divisions[2:6] == [0] * 4 and c.divisions[6] == 4
    assert c.divisions[7:] == [0] * (INTERVALS - 7)


def test_uniform_divisions_reach_the_model():
    assert parse_alloc_conf("roundup_power2_divisions:4").options == {"roundup_power2_divisions": 4}
    assert parse_alloc_conf("roundup_power2_divisions:[1:8,>:8]").options == {
        "roundup_power2_divisions": 8}
    # as in PyTorch, '>' alone starts after interval 0, which keeps 0
    assert parse_alloc_conf("roundup_power2_divisions:[>:8]").divisions == [0] + [8] * 15


def test_empty_is_the_defaults():
    c = parse_alloc_conf("")
    assert c.options == {} and c.unmodelled == {}
    assert parse_alloc_conf(None).options == {}


@pytest.mark.parametrize("bad, words", [
    ("max_split_size_mb:20", "too small"),
    ("max_split_size_mb:abc", "whole number"),
    ("expandable_segments:yes", "True or False"),
    ("roundup_power2_divisions:3", "power of 2"),
    ("roundup_power2_divisions:[100:2]", "powers of 2"),
    ("roundup_power2_divisions:[256:1", "unclosed"),
    ("roundup_power2_divisions:[256:3,>:8]", "got 3 in '256:3'"),
    ("roundup_power2_divisions:[256:1,x:2]", "whole number, got 'x'"),
    ("roundup_power2_divisions:[256:1,512]", "got '512'"),
    ("roundup_power2_divisions:0", "power of 2, got 0"),
    ("garbage_collection_threshold:0", "between 0 and 1"),
    ("garbage_collection_threshold:nan", "between 0 and 1"),
    ("garbage_collection_threshold:high", "expects a number, got 'high'"),
    ("per_process_memory_fraction:1.5", "in \\(0, 1\\]"),
    ("garbage_collection_threshold:1.5", "between 0 and 1"),
    ("no_such_option:1", "unknown option"),
    ("expandable_segments", "key:value"),
    ("backend:cuda", "native or cudaMallocAsync"),
    ("max_split_size_mb:64,max_split_size_mb:128", "twice"),
])
def test_bad_strings_are_refused_by_name(bad, words):
    with pytest.raises(InvalidArgumentError, match=words):
        parse_alloc_conf(bad)


def test_host_only_settings_are_named():
    c = parse_alloc_conf("pinned_use_cuda_host_register:True,release_lock_on_cudamalloc:True")
    assert c.options == {}
    assert all("host-side" in why for why in c.unmodelled.values())


def test_environment():
    assert from_environment({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}).options == {
        "expandable_segments": True}
    assert from_environment({}).text == ""


def _read_before_2_9(value):
    """PyTorch's reading of the per-interval form before 2.9: ``>`` fills from the last
    key's own interval on (overwriting it)."""
    out, first, last = [0] * INTERVALS, True, 0
    for item in value.strip("[]").split(","):
        k, v = item.split(":")
        if k == ">":
            out[last:] = [int(v)] * (INTERVALS - last)
            continue
        i = min(int(k).bit_length() - 1, INTERVALS - 1)
        if first:
            out[:i] = [int(v)] * i
            first = False
        out[i], last = int(v), i
    return out


def test_format_divisions_reads_back_the_same_in_every_pytorch():
    rng = random.Random(7)
    tables = [[rng.choice([0, 0, 1, 2, 4, 8, 16]) for _ in range(INTERVALS)]
              for _ in range(3000)]
    tables += [[1] * 9 + [2, 4] + [8] * 5, [0] * 15 + [4], [4] + [0] * 15, [2] * 15 + [0]]
    for t in tables:
        text = format_divisions(t)
        assert parse_alloc_conf(f"roundup_power2_divisions:{text}").divisions == t, text
        if text.startswith("["):
            assert _read_before_2_9(text) == t, text
    assert format_divisions([1] * 9 + [2, 4] + [8] * 5) == "[256:1,512:2,1024:4,2048:8,>:8]"
    assert format_divisions([4] * INTERVALS) == "4"
    assert format_divisions(0) == "[1:0]"


@pytest.mark.parametrize("bad", [[3] * INTERVALS, [2] * 15])
def test_format_divisions_refuses_what_pytorch_refuses(bad):
    with pytest.raises(InvalidArgumentError, match="roundup_power2_divisions"):
        format_divisions(bad)


def test_settings_of_a_snapshot():
    """allocator_settings record the GC threshold, the fraction (recent PyTorch) and the
    table keyed by interval in MiB."""
    keys = [str(1 << i) for i in range(INTERVALS)]
    table = dict(zip(keys, [1] * 9 + [2, 4] + [8] * 5))
    got = options_from_settings({"garbage_collection_threshold": 0.7,
                                 "per_process_memory_fraction": 0.9,
                                 "roundup_power2_divisions": table})
    assert got == {"garbage_collection_threshold": 0.7, "memory_fraction": 0.9,
                   "roundup_power2_divisions": [1] * 9 + [2, 4] + [8] * 5}
    # PyTorch's defaults as recorded: nothing to set
    assert options_from_settings({"garbage_collection_threshold": 0.0,
                                  "roundup_power2_divisions": dict.fromkeys(keys, 0)}) == {
        "roundup_power2_divisions": 0}
    assert options_from_settings({"roundup_power2_divisions": {"a": 1}}) == {}


@pytest.mark.parametrize("opts, words", [
    ({"garbage_collection_threshold": 1.0}, "garbage_collection_threshold"),
    ({"memory_fraction": 0.0}, "memory_fraction"),
    ({"roundup_power2_divisions": [2] * 15}, "15 counts"),
    ({"roundup_power2_divisions": [3] * INTERVALS}, "power of 2"),
    ({"roundup_power2_divisions": "8"}, "per interval"),
])
def test_the_core_refuses_bad_options(opts, words):
    from gpumm import _core

    with pytest.raises(InvalidArgumentError, match=words):
        _core.replay("caching", 1 << 30, [0], [1], [4096], [0], [0], options=opts)


@needs_shared
def test_a_snapshot_replays_with_its_recorded_gc_and_table():
    """Settings recorded in allocator_settings are the replay's, as if given by hand."""
    from gpumm.replay import replay
    from gpumm.traces import read_traces

    t = read_traces(TRACES / "wild" / "octnca_train3d_my_snapshot.pickle")[0]
    keys = [str(1 << i) for i in range(INTERVALS)]
    table = [1] * 9 + [2, 4] + [8] * 5
    by_hand = {"garbage_collection_threshold": 0.6, "roundup_power2_divisions": table}
    plain = replay(t, ["caching"], capacity="20GiB", min_capacity=False)
    given = replay(t, ["caching"], capacity="20GiB", min_capacity=False,
                   caching_options=by_hand)
    t.settings = dict(t.settings, garbage_collection_threshold=0.6,
                      roundup_power2_divisions=dict(zip(keys, table)))
    recorded = replay(t, ["caching"], capacity="20GiB", min_capacity=False)
    got = [r.results["caching"].peak_reserved for r in (plain, given, recorded)]
    assert got[1] == got[2] != got[0]
