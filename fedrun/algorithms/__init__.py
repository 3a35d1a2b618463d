"""Algorithms. The list of algorithms is conf/algo (one yaml per algorithm, `_target_` naming its
module's class, `fedrun.algorithms.ditto.Ditto`; a user's own folder on Hydra's search path adds
more): `names()` and `build()` read it, and nothing in fedrun keeps a list of algorithm names or
classes. A new algorithm is its module and its yaml; this file does not change.

`from fedrun.algorithms import Ditto` and the yamls' `_target_: fedrun.algorithms.Ditto` of before
2026-11-28 (in run folders and users' own yamls) still work: a name this package does not define
is the class of that name in one of its modules (`__getattr__`), found by looking, not by a list."""
from __future__ import annotations

import functools
import importlib
import inspect
import pkgutil
from typing import TYPE_CHECKING

from ..errors import ConfigError

if TYPE_CHECKING:
    from .base import Algorithm

__all__ = ["names", "build", "algorithm_class", "module_target"]


@functools.lru_cache(maxsize=None)
def _modules() -> tuple[str, ...]:
    return tuple(sorted(m.name for m in pkgutil.iter_modules(__path__)))


@functools.lru_cache(maxsize=None)
def _class_named(name: str) -> type | None:
    """The public class `name` defined in one of this package's modules (its module named like it
    looked at first: `Ditto` in ditto.py), else None. The modules define each class name once
    (tests/algorithms/test_discovery.py)."""
    guess = name.lower()
    for module in sorted(_modules(), key=lambda m: m != guess):
        cls = getattr(importlib.import_module(f"{__name__}.{module}"), name, None)
        if inspect.isclass(cls) and cls.__module__ == f"{__name__}.{module}":
            return cls
    return None


def __getattr__(name: str):
    """A module of this package (`fedrun.algorithms.ditto`, imported on first use), else the class
    of that name defined in one of them (`fedrun.algorithms.Ditto`)."""
    if name in _modules():
        return importlib.import_module(f"{__name__}.{name}")
    cls = None if name.startswith("_") else _class_named(name)
    if cls is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return cls


def module_target(target: str) -> str:
    """`target` as conf/algo names classes now: `fedrun.algorithms.Ditto` (the yamls' `_target_`
    before 2026-11-28, kept in the run folders and checkpoints written then) is
    `fedrun.algorithms.ditto.Ditto`; any other target is returned as it is."""
    package, _, name = str(target).rpartition(".")
    cls = _class_named(name) if package == __name__ and name and not name.startswith("_") else None
    return target if cls is None else f"{cls.__module__}.{cls.__qualname__}"


def names(roots: list[str] | None = None) -> list[str]:
    """The algorithms `fedrun algo=...` accepts: the yamls of conf/algo (and of `roots`, if given)."""
    from ..config import group_options

    return group_options("algo", roots)


def algorithm_class(name: str, roots: list[str] | None = None) -> type:
    """The class `algo=<name>` builds (its yaml's `_target_`), not built."""
    from hydra.utils import get_class

    from ..config import group_file, yaml_values

    if name not in names(roots):
        raise ConfigError(f"algo={name!r} is not a known algo; choose one of: {', '.join(names(roots))}")
    return get_class(str(yaml_values(group_file("algo", name, roots))["_target_"]))


def build(name: str, roots: list[str] | None = None, **options) -> Algorithm:
    """The algorithm `fedrun algo=<name> algo.<k>=<v> ...` builds, from its yaml with `options` on top."""
    from hydra.utils import instantiate

    from ..config import group_file, load_conf

    if name not in names(roots):
        raise ConfigError(f"algo={name!r} is not a known algo; choose one of: {', '.join(names(roots))}")
    node = load_conf(group_file("algo", name, roots))
    for k, v in options.items():
        node[k] = v
    return instantiate(node)
