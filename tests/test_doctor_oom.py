"""The doctor reads the recorded out-of-memory failure: it names its device and size, gives the
state at that moment from the caching model's replay, replays each candidate fix, and never
recommends a setting the snapshot already had (the 3-GPU snapshot ran with
expandable_segments:True)."""

import pytest

from gpumm.doctor import diagnose_file, diagnose_trace
from gpumm.oom import live_at, recorded_reserved_at, state_at_oom, try_fix
from gpumm.replay import recorded_options
from gpumm.traces import read_traces
from gpumm.units import format_size

from shared_traces import TRACES, needs_shared

QWEN3 = TRACES / "wild" / "code_location_qwen3_train.pickle"


@pytest.fixture(scope="module")
def dev1():
    return next(t for t in read_traces(QWEN3) if t.device == 1)


@needs_shared
def test_doctor_names_the_oom_with_device_and_size(dev1):
    oom = dev1.recorded_ooms()[0]
    d = diagnose_trace(dev1, capacity="80GB")
    text = "\n".join(d.lines())
    assert "device 1" in text and format_size(oom["size"]) in text
    assert any(line.startswith("at the failure (device 1, stream 0") for line in d.lines())


@needs_shared
def test_state_at_the_failure(dev1):
    oom = dev1.recorded_ooms()[0]
    st = state_at_oom(dev1, oom)
    # live memory counted from the events themselves
    assert st.live == sum(s for s, _ in live_at(dev1, oom["index"]))
    assert st.live > 0 and st.size == oom["size"]
    assert st.recorded_reserved == recorded_reserved_at(dev1, oom["index"]) > 0
    assert 0 <= st.largest_free <= st.cached_free <= st.reserved
    # the largest holder is a line of the job's own code, not the unwinder
    key = st.holders[0][0]
    assert key.startswith("train/") and "unwind" not in key


@needs_shared
def test_fixes_are_replayed(dev1):
    """A fix is judged by replaying: a device that holds everything serves the request, one no
    larger than live memory does not."""
    oom = dev1.recorded_ooms()[0]
    st = state_at_oom(dev1, oom)
    opts = recorded_options(dev1, None)
    assert try_fix(dev1, oom, "caching", opts, 1 << 40) is True
    assert try_fix(dev1, oom, "caching", opts, st.live) is False
    assert try_fix(dev1, oom, "gpumm", {}, st.live) is False


@needs_shared
def test_too_much_live_memory_is_said(dev1):
    d = diagnose_trace(dev1, capacity="80GB")
    st = state_at_oom(dev1, dev1.recorded_ooms()[0])
    if st.live + st.size > 80 * 10**9:
        assert any(line.startswith("no allocator setting serves it") for line in d.lines())


@needs_shared
def test_never_recommends_a_recorded_setting():
    for d in diagnose_file(str(QWEN3), capacity="80GB"):
        for f in d.findings:
            if f.kind == "remedy":
                assert "with expandable_segments" not in f.text, f.text
                assert "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True would" not in f.text


@needs_shared
def test_every_corpus_oom_is_named():
    """Every snapshot of the corpus with a recorded failure: the doctor names it."""
    files = sorted(TRACES.glob("*.pickle")) + sorted((TRACES / "wild").glob("*.pickle"))
    seen = 0
    for path in files:
        for t in read_traces(path):
            for oom in t.recorded_ooms()[:1]:
                seen += 1
                text = "\n".join(diagnose_trace(t).lines())
                assert f"device {t.device}" in text and format_size(oom["size"]) in text
    assert seen >= 1


def _two_tensors():
    """4 MiB, then 6.25 MiB while it is live: peak live 10.25 MiB."""
    from gpumm.traces import Event, Trace
    from gpumm.units import MiB

    sizes = [4 * MiB, 6 * MiB + 256 * 1024]
    events = [Event("alloc", 0x1000 * (i + 1), s, 0, i) for i, s in enumerate(sizes)]
    events += [Event("free", 0x1000 * (i + 1), s, 0, 10 + i) for i, s in enumerate(sizes)]
    return Trace(events, "two.csv", format="rmm")


def test_a_device_too_small_for_the_pool_is_said():
    """On a device smaller than the pool needs, the doctor says gpumm's pool fails there and
    what it needs, and does not set the peak it reached before failing against the plan (it
    said "gpumm's pool reserves 4 MiB (0.3902 × the bound, 6.25 MiB below the plan)")."""
    text = [f.text for f in diagnose_trace(_two_tensors(), "8MiB").findings]
    fails = [line for line in text if "gpumm's pool fails" in line]
    assert len(fails) == 1 and "1 request" in fails[0] and "8 MiB" in fails[0], text
    assert "12 MiB" in fails[0], fails  # its smallest capacity, the search's
    assert not any("below the plan" in line or "gpumm's pool reserves" in line for line in text)
    assert not any("gpumm's pool fails" in f.text for f in diagnose_trace(_two_tensors()).findings)


def test_the_least_device_it_names_runs_the_trace():
    """"No allocator can need less than X": X is what the driver model needs, not its smallest
    capacity to the search's step (2 MiB here, 1 % of peak live on a large trace). Peak live
    10.25 MiB: a device of that much (in 512 B blocks) runs the driver model, so X is no more."""
    from gpumm.replay import replay
    from gpumm.units import MiB, parse_size

    t = _two_tensors()
    line = next(f.text for f in diagnose_trace(t).findings if "can need less than" in f.text)
    named = parse_size(line.split("can need less than ")[1].split(" of device")[0].replace(" ", ""))
    enough = -(-t.peak_live() // 512) * 512
    assert not replay(t, ["driver"], capacity=enough, min_capacity=False).results["driver"].ooms
    assert t.peak_live() - MiB // 100 <= named <= enough + MiB // 100, line


def test_a_job_that_would_fail_on_the_device_gets_each_fix_replayed():
    """No failure recorded, but on the device given (``--capacity``) PyTorch's allocator with
    the trace's settings fails: the doctor says so first, with what it needs, then replays
    each candidate fix over the whole trace on that device and says which serve it. On the
    shipped trace at 4,500 MiB: the defaults need 4,664, expandable segments 4,400 and
    gpumm's pool 4,356 (all three searched here, not written in)."""
    from gpumm.cli import demo_trace_path
    from gpumm.replay import replay
    from gpumm.traces import read_trace

    t = read_trace(demo_trace_path())
    need = replay(t, ["caching", "caching-expandable", "gpumm"], planned=False).results
    cap = 4500 << 20
    assert need["caching-expandable"].min_capacity <= cap < need["caching"].min_capacity
    assert need["gpumm"].min_capacity <= cap
    text = [f.text for f in diagnose_trace(t, "4500MiB", planned=False).findings]
    assert text[0].startswith("on a device of 4.39 GiB PyTorch's caching allocator "
                              "(PyTorch's defaults) fails"), text
    assert f"it needs {format_size(need['caching'].min_capacity)}" in text[0], text
    serves = [line for line in text if "serves every request" in line]
    assert any("expandable_segments:True" in line for line in serves), text
    assert any("gpumm's pool" in line for line in serves), text
    assert any("max_split_size_mb:512 would also fail" in line for line in text), text
    # on the default device (80 GiB) nothing fails, and none of this is said
    assert not any("fails" in f.text or "serves every" in f.text
                   for f in diagnose_trace(t, planned=False).findings)
