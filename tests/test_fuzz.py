"""Fuzzing of every parser of outside input, for a bounded time (atheris), and the inputs
that crashed a parser before its fix, kept as regression tests."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpumm.errors import InvalidSizeError, TraceFormatError
from gpumm.traces import read_profiler_json, read_rmm_csv, read_snapshot, read_trace
from gpumm.units import parse_size

HERE = Path(__file__).parent / "fuzz"
REGRESSIONS = sorted((HERE / "regressions").iterdir())
atheris = pytest.importorskip("atheris", reason="atheris is not installed (pip install '.[test]')")


@pytest.mark.parametrize("target", ["rmm", "snapshot", "pickle", "profiler", "size"])
def test_fuzz_target_for_a_few_seconds(target, tmp_path):
    corpus = tmp_path / target
    shutil.copytree(HERE / "corpus" / target, corpus)
    r = subprocess.run(
        [sys.executable, str(HERE / "fuzz_parsers.py"), target, "-max_total_time=4",
         "-print_final_stats=1", "-rss_limit_mb=1024", f"-artifact_prefix={tmp_path}/", str(corpus)],
        capture_output=True, text=True, timeout=120,
    )
    runs = re.search(r"stat::number_of_executed_units:\s+(\d+)", r.stderr)
    assert r.returncode == 0, r.stderr[-3000:]
    assert runs and int(runs.group(1)) > 1000


@pytest.mark.parametrize("path", REGRESSIONS, ids=[p.name for p in REGRESSIONS])
def test_inputs_that_crashed_before(path):
    """Each once crashed a parser (an escaping zlib.error, or a pickle memory bomb); now every
    reader refuses it with its own error."""
    for read in (read_rmm_csv, read_snapshot, read_profiler_json, read_trace):
        with pytest.raises(TraceFormatError):
            read(path)


def test_size_strings_never_crash():
    for text in ["", " ", "-", "1e400", "9" * 400, "0x", "1 TiB TiB", "nan", "\x00", "𝟙MiB"]:
        try:
            parse_size(text)
        except InvalidSizeError:
            pass
