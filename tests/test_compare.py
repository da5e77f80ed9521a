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
