"""scripts/class_seeds.py: its verdict counts the seeds over issue 27's bound and the seeds
where another model holds less, the class's own seed left out, and tells those where the
other model holds less than whole pages could."""

from __future__ import annotations

import pytest

from script_loader import load_script


@pytest.fixture(scope="module")
def cs():
    return load_script("class_seeds")


def test_verdict_leaves_the_own_seed_out(cs):
    # seed 0 is the class's own: over its bound and behind `cupy`, and counted nowhere
    rows = {"gpumm": [40.0, 34.0, 30.0, 36.0], "cupy": [31.0, 35.0, 29.5, 34.5]}
    bounds = [38.0, 33.0, 31.0, 36.5]
    floors = [32.0, 32.0, 30.0, 34.0]
    text = cs.verdict(rows, bounds, floors, own=0)
    # over: seed 1 only (34 > 33); behind: seeds 2 (29.5 < 30) and 3 (34.5 < 36), and of
    # those only seed 2 below its floor (29.5 < 30; seed 3: 34.5 against 34)
    assert text.startswith("gpumm over the bound on 1 of 3 seeds")
    assert "holds less on 2, on 1 of them less than the pages the peak live fills" in text


def test_verdict_without_other_models(cs):
    text = cs.verdict({"gpumm": [10.0, 12.0]}, [11.0, 11.0], [10.0, 12.0], own=1)
    assert text == "gpumm over the bound on 0 of 1 seeds"


def test_the_script_prints_bounds_and_the_verdict(cs, capsys):
    assert cs.main(["kv_cache", "--seeds", "10", "--models", "gpumm,buddy"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in out[:4]] == ["seed", "gpumm", "buddy", "bound"]
    bound = [float(v) for v in out[3].split()[1:]]
    assert len(bound) == 3 and all(b > 0 for b in bound)  # own seed, seed 10, the sum
    assert out[4].startswith("gpumm over the bound on ") and "of 1 seeds" in out[4]
