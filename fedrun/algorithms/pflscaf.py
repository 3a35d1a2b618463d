"""PFLScaf (Acar et al. 2021; paper 004, Alg. 1 with Alg. 2's PFLScaf Regularizer, g_i update and
Update_2; `debiased` gives the formulas): the debiased local SGD with SCAFFOLD's control variates,
c_i per client (`PFLScafClients.c`) and c on the server (`extra["c"]`), over the model's parameters (a
BatchNorm model's running statistics are averaged as the parameters are). A round's clients hold a
`PFLScafLocal`."""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from ..engine.tree import (
    Params,
    expand,
    gather,
    only,
    param_names,
    per_client,
    scatter,
    stack,
    sub,
    weighted_mean,
    zeros_like,
)
from .base import ServerState
from .debiased import AGREEMENT_META, DebiasedSGD


class PFLScafClients(NamedTuple):
    c: Params  # c_i, every client's control variate, over the model's parameters
    last: Params = {}  # every client's latest local model (eval_model=clients_mean; {}: eval_model=server)


class PFLScafLocal(NamedTuple):
    params: Params  # w, the model each client trains
    start: Params  # w^t, the round's server model (expanded: one copy for all clients)
    c: Params  # c, the server's control variate (expanded)
    ci: Params  # c_i
    steps: Tensor  # [m, 1] the local steps taken this round (K of c_i's update)
    opt: dict = {}  # the local trainer's optimizer state, by slot (`trainer.slot_of`)


class PFLScaf(DebiasedSGD):
    """PFLScaf (paper 004, Alg. 1 with Alg. 2's PFLScaf Regularizer, g_i update and Update_2)."""

    name = "pflscaf"
    Clients = PFLScafClients
    models_per_round = 2
    agreement_options = AGREEMENT_META  # fedrun.bench.agreement

    def init(self, params: Params, num_clients: int) -> ServerState:
        trained = only(params, param_names(params))
        c = {k: torch.zeros_like(v) for k, v in trained.items()}
        return ServerState(params=params, extra={"c": c},
                           clients=PFLScafClients(c=zeros_like(trained, num_clients),
                                                  last=self.last_models(params, num_clients)))

    def client_init(self, state: ServerState, clients: Tensor, rnd: int) -> PFLScafLocal:
        m = len(clients)
        first = next(iter(state.params.values()))
        return PFLScafLocal(params=stack(state.params, m), start=expand(state.params, m),
                            c=expand(state.extra["c"], m), ci=gather(state.clients.c, clients),
                            steps=torch.zeros(m, 1, dtype=first.dtype, device=first.device))

    def linear_term(self, local: PFLScafLocal) -> Params:
        return sub(local.c, local.ci)  # c - c_i

    def count_step(self, local: PFLScafLocal) -> PFLScafLocal:
        return local._replace(steps=local.steps + 1)

    def server_update(self, state: ServerState, local: PFLScafLocal, clients: Tensor, selected: Tensor,
                      weights: Tensor | None) -> ServerState:
        w = gather(local.params, selected)
        scale = local.steps[selected].squeeze(1) * self.lr  # K beta, beta the configured (undecayed) lr
        ci = gather(local.ci, selected)
        ci_new = {k: ci[k] - state.extra["c"][k] + (state.params[k] - w[k]) / per_client(scale, w[k])
                  for k in ci}  # (the parameters: c_i's entries)
        m = len(next(iter(state.clients.c.values())))
        c = {k: state.extra["c"][k] + (ci_new[k] - ci[k]).sum(0) / m for k in ci}
        ids = clients[selected]
        kept = self.keep_last(state.clients, ids, w)
        return ServerState(params=weighted_mean(w, weights), extra={**state.extra, "c": c},
                           clients=kept._replace(c=scatter(state.clients.c, ids, ci_new)))
