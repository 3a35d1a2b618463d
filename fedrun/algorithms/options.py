"""An algorithm's options: its class signature is the schema (names and types, no defaults), and
conf/algo/<name>.yaml holds the one set of defaults, for the command line and for Python alike.

`AlgorithmMeta` makes `PerFedAvg(beta=0.1)` in Python the same algorithm as `fedrun algo=perfedavg
algo.beta=0.1`: arguments left out are filled from the algorithm's yaml (the one in the shipped
configs whose `_target_` is the class, `<Class.name>.yaml` first); unknown options and wrong types
get one line naming the option; the class's own range checks (beside the fields) speak first when
they catch the value, since they also say the allowed range.
"""
from __future__ import annotations

import inspect
import math
import os
import types
import typing
from functools import lru_cache

from ..errors import ConfigError


def signature_options(cls) -> dict[str, inspect.Parameter]:
    """The keyword options of `cls(...)`, following `**options` to the parent class it forwards to."""
    out: dict[str, inspect.Parameter] = {}
    for klass in cls.__mro__:
        if "__init__" not in vars(klass) or klass is object:
            continue
        params = list(inspect.signature(klass.__init__).parameters.values())[1:]
        out.update({p.name: p for p in params if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL) and p.name not in out})
        if not any(p.kind == p.VAR_KEYWORD for p in params):
            break
    return out


def _hints(cls) -> dict:
    hints = {}
    for klass in reversed(cls.__mro__):
        if "__init__" in vars(klass) and klass is not object:
            try:
                hints.update(typing.get_type_hints(klass.__init__))
            except Exception:  # noqa: BLE001 - an annotation we cannot evaluate is simply not checked
                pass
    return hints


_WORDS = {float: "a number", int: "an integer", bool: "true or false", str: "a string"}


def _type_ok(value, hint) -> tuple[bool, str]:
    """(value fits the annotation, the annotation in words); unknown annotations always fit."""
    args = (typing.get_args(hint) if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union
            else (hint,))
    words, ok = [], False
    for t in args:
        if t is type(None):
            words.append("null")
            ok = ok or value is None
        elif t in _WORDS:
            words.append(_WORDS[t])
            if t is float:  # finite: inf and nan pass no option's meaning
                number = isinstance(value, (int, float)) and not isinstance(value, bool)
                ok = ok or (number and math.isfinite(value))
                if number and not math.isfinite(value):
                    words[-1] = "a finite number"
            elif t is int:
                ok = ok or (isinstance(value, int) and not isinstance(value, bool))
            else:
                ok = ok or isinstance(value, t)
        else:
            return True, ""
    return ok, " or ".join(words)


@lru_cache(maxsize=None)
def conf_defaults(cls) -> dict:
    """The option values of the shipped conf/algo yaml whose `_target_` is `cls`, else the nearest
    base class's (a subclass made in Python, e.g. in a test); {} if none."""
    from hydra.utils import get_class

    from ..config import CONF_DIR, group_options, yaml_values

    names = group_options("algo")
    first = getattr(cls, "name", None)
    targets = {}
    for name in ([first] if first in names else []) + [n for n in names if n != first]:
        node = yaml_values(os.path.join(CONF_DIR, "algo", f"{name}.yaml"))
        try:
            target = get_class(node.get("_target_", ""))
        except Exception:  # noqa: BLE001 - another algorithm's module that does not import here
            continue
        targets.setdefault(target, node)
    for klass in cls.__mro__:
        if klass in targets:
            return {k: v for k, v in targets[klass].items() if not k.startswith("_")}
    return {}


# Options every algorithm takes, handled by the base class where an algorithm's signature does not name
# them (its own signature, where it does, wins): the local-work unit (`Algorithm.set_local_epochs`).
BASE_OPTIONS = ("local_epochs",)


class AlgorithmMeta(type):
    def __call__(cls, *args, **kwargs):
        options = signature_options(cls)
        base = {k: kwargs.pop(k) for k in BASE_OPTIONS if k not in options and k in kwargs}
        defaults = conf_defaults(cls)
        base.update({k: defaults[k] for k in BASE_OPTIONS if k not in options and k not in base and k in defaults})
        obj = cls._construct(options, args, kwargs)
        for k, v in base.items():
            getattr(obj, f"set_{k}")(v)
        return obj

    def _construct(cls, options, args, kwargs):
        names = list(options)
        for k in kwargs:
            if k not in options:
                raise ConfigError(f"algo.{k} is not an option of {cls.__name__}; "
                                  f"its options: {', '.join(sorted(set(names) | set(BASE_OPTIONS)))}")
        given = {**dict(zip(names, args)), **kwargs}
        defaults = conf_defaults(cls)
        filled = {k: defaults[k] for k in names if k not in given and k in defaults}
        hints, problem = _hints(cls), None
        for k, v in {**given, **filled}.items():
            ok, words = _type_ok(v, hints.get(k, inspect.Parameter.empty))
            if not ok:
                problem = problem or f"algo.{k}={v!r} must be {words}"
        try:  # the class's own range checks first: their messages also say the allowed range
            obj = super().__call__(*args, **kwargs, **filled)
        except ConfigError:
            raise
        except Exception:
            if problem:
                raise ConfigError(problem) from None
            raise
        if problem:  # a wrong type no range check covers (e.g. train_all='yes')
            raise ConfigError(problem)
        return obj
