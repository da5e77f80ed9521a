"""Every event kind and layout variant PyTorch's snapshots and RMM's logs have been written
in, each on a small file written here."""

import gzip
import pickle

import pytest

from gpumm.errors import TraceFormatError
from gpumm.replay import prepare
from gpumm.traces import load_snapshot, read_rmm_csv, read_snapshot, read_trace, read_traces
from gpumm.units import MiB

SEG = 0x7F0000000000


def write(tmp_path, data, protocol=4, name="s.pickle"):
    p = tmp_path / name
    p.write_bytes(pickle.dumps(data, protocol=protocol))
    return p


def seg(blocks, total=2 * MiB, addr=SEG, **kw):
    return {"device": 0, "address": addr, "total_size": total, "stream": 0, "blocks": blocks, **kw}


def ev(action, addr, size, t=0, **kw):
    return {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": t, **kw}


def test_expandable_segment_map_and_unmap_rewind_into_the_start(tmp_path):
    # final: 4 MiB mapped; the history mapped the upper 2 MiB and unmapped a further 2 MiB
    data = {"segments": [seg([], total=4 * MiB)], "device_traces": [[
        ev("segment_map", SEG + 2 * MiB, 2 * MiB),
        ev("segment_unmap", SEG + 4 * MiB, 2 * MiB),
    ]]}
    t = read_snapshot(write(tmp_path, data))
    assert [e.action for e in t.events] == ["segment_map", "segment_unmap"]
    # before the map only the lower 2 MiB and the (later unmapped) 2 MiB above the gap
    assert t.start.segments == [(SEG, 2 * MiB, 0), (SEG + 4 * MiB, 2 * MiB, 0)]
    assert t.recorded_peak_reserved() == 6 * MiB
    assert list(prepare(t).actions) == [4, 5]


def test_snapshot_entries_change_nothing(tmp_path):
    data = {"segments": [seg([])], "device_traces": [[
        ev("alloc", SEG, 512), {"action": "snapshot", "addr": 0, "size": 0},
        {"action": "snapshot"}, ev("free_completed", SEG, 512)]]}
    t = read_snapshot(write(tmp_path, data))
    assert [e.action for e in t.events] == ["alloc", "free"]


def test_oom_keeps_device_free(tmp_path):
    data = {"segments": [seg([])], "device_traces": [[
        ev("alloc", SEG, 512, 1),
        {"action": "oom", "size": 5 * MiB, "stream": 0, "time_us": 7, "device_free": 91 * MiB},
        {"action": "oom", "addr": None, "size": 6 * MiB, "time_us": 9, "frames": []},
    ]]}
    t = read_snapshot(write(tmp_path, data))
    ooms = t.recorded_ooms()
    assert [(o["index"], o["size"], o["device_free"]) for o in ooms] == [
        (1, 5 * MiB, 91 * MiB), (2, 6 * MiB, None)]
    assert ooms[0]["time_us"] == 6  # counted from the first event


def test_free_requested_without_free_completed_stays_live(tmp_path):
    # record_stream: the program let go, the allocator has not got the block back yet, and
    # the final state shows it waiting (active_pending_free)
    data = {"segments": [seg([{"address": SEG, "size": 1024, "requested_size": 1000,
                               "state": "active_pending_free"},
                              {"address": SEG + 1024, "size": 2 * MiB - 1024, "state": "inactive"}])],
            "device_traces": [[ev("alloc", SEG, 1000, 1), ev("free_requested", SEG, 1000, 2)]]}
    t = read_snapshot(write(tmp_path, data))
    assert [e.action for e in t.events] == ["alloc"]
    assert t.start.blocks == []
    p = prepare(t)
    assert list(p.actions) == [0] and p.peak_live == 1000  # never freed within the trace


def test_history_that_starts_mid_step_rebuilds_its_start(tmp_path):
    # two blocks allocated before the ring buffer's first entry, freed inside it; one of
    # them lived in a segment the history frees
    data = {"segments": [seg([])], "device_traces": [[
        ev("free_completed", SEG + 4096, 3000, 1),
        ev("free_completed", SEG + 8 * MiB, 100, 2),
        ev("segment_free", SEG + 8 * MiB, 2 * MiB, 3),
        ev("alloc", SEG, 512, 4),
    ]]}
    t = read_snapshot(write(tmp_path, data))
    assert t.start.blocks == [(SEG + 4096, 3000, 3072, 0), (SEG + 8 * MiB, 100, 512, 0)]
    assert t.start.segments == [(SEG, 2 * MiB, 0), (SEG + 8 * MiB, 2 * MiB, 0)]
    assert t.peak_live() == 3100
    p = prepare(t)
    assert list(p.actions) == [1, 1, 3, 0] and list(p.ids[:2]) == [0, 1]


def test_older_layouts(tmp_path):
    # no time_us, blocks without address or requested_size, a segment without device,
    # the documented state name active_awaiting_free, protocol 2
    data = {"segments": [{"address": SEG, "total_size": 2 * MiB,
                          "blocks": [{"size": 1024, "state": "active_allocated"},
                                     {"size": 512, "state": "active_awaiting_free"},
                                     {"size": 2 * MiB - 1536, "state": "inactive"}]}],
            "device_traces": [[{"action": "alloc", "addr": SEG + 1536, "size": 64, "stream": 0}]]}
    t = read_snapshot(write(tmp_path, data, protocol=2))
    assert t.events[0].time_us == 0
    assert t.start.blocks == [(SEG, 1024, 1024, 0), (SEG + 1024, 512, 512, 0)]
    # a snapshot with no device_traces at all: state only
    t = read_snapshot(write(tmp_path, {"segments": data["segments"]}, protocol=0))
    assert not t.has_history and len(t.events) == 0


def test_a_bare_list_of_segments_reads_as_a_state(tmp_path):
    # torch.cuda.memory_snapshot() returns the segments list itself
    p = write(tmp_path, [seg([{"address": SEG, "size": 4096, "state": "active_allocated"}])])
    t = read_trace(p)
    assert t.format == "snapshot" and not t.has_history
    assert t.start.blocks == [(SEG, 4096, 4096, 0)]
    assert load_snapshot(p)["segments"][0]["address"] == SEG


def test_allocator_settings_and_external_annotations(tmp_path):
    data = {"segments": [seg([]), seg([], addr=SEG * 2, device=1)],
            "device_traces": [[ev("alloc", SEG, 512, 5)], [ev("alloc", SEG * 2, 512, 5)]],
            "allocator_settings": {"expandable_segments": True, "max_split_size": -1,
                                   "roundup_power2_divisions": {"1": 4}},
            "external_annotations": [{"device": 0, "stage": "START", "name": "fwd", "time_us": 5},
                                     {"device": 1, "stage": "END", "name": "bwd", "time_us": 6}]}
    ts = read_traces(write(tmp_path, data))
    assert [t.device for t in ts] == [0, 1]
    assert ts[0].settings["expandable_segments"] is True
    assert [a["name"] for a in ts[0].annotations] == ["fwd"]
    assert [a["name"] for a in ts[1].annotations] == ["bwd"]


def test_windows_paths_in_frames(tmp_path):
    frames = [{"filename": "C:\\Users\\me\\train.py", "line": 12, "name": "step"},
              {"filename": "D:\\a\\torch\\nn\\modules\\linear.py", "line": 125, "name": "forward"}]
    data = {"segments": [seg([])], "device_traces": [[ev("alloc", SEG, 512, frames=frames)]]}
    t = read_snapshot(write(tmp_path, data))
    stack = t.frames[t.events[0].frames]
    assert stack[0] == "C:\\Users\\me\\train.py:12:step"
    assert stack[1].rsplit(":", 2) == ["D:\\a\\torch\\nn\\modules\\linear.py", "125", "forward"]


def test_frames_are_interned_across_entries(tmp_path):
    f = [{"filename": "m.py", "line": 1, "name": "f"}]
    data = {"segments": [seg([])], "device_traces": [[
        ev("alloc", SEG, 512, frames=[dict(x) for x in f]),
        ev("alloc", SEG + 512, 512, frames=[dict(x) for x in f]),
        ev("alloc", SEG + 1024, 512, frames=[{"filename": "m.py", "line": 2, "name": "f"}])]]}
    t = read_snapshot(write(tmp_path, data))
    assert [e.frames for e in t.events] == [0, 0, 1]
    assert t.frames == [["m.py:1:f"], ["m.py:2:f"]]


def test_an_entry_of_unusual_types_reads_as_before(tmp_path):
    # a string time and a float stream: read as 0, as the reader always has; a string size
    # is refused naming the entry
    data = {"segments": [seg([])], "device_traces": [[
        {"action": "alloc", "addr": SEG, "size": 512, "stream": 1.5, "time_us": "x"}]]}
    t = read_snapshot(write(tmp_path, data))
    assert (t.events[0].stream, t.events[0].time_us) == (0, 0)
    data["device_traces"][0].append({"action": "alloc", "addr": SEG, "size": "512"})
    with pytest.raises(TraceFormatError, match=r"device_traces\[0\]\[1\].*'size'"):
        read_snapshot(write(tmp_path, data))


RMM_HEADER = "Thread,Time,Action,Pointer,Size,Stream\n"


def test_rmm_allocate_failure_rows(tmp_path):
    p = tmp_path / "r.csv"
    p.write_text(RMM_HEADER + "7,00:00:01.000001,allocate,0x1000,64,0x0\n"
                 "7,00:00:01.000002,allocate failure,(nil),1073741824,0x0\n"
                 "7,00:00:01.000003,allocate failure,0x0,2048,0x0\n"
                 "7,00:00:01.000004,free,0x1000,64,0x0\n")
    t = read_rmm_csv(p)
    assert [e.action for e in t.events] == ["alloc", "alloc_failed", "alloc_failed", "free"]
    assert [o["size"] for o in t.recorded_ooms()] == [1 << 30, 2048]
    assert list(prepare(t).actions) == [0, 1]


def test_rmm_hex_and_decimal_pointers_and_streams(tmp_path):
    p = tmp_path / "r.csv"
    p.write_text(RMM_HEADER + "1,00:00:00.1,allocate,0x7f00dead0000,64,0x5599aa\n"
                 "1,00:00:00.2,allocate,7f00dead1000,64,0\n"
                 "1,00:00:00.3,allocate,139637976514560,64,94098474\n")
    e = read_rmm_csv(p).events
    assert [x.ptr for x in e] == [0x7F00DEAD0000, 0x7F00DEAD1000, 139637976514560]
    assert [x.stream for x in e] == [0x5599AA, 0, 94098474]


def test_rmm_several_threads_and_streams(tmp_path):
    p = tmp_path / "r.csv.gz"
    p.write_bytes(gzip.compress((RMM_HEADER + "11,00:00:00.1,allocate,0x1000,64,0x1\n"
                                 "22,00:00:00.2,allocate,0x2000,64,0x2\n"
                                 "22,00:00:00.3,free,0x1000,64,0x1\n").encode()))
    t = read_rmm_csv(p)
    assert [(e.thread, e.stream) for e in t.events] == [(11, 1), (22, 2), (22, 1)]
    assert list(prepare(t).streams) == [1, 2, 1]


def test_rmm_either_time_format(tmp_path):
    p = tmp_path / "r.csv"
    p.write_text(RMM_HEADER + "1,13:45:10.250000,allocate,0x1000,64,0x0\n"
                 "1,13:45:10,free,0x1000,64,0x0\n"
                 "1,1700000000.5,allocate,0x1000,64,0x0\n"       # seconds since the epoch
                 "1,1700000000500001,free,0x1000,64,0x0\n"       # microseconds
                 "1,1700000000500002000,allocate,0x1000,64,0x0\n")  # nanoseconds
    t = [e.time_us for e in read_rmm_csv(p).events]
    assert t[:2] == [(13 * 3600 + 45 * 60 + 10) * 10**6 + 250000, (13 * 3600 + 45 * 60 + 10) * 10**6]
    assert t[2:] == [1700000000500000, 1700000000500001, 1700000000500002]


@pytest.mark.parametrize("row, what", [
    ("1,00:00:00.1,allocate,0xzz,64,0x0", "pointer"),
    ("1,00:00:00.1,allocate,(nil),64,0x0", "pointer"),  # a null pointer only on a failure
    ("1,00:00:0x,allocate,0x1,64,0x0", "time"),
    ("1,00:00:00.1,allocate,0x1,-64,0x0", "size"),
    ("1,00:00:00.1,reallocate,0x1,64,0x0", "unknown action"),
    ("1,00:00:00.1,allocate,0x1,64", "expected 6 fields"),
])
def test_rmm_bad_rows_are_refused_naming_the_line(tmp_path, row, what):
    p = tmp_path / "r.csv"
    p.write_text(RMM_HEADER + "1,00:00:00.1,allocate,0x10,64,0x0\n" + row + "\n")
    with pytest.raises(TraceFormatError, match=f"line 3: .*{what}"):
        read_rmm_csv(p)


def test_sizes_near_the_top_of_u64_saturate(tmp_path):
    # 5 bytes, then 2^64 - 1: the live sum saturates rather than wrapping round to 4
    p = tmp_path / "r.csv"
    top = (1 << 64) - 1
    p.write_text(RMM_HEADER + f"1,00:00:00.1,allocate,0x10,5,0x0\n1,00:00:00.2,allocate,0x20,{top},0x0\n")
    t = read_rmm_csv(p)
    assert t.peak_live() == top
    assert prepare(t).peak_live == top


def test_an_allocation_at_a_live_pointer_frees_the_old_one_first(tmp_path):
    """A log that missed a free: the engine is told the old allocation ended, so every model
    holds what the trace holds (peak live 96 B, not 160)."""
    from gpumm.replay import replay

    p = tmp_path / "r.csv"
    p.write_text(RMM_HEADER + "1,00:00:00.1,allocate,0x1000,64,0x0\n"
                 "1,00:00:00.2,allocate,0x1000,96,0x0\n"
                 "1,00:00:00.3,free,0x1000,96,0x0\n")
    t = read_rmm_csv(p)
    prep = prepare(t)
    assert list(prep.actions) == [0, 1, 0, 1] and prep.peak_live == 96
    assert list(prep.ids) == [0, 0, 1, 1]
    report = replay(t, capacity="1GiB", min_capacity=False)
    for r in report.results.values():
        assert r.peak_live == 96 and r.final_reserved >= 0, r.allocator


def test_a_device_read_twice_reads_the_same(tmp_path):
    # the first read of a one-device history takes the rows' columns into its log
    from gpumm import _core
    data = {"segments": [seg([{"size": 512, "state": "active_allocated"}])], "device_traces": [[
        ev("free_requested", SEG, 512, t=5), ev("free_completed", SEG, 512, t=6),
        ev("alloc", SEG, 512, t=9)]]}
    snap = _core.read_snapshot(str(write(tmp_path, data)))
    first, again = snap.device(0), snap.device(0)
    assert list(first[0].tuples()) == list(again[0].tuples()) == [
        ("free", SEG, 512, 0, 0, 0, -1), ("alloc", SEG, 512, 0, 3, 0, -1)]
    assert first[1:] == again[1:] and first[1] is not again[1]


def test_devices_sharing_one_history_read_it_alike(tmp_path):
    h = [ev("alloc", SEG, 512, t=1), ev("free_requested", SEG, 512, t=2),
         ev("free_completed", SEG, 512, t=3)]
    p = write(tmp_path, {"segments": [], "device_traces": [h, h]})
    t0, t1 = read_traces(p)
    assert [(e.action, e.ptr, e.size, e.time_us) for e in t0.events] == \
        [(e.action, e.ptr, e.size, e.time_us) for e in t1.events] == \
        [("alloc", SEG, 512, 0), ("free", SEG, 512, 2)]
