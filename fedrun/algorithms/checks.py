"""Option checks: each raises a one-line ConfigError naming the option and what it allows."""
from __future__ import annotations

import math

from ..engine.tree import Params, head_names
from ..errors import ConfigError


def check_choice(option: str, value, allowed) -> None:
    if value not in allowed:
        raise ConfigError(f"{option}={value!r} is not allowed; choose one of: {', '.join(map(str, allowed))}")


def check_positive(option: str, value, allow_zero: bool = False, allow_null: bool = False) -> None:
    if allow_null and value is None:
        return
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) \
        and (value >= 0 if allow_zero else value > 0)
    if not ok:  # inf and nan too: a run with them diverges, or trains nothing, without a word
        finite = "finite " if isinstance(value, float) and not math.isfinite(value) else ""
        words = f"a {finite}number {'>= 0' if allow_zero else '> 0'}" + (" or null" if allow_null else "")
        raise ConfigError(f"{option}={value!r} must be {words}")


def check_int(option: str, value, low: int = 1) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ConfigError(f"{option}={value!r} must be an integer >= {low}")


def check_optional_int(option: str, value, low: int = 1) -> None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < low):
        raise ConfigError(f"{option}={value!r} must be an integer >= {low} or null")


def check_unit(option: str, value) -> None:
    """A number in [0, 1] (a mixing weight)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value <= 1:
        raise ConfigError(f"{option}={value!r} must be a number in [0, 1]")


def require_body(name: str, params: Params, what: str, also: str = "") -> None:
    """One line when the model has no body (MLR is a head alone): an algorithm that splits the model
    in two (FedPer, LG-FedAvg, FedRep, FedBABU) would train or share nothing, and Proto adaptation
    has no hidden layer to embed with."""
    head = head_names(params)
    if not head or len(head) == len(params):
        raise ConfigError(f"algo={name} {what}, but this model is one layer (a head without a body); use a model "
                          f"with a hidden layer: model=mlp, dnn or cnn{also}")
