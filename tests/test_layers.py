"""The layers contract of python/gpumm, read from the source: the import graph, counting the
imports inside functions too, has no cycle, and each module imports only from its own layer or
below. A module of the package not listed falls in its parent's layer (a new reader under
``gpumm.traces`` is a reader)."""

import ast
from pathlib import Path
from typing import Dict, List, Set

import pytest

import gpumm

PKG = Path(gpumm.__file__).parent

# lowest first; a module may import from its layer and the layers before it
LAYERS: List[List[str]] = [
    ["gpumm._core", "gpumm.errors", "gpumm.units"],
    ["gpumm.arch", "gpumm.frames", "gpumm.alloc_conf"],
    ["gpumm.observe", "gpumm.diagnosis"],
    ["gpumm.pmm", "gpumm.uvm", "gpumm.pool", "gpumm.policy", "gpumm.integrations"],
    ["gpumm.traces.base", "gpumm.traces.rmm", "gpumm.traces.snapshot", "gpumm.traces.profiler",
     "gpumm.traces.prepare"],
    # the Python pool replay runs a MemoryPool and the engine's arrays; `gpumm.traces` gathers
    # the readers and it
    ["gpumm.replay", "gpumm.traces.pool_replay", "gpumm.traces"],
    # recording a PyTorch program writes a trace
    ["gpumm.recorder", "gpumm.record_hooks", "gpumm.record_cuda", "gpumm.record"],
    ["gpumm.tune", "gpumm.oom", "gpumm.doctor", "gpumm.report", "gpumm.report_parts",
     "gpumm.predict"],
    ["gpumm.cli", "gpumm.cli_tune", "gpumm.cli_record", "gpumm.__main__", "gpumm"],
]


def module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> Dict[str, Path]:
    found = {module_name(p): p for p in PKG.rglob("*.py")}
    found["gpumm._core"] = PKG / "_core.pyi"
    return found


def imports(name: str, path: Path, known: Set[str]) -> Set[str]:
    """Every module of the package that `name` imports, at any depth of its code."""
    if path.suffix == ".pyi":
        return set()
    is_pkg = path.name == "__init__.py"
    out: Set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = name.split(".") if is_pkg else name.split(".")[:-1]
                pkg = pkg[: len(pkg) - (node.level - 1)]
                base = ".".join(pkg + ([base] if base else []))
            # `from a import b` imports the module a.b when there is one, else a
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base
                       for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in known:  # `import gpumm.traces.rmm as r` names the module
                t = t.rpartition(".")[0]
            if t and t != name:
                out.add(t)
    return out


def graph() -> Dict[str, Set[str]]:
    mods = modules()
    known = set(mods)
    return {name: imports(name, path, known) for name, path in mods.items()}


def layer_of(name: str) -> int:
    probe = name
    while probe:
        for i, layer in enumerate(LAYERS):
            if probe in layer:
                return i
        probe = probe.rpartition(".")[0]
    raise AssertionError(f"{name} is in no layer")


def cycles(g: Dict[str, Set[str]]) -> List[List[str]]:
    found: List[List[str]] = []
    state: Dict[str, int] = {}  # 1: on the path, 2: done
    path: List[str] = []

    def visit(n: str) -> None:
        state[n] = 1
        path.append(n)
        for m in sorted(g.get(n, ())):
            if state.get(m) == 1:
                found.append(path[path.index(m):] + [m])
            elif m not in state:
                visit(m)
        path.pop()
        state[n] = 2

    for n in sorted(g):
        if n not in state:
            visit(n)
    return found


def test_the_graph_sees_function_level_imports():
    g = graph()
    # `gpumm.cli` imports `gpumm.replay` only inside its command functions
    assert "gpumm.replay" in g["gpumm.cli"]
    assert "gpumm.units" in g["gpumm.pmm"] and "gpumm._core" in g["gpumm.pool"]


def test_no_import_cycle():
    assert cycles(graph()) == []


def test_each_module_imports_only_its_layer_and_below():
    upward = [f"{a} (layer {layer_of(a)}) imports {b} (layer {layer_of(b)})"
              for a, targets in sorted(graph().items()) for b in sorted(targets)
              if layer_of(b) > layer_of(a)]
    assert upward == []


@pytest.mark.parametrize("cyclic, expected", [
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}}, [["a", "b", "c", "a"]]),
    ({"a": {"b"}, "b": set()}, []),
])
def test_cycles_finds_a_cycle(cyclic, expected):
    assert cycles(cyclic) == expected
