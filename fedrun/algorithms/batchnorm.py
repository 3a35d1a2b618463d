"""`BatchNormState`: what an algorithm adds to handle models with BatchNorm layers (their running
statistics, "buffers"). The generic `Algorithm` handles parameters only and refuses such models;
an algorithm that handles them puts this mixin first among its bases (FedAvg, FedBN).

A BatchNorm model's state (`engine.params_of`) is its parameters plus the layers' buffers: the
server keeps the shared buffers in `ServerState.extra["buffers"]`, a round's clients carry theirs
in `Local["buffers"]`, each local step runs in training mode (`Engine.train_grad`: batch
statistics, running ones updated), and the server averages them as parameters
(`engine.batchnorm.mean_buffers`). Without buffers (a model with no BatchNorm) every method is the
base algorithm's.
"""
from __future__ import annotations

from torch import Tensor

from ..engine import Engine
from ..engine.batchnorm import mean_buffers, split_buffers
from ..engine.tree import Params, gather, stack
from .base import Local, ServerState


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

    def client_init(self, state: ServerState, clients: Tensor, rnd: int) -> Local:
        local = super().client_init(state, clients, rnd)
        if "buffers" in state.extra:
            local["buffers"] = stack(state.extra["buffers"], len(clients))
        return local

    def client_step(self, engine: Engine, local: Local, batches, rnd: int) -> Local:
        """One SGD step of lr `lr` in training mode (each client's batch statistics, its running
        statistics updated)."""
        if "buffers" not in local:
            return super().client_step(engine, local, batches, rnd)
        (x, y), = batches
        g, _, buffers = engine.train_grad(local["params"], local["buffers"], x, y)
        return {**self.descend(local, "params", g, self.lr, rnd), "buffers": buffers}

    def server_update(self, state: ServerState, local: Local, clients: Tensor, selected: Tensor,
                      weights: Tensor | None) -> ServerState:
        new = super().server_update(state, local, clients, selected, weights)
        if "buffers" not in local:
            return new
        # running statistics averaged like parameters
        buffers = mean_buffers(gather(local["buffers"], selected), weights)
        return ServerState(params=new.params, extra={**new.extra, "buffers": buffers}, clients=new.clients)

    def shared_buffers(self, local: Local) -> Params:  # (fedrun.algorithms.trainer, bn=local)
        return local.get("buffers", {})

    def with_shared_buffers(self, local: Local, buffers: Params) -> Local:
        return {**local, "buffers": buffers} if "buffers" in local else local

    def server_with_buffers(self, state: ServerState, buffers: Params) -> ServerState:
        return ServerState(params=state.params, extra={**state.extra, "buffers": buffers}, clients=state.clients)

    def eval_params(self, state: ServerState) -> Params:
        """The shared model with its running statistics."""
        return {**super().eval_params(state), **state.extra.get("buffers", {})}
