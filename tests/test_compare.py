"""benches/compare.py's own arithmetic (the benchmarks it runs are not run here)."""

import importlib.util
import os
from pathlib import Path

spec = importlib.util.spec_from_file_location(
    "compare", Path(__file__).resolve().parents[1] / "benches" / "compare.py")
compare = importlib.util.module_from_spec(spec)
spec.loader.exec_module(compare)


def test_repeated_runs_give_each_row_its_median():
    runs = [{("churn", "gpumm"): 150.0, ("churn", "null"): 60.0},
            {("churn", "gpumm"): 380.0},  # a noisy run, and one row missing from it
            {("churn", "gpumm"): 160.0, ("churn", "null"): 64.0}]
    assert compare.median_rows(runs) == {("churn", "gpumm"): 160.0, ("churn", "null"): 62.0}
    assert compare.median_rows(runs[:1]) == runs[0]


def test_the_machine_is_named():
    m = compare.machine()
    assert f"{os.cpu_count()} cores" in m and "Python 3." in m


def test_both_tables_of_the_fill_bench_are_read():
    out = """| allocator | in use at the first failure (seeds [1, 2, 3]) | mean |
|---|---|---|
| gpumm (2 MiB pages) | 99.74 %, 99.66 %, 99.71 % | 99.70 % |
| offset-allocator | 93.50 %, 93.40 %, 93.48 % | 93.46 % |

| allocator | smallest device for the churn stream (8 passes; peak live 10.98 GiB) |
|---|---|
| gpumm (2 MiB pages) | 11.1875 GiB |
| offset-allocator | 12.6250 GiB |
| buddy | over 80 GiB |
"""
    fills, devices = compare.parse_fill(out)
    assert fills == [("gpumm (2 MiB pages)", 99.70), ("offset-allocator", 93.46)]
    assert devices == [("gpumm (2 MiB pages)", 11.1875), ("offset-allocator", 12.625)]
