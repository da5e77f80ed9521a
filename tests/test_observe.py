"""Leak tracking, metrics, Prometheus text, counting scopes, gpumm top, diagnosis."""

import json
import re
import time
import warnings

import pytest

import gpumm
from gpumm.cli import main
from gpumm.units import KiB, MiB


@pytest.fixture
def tracked(device):
    pool = gpumm.MemoryPool(device, name="t")
    gpumm.track(pool)
    yield pool
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        pool.close()


def make_activations(pool, n):
    return [pool.alloc(3 * MiB, tag="activations") for _ in range(n)]


def test_leaks_grouped_by_stack(tracked):
    kept = make_activations(tracked, 3)
    small = [tracked.alloc(1000) for _ in range(4)]
    for a in small[:2]:
        a.free()
    groups = tracked.leaks()
    assert groups[0].count == 3 and groups[0].bytes == 9 * MiB
    assert groups[0].tags == ["activations"] * 3
    assert any(name == "make_activations" for _, _, name in groups[0].stack)
    assert groups[1].count == 2 and groups[1].bytes == 2000
    for a in kept:
        a.free()
    assert [g.count for g in tracked.leaks()] == [2]


def test_audit(tracked, device):
    before = tracked.alloc(100)
    with tracked.audit() as a:
        x = tracked.alloc(5000)
        y = tracked.alloc(6000)
        y.free()
    assert [g.bytes for g in a.leaks] == [5000] and a.leaked_bytes == 5000
    with pytest.raises(gpumm.LeakError, match="1 allocation"):
        with tracked.audit(raise_on_leak=True):
            tracked.alloc(7)
    untracked = gpumm.MemoryPool(device)
    with untracked.audit() as b:
        untracked.alloc(10)
    assert b.leaked_bytes == 10 and not untracked.is_tracking  # audit tracks only inside
    x.free()
    before.free()


def test_tags_and_scopes_reach_snapshots(tracked):
    a = tracked.alloc(1000, tag="kv")
    with tracked.scope(name="step") as s:
        b = tracked.alloc(2000)
        snap = tracked.snapshot()
        tags = {x["ptr"]: x.get("tag") for x in snap["allocations"]}
        assert tags[a.ptr] == "kv" and tags[b.ptr] == "step"
        assert all(x["frames"] for x in snap["allocations"])


def test_close_with_live_allocations_warns_with_stacks(device):
    pool = gpumm.MemoryPool(device)
    gpumm.track(pool)
    make_activations(pool, 2)
    with pytest.warns(ResourceWarning, match="(?s)2 live allocation.*make_activations"):
        pool.close()


def test_tracking_is_off_by_default(pool):
    pool.alloc(100)
    assert pool.leaks() == [] and not pool.is_tracking


def test_metrics_and_prometheus(device):
    pool = gpumm.MemoryPool(device, name='my"pool', max_size="8MiB")
    pool.alloc(3 * MiB)
    with pytest.raises(gpumm.OutOfMemoryError):
        pool.alloc(7 * MiB)
    m = pool.metrics()
    assert m["allocs"] == 1 and m["failures"] == 1 and m["success_rate"] == 0.5
    assert m["live_by_size"] == [(4 * MiB, 1, 3 * MiB)]
    text = gpumm.metrics_text()
    assert "# TYPE gpumm_live_bytes gauge" in text and "# TYPE gpumm_allocs_total counter" in text
    line = next(l for l in text.splitlines() if l.startswith("gpumm_live_bytes{") and 'my\\"pool' in l)
    assert line.endswith(f" {3 * MiB}")
    other = gpumm.MemoryPool(device, name="cached")
    keep = other.alloc(1000)  # (so that the 4 KiB block is not alone in its heap page)
    for _ in range(2):  # the first free waits for the second request of its size
        other.alloc(4096).free()
    hits = next(l for l in gpumm.metrics_text().splitlines()
                if l.startswith("gpumm_cache_hits_total{") and 'cached' in l)
    keep.free()
    assert hits.endswith(" 1")
    # every sample line is name{labels} value
    for l in text.splitlines():
        if not l.startswith("#"):
            assert re.fullmatch(r'gpumm_\w+\{(\w+="(?:[^"\\]|\\.)*",?)+\} [0-9.e+-]+', l), l
    pool.close()
    assert 'my\\"pool' not in gpumm.metrics_text()  # closed pools leave the exposition


