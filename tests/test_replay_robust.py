"""Every real trace through every allocator model, every device, at a capacity that holds it
and at one that does not, with the caching models' smallest-capacity search: no model fails
in the core (``AllocatorResult.error`` would name it). The caching model's fidelity against
PyTorch, per device, is in test_replay.py."""

import pytest

import corpus
from gpumm.replay import ALLOCATORS, replay
from gpumm.traces import read_traces
from gpumm.units import GiB


@pytest.mark.parametrize("path", corpus.params(corpus.ALL))
def test_every_model_replays_every_device(path):
    for t in read_traces(path):
        own = max(t.peak_live(), t.recorded_peak_reserved() or 0)
        for cap in (own + own // 4 + GiB, own // 2 + 1):
            report = replay(t, ALLOCATORS, capacity=cap, min_capacity=False)
            assert list(report.results) == list(ALLOCATORS)
            assert [r.error for r in report.results.values()] == [None] * len(ALLOCATORS), cap
        report = replay(t, ["caching", "caching-expandable"], capacity=2 * own + GiB,
                        step=own // 8 + 1, min_capacity=True)
        for r in report.results.values():
            assert r.error is None, r.error
            assert r.min_capacity is None or r.min_capacity <= 2 * own + GiB + own // 8 + 1
