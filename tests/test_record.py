"""gpumm.record on the CPU, for real and on fake tensors (torch from the test extra)."""

import pickle
import sys


import torch  # in the test extra: CI records a model for real

from gpumm.cli import main
from gpumm.record import record, recording_info
from gpumm.traces import read_trace


def _forward():
    with torch.no_grad():
        l1 = torch.nn.Linear(64, 256, bias=False)
        l2 = torch.nn.Linear(256, 10, bias=False)
        x = torch.randn(32, 64)
        return l2(torch.relu(l1(x)))


def test_forward_peak_by_hand(tmp_path):
    path = tmp_path / "fwd.pickle"
    with record(path):
        _forward()
    t = read_trace(path)
    # weights 256x64 and 10x256, x 32x64, then l1's output and relu's, both live at once
    w1, w2, x, h = 256 * 64 * 4, 10 * 256 * 4, 32 * 64 * 4, 32 * 256 * 4
    assert t.peak_live() == w1 + w2 + x + 2 * h
    sizes = [e.size for e in t.events if e.action == "alloc"]
    assert sizes == [w1, w2, x, h, h, 32 * 10 * 4]
    # the stack of the allocation names this file's function
    first = t.frames[t.events[0].frames]
    assert any(line.endswith(":_forward") for line in first)
    assert recording_info(path)["mode"] == "cpu"


def _train(steps=3, device="cuda"):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 10)).to(device)
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randn(32, 64, device=device)
    y = torch.randint(0, 10, (32,), device=device)
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        torch.cuda.synchronize()


def test_fake_gives_the_sizes_of_the_real_run(tmp_path):
    seqs = {}
    for fake in (False, True):
        path = tmp_path / f"train{fake}.pickle"
        with record(path, fake=fake, warmup=1):
            _train()
        seqs[fake] = [(e.action, e.size) for e in read_trace(path).events]
        info = recording_info(path)
        assert info["step_on"] == "optimizer" and info["steps"] == 3
        assert info["gpu_only"] is True  # the CPU-side Adam step counters are left out
    assert seqs[True] == seqs[False] and len(seqs[True]) > 100
    # parameters, grads and Adam's two moments stay live after the warm-up step
    params = (64 * 256 + 256 + 256 * 10 + 10) * 4
    with open(tmp_path / "trainTrue.pickle", "rb") as f:
        hist = pickle.load(f)["device_traces"][0]
    live = {}
    for e in hist[:recording_info(tmp_path / "trainTrue.pickle")["warmup_end"]]:
        if e["action"] == "alloc":
            live[e["addr"]] = e["size"]
        elif e["action"] == "free_completed":
            del live[e["addr"]]
    assert sum(live.values()) == 4 * params + 32 * 64 * 4 + 32 * 8  # + x and y


def test_fake_records_what_does_not_fit_in_memory(tmp_path):
    path = tmp_path / "big.pickle"
    with record(path, fake=True):
        w = torch.empty(1 << 16, 1 << 16, device="cuda")  # 16 GiB
        (w @ w[:, :8]).sum()
    t = read_trace(path)
    assert t.peak_live() >= 16 << 30


def test_in_place_resize_is_a_new_block(tmp_path):
    with record(None) as rec:
        x = torch.empty(10)
        x.resize_(1000)
    acts = [(e[0], e[2]) for e in rec.all_events()]
    assert acts == [("alloc", 40), ("free", 40), ("alloc", 4000)]


def test_csv_output(tmp_path):
    path = tmp_path / "fwd.csv.gz"
    with record(path):
        _forward()
    assert read_trace(path).format == "rmm" and read_trace(path).num_allocs == 6


SCRIPT = """
import sys, torch
model = torch.nn.Linear(16, 16).to("cuda")
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(10):
    opt.zero_grad()
    model(torch.randn(4, 16, device="cuda")).sum().backward()
    opt.step()
    print("done", step)
"""


def test_cli_records_a_script_and_stops_after_the_steps(tmp_path, capsys):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    out = tmp_path / "t.pickle"
    assert main(["record", "-o", str(out), "--steps", "2", "--warmup", "1", "--",
                 sys.executable, str(script)]) == 0
    text = capsys.readouterr().out
    assert "done 1" in text and "done 3" not in text  # stopped inside the third step
    info = recording_info(out)
    assert info["steps"] == 3 and info["warmup_end"] is not None
    assert read_trace(out).num_allocs > 0


def test_cli_record_needs_a_program(tmp_path, capsys):
    assert main(["record", "-o", str(tmp_path / "x.pickle")]) == 2
    assert "no program" in capsys.readouterr().err


class _NormMLP(torch.nn.Module):
    """A hand-written RMSNorm and SiLU: eager autograd saves each pointwise result, AOT
    autograd's partitioner (torch.compile) recomputes them in the backward."""

    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(32, 128, bias=False)
        self.down = torch.nn.Linear(128, 32, bias=False)

    def forward(self, x):
        x = x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-5)
        h = self.up(x)
        return self.down(h * torch.sigmoid(h))


def _saved_bytes(model, x):
    """What the forward keeps for the backward, by torch's own saved-tensor hooks."""
    storages = {}

    def pack(t):
        st = t.untyped_storage()
        storages[st.data_ptr()] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(x)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    return sum(n for p, n in storages.items() if p not in params and p != x.data_ptr()), out


def test_compile_records_what_the_compiled_forward_saves(tmp_path):
    torch.manual_seed(0)
    torch._dynamo.reset()
    model, x = _NormMLP(), torch.randn(64, 32)
    eager_saved, _ = _saved_bytes(model, x)
    compiled_saved, out = _saved_bytes(torch.compile(model), x)  # inductor, for real
    torch._dynamo.reset()
    assert compiled_saved < eager_saved  # the model shows the difference
    got = {}
    for compile in (False, True):
        path = tmp_path / f"c{compile}.pickle"
        with record(path, compile=compile, step_on="forward") as rec:
            cm = torch.compile(model) if compile else model
            y = cm(x)
            # weights and x count from the first operator that reads them
            base = sum(t.untyped_storage().nbytes() for t in (x, *model.parameters(), y))
            got[compile] = rec.live_bytes - base
            y.sum().backward()
        assert recording_info(path)["compile"] is compile
    assert got[False] == eager_saved
    assert got[True] == compiled_saved


def test_live_storages_counts_dense_tensors_and_passes_over_sparse_ones():
    from gpumm.record_hooks import live_storages

    dense, sparse = torch.ones(3), torch.ones(4).to_sparse()  # sparse: no StorageImpl
    held = live_storages()
    assert dense.untyped_storage()._cdata in held
    assert sparse.is_sparse
