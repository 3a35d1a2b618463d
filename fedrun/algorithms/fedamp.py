"""FedAMP, attentive message passing (Huang, Chu, Zhou, Wang, Liu, Pei, Zhang, AAAI 2021, Alg. 1 and
eqs. 5-7): every client keeps its own model w_i; before client i trains, the server sends it a
personalized cloud model

    u_i = sum_j xi_ij w_j,   xi_ij = alpha_k A'(||w_i - w_j||^2)  (j != i),   xi_ii = 1 - sum_{j != i} xi_ij,
    A'(d) = exp(-d / sigma) / sigma       (the derivative of the attention A(d) = 1 - exp(-d / sigma)),

a mixture that weighs most the clients whose models are close to w_i; the client then takes local SGD
steps on

    f_i(w) + lam / (2 alpha_k) ||w - u_i||^2,    w <- w - lr (grad f_i(w) + (lam / alpha_k)(w - u_i)),

from its own previous w_i, and keeps the result as its personalized model (served at test time).
With partial participation the j run over the clients that trained in the previous round, as PFLlib's
server does (it holds only the models it last received); with every client training every round that
is the paper's sum over all clients.

`follow=pfllib` (protocol=official) reproduces PFLlib's clientAMP: its regularizer is built from the
parameters' `.data` (detached), so it adds a constant to the loss and no gradient: a client's w
trains by plain SGD on f_i and u_i is computed but never used (docs/baselines.md, "FedAMP").

Server side, one computation over the round's m clients: the squared distances between their models
and every previous-round model are an [m, C] matrix (torch.cdist on the flattened parameters,
computed by differences, not through a Gram matrix, so that close models keep their digits), the
mixtures one [m, C] x [C, P] product per parameter tensor: O(m C P) time and O(m C + m P) memory
besides the stacked client models (100 clients of a 1M-parameter model: a 100 x 100 matrix).

The shared model (`global_*` metrics) stays the initial model: FedAMP has no global model.

Per-client state (stacked over ALL clients in `ServerState.clients`, a `FedAMPClients`, checkpointed,
gathered for the round's clients and scattered back, so unsampled clients keep theirs): each client's
model `params` and its last cloud model `u` (parameters only), both started from the initial model; a
round's clients hold a `FedAMPLocal`. `extra["sent"]`: a [C] mask of the clients whose models the
previous round uploaded.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from ..engine import Engine
from ..engine.tree import Params, add, gather, only, param_names, prox_grad, scale, scatter, stack
from .base import Algorithm, EvalContext, Phase, ServerState
from .checks import check_choice, check_optional_int, check_positive
from .personalize import onboarding_batches


def squared_distances(a: Params, b: Params) -> Tensor:
    """||a_i - b_j||^2 over all parameters, [len(a), len(b)], by differences (no Gram matrix)."""
    return sum(torch.cdist(a[k].flatten(1).unsqueeze(0), b[k].flatten(1).unsqueeze(0),
                           compute_mode="donot_use_mm_for_euclid_dist")[0].square() for k in a)


def mixtures(coef: Tensor, models: Params) -> Params:
    """sum_j coef[i, j] models_j per row i of coef [m, C], over models stacked [C, ...]."""
    return {k: (coef @ v.flatten(1)).view(len(coef), *v.shape[1:]) for k, v in models.items()}


class FedAMPClients(NamedTuple):
    params: Params  # w_i, every client's model
    u: Params  # u_i, every client's last cloud model (parameters only)


class FedAMPLocal(NamedTuple):
    params: Params  # w_i
    u: Params  # u_i, the round's cloud model
    opt: dict = {}  # the local trainer's optimizer state, by slot (`trainer.slot_of`)


class FedAMP(Algorithm):
    name = "fedamp"
    Clients = FedAMPClients

    FOLLOW = ("paper", "pfllib")
    protocol = {"follow": dict(honest="paper", official="pfllib")}  # PFLlib's clientAMP: no proximal gradient
    agreement_options = dict(lr=0.1, sigma=10.0)  # fedrun.bench.agreement: attention weights away from 0

    def __init__(self, lr: float, lam: float, alpha_k: float, sigma: float, follow: str | None,
                 local_epochs: int | None, new_client_steps: int | None,
                 finetune_steps: int, finetune_epochs: int | None, finetune_lr: float | None):
        check_positive("algo.lr", lr)
        check_positive("algo.lam", lam, allow_zero=True)
        check_positive("algo.alpha_k", alpha_k)
        check_positive("algo.sigma", sigma)
        check_choice("algo.follow", follow or "paper", self.FOLLOW)
        check_optional_int("algo.local_epochs", local_epochs)
        check_optional_int("algo.new_client_steps", new_client_steps)
        self.lr, self.lam, self.alpha_k, self.sigma = lr, lam, alpha_k, sigma
        self.follow, self.local_epochs, self.new_client_steps = follow or "paper", local_epochs, new_client_steps
        self.set_finetuning(finetune_steps, finetune_epochs, finetune_lr)

    def phases(self) -> tuple[Phase, ...] | None:
        return None if self.local_epochs is None else (Phase(self.client_step, epochs=self.local_epochs),)

    def init(self, params: Params, num_clients: int) -> ServerState:
        first = next(iter(params.values()))
        return ServerState(params=params,
                           extra={"sent": torch.zeros(num_clients, dtype=torch.bool, device=first.device)},
                           clients=FedAMPClients(params=stack(params, num_clients),
                                                 u=stack(only(params, param_names(params)), num_clients)))

    def cloud_models(self, state: ServerState, w: Params, ids: Tensor) -> Params:
        """u_i for the clients `ids` whose models are `w` (stacked), from the models the previous round
        uploaded (all of them zero-weighted on the first round: u_i = w_i)."""
        sent = state.extra["sent"]
        names = param_names(w)  # (the parameters: a distance or mixture of running statistics is not the method)
        models, w = only(state.clients.params, names), only(w, names)
        d = squared_distances(w, models)  # [m, C]
        others = sent.unsqueeze(0) & (ids.view(-1, 1) != torch.arange(len(sent), device=sent.device))
        coef = torch.where(others, self.alpha_k * torch.exp(-d / self.sigma) / self.sigma, torch.zeros_like(d))
        own = 1 - coef.sum(1)
        return add(mixtures(coef, models), scale(w, own))

    def client_init(self, state: ServerState, clients: Tensor, rnd: int) -> FedAMPLocal:
        w = gather(state.clients.params, clients)
        return FedAMPLocal(params=w, u=self.cloud_models(state, w, clients))

    optim_ok = True  # one optimizer of the client's model on f_i + lam / (2 alpha_k) ||w - u_i||^2
    batchnorm_ok = True  # u_i and the server's distances over the parameters; each w_i keeps its statistics

    def client_step(self, engine: Engine, local: FedAMPLocal, batches, rnd: int) -> FedAMPLocal:
        (x, y), = batches
        g, _, local = self.grad(engine, local, "params", x, y)
        if self.follow == "paper":  # PFLlib's regularizer carries no gradient
            g = prox_grad(g, local.params, local.u, self.lam / self.alpha_k)
        return self.descend(local, "params", g, self.lr, rnd)

    @staticmethod
    def _kept(state: ServerState, clients: Tensor, local: FedAMPLocal) -> FedAMPClients:
        """The per-client state with the clients `clients`' rows replaced by theirs in `local`."""
        return FedAMPClients(params=scatter(state.clients.params, clients, local.params),
                             u=scatter(state.clients.u, clients, local.u))

    def server_update(self, state: ServerState, local: FedAMPLocal, clients: Tensor, selected: Tensor,
                      weights: Tensor | None) -> ServerState:
        sent = torch.zeros_like(state.extra["sent"]).index_fill(0, clients[selected], True)
        return ServerState(params=state.params, extra={**state.extra, "sent": sent},
                           clients=self._kept(state, clients, local))

    def personalize(self, engine: Engine, state: ServerState, ctx: EvalContext):
        return state.clients.params, None

    def onboard(self, engine: Engine, state: ServerState, ctx: EvalContext, new: Tensor) -> ServerState:
        """A held-out client: from the initial model (the shared one; as every client's w starts),
        its cloud model from the last round's uploaded models, then new_client_steps (null: tau) of
        its local FedAMP steps; it is served its trained w."""
        w = self.own_models(state, new)  # (bn=local: its own statistics, the initial)
        local = FedAMPLocal(params=w, u=self.cloud_models(state, w, new))
        for batches in onboarding_batches(ctx, new, self.new_client_steps):
            local = self.client_step(engine, local, batches, 0)
        return ServerState(params=state.params, extra=state.extra, clients=self._kept(state, new, local))
