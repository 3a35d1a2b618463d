"""`BatchNormState`: what an algorithm adds to handle models with BatchNorm layers (their running
statistics, "buffers"). The generic `Algorithm` handles parameters only and refuses such models;
an algorithm that handles them puts this mixin first among its bases (FedAvg, FedBN).

A BatchNorm model's state (`engine.params_of`) is its parameters plus the layers' buffers: the
server keeps the shared buffers in `ServerState.extra["buffers"]`, a round's clients carry theirs
apart from their parameters (a `BatchNormLocal`'s `buffers`), each local step runs in training mode
(`Engine.train_grad`: batch statistics, running ones updated), and the server averages them as
parameters (`engine.batchnorm.mean_buffers`). Without buffers (a model with no BatchNorm, `buffers`
{}) every method is the base algorithm's.
"""
from __future__ import annotations

from typing import NamedTuple

from torch import Tensor

from ..engine import Engine
from ..engine.batchnorm import mean_buffers, split_buffers
from ..engine.tree import Params, gather, stack, weighted_mean
from .base import ServerState


class BatchNormLocal(NamedTuple):
    """The round's Local of FedAvg and FedBN (the algorithms with `BatchNormState`)."""

    params: Params  # the clients' models (parameters; FedBN's with each client's own BatchNorm layers)
    buffers: Params = {}  # their BatchNorm running statistics, stacked ({}: a model without BatchNorm)
    opt: dict = {}  # the local trainer's optimizer state, by slot (`trainer.slot_of`)


def _buffers(local) -> Params:
    """A Local's shared BatchNorm statistics ({}: none; a subclass's Local may lack the field)."""
    return getattr(local, "buffers", {})


class BatchNormState:
    """Mixin (before the algorithm's base class) for the algorithms that handle BatchNorm models."""

    lr: float

    def check_params(self, params: Params) -> None:
        super().check_params(split_buffers(params)[0])  # the base's checks, on the parameters

    def init(self, params: Params, num_clients: int) -> ServerState:
        params, buffers = split_buffers(params)
        state = super().init(params, num_clients)
        return ServerState(params=state.params, extra={**state.extra, "buffers": buffers} if buffers else state.extra,
                           clients=state.clients)

    def client_init(self, state: ServerState, clients: Tensor, rnd: int) -> BatchNormLocal:
        params = super().client_init(state, clients, rnd).params
        return BatchNormLocal(params=params, buffers=stack(state.extra.get("buffers", {}), len(clients)))

    def client_step(self, engine: Engine, local: BatchNormLocal, batches, rnd: int) -> BatchNormLocal:
        """One SGD step of lr `lr` in training mode (each client's batch statistics, its running
        statistics updated)."""
        if not _buffers(local):
            return super().client_step(engine, local, batches, rnd)
        (x, y), = batches
        g, _, buffers = engine.train_grad(local.params, _buffers(local), x, y)
        return self.descend(local, "params", g, self.lr, rnd)._replace(buffers=buffers)

    def server_update(self, state: ServerState, local: BatchNormLocal, clients: Tensor, selected: Tensor,
                      weights: Tensor | None) -> ServerState:
        """FedAvg's rule: the (weighted) mean of the clients' parameters, and of their running statistics
        (averaged like parameters)."""
        params = weighted_mean(gather(local.params, selected), weights)
        if not _buffers(local):
            return ServerState(params=params, extra=state.extra, clients=state.clients)
        buffers = mean_buffers(gather(_buffers(local), selected), weights)
        return ServerState(params=params, extra={**state.extra, "buffers": buffers}, clients=state.clients)

    def shared_buffers(self, local: BatchNormLocal) -> Params:  # (fedrun.algorithms.trainer, bn=local)
        return _buffers(local)

    def with_shared_buffers(self, local: BatchNormLocal, buffers: Params) -> BatchNormLocal:
        return local._replace(buffers=buffers) if _buffers(local) else local

    def server_with_buffers(self, state: ServerState, buffers: Params) -> ServerState:
        return ServerState(params=state.params, extra={**state.extra, "buffers": buffers}, clients=state.clients)

    def eval_params(self, state: ServerState) -> Params:
        """The shared model with its running statistics."""
        return {**super().eval_params(state), **state.extra.get("buffers", {})}
