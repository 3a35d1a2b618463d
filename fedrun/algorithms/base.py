"""What every algorithm provides to the round loop (fedrun.simulate).

An algorithm is a small object of hyperparameters with pure-ish methods over stacked parameters:
  init(params)                           -> ServerState
  client_step(engine, params, batches)   -> params     one local step for all clients of the round
  server_update(state, client_params, weights) -> ServerState
  personalize(engine, params, train)     -> per-client params served at test time, or None
"""
from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor

from ..data.federated import ClientSplit
from ..functional import Engine, Params, stack, weighted_mean


class ConfigError(ValueError):
    """A user-facing configuration problem; the message names the option and what is allowed."""


def check_choice(option: str, value, allowed) -> None:
    if value not in allowed:
        raise ConfigError(f"{option}={value!r} is not allowed; choose one of: {', '.join(map(str, allowed))}")


def check_positive(option: str, value, allow_zero: bool = False) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and (value >= 0 if allow_zero else value > 0)
    if not ok:
        raise ConfigError(f"{option}={value!r} must be a number {'>= 0' if allow_zero else '> 0'}")


@dataclass
class ServerState:
    params: Params
    extra: dict = field(default_factory=dict)


class Algorithm:
    name = "base"
    batches_per_step = 1  # independent minibatches each local step draws per client
    models_per_round = 1  # models a client sends the server per round (for "models transmitted")

    def init(self, params: Params) -> ServerState:
        return ServerState(params=params)

    def client_step(self, engine: Engine, params: Params, batches: list[tuple[Tensor, Tensor]]) -> Params:
        raise NotImplementedError

    def server_update(self, state: ServerState, client_params: Params, weights: Tensor | None) -> ServerState:
        return ServerState(params=weighted_mean(client_params, weights), extra=state.extra)

    def personalize(self, engine: Engine, params: Params, train: ClientSplit, batch=None) -> tuple[Params | None, Tensor]:
        """Per-client models served at test time, and the served model's per-client training loss.

        Args:
            params: the server model.
            train: all clients' training rows (personalization never sees test rows).
            batch: optional (x [C, B, ...], y [C, B]) minibatch of every client's training rows; when
                given, adaptation uses it instead of all training rows.
        """
        raise NotImplementedError


class OneStepPersonalization:
    """Serves each client the server model after one gradient step of lr `self.alpha` on the
    client's own training rows (Per-FedAvg's test-time update; "FedAvg + update" for FedAvg)."""

    alpha: float

    def personalize(self, engine: Engine, params: Params, train: ClientSplit, batch=None) -> tuple[Params, Tensor]:
        return one_step_adapt(engine, params, train, self.alpha, batch)


def one_step_adapt(engine: Engine, params: Params, train: ClientSplit, lr: float, batch=None) -> tuple[Params, Tensor]:
    """Every client's model after one gradient step of `lr` from the shared `params` on its own
    TRAINING rows, all of them or the given minibatch (Per-FedAvg's one-step personalization).
    Also returns the shared model's per-client loss on those rows."""
    if batch is None:
        grads, loss = engine.full_grad(params, train, shared=True)
    else:
        grads, loss = engine.grad(stack(params, len(batch[0])), *batch)
    return {k: params[k] - lr * grads[k] for k in params}, loss



