"""Smoke test of benches/read.py: it runs on small generated files and reports every figure."""

import importlib.util
from pathlib import Path


def test_read_bench_runs_on_small_files(tmp_path):
    spec = importlib.util.spec_from_file_location("read_bench", Path(__file__).parent / "read.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = mod.main(["--events", "3000", "--repeat", "1", "--json", str(tmp_path / "r.json")])
    assert [r["peer"] for r in out["rows"]] == ["pickle.load", "csv.reader"]
    for r in out["rows"]:
        assert r["events"] > 1000 and r["ratio"] > 0 and r["held_bytes_per_event"] > 0
    assert (tmp_path / "r.json").exists()
