"""PyTorch snapshot reader: real snapshots from ../shared/traces, hostile and broken pickles,
the profiler JSON reader, the writers, and format detection."""

import gzip
import json
import os
import pickle
import pickletools

import pytest

import gpumm
from gpumm.errors import TraceFormatError
from gpumm.replay import replay
from gpumm.traces import (load_snapshot, read_profiler_json, read_rmm_csv, read_snapshot,
                          read_trace, write_rmm_csv, write_snapshot)
from gpumm.units import GiB, MiB

from shared_traces import TRACES, needs_shared

# name: (allocations, start live GiB, peak live GiB, PyTorch's peak reserved / peak live)
SNAPSHOTS = {
    "compile_train": (2162, 2.85, 3.585, 1.101),
    "cs336_ctx128_forward": (3113, 12.69, 16.394, 1.016),
    "magma_train": (1721, 1.28, 12.968, 1.018),
    "forward_bf16": (937, 0.49, 0.726, 1.105),
}


@needs_shared
@pytest.mark.parametrize("name", SNAPSHOTS)
def test_real_snapshots_with_history(name):
    allocs, start_live, peak, torch_ratio = SNAPSHOTS[name]
    t = read_snapshot(TRACES / f"{name}.pickle")
    assert t.format == "snapshot" and t.has_history
    assert t.num_allocs == allocs
    assert t.start.live_bytes / GiB == pytest.approx(start_live, abs=0.01)
    assert t.peak_live() / GiB == pytest.approx(peak, abs=0.001)
    assert t.recorded_peak_reserved() / t.peak_live() == pytest.approx(torch_ratio, abs=0.001)
    # stacks are kept for reports
    assert t.frames and any(e.frames >= 0 for e in t.events)
    # the start state is consistent: every live block lies in a start segment
    segs = sorted(t.start.segments)
    for addr, req, bsize, _ in t.start.blocks:
        assert any(s <= addr and addr + bsize <= s + n for s, n, _ in segs), hex(addr)


@needs_shared
@pytest.mark.parametrize("name, live_gib, torch_ratio",
                         [("oom_state", 11.03, 1.000), ("opt13_state", 3.61, 1.716)])
def test_real_snapshots_state_only(name, live_gib, torch_ratio):
    t = read_snapshot(TRACES / f"{name}.pickle")
    assert not t.has_history and t.num_allocs == 0
    assert t.start.live_bytes / GiB == pytest.approx(live_gib, abs=0.01)
    assert t.start.reserved_bytes / t.start.live_bytes == pytest.approx(torch_ratio, abs=0.002)


