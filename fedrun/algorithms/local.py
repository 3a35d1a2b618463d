"""Local training only (the lower bound of every PFL table): each sampled client takes `tau` SGD
steps of lr `lr` on its own model; nothing is sent or averaged. The server model stays the initial
model (the `global_*` metrics score it); `pers_*` score the clients' models.

Per-client state (stacked over ALL clients in `ServerState.clients`, a `LocalOnlyClients`,
checkpointed, gathered for the round's clients and scattered back, so unsampled clients keep theirs):
each client's model, started from the initial model (a BatchNorm model's with its running
statistics: `bn=` changes nothing, they are each client's own). A round's clients hold a
`LocalOnlyLocal`.
"""
from __future__ import annotations

from typing import NamedTuple

from torch import Tensor

from ..engine import Engine
from ..engine.tree import Params, gather, scatter, stack
from .base import EvalContext, LocalLR, ServerState
from .personalize import onboarding_batches


class LocalOnlyClients(NamedTuple):
    params: Params  # every client's own model


class LocalOnlyLocal(NamedTuple):
    params: Params  # the round's clients' models
    opt: dict = {}  # the local trainer's optimizer state, by slot (`trainer.slot_of`)


class LocalOnly(LocalLR):
    name = "local"
    Clients = LocalOnlyClients
    optim_ok = True  # (optim.*: its local step is sgd_step)
    batchnorm_ok = True  # each client's model carries its own running statistics
    models_per_round = 0  # nothing is transmitted

    def init(self, params: Params, num_clients: int) -> ServerState:
        return ServerState(params=params, clients=LocalOnlyClients(params=stack(params, num_clients)))

    def client_init(self, state: ServerState, clients: Tensor, rnd: int) -> LocalOnlyLocal:
        return LocalOnlyLocal(params=gather(state.clients.params, clients))

    def client_step(self, engine: Engine, local: LocalOnlyLocal, batches, rnd: int) -> LocalOnlyLocal:
        return self.sgd_step(engine, local, batches, self.lr, rnd)

    def server_update(self, state: ServerState, local: LocalOnlyLocal, clients: Tensor, selected: Tensor,
                      weights: Tensor | None) -> ServerState:
        kept = scatter(state.clients.params, clients, local.params)
        return ServerState(params=state.params, extra=state.extra, clients=LocalOnlyClients(params=kept))

    def shared_buffers(self, local: LocalOnlyLocal) -> Params:  # (trainer, bn=local): no shared model, nothing to keep
        return {}

    def personalize(self, engine: Engine, state: ServerState, ctx: EvalContext):
        return state.clients.params, None

    def onboard(self, engine: Engine, state: ServerState, ctx: EvalContext, new: Tensor) -> ServerState:
        """A held-out client trains its own model as a sampled client does, from the initial model."""
        local = self.client_init(state, new, 0)
        for batches in onboarding_batches(ctx, new, self.new_client_steps):
            local = self.client_step(engine, local, batches, 0)
        kept = scatter(state.clients.params, new, local.params)
        return ServerState(params=state.params, extra=state.extra, clients=LocalOnlyClients(params=kept))
