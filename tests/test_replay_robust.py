"""Every real trace through every allocator model, every device, with no exception; and the
``caching`` model exact against PyTorch on every snapshot with history, per device."""

import pytest

from gpumm.replay import ALLOCATORS, replay
from gpumm.traces import read_traces
from gpumm.units import GiB

from shared_traces import TRACES, needs_shared


def corpus(pattern="*"):
    found = sorted(p for d in (TRACES, TRACES / "wild") if d.is_dir() for p in d.glob(pattern)
                   if p.is_file() and p.suffix != ".md")
    return [pytest.param(p, id=p.name) for p in found] or [pytest.param(None, id="absent")]


@needs_shared
@pytest.mark.parametrize("path", corpus("*.pickle"))
def test_caching_model_matches_pytorch_on_every_device(path):
    """From the state rebuilt at the history's start, the model puts at least 99 % of
    allocations where PyTorch did and peaks within 0.5 % of PyTorch's recorded reserve, on
    each device of the snapshot (expandable segments as the snapshot had them)."""
    misses = []
    checked = 0
    for t in read_traces(path):
        if not t.has_history:
            continue
        report = replay(t, ["caching"], capacity=200 * GiB, min_capacity=False)
        c = report.results["caching"]
        recorded = report.recorded_peak_reserved
        off = c.peak_reserved / recorded - 1
        if c.address_match is None or c.address_match < 0.99 or abs(off) > 0.005:
            misses.append(f"device {t.device}: address match {c.address_match}, "
                          f"peak reserved {off:+.4%} vs recorded")
        checked += 1
    if checked == 0:
        pytest.skip(f"{path.name} holds no history")
    assert not misses, "; ".join(misses)


@needs_shared
@pytest.mark.parametrize("path", corpus())
def test_every_model_replays_every_device(path):
    """Every model, at a capacity like the trace's own (its peak, with room) and at a capacity
    below it, and the min_capacity search of the caching models: no exception."""
    for t in read_traces(path):
        own = max(t.peak_live(), t.recorded_peak_reserved() or 0)
        for cap in (own + own // 4 + GiB, own // 2 + 1):
            report = replay(t, ALLOCATORS, capacity=cap, min_capacity=False)
            assert list(report.results) == list(ALLOCATORS)
        report = replay(t, ["caching", "caching-expandable"], capacity=2 * own + GiB,
                        step=own // 8 + 1, min_capacity=True)
        for r in report.results.values():
            assert r.min_capacity is None or r.min_capacity <= 2 * own + GiB + own // 8 + 1
