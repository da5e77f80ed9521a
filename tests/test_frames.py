"""User frames: the unwinder's, the allocator's, the dispatcher's and CPython's frames are
skipped, memory is grouped by the first frame in the user's code, library frames come after
the user's, on POSIX and Windows paths; and on the real 3-GPU snapshot's stacks."""

from gpumm.frames import classify, group_key, holders, parse_frame, useful_frames, user_frame
from gpumm.traces import read_traces

from shared_traces import TRACES, needs_shared

#: a stack as PyTorch records one (innermost first), shortened
STACK = [
    "??:0:torch::unwind::unwind()",
    "??:0:torch::CapturedTraceback::gather(bool, bool, bool)",
    "CUDACachingAllocator.cpp:0:c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator"
    "::malloc(signed char, unsigned long, CUstream_st*)",
    "??:0:at::_ops::linear::call(at::Tensor const&, at::Tensor const&)",
    ":0:_PyEval_EvalFrameDefault",
    "/opt/conda/lib/python3.11/site-packages/torch/nn/modules/linear.py:125:forward",
    "/opt/conda/lib/python3.11/site-packages/torch/nn/modules/module.py:1750:_call_impl",
    "<frozen runpy>:88:_run_code",
    "/home/me/proj/model.py:31:block",
    "/home/me/proj/train.py:12:<module>",
]


def test_native_and_plumbing_frames_are_skipped():
    kinds = [parse_frame(s).kind for s in STACK]
    assert kinds[:5] == ["internal"] * 5
    assert kinds[5] == "library"           # torch/nn/modules/linear.py
    assert kinds[6] == "internal"          # module.py's _call_impl: plumbing
    assert kinds[7] == "internal"          # a frozen module
    assert kinds[8:] == ["user", "user"]


def test_user_frames_first_then_library():
    names = [f.name for f in useful_frames(STACK)]
    assert names == ["block", "<module>", "forward"]
    f = user_frame(STACK)
    assert (f.file, f.line, f.name) == ("/home/me/proj/model.py", 31, "block")
    assert group_key(STACK) == "proj/model.py:31 block"


def test_library_frame_when_no_user_frame():
    lib_only = STACK[:7]
    assert user_frame(lib_only).name == "forward"
    assert group_key(STACK[:5]) == "(no Python frame)"


def test_windows_paths():
    win = ["C:\\Users\\me\\proj\\train.py:7:step",
           "C:\\Python311\\Lib\\site-packages\\torch\\nn\\modules\\conv.py:456:forward",
           "C:\\Python311\\Lib\\threading.py:982:run"]
    f = parse_frame(win[0])
    assert (f.file, f.line, f.name, f.kind) == ("C:\\Users\\me\\proj\\train.py", 7, "step", "user")
    assert classify(parse_frame(win[1]).file) == "library"
    assert classify(parse_frame(win[2]).file) == "library"
    assert str(f) == "proj/train.py:7 step"


def test_holders_group_by_user_frame():
    other = ["/home/me/proj/model.py:40:head"] + STACK
    got = holders([(100, STACK), (50, other), (30, STACK)])
    assert [(k, b, n) for k, b, n, _ in got] == [("proj/model.py:31 block", 130, 2),
                                                 ("proj/model.py:40 head", 50, 1)]
    assert got[0][3][0] == "proj/model.py:31 block"


@needs_shared
def test_real_snapshot_stacks_lead_with_user_code():
    """Every stack of the 3-GPU snapshot that has a Python frame groups under a .py file of
    the job's own code, never under the unwinder."""
    t = read_traces(TRACES / "wild" / "code_location_qwen3_train.pickle")[0]
    keys = {group_key(s) for s in t.frames}
    assert keys - {"(no Python frame)"}
    for k in keys - {"(no Python frame)"}:
        assert "unwind" not in k and "c10::" not in k
        assert ".py:" in k
    users = [user_frame(s) for s in t.frames if user_frame(s)]
    assert any(f.kind == "user" and "train/" in f.file for f in users)