class Evil:
    """Pickles to a call of os.system: a snapshot from a stranger must never run it."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


class Call:
    """Pickles to ``fn(*args)``."""

    def __init__(self, fn, *args):
        self.fn, self.args = fn, args

    def __reduce__(self):
        return (self.fn, self.args)


def evil_pickles(marker):
    """Pickles that try to import and call something, in old and new protocols."""
    import builtins
    import subprocess

    yield "os.system", pickle.dumps({"segments": [], "x": Evil(marker)}), "system"
    yield "subprocess.call", pickle.dumps(Call(subprocess.call, ["touch", str(marker)])), "subprocess"
    yield "builtins.eval", pickle.dumps(Call(builtins.eval, "1+1"), protocol=0), "_builtin.*eval"
    yield "builtins.exec", pickle.dumps([Call(builtins.exec, "open('x','w')")], protocol=2), "_builtin.*exec"
    yield "a bare global", pickle.dumps(os.getcwd, protocol=4), "getcwd"


def test_hostile_pickles_are_refused_and_never_run(tmp_path):
    marker = tmp_path / "pwned"
    for what, data, name in evil_pickles(marker):
        p = tmp_path / "evil.pickle"
        p.write_bytes(data)
        with pytest.raises(TraceFormatError, match=f"refused to load the global .*{name}"):
            read_snapshot(p)
        with pytest.raises(TraceFormatError):
            read_trace(p)
        assert not marker.exists(), f"{what}: code ran"
    # the first one really does name its global
    p.write_bytes(pickle.dumps({"segments": [], "x": Evil(marker)}))
    with pytest.raises(TraceFormatError, match="posix.system|os.system"):
        load_snapshot(p)


def small_snapshot():
    seg = 0x7F0000000000
    return {
        "segments": [{"device": 0, "address": seg, "total_size": 2 * MiB, "stream": 0,
                      "segment_type": "small",
                      "blocks": [{"address": seg, "size": 1024, "requested_size": 1000,
                                  "state": "active_allocated"},
                                 {"address": seg + 1024, "size": 2 * MiB - 1024,
                                  "requested_size": 0, "state": "inactive"}]}],
        "device_traces": [[
            {"action": "alloc", "addr": seg + 1024, "size": 100, "stream": 0, "time_us": 10,
             "frames": [{"filename": "train.py", "line": 3, "name": "step"}]},
            {"action": "free_requested", "addr": seg + 1024, "size": 100, "stream": 0},
            {"action": "free_completed", "addr": seg + 1024, "size": 100, "stream": 0},
            {"action": "alloc", "addr": seg, "size": 1000, "stream": 0, "time_us": 20},
        ]],
    }


def test_rewinds_to_the_start(tmp_path):
    p = tmp_path / "s.pickle"
    p.write_bytes(pickle.dumps(small_snapshot()))
    t = read_snapshot(p)
    assert [e.action for e in t.events] == ["alloc", "free", "alloc"]
    assert t.start.segments == [(0x7F0000000000, 2 * MiB, 0)]
    assert t.start.blocks == []  # the 1000 B block was allocated inside the history
    assert t.frames == [["train.py:3:step"]] and t.events[0].frames == 0
    assert t.peak_live() == 1000 and t.recorded_peak_reserved() == 2 * MiB


def test_annotations_are_read_past(tmp_path):
    """Recent PyTorch (2.15 documents it) writes an ``annotate`` entry where metadata is
    attached to a live allocation (``_annotate_tensor``, ``global_record_annotations``); it
    changes no memory. Both readers of an entry (the compact row, and the general one for a field of another
    type) read past it."""
    snap = small_snapshot()
    seg = 0x7F0000000000
    snap["device_traces"][0].insert(1, {"action": "annotate", "addr": seg + 1024, "size": 100,
                                        "stream": 0, "time_us": 11, "user_metadata": "step 3"})
    snap["device_traces"][0].append({"action": "annotate", "addr": seg, "stream": 0,
                                     "time_us": "late", "user_metadata": {"k": 1}})
    p = tmp_path / "a.pickle"
    p.write_bytes(pickle.dumps(snap))
    t = read_snapshot(p)
    assert [e.action for e in t.events] == ["alloc", "free", "alloc"]
    assert t.peak_live() == 1000
    plain = tmp_path / "plain.pickle"
    plain.write_bytes(pickle.dumps(small_snapshot()))
    for name in ("gpumm", "caching"):
        a, b = (replay(read_snapshot(f), [name], capacity="1GiB").results[name] for f in (p, plain))
        assert (a.peak_reserved, a.ooms, a.address_match) == (b.peak_reserved, b.ooms, b.address_match)


def _without(snap, action):
    """``snap`` as ``_record_memory_history(skip_actions=[action])`` records it."""
    out = dict(snap)
    out["device_traces"] = [[e for e in d if e["action"] != action] for d in snap["device_traces"]]
    return out


def test_a_history_without_free_completed_frees_at_free_requested(tmp_path):
    """``_record_memory_history(skip_actions=["free_completed"])`` records no
    ``free_completed``: the memory is freed at ``free_requested`` instead of never, in the
    compact rows and in entries read by the general path (a field of another type). Where
    both are recorded, a block is freed at ``free_completed``, even one requested earlier."""
    seg = 0x7F0000000000
    snap = small_snapshot()
    p = tmp_path / "s.pickle"
    p.write_bytes(pickle.dumps(_without(snap, "free_completed")))
    t = read_snapshot(p)
    assert [(e.action, e.ptr) for e in t.events] == \
        [("alloc", seg + 1024), ("free", seg + 1024), ("alloc", seg)]
    assert t.peak_live() == 1000
    general = _without(snap, "free_completed")
    general["device_traces"][0][1]["time_us"] = "late"  # not an int: the general reader
    p.write_bytes(pickle.dumps(general))
    assert [e.action for e in read_snapshot(p).events] == ["alloc", "free", "alloc"]
    # both recorded, the completion late (a block used on another stream): freed there
    late = small_snapshot()
    hist = late["device_traces"][0]
    hist.insert(3, hist.pop(2))  # free_completed after the second alloc
    p.write_bytes(pickle.dumps(late))
    assert [e.action for e in read_snapshot(p).events] == ["alloc", "alloc", "free"]
    assert read_snapshot(p).peak_live() == 1100


@needs_shared
@pytest.mark.parametrize("name", ["compile_train", "forward_bf16"])
def test_a_real_history_without_free_completed_replays_as_recorded(tmp_path, name):
    """Real snapshots whose blocks are freed as soon as requested: recorded without
    ``free_completed`` they read to the same events, and every model reserves the same."""
    snap = load_snapshot(TRACES / f"{name}.pickle")
    p = tmp_path / "s.pickle"
    p.write_bytes(pickle.dumps(_without(snap, "free_completed")))
    got, want = read_snapshot(p), read_snapshot(TRACES / f"{name}.pickle")
    assert [(e.action, e.ptr, e.size) for e in got.events] == \
        [(e.action, e.ptr, e.size) for e in want.events]
    models = ["gpumm", "caching", "cupy"]
    a, b = (replay(t, models, capacity="80GiB").results for t in (got, want))
    assert [a[m].peak_reserved for m in models] == [b[m].peak_reserved for m in models]


def _zip_as_torch_save(path, payload: bytes, compress: bool = False):
    """``torch.save``'s layout: a zip whose ``<name>/data.pkl`` is the pickle, with the
    ``<name>/version`` and ``<name>/byteorder`` records beside it."""
    import zipfile

    how = zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED
    with zipfile.ZipFile(path, "w", compression=how) as z:
        z.writestr("snap/version", "3\n")
        z.writestr("snap/data.pkl", payload)
        z.writestr("snap/byteorder", "little")


def test_a_snapshot_gzipped_or_saved_with_torch_save_reads_as_the_pickle(tmp_path):
    """Users gzip a snapshot to share it, or save ``_snapshot()`` with ``torch.save`` (a zip
    holding ``data.pkl``): both read as the pickle itself, by every reader and the CLI."""
    raw = pickle.dumps(small_snapshot())
    plain = tmp_path / "s.pickle"
    plain.write_bytes(raw)
    gz = tmp_path / "s.pickle.gz"
    gz.write_bytes(gzip.compress(raw))
    stored, deflated = tmp_path / "s.pt", tmp_path / "d.pt"
    _zip_as_torch_save(stored, raw)
    _zip_as_torch_save(deflated, raw, compress=True)
    want = read_snapshot(plain)
    for f in (gz, stored, deflated):
        t = gpumm.traces.read_trace(f)
        assert [(e.action, e.ptr, e.size) for e in t.events] == \
            [(e.action, e.ptr, e.size) for e in want.events]
        assert t.start.segments == want.start.segments and t.frames == want.frames
        assert load_snapshot(f) == small_snapshot()
        assert len(gpumm.traces.read_traces(f)) == 1
    # a zip without a pickle, a gzip cut short: a clear error, naming what is missing
    import zipfile

    empty = tmp_path / "e.pt"
    with zipfile.ZipFile(empty, "w") as z:
        z.writestr("x/version", "3")
    with pytest.raises(TraceFormatError, match="data.pkl"):
        gpumm.traces.read_trace(empty)
    cut = tmp_path / "c.pickle.gz"
    cut.write_bytes(gz.read_bytes()[:-30])
    with pytest.raises(TraceFormatError):
        gpumm.traces.read_trace(cut)


def test_a_snapshot_written_as_json_reads_as_the_pickle(tmp_path):
    """``json.dump(torch.cuda.memory._snapshot(), f)``, plain or gzipped, reads as the pickle
    of the same dict; JSON cut short is a clear error, and so is a snapshot whose keys are in
    an order that tells it from a profiler trace only once read whole."""
    want = read_snapshot(_write(tmp_path / "s.pickle", pickle.dumps(small_snapshot())))
    text = json.dumps(small_snapshot())
    plain = _write(tmp_path / "s.json", text.encode())
    gz = _write(tmp_path / "s.json.gz", gzip.compress(b"  \n" + text.encode()))
    for f in (plain, gz):
        t = gpumm.traces.read_trace(f)
        assert t.format == "snapshot"
        assert [(e.action, e.ptr, e.size) for e in t.events] == \
            [(e.action, e.ptr, e.size) for e in want.events]
        assert t.start.segments == want.start.segments and t.frames == want.frames
        assert load_snapshot(f) == json.loads(text)
    cut = _write(tmp_path / "c.json", text[:-20].encode())
    with pytest.raises(TraceFormatError, match="not readable JSON"):
        gpumm.traces.read_trace(cut)
    deep = _write(tmp_path / "d.json", b'{"segments": ' + b"[" * 100_000)
    with pytest.raises(TraceFormatError, match="not readable JSON"):
        gpumm.traces.read_trace(deep)
    other = _write(tmp_path / "o.json", json.dumps(
        {"user": 1, **small_snapshot()}).encode())
    with pytest.raises(TraceFormatError, match="written as JSON.*read_snapshot"):
        gpumm.traces.read_trace(other)
    assert read_snapshot(other).peak_live() == want.peak_live()


def _write(path, data: bytes):
    path.write_bytes(data)
    return path


@needs_shared
def test_a_real_snapshot_written_as_json_replays_as_its_pickle(tmp_path):
    snap = load_snapshot(TRACES / "forward_bf16.pickle")
    p = _write(tmp_path / "s.json", json.dumps(snap).encode())
    got, want = read_snapshot(p), read_snapshot(TRACES / "forward_bf16.pickle")
    assert [(e.action, e.ptr, e.size, e.frames) for e in got.events] == \
        [(e.action, e.ptr, e.size, e.frames) for e in want.events]
    assert got.frames == want.frames and got.settings == want.settings


def test_truncated_and_corrupt_snapshots(tmp_path):
    good = pickle.dumps(small_snapshot())
    p = tmp_path / "t.pickle"
    for cut in range(0, len(good), max(1, len(good) // 40)):
        p.write_bytes(good[:cut])
        with pytest.raises(TraceFormatError):
            read_snapshot(p)
    bad = small_snapshot()
    bad["segments"][0]["total_size"] = -5
    p.write_bytes(pickle.dumps(bad))
    with pytest.raises(TraceFormatError, match=r"segments\[0\].*total_size"):
        read_snapshot(p)
    bad = small_snapshot()
    bad["device_traces"][0][1]["action"] = "teleport"
    p.write_bytes(pickle.dumps(bad))
    with pytest.raises(TraceFormatError, match=r"device_traces\[0\]\[1\].*teleport"):
        read_snapshot(p)
    p.write_bytes(pickle.dumps([1, 2, 3]))
    with pytest.raises(TraceFormatError, match="not a PyTorch memory snapshot"):
        read_snapshot(p)


def profiler_events():
    mem = lambda addr, nbytes, ts, dev=1: {  # noqa: E731
        "ph": "i", "name": "[memory]", "ts": ts, "pid": 1, "tid": 1,
        "args": {"Addr": addr, "Bytes": nbytes, "Total Allocated": 0, "Total Reserved": 0,
                 "Device Type": dev, "Device Id": 0}}
    return {"traceEvents": [
        {"ph": "X", "name": "aten::mm", "ts": 1.0, "dur": 2.0},
        mem(0x1000, 4096, 10.0), mem(0x3000, 512, 11.5), mem(0x1000, -4096, 20.0),
        mem(0x9000, 64, 12.0, dev=0),
    ]}


def test_profiler_json(tmp_path):
    p = tmp_path / "trace.json"
    p.write_text(json.dumps(profiler_events()))
    t = read_profiler_json(p)
    assert [(e.action, e.ptr, e.size) for e in t.events] == [
        ("alloc", 0x1000, 4096), ("alloc", 0x3000, 512), ("free", 0x1000, 4096)]
    assert read_profiler_json(p, device_type=0).num_allocs == 1
    gz = tmp_path / "trace.json.gz"
    gz.write_bytes(gzip.compress(p.read_bytes()))
    assert read_trace(gz).num_allocs == 2
    bad = profiler_events()
    del bad["traceEvents"][2]["args"]["Bytes"]
    p.write_text(json.dumps(bad))
    with pytest.raises(TraceFormatError, match=r"traceEvents\[2\]"):
        read_profiler_json(p)
    p.write_text('{"traceEvents": [')
    with pytest.raises(TraceFormatError, match="not readable JSON"):
        read_profiler_json(p)


def _memory_event(addr, nbytes, ts, dtype, did):
    return {"ph": "i", "name": "[memory]", "ts": ts, "pid": 1, "tid": 1,
            "args": {"Addr": addr, "Bytes": nbytes, "Total Allocated": 0, "Total Reserved": 0,
                     "Device Type": dtype, "Device Id": did}}


def test_a_gpu_profile_reads_every_cuda_device_not_the_cpu(tmp_path, capsys):
    """A GPU job's profile has the CPU's allocations beside each GPU's, often more of them:
    the CUDA devices are read, each a trace of its own (it read the type with the most
    events, here the CPU's, and of it device 0 only)."""
    from gpumm.cli import main
    from gpumm.traces import read_traces

    cpu = [_memory_event(0x10 * (i + 1), 64, float(i), 0, -1) for i in range(20)]
    gpu = [_memory_event(0x1000, 4096, 1.0, 1, 0), _memory_event(0x1000, -4096, 5.0, 1, 0),
           _memory_event(0x8000, 8192, 2.0, 1, 1), _memory_event(0x9000, 512, 3.0, 1, 1)]
    p = tmp_path / "gpu.pt.trace.json.gz"
    p.write_bytes(gzip.compress(json.dumps({"traceEvents": cpu + gpu}).encode()))
    ts = read_traces(p)
    assert [(t.device, t.num_allocs, t.peak_live()) for t in ts] == [(0, 1, 4096), (1, 2, 8704)]
    assert read_trace(p).device == 0 and read_trace(p, device=1).num_allocs == 2
    with pytest.raises(TraceFormatError, match="no memory event of device 3; it has devices 0, 1"):
        read_trace(p, device=3)
    assert read_profiler_json(p, device_type=0).num_allocs == 20
    assert main(["replay", str(p), "--no-min-capacity", "--no-plan", "--json", "-"]) == 0
    assert [d["device"] for d in json.loads(capsys.readouterr().out)["devices"]] == [0, 1]


def test_a_cpu_profile_reads_its_memory_events(tmp_path):
    """The CPU's memory events carry ``Device Id`` -1: a CPU-only profile is read as device
    0 (it read as empty, and the replay said "profile with profile_memory=True")."""
    from gpumm.traces import read_traces

    p = tmp_path / "cpu.json"
    p.write_text(json.dumps({"traceEvents": [
        _memory_event(0x10, 1024, 1.0, 0, -1), _memory_event(0x20, 2048, 2.0, 0, -1),
        _memory_event(0x10, -1024, 3.0, 0, -1)]}))
    (t,) = read_traces(p)
    assert (t.device, t.num_allocs, t.peak_live()) == (0, 2, 3072)
    assert read_trace(p, device=0).num_allocs == 2


def test_rmm_writer_round_trip(tmp_path):
    src = tmp_path / "a.csv"
    src.write_text("Thread,Time,Action,Pointer,Size,Stream\n"
                   "1,00:00:00.000001,allocate,0x1000,4096,0x0\n"
                   "2,00:00:01.250000,allocate failure,0x0,99999,0x7\n"
                   "1,00:01:02.000003,free,0x1000,4096,0x0\n")
    t = read_rmm_csv(src)
    for name in ("b.csv", "b.csv.gz"):
        write_rmm_csv(t, tmp_path / name)
        assert read_rmm_csv(tmp_path / name).events == t.events


def test_pool_snapshot_writer(tmp_path):
    pool = gpumm.MemoryPool(gpumm.Device(vidmem="64MiB"))
    # (the small one first: made after, it would take the large segment's free end; whole
    # pages, so that the heap page's free end saves it no page and it opens a large segment)
    b = pool.alloc(1000)
    a = pool.alloc(4 * MiB)
    p = tmp_path / "pool.pickle"
    write_snapshot(pool.snapshot(), p)
    data = load_snapshot(p)  # plain data: loads with the refusing unpickler
    assert {s["segment_type"] for s in data["segments"]} == {"small", "large"}
    t = read_snapshot(p)
    assert not t.has_history
    assert t.start.reserved_bytes == pool.stats()["reserved_bytes"]
    assert {blk[0] for blk in t.start.blocks} >= {a.ptr, b.ptr}
    # no pickle opcode in it names a global
    assert not any(op.name in ("GLOBAL", "STACK_GLOBAL", "REDUCE", "INST", "OBJ")
                   for op, _, _ in pickletools.genops(p.read_bytes()))


def test_read_trace_detects_formats(tmp_path):
    p = tmp_path / "x.bin"
    p.write_bytes(b"hello, world")
    with pytest.raises(TraceFormatError, match="not a known trace format"):
        read_trace(p)
    p.write_bytes(pickle.dumps(small_snapshot()))
    assert read_trace(p).format == "snapshot"
