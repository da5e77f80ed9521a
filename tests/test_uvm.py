"""The unified-memory model through Python: behaviours the driver's machinery must show, the
modes, the CLI, the placement policy and the planner, bad input."""

import json

import pytest

import gpumm
from gpumm import _core
from gpumm.cli import main
from gpumm.policy import Usage, place, plan
from gpumm.uvm import MODES, PATTERNS, benchmark, model, summary

SMALL = "512MiB"  # an H100-like device, small enough for tests


def run(pattern, factor, mode="page_fault", **kw):
    return benchmark("h100", pattern, factor, mode, vidmem=SMALL, validate=True, **kw)


def test_every_pattern_and_mode_runs_and_keeps_invariants():
    for p in PATTERNS:
        for m in MODES:
            r = run(p, 1.1, m)
            assert r["estimated_time_s"] > 0 and r["accesses"] > 0


def test_prefetch_cuts_streaming_faults_tenfold():
    on = run("streaming", 0.9)
    off = run("streaming", 0.9, prefetch=False)
    assert off["faults"] >= 10 * on["faults"]
    assert on["prefetched_pages"] > 0 and on["estimated_time_s"] < off["estimated_time_s"]


def test_random_access_past_capacity_is_much_slower():
    fits = run("random_warp", 0.9)
    over = run("random_warp", 1.25)
    per_byte = lambda r: r["estimated_time_s"] / r["working_set"]  # noqa: E731
    assert per_byte(over) > 20 * per_byte(fits)
    assert over["evictions"] > 0 and fits["evictions"] == 0


def test_zero_copy_never_migrates():
    r = run("random_warp", 1.5, "zero_copy")
    assert (r["faults"], r["bytes_h2d"], r["bytes_d2h"], r["evictions"]) == (0, 0, 0, 0)
    assert r["remote_bytes"] > 0


def test_stripe_and_prefetch_modes():
    s = run("streaming", 1.5, "stripe")
    assert s["faults"] == 0 and s["remote_bytes"] > 0 and s["hbm_bytes"] > 0
    p = run("streaming", 0.5, "prefetch")
    assert p["faults"] == 0  # it all fits: prefetched once, no fault after


def test_pinning_stops_ping_pong():
    m = model("h100", vidmem=SMALL)
    r = m.alloc_managed("64KiB")
    for _ in range(40):
        m.run_kernel(r, "explicit", processor="cpu", write=True, pages=[0])
        m.run_kernel(r, "explicit", processor="gpu", pages=[0])
    t = m.total()
    assert t["thrashing_pages"] >= 1 and t["throttles"] > 0 and t["pins"] >= 1
    before = m.total()
    m.run_kernel(r, "explicit", processor="cpu", write=True, pages=[0])
    m.run_kernel(r, "explicit", processor="gpu", pages=[0])
    after = m.total()
    assert after["bytes_h2d"] == before["bytes_h2d"] and after["bytes_d2h"] == before["bytes_d2h"]
    m.validate()


def test_read_mostly_duplicates():
    m = model("h100", vidmem=SMALL)
    r = m.alloc_managed("4MiB")
    m.advise(r, "read_mostly")
    m.run_kernel(r, processor="cpu", write=True)
    m.run_kernel(r)
    assert m.resident() == (4 << 20, 4 << 20)
    s = m.run_kernel(r, processor="cpu")
    assert s["cpu_faults"] == 0 and s["bytes_d2h"] == 0


def test_deterministic_for_a_seed():
    a = run("random_warp", 1.25, seed=3)
    b = run("random_warp", 1.25, seed=3)
    c = run("random_warp", 1.25, seed=4)
    assert summary(a) == summary(b) and a["kernels"] == b["kernels"]
    assert a["kernels"] != c["kernels"]


def test_costs_come_from_the_device_and_can_be_overridden():
    h100 = run("streaming", 1.25)
    slow_link = run("streaming", 1.25, costs={"link_bw": 15.75e9})
    assert slow_link["estimated_time_s"] > 2 * h100["estimated_time_s"]
    gh200 = benchmark("gh200", "streaming", 1.25, vidmem=SMALL)  # NVLink-C2C
    assert gh200["estimated_time_s"] < h100["estimated_time_s"]


