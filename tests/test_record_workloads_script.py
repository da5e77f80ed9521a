"""scripts/record_workloads.py and the workloads it records (scripts/workloads.py,
scripts/workloads_heldout.py, scripts/workloads_heldout_decode.py,
scripts/workloads_heldout_kinds.py): every workload listed
once, and a plain ``torch.nn`` one recorded for real into an RMM log that the replay
reads."""

from __future__ import annotations

import sys

import pytest

from script_loader import load_script

from gpumm.replay import replay
from gpumm.traces import read_trace

MiB = 1 << 20


def test_every_workload_is_listed_once_the_held_out_ones_with_the_others():
    rec = load_script("record_workloads")
    held = load_script("workloads_heldout")
    names = [w.name for w in held.HELD_OUT]
    assert len(names) == len(set(names))
    assert set(names) <= set(rec.WORKLOADS), "every held-out workload can be recorded"
    assert all(w.warmup >= 1 and w.steps >= 1 for w in rec.WORKLOADS.values())


def test_a_plain_torch_workload_records_to_an_rmm_log_the_replay_reads(tmp_path):
    pytest.importorskip("torch")
    rec = load_script("record_workloads")
    assert rec.main(["--only", "dcgan_train", "--out", str(tmp_path)]) == 0
    t = read_trace(tmp_path / "dcgan_train.csv.gz")
    # a GAN step of batch 64: two steps' activations, gradients and Adam's temporaries
    assert t.num_allocs > 500
    assert 30 * MiB < t.peak_live() < 80 * MiB
    g = replay(t, ["gpumm"], capacity=1 << 30, min_capacity=False, planned=False).results["gpumm"]
    assert g.ooms == [] and g.peak_live == t.peak_live() <= g.peak_reserved


def test_a_recording_the_kernel_kills_is_reported_by_name_and_the_run_fails(capsys):
    """SIGKILL (the out-of-memory killer's signal) ends a process without a word from it:
    the recording's own process is killed, and the parent says which one and most likely why."""
    rec = load_script("record_workloads")
    kill_self = [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"]
    assert rec.run_child(kill_self, "[1/1] big_train") is False
    said = capsys.readouterr().out
    assert "[1/1] big_train: not recorded: killed by SIGKILL" in said
    assert "out-of-memory killer" in said
    assert rec.run_child([sys.executable, "-c", "pass"], "[1/1] ok") is True
    assert capsys.readouterr().out == ""
    assert rec.how_it_ended(3) == "exit status 3"
