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
    ["data", "models", "help"],
    ["config", "device", "outputs", "plots", "clock", "branches", "args", "openmp"],
    ["hydra_compat"],                             # the only hooks into Hydra's and OmegaConf's private code
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
    ({"fedrun.a": {"fedrun.b"}, "fedrun.b": {"fedrun.c"}, "fedrun.c": {"fedrun.a"}},
     [["fedrun.a", "fedrun.b", "fedrun.c"]]),
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


# Private code of the libraries fedrun builds on, each reached from one file only: a private module
# of Hydra or OmegaConf (a dotted part starting with `_`) from fedrun/hydra_compat.py, which
# tests/test_hydra_compat.py checks against the installed versions; torch's private pytree module
# from fedrun/engine/tree.py, which gives the rest of the package its functions.
PRIVATE_HOMES = {"hydra": "fedrun/hydra_compat.py", "omegaconf": "fedrun/hydra_compat.py",
                 "torch.utils._pytree": "fedrun/engine/tree.py"}


def _private_home(dotted: str) -> str | None:
    """The one file allowed to reach `dotted` (a module or attribute path), None if it is public."""
    if dotted == "torch.utils._pytree" or dotted.startswith("torch.utils._pytree."):
        return PRIVATE_HOMES["torch.utils._pytree"]
    root, *rest = dotted.split(".")
    if root in ("hydra", "omegaconf") and any(p.startswith("_") and not p.startswith("__") for p in rest):
        return PRIVATE_HOMES[root]
    return None


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return ".".join([node.id, *reversed(parts)]) if isinstance(node, ast.Name) else None


def private_uses(root: Path, folders=("fedrun", "hydra_plugins")) -> list[str]:
    """'path:line name' for every import of (or attribute path into) a private module of Hydra,
    OmegaConf or torch's pytree outside the one file allowed it (PRIVATE_HOMES)."""
    out = set()
    for folder in folders:
        for path in sorted((root / folder).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                    names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
                elif isinstance(node, ast.Attribute):
                    names = [_dotted(node) or ""]
                else:
                    continue
                for name in names:
                    home = _private_home(name)
                    if home is not None and home != rel:
                        out.add(f"{rel}:{node.lineno} {name.split('.')[0]}")
    return sorted(out)


def test_private_hydra_omegaconf_and_pytree_code_is_reached_from_one_file_each():
    assert private_uses(PACKAGE.parent) == []


def test_a_private_import_outside_its_file_is_found(tmp_path):
    """The check itself: each way of reaching private code is reported, public code is not."""
    (tmp_path / "fedrun" / "engine").mkdir(parents=True)
    (tmp_path / "hydra_plugins").mkdir()
    (tmp_path / "fedrun" / "a.py").write_text(
        "from hydra._internal.core_plugins.basic_sweeper import BasicSweeper\n"  # 1
        "import omegaconf._utils as u\n"                                       # 2
        "from hydra import _internal\n"                                        # 3
        "from torch.utils._pytree import tree_map\n"                           # 4
        "import torch\n"
        "x = torch.utils._pytree.tree_leaves\n"                                # 6
        "from hydra.core.plugins import Plugins\n"                             # public: not reported
        "from omegaconf import OmegaConf\n"
        "y = torch._dynamo, OmegaConf.__name__\n")
    (tmp_path / "fedrun" / "engine" / "tree.py").write_text("from torch.utils._pytree import tree_map\n")
    (tmp_path / "fedrun" / "hydra_compat.py").write_text("import omegaconf._utils\nimport hydra._internal.hydra\n")
    (tmp_path / "hydra_plugins" / "p.py").write_text("import omegaconf\nz = omegaconf._utils.get_yaml_loader\n")
    assert private_uses(tmp_path) == ["fedrun/a.py:1 hydra", "fedrun/a.py:2 omegaconf", "fedrun/a.py:3 hydra",
                                      "fedrun/a.py:4 torch", "fedrun/a.py:6 torch", "hydra_plugins/p.py:2 omegaconf"]
