"""PFLDyn (Acar et al. 2021; paper 004, Alg. 1 with Alg. 2's PFLDyn Regularizer, g_i update and
Update_1; `debiased` gives the formulas): the debiased local SGD with FedDyn's linear and proximal
terms; per-client state g_i (`clients["g"]`), server state h (`extra["h"]`), over the model's parameters (a
BatchNorm model's running statistics are averaged as the parameters are)."""
from __future__ import annotations

import torch
from torch import Tensor

from ..engine.tree import Params, expand, gather, only, param_names, scatter, weighted_mean, zeros_like
from .base import Local, ServerState
from .checks import check_positive
from .debiased import AGREEMENT_META, DebiasedSGD


class PFLDyn(DebiasedSGD):
    """PFLDyn (paper 004, Alg. 1 with Alg. 2's PFLDyn Regularizer, g_i update and Update_1)."""

    name = "pfldyn"
    agreement_options = dict(AGREEMENT_META, alpha=0.01)  # fedrun.bench.agreement

    def __init__(self, alpha: float, **options):
        check_positive("algo.alpha", alpha)
        super().__init__(**options)
        self.alpha = alpha

    def init(self, params: Params, num_clients: int) -> ServerState:
        state = super().init(params, num_clients)
        trained = only(params, param_names(params))
        h = {k: torch.zeros_like(v) for k, v in trained.items()}
        return ServerState(params=params, extra={"h": h},
                           clients={**state.clients, "g": zeros_like(trained, num_clients)})

    def client_init(self, state: ServerState, clients: Tensor, rnd: int) -> Local:
        local = super().client_init(state, clients, rnd)
        return {**local, "start": expand(state.params, len(clients)),
                "g": gather(state.clients["g"], clients)}

    def linear_term(self, local: Local) -> Params:
        return {k: -v for k, v in local["g"].items()}

    def proximal_term(self, local: Local) -> Params:
        w, w0 = local["params"], local["start"]
        return {k: self.alpha * (w[k] - w0[k]) for k in local["g"]}  # (the parameters: g_i's entries)

    def server_update(self, state: ServerState, local: Local, clients: Tensor, selected: Tensor,
                      weights: Tensor | None) -> ServerState:
        w = gather(local["params"], selected)
        delta = {k: w[k] - state.params[k] for k in state.extra["h"]}  # w_i - w^t, sampled clients, parameters
        g_new = {k: local["g"][k][selected] - self.alpha * delta[k] for k in delta}
        m = state.clients["g"][next(iter(delta))].shape[0]
        h = {k: state.extra["h"][k] - self.alpha / m * delta[k].sum(0) for k in delta}
        avg = weighted_mean(w, weights)  # (a BatchNorm model's running statistics: averaged)
        params = {**avg, **{k: avg[k] - h[k] / self.alpha for k in h}}
        ids = clients[selected]
        kept = self.keep_last(state.clients, ids, w)
        return ServerState(params=params, extra={**state.extra, "h": h},
                           clients={**kept, "g": scatter(state.clients["g"], ids, g_new)})
