"""PFLDyn (Acar et al. 2021; paper 004, Alg. 1 with Alg. 2's PFLDyn Regularizer, g_i update and
Update_1; `debiased` gives the formulas): the debiased local SGD with FedDyn's linear and proximal
terms; per-client state g_i (`PFLDynClients.g`), server state h (`extra["h"]`), over the model's parameters (a
BatchNorm model's running statistics are averaged as the parameters are). A round's clients hold a
`PFLDynLocal`."""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from ..engine.tree import (
    Params,
    axpy,
    expand,
    gather,
    only,
    param_names,
    scale,
    scatter,
    stack,
    sub,
    tree_map,
    weighted_mean,
    zeros_like,
)
from .base import ServerState
from .checks import check_positive
from .debiased import AGREEMENT_META, DebiasedSGD


class PFLDynClients(NamedTuple):
    g: Params  # g_i, every client's linear term, over the model's parameters
    last: Params = {}  # every client's latest local model (eval_model=clients_mean; {}: eval_model=server)


class PFLDynLocal(NamedTuple):
    params: Params  # w, the model each client trains
    start: Params  # w^t, the round's server model (expanded: one copy for all clients)
    g: Params  # g_i
    opt: dict = {}  # the local trainer's optimizer state, by slot (`trainer.slot_of`)


class PFLDyn(DebiasedSGD):
    """PFLDyn (paper 004, Alg. 1 with Alg. 2's PFLDyn Regularizer, g_i update and Update_1)."""

    name = "pfldyn"
    Clients = PFLDynClients
    agreement_options = dict(AGREEMENT_META, alpha=0.01)  # fedrun.bench.agreement

    def __init__(self, alpha: float, **options):
        check_positive("algo.alpha", alpha)
        super().__init__(**options)
        self.alpha = alpha

    def init(self, params: Params, num_clients: int) -> ServerState:
        trained = only(params, param_names(params))
        h = {k: torch.zeros_like(v) for k, v in trained.items()}
        return ServerState(params=params, extra={"h": h},
                           clients=PFLDynClients(g=zeros_like(trained, num_clients),
                                                 last=self.last_models(params, num_clients)))

    def client_init(self, state: ServerState, clients: Tensor, rnd: int) -> PFLDynLocal:
        m = len(clients)
        return PFLDynLocal(params=stack(state.params, m), start=expand(state.params, m),
                           g=gather(state.clients.g, clients))

    def linear_term(self, local: PFLDynLocal) -> Params:
        return scale(local.g, -1)  # -g_i

    def proximal_term(self, local: PFLDynLocal) -> Params:
        # alpha (w - w^t), over the parameters (g_i's entries)
        return scale(sub(only(local.params, local.g), local.start), self.alpha)

    def server_update(self, state: ServerState, local: PFLDynLocal, clients: Tensor, selected: Tensor,
                      weights: Tensor | None) -> ServerState:
        w = gather(local.params, selected)
        h = state.extra["h"]
        delta = sub(only(w, h), state.params)  # w_i - w^t, sampled clients, parameters
        g_new = axpy(-self.alpha, delta, gather(local.g, selected))  # g_i - alpha (w_i - w^t)
        m = len(next(iter(state.clients.g.values())))
        h = axpy(-self.alpha / m, tree_map(lambda v: v.sum(0), delta), h)  # h - alpha/m sum_i (w_i - w^t)
        avg = weighted_mean(w, weights)  # (a BatchNorm model's running statistics: averaged)
        params = {**avg, **{k: avg[k] - h[k] / self.alpha for k in h}}
        ids = clients[selected]
        kept = self.keep_last(state.clients, ids, w)
        return ServerState(params=params, extra={**state.extra, "h": h},
                           clients=kept._replace(g=scatter(state.clients.g, ids, g_new)))
