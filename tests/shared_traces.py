"""The real allocation traces in ../shared/traces (beside the project's folder), for the tests
that use them. Tests mark themselves ``needs_shared``: they skip, saying why, only where that
folder is absent (a user's own clone); CI always has it."""

from pathlib import Path

import pytest

TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"

needs_shared = pytest.mark.skipif(
    not TRACES.is_dir(), reason="../shared/traces is absent (a user's own clone): real traces not available"
)
