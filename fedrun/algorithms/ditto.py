"""Ditto (Li, Hu, Beirami, Smith, ICML 2021, Alg. 1): the global model is trained as FedAvg (tau SGD
steps of lr `lr` from w^t, averaged), and each sampled client also updates its personal model v_i
with tau steps of lr `personal_lr` on

    f_i(v) + lam/2 ||v - w^t||^2,   v <- v - personal_lr (grad f_i(v; D') + lam (v - w^t)),

anchored at the round's server model w^t. Each local step draws two independent minibatches: D for
the global step, D' for the personal step (the reference code passes over its loader separately for
the two). lam = 0: v_i is a purely local model.

With `local_epochs` set, the round counts in epochs of each client's own rows, as PFLlib's
clientDitto does: first `personal_epochs` passes of the personal step (its ptrain, plocal_epochs),
then `local_epochs` passes of the global model's step (its train), each step on one minibatch
(`base.Phase`; tau is not used).

Per-client state (stacked over ALL clients in `ServerState.clients`, a `DittoClients`, checkpointed,
gathered for the round's clients and scattered back, so unsampled clients keep theirs): the personal
models, started from the initial model. A round's clients hold a `DittoLocal`.
"""
from __future__ import annotations

from typing import NamedTuple

from torch import Tensor

from ..engine import Engine
from ..engine.tree import Params, expand, gather, param_names, prox_grad, scatter, stack, weighted_mean
from .base import Algorithm, EvalContext, Phase, ServerState
from .checks import check_int, check_optional_int, check_phase_passes, check_positive
from .personalize import onboarding_batches
from .trainer import slot_of


class DittoClients(NamedTuple):
    personal: Params  # v_i, every client's personal model


class DittoLocal(NamedTuple):
    params: Params  # w: the global model, trained as FedAvg's
    anchor: Params  # w^t, the round's server model (expanded: one copy for all clients)
    personal: Params  # v_i
    opt: dict = {}  # the local trainer's optimizer state, by slot (`trainer.slot_of`)


class Ditto(Algorithm):
    name = "ditto"
    Clients = DittoClients
    batches_per_step = 2  # D for the global model's step, D' for the personal model's

    def __init__(self, lr: float, personal_lr: float, lam: float, local_epochs: int | None, personal_epochs: int,
                 new_client_steps: int | None, finetune_steps: int, finetune_epochs: int | None,
                 finetune_lr: float | None):
        check_positive("algo.lr", lr)
        check_positive("algo.personal_lr", personal_lr)
        check_positive("algo.lam", lam, allow_zero=True)
        check_optional_int("algo.new_client_steps", new_client_steps)
        check_optional_int("algo.local_epochs", local_epochs)
        check_int("algo.personal_epochs", personal_epochs, 0)
        check_phase_passes(self.name, "algo.personal_epochs", personal_epochs, local_epochs, "personal models")
        self.lr, self.personal_lr, self.lam, self.new_client_steps = lr, personal_lr, lam, new_client_steps
        self.local_epochs, self.personal_epochs = local_epochs, personal_epochs
        self.set_finetuning(finetune_steps, finetune_epochs, finetune_lr)

    def phases(self) -> tuple[Phase, ...] | None:
        if self.local_epochs is None:
            return None
        return Phase(self.personal_step, epochs=self.personal_epochs), Phase(self.global_step, epochs=self.local_epochs)

    optim_ok = True  # one optimizer per model, as PFLlib's clientDitto keeps (optimizer, poptimizer)
    batchnorm_ok = True  # each model carries its own running statistics

    def optim_slots(self, local: DittoLocal) -> dict:
        return {**super().optim_slots(local), slot_of("personal"): ("personal", param_names(local.personal))}

    def personal_step(self, engine: Engine, local: DittoLocal, batches, rnd: int) -> DittoLocal:
        """v <- v - personal_lr (grad f_i(v; D) + lam (v - w^t)) (a step of the personal optimizer)."""
        (x, y), = batches
        gv, _, local = self.grad(engine, local, "personal", x, y)
        gv = prox_grad(gv, local.personal, local.anchor, self.lam)
        return self.descend(local, "personal", gv, self.personal_lr, rnd)

    def global_step(self, engine: Engine, local: DittoLocal, batches, rnd: int) -> DittoLocal:
        return self.sgd_step(engine, local, batches, self.lr, rnd)

    def init(self, params: Params, num_clients: int) -> ServerState:
        return ServerState(params=params, clients=DittoClients(personal=stack(params, num_clients)))

    def client_init(self, state: ServerState, clients: Tensor, rnd: int) -> DittoLocal:
        m = len(clients)
        return DittoLocal(params=stack(state.params, m), anchor=expand(state.params, m),
                          personal=gather(state.clients.personal, clients))

    def client_step(self, engine: Engine, local: DittoLocal, batches, rnd: int) -> DittoLocal:
        (x, y), (x2, y2) = batches
        g, _, local = self.grad(engine, local, "params", x, y)
        gv, _, local = self.grad(engine, local, "personal", x2, y2)
        gv = prox_grad(gv, local.personal, local.anchor, self.lam)
        local = self.descend(local, "params", g, self.lr, rnd)
        return self.descend(local, "personal", gv, self.personal_lr, rnd)

    def server_update(self, state: ServerState, local: DittoLocal, clients: Tensor, selected: Tensor,
                      weights: Tensor | None) -> ServerState:
        new = weighted_mean(gather(local.params, selected), weights)
        personal = scatter(state.clients.personal, clients, local.personal)
        return ServerState(params=new, extra=state.extra, clients=DittoClients(personal=personal))

    def personalize(self, engine: Engine, state: ServerState, ctx: EvalContext):
        return state.clients.personal, None

    def onboard(self, engine: Engine, state: ServerState, ctx: EvalContext, new: Tensor) -> ServerState:
        """A held-out client's personal model: its personal objective f_i(v) + lam/2 ||v - w^t||^2,
        from v = w^t (as every client's v and w start from the same model), new_client_steps steps
        (null: tau) of personal_lr on minibatches of its training rows."""
        m = len(new)
        w = expand(state.params, m)
        personal = self.own_models(state, new)  # (bn=local: its own statistics, the initial)
        local = DittoLocal(params=w, anchor=w, personal=personal)
        for batches in onboarding_batches(ctx, new, self.new_client_steps):
            local = self.personal_step(engine, local, batches, 0)  # (round 0: the schedule's first rate)
        personal = scatter(state.clients.personal, new, local.personal)
        return ServerState(params=state.params, extra=state.extra, clients=DittoClients(personal=personal))
