"""The package's walls: fedrun's import graph, read from the source (ast; imports inside functions
count too), has no cycle, and every import runs down the declared floors below.

A room is a top-level module (fedrun/run/runner.py) or a subpackage (fedrun/engine/, one room however
many files it has). A room may import only rooms on lower floors; files inside one room may import
each other, but no file-level cycle is allowed anywhere. A new module or subpackage must be given
its floor here, which is the point: where it sits is a decision, not an accident.
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "fedrun"

# Top floor first. Rooms on one floor do not import each other.
FLOORS = [
    ["cli", "data_cli", "bench", "report"],       # the console tools
    ["run"],                                      # config -> checked options -> one run (or a group of seeds)
    ["simulate"],                                 # the round loop
    ["evaluate"],                                 # metrics of all clients at once
    ["algorithms"],                               # the methods (contract, state, options)
    ["engine"],                                   # stacked parameters, vmap and loop engines
    ["data", "models", "help",
     "hydra_compat"],                             # the only hooks into Hydra's and OmegaConf's private code
    ["config", "device", "outputs", "plots", "clock", "branches", "args", "openmp"],
    ["errors"],                                   # the ground floor
]


def modules() -> dict[str, Path]:
    """Dotted module name -> file, for every .py file of the package."""
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def import_graph() -> dict[str, set[str]]:
    """module -> the package's modules it imports (a `from X import name` counts X.name when that is
    a module, else X)."""
    mods = modules()

    def known(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in mods}
    for m, path in mods.items():
        package = m if path.name == "__init__.py" else m.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                targets = [f"{source}.{a.name}" for a in node.names] or [source]
            else:
                continue
            for t in targets:
                found = known(t) if t.startswith("fedrun") else None
                if found and found != m:
                    graph[m].add(found)
    return graph


def room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "fedrun"


def floor_of() -> dict[str, int]:
    return {r: i for i, rooms in enumerate(FLOORS) for r in rooms}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_every_room_has_a_floor():
    rooms = {room(m) for m in modules()} - {"fedrun"}
    assert rooms - set(floor_of()) == set(), "give the new module or subpackage its floor in FLOORS"
    assert set(floor_of()) - rooms == set(), "FLOORS names a room the package no longer has"


def test_no_import_cycle():
    assert cycles(import_graph()) == []


def test_imports_run_down():
    floors = floor_of()
    up = [f"{a} -> {b}" for a, targets in import_graph().items() for b in sorted(targets)
          if room(a) != room(b) and room(a) in floors and room(b) in floors and floors[room(b)] <= floors[room(a)]]
    assert up == []


@pytest.mark.parametrize("edge, expected", [
    ({"fedrun.a": {"fedrun.b"}, "fedrun.b": {"fedrun.c"}, "fedrun.c": {"fedrun.a"}}, [["fedrun.a", "fedrun.b", "fedrun.c"]]),
    ({"fedrun.a": {"fedrun.b"}, "fedrun.b": set()}, []),
])
def test_cycles_are_found(edge, expected):
    assert cycles(edge) == expected


def test_an_upward_import_is_found(tmp_path, monkeypatch):
    """The check itself: an import of the runner from the engine is reported."""
    fake = tmp_path / "fedrun"
    (fake / "engine").mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "runner.py").write_text("from .engine import x\n")
    (fake / "engine" / "__init__.py").write_text("def f():\n    from ..runner import run\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", fake)
    graph = import_graph()
    assert graph["fedrun.engine"] == {"fedrun.runner"} and cycles(graph) == [["fedrun.engine", "fedrun.runner"]]
