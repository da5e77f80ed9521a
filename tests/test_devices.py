"""Every device of a multi-GPU snapshot: `gpumm replay` and `gpumm doctor` report each one, the
device that recorded an out-of-memory failure first, `--gpu N` picks one, and the JSON, the
HTML report and the Python API keep one entry per device. On a small snapshot written here
(three devices, the middle one with an ``oom`` entry) and on the real 3-GPU snapshot."""

import html.parser
import json
import pickle

import pytest

from gpumm.cli import demo_trace_path, main
from gpumm.doctor import diagnose_file
from gpumm.errors import InvalidArgumentError, TraceFormatError
from gpumm.replay import ALLOCATORS, devices_json, read_devices, replay_file
from gpumm.report import html_report, recorded_oom_text
from gpumm.traces import read_traces
from gpumm.units import GiB, MiB

from shared_traces import TRACES, needs_shared

QWEN3 = TRACES / "wild" / "code_location_qwen3_train.pickle"

#: the keys of one device's replay in --json, as they were before several devices
DEVICE_KEYS = {"trace", "format", "events", "allocations", "peak_live", "capacity",
               "has_history", "recorded_peak_reserved", "allocators"}


def _device(dev, sizes, oom=None):
    """One device's history and final segment: a 64 MiB segment, allocations of ``sizes`` back
    to back (the first freed again), then an ``oom`` entry for ``oom`` bytes if given."""
    base = (0x7F00 + dev) << 32
    t = 1000 * dev
    frames = [{"filename": "/home/u/train.py", "line": 40 + dev, "name": "step"}]
    history = [{"action": "segment_alloc", "addr": base, "size": 64 * MiB, "stream": 0,
                "time_us": t}]
    addr, blocks = base, []
    for i, s in enumerate(sizes):
        t += 10
        history.append({"action": "alloc", "addr": addr, "size": s, "stream": 0, "time_us": t,
                        "frames": frames})
        blocks.append({"address": addr, "size": s, "requested_size": s,
                       "state": "inactive" if i == 0 else "active_allocated", "frames": frames})
        addr += s
    for action in ("free_requested", "free_completed"):
        t += 10
        history.append({"action": action, "addr": base, "size": sizes[0], "stream": 0,
                        "time_us": t, "frames": frames})
    if oom is not None:
        t += 10
        history.append({"action": "oom", "size": oom, "device_free": 91 * MiB, "stream": 0,
                        "time_us": t, "frames": frames})
    blocks.append({"address": addr, "size": base + 64 * MiB - addr, "requested_size": 0,
                   "state": "inactive", "frames": []})
    segment = {"device": dev, "address": base, "total_size": 64 * MiB, "stream": 0,
               "segment_type": "large", "allocated_size": sum(sizes[1:]), "blocks": blocks}
    return history, segment


@pytest.fixture
def three_gpus(tmp_path):
    """A snapshot of three devices; device 1 recorded a 3 GiB request that did not fit."""
    devs = [_device(0, [4 * MiB, 6 * MiB, 2 * MiB]),
            _device(1, [8 * MiB, 8 * MiB, 8 * MiB, 8 * MiB], oom=3 * GiB),
            _device(2, [2 * MiB, 2 * MiB])]
    data = {"segments": [s for _, s in devs], "device_traces": [h for h, _ in devs],
            "allocator_settings": {"expandable_segments": False}}
    p = tmp_path / "three.pickle"
    p.write_bytes(pickle.dumps(data))
    return p


def _replay(capsys, *args):
    rc = main(["replay", *map(str, args), "--capacity", "1GiB", "--no-min-capacity"])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def test_the_small_snapshot_reads_as_three_devices(three_gpus):
    # the file itself, as the readers see it (what the tests below build on)
    ts = read_traces(three_gpus)
    assert [t.device for t in ts] == [1, 0, 2]
    assert [o["size"] for o in ts[0].recorded_ooms()] == [3 * GiB]
    assert [t.num_allocs for t in ts] == [4, 3, 2]


def test_replay_reports_every_device_oom_first(three_gpus, capsys):
    rc, out, _ = _replay(capsys, three_gpus)
    assert rc == 0
    at = [out.index(f"device {d} ─") for d in (1, 0, 2)]
    assert at == sorted(at), out
    # each device's table lies under its own heading
    assert out.count("allocator") >= 3 and out.count("ev/s") == 3
    # the recorded failure, stated plainly, under device 1's heading
    flat = " ".join(out.split())
    at = [flat.index(f"device {d} ─") for d in (1, 0, 2)]
    assert at[0] < flat.index("out of memory on device 1: 3 GiB requested") < at[1]
    if "device_free" in read_traces(three_gpus)[0].recorded_ooms()[0]:
        assert "91 MiB free on the device" in flat
    assert "at event 6 of 7" in flat
    assert "--gpu" in out  # says how to pick one


