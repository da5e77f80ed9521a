"""PYTORCH_CUDA_ALLOC_CONF as PyTorch's CUDAAllocatorConfig reads it."""

import pytest

from gpumm.alloc_conf import INTERVALS, from_environment, parse_alloc_conf
from gpumm.errors import InvalidArgumentError

MiB = 1 << 20


def test_the_example_string():
    c = parse_alloc_conf("expandable_segments:True,max_split_size_mb:512,"
                         "roundup_power2_divisions:[256:1,512:2,>:4],"
                         "garbage_collection_threshold:0.6")
    assert c.options["expandable_segments"] is True
    assert c.options["max_split_size"] == 512 * MiB
    # 1..128 MiB take the first key's 1; 256 MiB: 1; 512 MiB: 2; above: 4
    assert c.divisions == [1] * 9 + [2] + [4] * (INTERVALS - 10)
    # per-interval counts and the GC threshold are named, not dropped
    assert "roundup_power2_divisions" not in c.options
    assert set(c.unmodelled) == {"roundup_power2_divisions", "garbage_collection_threshold"}
    assert c.settings["garbage_collection_threshold"] == 0.6


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