def test_bad_input():
    with pytest.raises(gpumm.InvalidArgumentError, match="unknown pattern"):
        benchmark("h100", "zigzag", 1.0, vidmem=SMALL)
    with pytest.raises(gpumm.InvalidArgumentError, match="unknown mode"):
        benchmark("h100", "streaming", 1.0, "teleport", vidmem=SMALL)
    with pytest.raises(gpumm.InvalidArgumentError):
        benchmark("h100", "streaming", 0, vidmem=SMALL)
    m = model("h100", vidmem=SMALL)
    with pytest.raises(gpumm.InvalidSizeError):
        m.alloc_managed(0)
    r = m.alloc_managed(4096)
    with pytest.raises(gpumm.InvalidArgumentError, match="outside"):
        m.run_kernel(r, "explicit", pages=[5])
    with pytest.raises(gpumm.InvalidArgumentError, match="unknown advice"):
        m.advise(r, "please")
    with pytest.raises(gpumm.InvalidHandleError):
        m.run_kernel(99)
    with pytest.raises(gpumm.InvalidArgumentError, match="unknown cost"):
        _core.Uvm(1 << 30, 1e12, 1e10, costs={"speed_of_light": 1.0})
    with pytest.raises(gpumm.InvalidArgumentError, match="replay"):
        _core.Uvm(1 << 30, 1e12, 1e10, replay="sometimes")


def test_replay_policies():
    m = lambda replay: benchmark("h100", "random_warp", 0.9, vidmem=SMALL)  # noqa: E731
    base = m("batch")
    for policy in ("batch", "block", "once"):
        u = model("h100", vidmem=SMALL, replay=policy)
        r = u.alloc_managed(256 << 20)
        s = u.run_kernel(r, "random_warp")
        assert s["replays"] >= 1
    assert base["replays"] >= 1


def test_cli_json(capsys):
    assert main(["uvm", "--vidmem", SMALL, "--pattern", "random_warp", "--oversubscription",
                 "1.5", "--mode", "page_fault", "--json", "-"]) == 0
    data = json.loads(capsys.readouterr().out)
    for k in ("estimated_time_s", "faults", "bytes_h2d", "bytes_d2h", "evictions", "thrashing_pages"):
        assert k in data
    assert main(["uvm", "--vidmem", SMALL, "--sweep", "--pattern", "streaming", "--mode",
                 "zero_copy", "--json", "-"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["oversubscription"] for r in rows] == [0.5, 0.9, 1.1, 1.25, 1.5]


def test_cli_table_and_errors(capsys):
    assert main(["uvm", "--vidmem", SMALL, "--no-prefetch"]) == 0
    assert "prefetch off" in capsys.readouterr().out
    assert main(["uvm", "--vidmem", SMALL, "--mode", "nope"]) == 2
    assert "unknown mode" in capsys.readouterr().err


def test_placement_rule():
    us = [Usage("weights", 2 << 30, gpu_accesses=1e12),
          Usage("dataloader_batch", 64 << 20, gpu_accesses=1e6, cpu_accesses=1e6, short_lived=True),
          Usage("kv_cache", 8 << 30, gpu_accesses=1e11, cpu_accesses=2e10),
          Usage("logs", 1 << 20, cpu_accesses=1e5),
          Usage("embeddings", 100 << 30, gpu_accesses=1e9)]
    p = {x.name: x for x in place(us, device="h100")}
    assert p["weights"].where == "vidmem" and "GPU" in p["weights"].reason
    assert p["dataloader_batch"].where == "sysmem" and "staging" in p["dataloader_batch"].reason
    assert p["kv_cache"].where == "managed" and "shared" in p["kv_cache"].reason
    assert p["logs"].where == "sysmem"
    assert p["embeddings"].where == "managed" and "does not fit" in p["embeddings"].reason
    o = place(us, overrides={"logs": "vidmem"})
    assert o[3].where == "vidmem" and o[3].reason == "explicit override"
    with pytest.raises(gpumm.InvalidArgumentError):
        place(us, overrides={"logs": "tape"})


def test_planner_recommends_the_fastest():
    pl = plan("h100", "768MiB", "random_warp", vidmem=SMALL)
    times = [t for _, t, _, _ in pl.options]
    assert times == sorted(times) and pl.recommended == pl.options[0][0]
    assert pl.recommended in MODES and "faster than" in pl.reason
    fits = plan("h100", "256MiB", "streaming", vidmem=SMALL)
    assert fits.recommended != "zero_copy"