def test_recorded_oom_text():
    oom = {"index": 332, "size": 5308694528, "time_us": 1451426, "frames": -1,
           "device_free": 95 * MiB + 512 * 1024}
    text = recorded_oom_text(oom, events=421, device=1, start_us=0)
    assert "device 1" in text and "4.94 GiB requested" in text
    assert "95.5 MiB free on the device" in text and "event 332 of 421" in text
    assert "1.451 s" in text
    del oom["device_free"]
    assert "free on the device not recorded" in recorded_oom_text(oom, 421, 1, 0)


def test_json_keeps_one_entry_per_device(three_gpus, capsys):
    rc, out, _ = _replay(capsys, three_gpus, "--json", "-")
    assert rc == 0
    data = json.loads(out)
    assert [d["device"] for d in data["devices"]] == [1, 0, 2]
    for d in data["devices"]:
        assert DEVICE_KEYS <= set(d) and set(d["allocators"]) == set(ALLOCATORS)
    # the top level is the first device, as it was before several devices were read
    first = data["devices"][0]
    assert {k: v for k, v in data.items() if k != "devices"} == first
    assert first["allocations"] == 4 and data["devices"][2]["allocations"] == 2
    assert [o["size"] for o in first["recorded_ooms"]] == [3 * GiB]
    assert data["devices"][1]["recorded_ooms"] == []


def test_gpu_picks_one_device(three_gpus, capsys):
    rc, out, _ = _replay(capsys, three_gpus, "--gpu", "2", "--json", "-")
    assert rc == 0
    data = json.loads(out)
    assert [d["device"] for d in data["devices"]] == [2] and data["device"] == 2
    assert data["allocations"] == 2
    rc, out, _ = _replay(capsys, three_gpus, "--gpu", "0")
    assert rc == 0 and "device 0 ─" in out and "device 1 ─" not in out and "device 2 ─" not in out


def test_a_device_the_file_does_not_have(three_gpus, tmp_path, capsys):
    for cmd in ("replay", "doctor"):
        assert main([cmd, str(three_gpus), "--gpu", "5"]) == 2
        err = " ".join(capsys.readouterr().err.split())
        assert "no device 5" in err and "it holds devices 0, 1, 2" in err, err
    with pytest.raises(InvalidArgumentError, match="no device 3"):
        read_devices(three_gpus, gpu=3)
    with pytest.raises(InvalidArgumentError, match="device index"):
        read_devices(three_gpus, gpu="1")
    # an RMM log has one device, 0
    assert main(["replay", demo_trace_path(), "--gpu", "1", "--no-min-capacity"]) == 2
    assert "no device 1" in " ".join(capsys.readouterr().err.split())  # wrapped to the terminal
    assert main(["replay", demo_trace_path(), "--gpu", "0", "--no-min-capacity",
                 "--allocator", "gpumm", "--json", "-"]) == 0
    assert json.loads(capsys.readouterr().out)["device"] == 0


@pytest.mark.parametrize("name, body, says", [
    ("header.csv", b"Thread,Time,Action,Pointer,Size,Stream\n", "no allocation in this RMM log"),
    ("frees_only.csv", b"Thread,Time,Action,Pointer,Size,Stream\n1,0.1,free,0x10,512,0x0\n",
     "no allocation in this RMM log"),
    ("empty.pickle", pickle.dumps({"segments": [], "device_traces": [[], []]}),
     "_record_memory_history()"),
    ("cached_only.pickle", pickle.dumps({"segments": [{
        "device": 0, "address": 0, "total_size": 2 * MiB, "stream": 0, "segment_type": "large",
        "allocated_size": 0, "active_size": 0,
        "blocks": [{"size": 2 * MiB, "state": "inactive", "address": 0}]}]}),
     "no live block in its state"),
    ("no_memory.json", b'{"traceEvents": []}', "profile_memory=True"),
])
def test_a_file_with_nothing_to_replay_is_a_clear_error(tmp_path, capsys, name, body, says):
    """A trace of a known format that holds no allocation (history not recorded, memory
    not profiled) is an error that says so and what records one, not a table of zeros."""
    path = tmp_path / name
    path.write_bytes(body)
    for cmd in ("replay", "doctor"):
        assert main([cmd, str(path), "--no-plan"]) == 2
        err = " ".join(capsys.readouterr().err.split())
        assert "nothing to replay" in err and says in err, err
    with pytest.raises(TraceFormatError, match="nothing to replay"):
        replay_file(path)


