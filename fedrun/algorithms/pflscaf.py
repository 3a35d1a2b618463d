"""PFLScaf (Acar et al. 2021; paper 004, Alg. 1 with Alg. 2's PFLScaf Regularizer, g_i update and
Update_2; `debiased` gives the formulas): the debiased local SGD with SCAFFOLD's control variates,
c_i per client (`clients["c"]`) and c on the server (`extra["c"]`), over the model's parameters (a
BatchNorm model's running statistics are averaged as the parameters are, `DebiasedSGD.server_update`)."""
from __future__ import annotations

import torch
from torch import Tensor

from ..engine.tree import Params, expand, gather, only, param_names, per_client, scatter, weighted_mean, zeros_like
from .base import Local, ServerState
from .debiased import AGREEMENT_META, DebiasedSGD


class PFLScaf(DebiasedSGD):
    """PFLScaf (paper 004, Alg. 1 with Alg. 2's PFLScaf Regularizer, g_i update and Update_2)."""

    name = "pflscaf"
    models_per_round = 2
    agreement_options = AGREEMENT_META  # fedrun.bench.agreement

    def init(self, params: Params, num_clients: int) -> ServerState:
        state = super().init(params, num_clients)
        trained = only(params, param_names(params))
        c = {k: torch.zeros_like(v) for k, v in trained.items()}
        return ServerState(params=params, extra={"c": c},
                           clients={**state.clients, "c": zeros_like(trained, num_clients)})

    def client_init(self, state: ServerState, clients: Tensor, rnd: int) -> Local:
        local = super().client_init(state, clients, rnd)
        m = len(clients)
        first = next(iter(state.params.values()))
        return {**local, "start": expand(state.params, m), "c": expand(state.extra["c"], m),
                "ci": gather(state.clients["c"], clients),
                "steps": torch.zeros(m, 1, dtype=first.dtype, device=first.device)}

    def linear_term(self, local: Local) -> Params:
        return {k: local["c"][k] - local["ci"][k] for k in local["c"]}

    def server_update(self, state: ServerState, local: Local, clients: Tensor, selected: Tensor,
                      weights: Tensor | None) -> ServerState:
        w = gather(local["params"], selected)
        scale = local["steps"][selected].squeeze(1) * self.lr  # K beta, beta the configured (undecayed) lr
        ci = gather(local["ci"], selected)
        ci_new = {k: ci[k] - state.extra["c"][k] + (state.params[k] - w[k]) / per_client(scale, w[k])
                  for k in ci}  # (the parameters: c_i's entries)
        m = state.clients["c"][next(iter(ci))].shape[0]
        c = {k: state.extra["c"][k] + (ci_new[k] - ci[k]).sum(0) / m for k in ci}
        ids = clients[selected]
        kept = self.keep_last(state.clients, ids, w)
        return ServerState(params=weighted_mean(w, weights), extra={**state.extra, "c": c},
                           clients={**kept, "c": scatter(state.clients["c"], ids, ci_new)})