def test_counting_scopes_nest(pool):
    pool.alloc(100)
    pool.push_counters()
    pool.alloc(200)
    with pool.counting() as inner:
        pool.alloc(300).free()
    outer = pool.pop_counters()
    assert (inner["allocs"], inner["frees"]) == (1, 1)
    assert (outer["allocs"], outer["frees"]) == (2, 1)
    with pytest.raises(gpumm.InvalidStateError):
        pool.pop_counters()


def test_publish_and_top(tmp_path, device, capsys):
    pool = gpumm.MemoryPool(device, name="served")
    pool.alloc(5 * MiB)
    path = str(tmp_path / "metrics.json")
    stop = gpumm.publish(path, interval=0.05)
    for _ in range(100):
        try:
            with open(path) as f:
                data = json.load(f)
            if any(p["name"] == "served" for p in data["pools"]):
                break
        except (OSError, ValueError):
            pass
        time.sleep(0.02)
    stop.set()
    assert main(["top", path, "--once"]) == 0
    out = capsys.readouterr().out
    assert "served" in out and "5 MiB" in out
    assert main(["top", str(tmp_path / "nothing.json"), "--once"]) == 2


def test_pool_diagnosis_and_oom_attributes(device):
    pool = gpumm.MemoryPool(device, max_size="16MiB")
    gpumm.track(pool)
    held = [pool.alloc(3 * MiB) for _ in range(4)]
    heap = [pool.alloc(64 * KiB, movable=True) for _ in range(32)]
    for a in heap[1:]:
        a.free()
    with pytest.raises(gpumm.OutOfMemoryError) as e:
        pool.alloc(8 * MiB)
    err = e.value
    assert err.requested == 8 * MiB and err.live == 12 * MiB + 64 * KiB
    assert err.reserved == pool.stats()["reserved_bytes"] and err.largest_request < 8 * MiB
    assert "Diagnosis:" in str(err) and "does not fit" in str(err)
    lines = err.diagnosis.lines()
    assert any("heap page" in l for l in lines)
    assert any("stack holding the most" in l for l in lines)
    d = pool.diagnose("1MiB")
    assert "fits now" in d.lines()[0]
    other = gpumm.MemoryPool(device)
    other.alloc(30 * MiB).free()  # 30 MiB cached in another pool of the same device
    d = gpumm.MemoryPool(device, max_size="48MiB").diagnose("40MiB")
    assert "trim() them" in d.lines()[0]
    for a in held:
        a.free()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        pool.close()


def test_diagnosis_tells_full_movable_pages_from_none(device):
    pool = gpumm.MemoryPool(device, max_size="8MiB")
    full = [pool.alloc(64 * KiB, movable=True) for _ in range(32)]  # one heap page, full
    fixed = pool.alloc(64 * KiB)  # a second heap page, with an allocation that may not move
    lines = pool.diagnose("8MiB").lines()
    assert any("the 1 holding only movable allocations have no room" in l for l in lines), lines
    assert not any("no heap page holds only movable" in l for l in lines), lines
    # with none that may move
    other = gpumm.MemoryPool(device, max_size="8MiB")
    pinned = [other.alloc(64 * KiB) for _ in range(32)]
    lines = other.diagnose("8MiB").lines()
    assert any("no heap page holds only movable" in l for l in lines), lines
    for a in full + pinned + [fixed]:
        a.free()


def test_doctor_cli(tmp_path, capsys):
    csv = tmp_path / "t.csv"
    rows = ["Thread,Time,Action,Pointer,Size,Stream"]
    for i in range(30):
        rows.append(f"1,00:00:00.{i:06d},allocate,{0x1000 * (i + 1):#x},{3 * MiB},0x0")
    rows.append("1,00:00:01.000000,allocate failure,0x0,99999999,0x0")
    csv.write_text("\n".join(rows) + "\n")
    assert main(["doctor", str(csv)]) == 0
    out = " ".join(capsys.readouterr().out.split())  # as words: rich wraps at 80 columns
    assert "1 allocation failure" in out and "peak live 90 MiB" in out
    assert "95.37 MiB requested" in out and "at event 30 of 31" in out
    assert main(["doctor", str(tmp_path / "missing")]) == 2