def test_a_snapshot_of_state_only_still_replays(tmp_path, capsys):
    """No history but a live block in the state (a snapshot taken without
    `_record_memory_history()`, as the shared oom_state.pickle): the replay allocates the
    live blocks, it is not "nothing to replay"."""
    path = tmp_path / "state.pickle"
    path.write_bytes(pickle.dumps({"segments": [{
        "device": 0, "address": 0, "total_size": 2 * MiB, "stream": 0, "segment_type": "large",
        "allocated_size": MiB, "active_size": MiB,
        "blocks": [{"size": MiB, "requested_size": MiB, "state": "active_allocated",
                    "address": 0},
                   {"size": MiB, "state": "inactive", "address": MiB}]}]}))
    (t,) = read_devices(path)
    assert t.num_allocs == 0 and t.start.blocks
    assert main(["replay", str(path), "--no-plan", "--no-min-capacity"]) == 0
    assert "state but no history" in " ".join(capsys.readouterr().out.split())


class _Sections(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.sections = []
        self.tables = 0

    def handle_starttag(self, tag, attrs):
        if tag == "section":
            self.sections.append(dict(attrs).get("id"))


def test_html_has_a_section_per_device(three_gpus, tmp_path, capsys):
    out = tmp_path / "r.html"
    rc, _, _ = _replay(capsys, three_gpus, "--html", out)
    assert rc == 0
    text = out.read_text()
    p = _Sections()
    p.feed(text)
    assert p.sections == ["device-1", "device-0", "device-2"]
    # each section has its own timeline, and device 1's holds the recorded failure
    parts = text.split("<section")[1:]
    assert all('aria-label="memory timeline"' in s for s in parts)
    assert "3 GiB requested" in parts[0] and "3 GiB requested" not in parts[1]
    assert '<a href="#device-0">' in text  # a link to each from the top
    assert "<script src" not in text  # the page's one script is inline


def test_python_api_per_device(three_gpus):
    reports = replay_file(three_gpus, ["gpumm", "caching"], capacity="1GiB", min_capacity=False)
    assert [r.device for r in reports] == [1, 0, 2]
    assert [r.allocations for r in reports] == [4, 3, 2]
    assert [o["size"] for o in reports[0].recorded_ooms] == [3 * GiB]
    (one,) = replay_file(three_gpus, ["gpumm"], gpu=0, capacity="1GiB", min_capacity=False)
    assert one.device == 0 and one.peak_live == 12 * MiB  # 4 + 6 + 2, before the first is freed
    j = devices_json(reports)
    assert [d["device"] for d in j["devices"]] == [1, 0, 2] and j["device"] == 1
    page = html_report(reports)
    assert page.count("<section") == 3
    ds = diagnose_file(three_gpus, capacity="1GiB")
    assert [d.device for d in ds] == [1, 0, 2]
    assert any("3 GiB requested" in f.text for f in ds[0].findings)
    assert not any("requested" in f.text for f in ds[1].findings)
    (d2,) = diagnose_file(three_gpus, capacity="1GiB", gpu=2)
    assert d2.device == 2


def test_doctor_reports_every_device(three_gpus, capsys):
    assert main(["doctor", str(three_gpus), "--capacity", "1GiB"]) == 0
    out = capsys.readouterr().out
    at = [out.index(f"device {d} ─") for d in (1, 0, 2)]
    assert at == sorted(at)
    assert at[0] < out.index("3 GiB requested") < at[1]
    assert main(["doctor", str(three_gpus), "--capacity", "1GiB", "--gpu", "2"]) == 0
    out = capsys.readouterr().out
    assert "device 2 ─" in out and "device 1 ─" not in out


def test_demo_is_one_device_with_no_heading(capsys):
    # an RMM log has no devices to tell apart: no heading, no per-device note
    assert main(["replay", demo_trace_path(), "--allocator", "gpumm", "--no-min-capacity"]) == 0
    out = capsys.readouterr().out
    assert "device 0" not in out and "--gpu" not in out


@needs_shared
def test_the_real_three_gpu_job(capsys):
    reports = replay_file(QWEN3, ["caching"], min_capacity=False)
    assert [r.device for r in reports] == [1, 0, 2]
    (oom,) = reports[0].recorded_ooms
    assert oom["size"] == 5308694528  # 4.94 GiB, the failure the job hit
    assert all(not r.recorded_ooms for r in reports[1:])
    assert main(["replay", str(QWEN3), "--allocator", "caching", "--no-min-capacity"]) == 0
    out = " ".join(capsys.readouterr().out.split())  # rich wraps lines at the terminal's width
    at = [out.index(f"device {d} ─") for d in (1, 0, 2)]
    assert at == sorted(at)
    assert at[0] < out.index("4.94 GiB requested, 91.25 MiB free on the device") < at[1]
    assert main(["replay", str(QWEN3), "--allocator", "caching", "--no-min-capacity",
                 "--gpu", "0", "--json", "-"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [d["device"] for d in data["devices"]] == [0]
    assert data["allocations"] == reports[1].allocations
