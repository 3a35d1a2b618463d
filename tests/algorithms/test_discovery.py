"""Algorithms are found, not listed: each conf/algo yaml's `_target_` names its module's class
(`fedrun.algorithms.ditto.Ditto`), fedrun/algorithms/__init__.py imports no algorithm, and the short
targets of before (`fedrun.algorithms.Ditto`, in run folders and users' yamls) still resolve."""
import importlib
import inspect
import pkgutil
import subprocess
import sys

import pytest
from hydra.utils import get_class

import fedrun.algorithms as A
from fedrun.algorithms import algorithm_class, module_target, names
from fedrun.config import group_file, load_conf


def _target(name: str) -> str:
    return str(load_conf(group_file("algo", name))["_target_"])


def test_each_yaml_names_the_class_of_the_module_named_like_it():
    for name in names():
        cls = algorithm_class(name)
        assert _target(name) == f"fedrun.algorithms.{name}.{cls.__name__}" == f"{cls.__module__}.{cls.__qualname__}"


def test_the_package_lists_no_algorithm():
    """Importing fedrun.algorithms (a new process: 0.3 s, no torch) imports none of its modules: a
    new module needs no line there; each is imported when first named (the test below)."""
    code = "import sys, fedrun.algorithms\nprint(sorted(m for m in sys.modules if m.startswith('fedrun.')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['fedrun.algorithms', 'fedrun.errors']", out


def test_the_short_targets_of_before_resolve_to_the_same_classes():
    for name in names():
        cls = algorithm_class(name)
        short = f"fedrun.algorithms.{cls.__name__}"
        assert get_class(short) is cls and getattr(A, cls.__name__) is cls
        assert module_target(short) == _target(name) and module_target(_target(name)) == _target(name)
    from fedrun.algorithms import Algorithm, LocalOnly, ServerState  # the Python names of before

    assert (Algorithm.__module__, ServerState.__module__, LocalOnly.__module__) == (
        "fedrun.algorithms.base", "fedrun.algorithms.base", "fedrun.algorithms.local")
    for other in ("my_algos.SignSGD", "fedrun.algorithms.NoSuch", "fedrun.algorithms._draw", "fedrun.models.MLP", ""):
        assert module_target(other) == other
    for missing in ("NoSuch", "_draw", "__wrapped__"):
        with pytest.raises(AttributeError, match=f"module 'fedrun.algorithms' has no attribute '{missing}'"):
            getattr(A, missing)


def test_a_class_name_is_defined_in_one_module_only():
    """What lets `fedrun.algorithms.<Class>` find its class without a list: no two modules of the
    package define a public class of the same name."""
    where = {}
    for m in pkgutil.iter_modules(A.__path__):
        module = importlib.import_module(f"fedrun.algorithms.{m.name}")
        for k, v in vars(module).items():
            if inspect.isclass(v) and v.__module__ == module.__name__ and not k.startswith("_"):
                where.setdefault(k, []).append(m.name)
    assert {k: v for k, v in where.items() if len(v) > 1} == {}
    assert set(where) >= {algorithm_class(name).__name__ for name in names()}
