"""The RMM log CSV reader: real traces from ../shared/traces and our own bad files."""

import gzip

import pytest

from gpumm.errors import TraceFormatError
from gpumm.traces import read_rmm_csv

from shared_traces import TRACES, needs_shared

GOOD = """Thread,Time,Action,Pointer,Size,Stream
1,00:00:00.000000,allocate,0x1000,4096,0x0
1,00:00:00.000010,allocate,0x3000,100,0x0
1,00:00:01.500000,free,0x1000,4096,0x0
2,00:00:02.000000,allocate failure,0x0,999999999,0x7f
1,00:00:02.000001,free,0xdead,8,0x0
"""


def test_reads_plain_and_gzip(tmp_path):
    plain = tmp_path / "t.csv"
    plain.write_text(GOOD)
    gz = tmp_path / "t.csv.gz"
    gz.write_bytes(gzip.compress(GOOD.encode()))
    for p in (plain, gz):
        t = read_rmm_csv(p)
        assert [e.action for e in t.events] == ["alloc", "alloc", "free", "alloc_failed", "free"]
        assert t.events[2].time_us == 1_500_000 and t.events[3].stream == 0x7F
        assert t.num_allocs == 2
        assert t.peak_live() == 4196  # the free of 0xdead (allocated before recording) is ignored


@pytest.mark.parametrize(
    "text, where",
    [
        ("", "line 1"),
        ("Thread,Time,Action\n", "line 1"),
        ("Thread,Time,Action,Pointer,Size,Stream\n1,00:00:00.0,allocate,0x10\n", "line 2: expected 6 fields"),
        ("Thread,Time,Action,Pointer,Size,Stream\n1,00:00:00.0,malloc,0x10,5,0x0\n", "line 2: unknown action"),
        ("Thread,Time,Action,Pointer,Size,Stream\n1,00:00:00.0,allocate,zz,5,0x0\n", "line 2"),
        ("Thread,Time,Action,Pointer,Size,Stream\n1,00:00:00.0,allocate,0x10,-5,0x0\n", "line 2: negative"),
        ("Thread,Time,Action,Pointer,Size,Stream\n1,noon,allocate,0x10,5,0x0\n", "line 2"),
    ],
)
def test_bad_files_name_file_and_line(tmp_path, text, where):
    p = tmp_path / "bad.csv"
    p.write_text(text)
    with pytest.raises(TraceFormatError, match=where) as e:
        read_rmm_csv(p)
    assert "bad.csv" in str(e.value)


def test_truncated_gzip_and_binary_garbage(tmp_path):
    data = gzip.compress((GOOD * 200).encode())
    p = tmp_path / "cut.csv.gz"
    p.write_bytes(data[: len(data) // 2])
    with pytest.raises(TraceFormatError, match="cut.csv.gz"):
        read_rmm_csv(p)
    q = tmp_path / "noise.csv"
    q.write_bytes(bytes(range(256)) * 4)
    with pytest.raises(TraceFormatError):
        read_rmm_csv(q)
    with pytest.raises(TraceFormatError, match="missing.csv"):
        read_rmm_csv(tmp_path / "missing.csv")


@needs_shared
@pytest.mark.parametrize(
    "name, allocs, peak_gib",
    [("gpt2_train.csv.gz", 9495, 5.42), ("bert_train.csv.gz", 10584, 3.08), ("resnet50_train.csv.gz", 3494, 1.31)],
)
def test_real_traces_match_their_readme(name, allocs, peak_gib):
    t = read_rmm_csv(TRACES / name)
    assert t.num_allocs == allocs
    assert round(t.peak_live() / 2**30, 2) == peak_gib
