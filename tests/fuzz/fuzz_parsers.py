"""atheris fuzz targets for every parser of outside input. Run one for a bounded time:

    python tests/fuzz/fuzz_parsers.py rmm -max_total_time=10 -print_final_stats=1 CORPUS_DIR

Targets: rmm (RMM log CSV), snapshot (PyTorch snapshot pickle, every device read),
pickle (the plain-data pickle reader alone, into Python objects), profiler (Chrome-trace
JSON), size (size strings). The readers of CSV and pickles are Rust (rust/traces): atheris
sees no coverage inside them, so their targets mutate the corpus blind; the cargo test
``no_input_panics`` walks every one-byte change of a snapshot too. A parser may refuse its input only with its own error class
(TraceFormatError, InvalidSizeError); anything else is a crash, and a crash becomes a test in
tests/test_fuzz.py.
"""

import os
import sys
import tempfile

import atheris

with atheris.instrument_imports():
    from gpumm.errors import InvalidSizeError, TraceFormatError
    from gpumm.traces.profiler import read_profiler_json
    from gpumm.traces.rmm import read_rmm_csv
    from gpumm.traces.snapshot import load_snapshot, read_snapshot, read_snapshot_devices
    from gpumm.units import parse_size

_DIR = tempfile.mkdtemp(prefix="gpumm-fuzz-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
_PATH = os.path.join(_DIR, "input")


def _file(data: bytes) -> str:
    with open(_PATH, "wb") as f:
        f.write(data)
    return _PATH


def rmm(data: bytes) -> None:
    try:
        read_rmm_csv(_file(data))
    except TraceFormatError:
        pass


def snapshot(data: bytes) -> None:
    try:
        read_snapshot(_file(data))
    except TraceFormatError:
        pass
    try:
        for t in read_snapshot_devices(_PATH):
            t.peak_live()
            t.final_segments
    except TraceFormatError:
        pass


def pickle_(data: bytes) -> None:
    try:
        load_snapshot(_file(data))
    except TraceFormatError:
        pass


def profiler(data: bytes) -> None:
    try:
        read_profiler_json(_file(data))
    except TraceFormatError:
        pass


def size(data: bytes) -> None:
    try:
        parse_size(data.decode("utf-8", "replace"))
    except InvalidSizeError:
        pass


TARGETS = {"rmm": rmm, "snapshot": snapshot, "pickle": pickle_, "profiler": profiler, "size": size}

if __name__ == "__main__":
    target = TARGETS[sys.argv[1]]
    atheris.Setup([sys.argv[0]] + sys.argv[2:], target)
    atheris.Fuzz()
