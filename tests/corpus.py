"""The corpus of real traces that the tests (and benches) walk, in one place.

- **Shared traces, required**: every trace file in ``../shared/traces`` and
  ``../shared/traces/wild`` (a new file there is walked with no change here). Their tests are
  marked ``needs_shared`` (tests/shared_traces.py): they skip only where that folder is absent
  (a user's own clone); CI always has it, so there they always run.
- **Recorded traces, optional**: the ``*.csv.gz`` files that ``scripts/record_workloads.py``
  wrote to the trace cache (``$GPUMM_TRACE_CACHE``, else ``~/.cache/gpumm/traces``). Recording
  needs torch and transformers, which CI does not install, so in CI this list is normally
  empty and nothing is skipped for it; where the files are present (a machine that ran the
  script) every corpus test walks them too.

Each list holds absolute paths; ``TRACES / path`` is the path itself, so a test written as
``read_trace(TRACES / name)`` takes any of them. Test ids are the names relative to the shared
folder (``wild/select_n_bert_1f2f548.pickle``) or ``recorded/<file>``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Dict, List

import pytest

from shared_traces import TRACES, needs_shared

WILD = TRACES / "wild"
#: what a trace file's name ends with (the READMEs beside them are not traces)
SUFFIXES = (".csv", ".csv.gz", ".pickle", ".json", ".json.gz")
#: snapshots that hold the final state and no history (shared README: the ``*_state`` files)
STATE_ONLY = {"oom_state.pickle", "opt13_state.pickle"}


def recorded_dir() -> Path:
    """Where scripts/record_workloads.py writes: ``$GPUMM_TRACE_CACHE`` or ``~/.cache/gpumm/traces``."""
    env = os.environ.get("GPUMM_TRACE_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "gpumm" / "traces"


def _traces(folder: Path) -> List[Path]:
    if not folder.is_dir():
        return []
    # a hidden name is a file being written (scripts/record_workloads.py), not a trace
    return sorted(p for p in folder.iterdir()
                  if p.is_file() and p.name.endswith(SUFFIXES) and not p.name.startswith("."))


#: every shared trace (``../shared/traces`` and ``wild/``)
SHARED: List[Path] = _traces(TRACES) + _traces(WILD)
#: every recorded trace in the cache folder (may be empty)
RECORDED: List[Path] = sorted(p for p in _traces(recorded_dir()) if p.name.endswith(".csv.gz"))

#: every trace of the corpus
ALL: List[Path] = SHARED + RECORDED
#: RMM logs (shared and recorded)
RMM: List[Path] = [p for p in ALL if p.name.endswith((".csv", ".csv.gz"))]
#: snapshots with history: the ones that recorded what PyTorch's allocator did
HISTORY: List[Path] = [p for p in SHARED if p.name.endswith(".pickle") and p.name not in STATE_ONLY]


def label(path: Path) -> str:
    """A test id: the name relative to the shared folder, or ``recorded/<file>``."""
    try:
        return path.relative_to(TRACES).as_posix()
    except ValueError:
        return f"recorded/{path.name}"


def params(paths: List[Path]) -> list:
    """``paths`` as pytest parameters, each with its label; shared ones marked ``needs_shared``."""
    return [pytest.param(p, id=label(p), marks=[needs_shared] if p in SHARED else [])
            for p in paths]


#: Recorded workloads on which gpumm's pool does not meet its reserve bound yet (issue 27:
#: 1.02 x peak live + 4 MiB): the tests that walk the corpus run every other check on them.
RESERVE_OPEN: Dict[str, str] = {
    # held-out workloads (recorded after the policy was tuned)
    "recorded/wav2vec2_ctc_train.csv.gz": "1.049-1.058 x peak live (218-220 MiB by recording; the bound 216.0)",
    "recorded/swin_train.csv.gz": "1.045 x peak live (266 MiB; the bound 263.6)",
    "recorded/dlrm_train.csv.gz": "1.097 x peak live (76 MiB; the bound 74.6)",
    "recorded/xlnet_train.csv.gz": "1.033 x peak live (352 MiB; the bound 351.7)",
    # one of its two recordings (1,058 allocations; the other, 1,050, holds 52 MiB)
    "recorded/dcgan_train.csv.gz": "1.105 x peak live (54 MiB; the bound 53.9)",
}
