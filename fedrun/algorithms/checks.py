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


def check_split_round(name: str, head_steps: int, tau: int, local_epochs: int | None) -> None:
    """One line unless `head_steps` of the round's `tau` steps train the head and at least one is left
    for the body (FedRep, FedPAC: with head_steps >= tau the body never trains, with 0 the head never
    does); the epochs form (`local_epochs` set) does not use them."""
    if local_epochs is not None or 1 <= head_steps < tau:
        return
    if tau < 2:
        raise ConfigError(f"algo={name} with tau={tau} cannot train both parts (algo.head_steps steps on the head, the "
                          f"rest of tau on the body); allowed: tau >= 2 with 1 <= algo.head_steps <= tau-1, "
                          f"or algo.local_epochs (rounds in passes)")
    idle = "body" if head_steps >= tau else "head"
    raise ConfigError(f"algo.head_steps={head_steps} with tau={tau} never trains algo={name}'s {idle} (head_steps "
                      f"steps train the head, the rest of tau the body); allowed: 1 <= algo.head_steps <= {tau - 1}"
                      + (f" (or tau >= {head_steps + 1})" if head_steps >= tau else ""))


def check_phase_passes(name: str, option: str, passes: int, local_epochs: int | None, part: str) -> None:
    """One line when a phase of the epochs form (`local_epochs` set) has 0 passes, so `part` never
    trains (FedRep's and FedPAC's head_epochs, Ditto's personal_epochs)."""
    if local_epochs is not None and passes == 0:
        raise ConfigError(f"{option}=0 with algo.local_epochs={local_epochs} never trains algo={name}'s {part}; "
                          f"allowed: {option} >= 1")
