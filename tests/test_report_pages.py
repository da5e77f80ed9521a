"""The replay's note on page granularity: models that reserve less than the 2 MiB pages the
peak live fills are named, with why no pool of whole pages can match them; no note where
every model holds whole pages' worth or more."""

from __future__ import annotations

from rich.console import Console

from gpumm.replay import replay
from gpumm.report import page_text, table
from gpumm.traces import read_rmm_csv
from gpumm.units import KiB, MiB
from test_reserve_classes import write_csv


def _report(tmp_path, sizes):
    events = [("allocate", i + 1, s, 0) for i, s in enumerate(sizes)]
    events += [("free", i + 1, 0, 0) for i in range(len(sizes))]
    trace = read_rmm_csv(write_csv(events, tmp_path / "t.csv"))
    return replay(trace, capacity="1GiB", min_capacity=False, planned=False)


def test_models_under_the_page_floor_are_named(tmp_path):
    rep = _report(tmp_path, [3 * MiB + KiB])  # live 3 MiB + 1 KiB: two pages, 4 MiB
    assert rep.results["cupy"].peak_reserved < 4 * MiB <= rep.results["gpumm"].peak_reserved
    text = page_text(rep)
    named = text.split(" reserve")[0]
    assert "cupy" in named and "gpumm" not in named and "driver" not in named
    assert "(4 MiB)" in text
    console = Console(record=True, width=80)
    console.print(table(rep))
    assert "pages that the peak live fills" in console.export_text()


def test_no_note_when_every_model_holds_whole_pages(tmp_path):
    rep = _report(tmp_path, [2 * MiB, 4 * MiB])
    assert all(r.peak_reserved >= 6 * MiB for n, r in rep.results.items() if n != "driver")
    assert page_text(rep) == ""
