"""The README's tour runs as written (the trace example, which needs a file, runs on ours)."""

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


def test_readme_has_examples():
    assert len(BLOCKS) >= 3


@pytest.mark.parametrize("i", range(len(BLOCKS)))
def test_readme_block_runs(i, tmp_path, monkeypatch):
    code = BLOCKS[i]
    if "gpt2_train.csv.gz" in code:
        rows = ["Thread,Time,Action,Pointer,Size,Stream",
                "1,00:00:00.000001,allocate,0x1000,3145728,0x0",
                "1,00:00:00.000002,free,0x1000,3145728,0x0"]
        (tmp_path / "gpt2_train.csv.gz").write_bytes(
            __import__("gzip").compress(("\n".join(rows) + "\n").encode()))
        monkeypatch.chdir(tmp_path)
    namespace = {}
    if "pmm.alloc_chunk" in code:
        exec("import gpumm", namespace)
    exec(compile(code, f"README block {i}", "exec"), namespace)
