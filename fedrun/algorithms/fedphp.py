"""FedPHP, personalization with inherited private models (Li, Zhan, Shao, Li, Song, ECML PKDD 2021):
each client keeps an inherited private model v_i, a temporal ensemble of its past personalized
models, which supervises its personalization from the next round's global model. A sampled client
starts from the server model w^t and takes local SGD steps on

    (1 - lam) CE(w; x, y) + lam MMD^2(h_w(x), h_{v_i}(x)),

h the network's last hidden layer (`Engine.features`) and MMD^2 the (biased) squared maximum mean
discrepancy between the two batches of features under a sum of RBF kernels exp(-||a - b||^2 / (2 s))
of s in `bandwidths` (PFLlib's 10, 15, 20, 50); v_i gets no gradient. After the round

    v_i <- (1 - mu_t) w_i + mu_t v_i,    mu_t = mu (t - 1) / T    (t = 1, 2, ...; T = mu_rounds),

so early rounds take mostly the fresh model and later ones keep more of the history; the server
averages the w_i as FedAvg. This is PFLlib's clientPHP / FedPHP (its round index R = t - 1 from 0,
its mu / global_rounds), which the trace of tests/test_golden_pfllib_mix.py replays; the paper's
other knowledge-transfer variants (e.g. distillation on logits) are not implemented
(docs/baselines.md, "FedPHP").

Served (`serve`): `local`, each client's model as its last round's personalization left it (the
shared model until it first trains; PFLlib scores a client's `model`, which is the round's global
model for the clients not sampled), or `hpm`, its inherited private model v_i.

Per-client state (stacked over ALL clients in `ServerState.clients`, a `FedPHPClients`, checkpointed,
gathered for the round's clients and scattered back, so unsampled clients keep theirs): `historical`,
the v_i, started from the initial model, and `params`, each client's last personalized w_i (kept for
`serve=local`). A round's clients hold a `FedPHPLocal`.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from ..engine import Engine
from ..engine.batchnorm import is_buffer
from ..engine.tree import Params, gather, per_client, scatter, stack, weighted_mean
from .base import Algorithm, EvalContext, Phase, ServerState
from .checks import check_choice, check_optional_int, check_positive, check_unit
from .personalize import onboarding_batches
from .representation import client_features, features_and_logits

BANDWIDTHS = (10.0, 15.0, 20.0, 50.0)  # PFLlib's MMD(..., 'rbf') bandwidths


def mmd_rbf(a: Tensor, b: Tensor, bandwidths=BANDWIDTHS) -> Tensor:
    """Biased squared MMD between the rows of a [B, h] and of b [B, h] under sum_s exp(-d / (2 s)),
    d the squared distance; the mean over all pairs of k(a, a') + k(b, b') - 2 k(a, b)."""
    aa, bb, ab = a @ a.T, b @ b.T, a @ b.T
    na, nb = aa.diagonal(), bb.diagonal()
    daa = na.unsqueeze(0) + na.unsqueeze(1) - 2 * aa
    dbb = nb.unsqueeze(0) + nb.unsqueeze(1) - 2 * bb
    dab = na.unsqueeze(1) + nb.unsqueeze(0) - 2 * ab
    k = sum(torch.exp(-0.5 * daa / s) + torch.exp(-0.5 * dbb / s) - 2 * torch.exp(-0.5 * dab / s) for s in bandwidths)
    return k.mean()


class FedPHPClients(NamedTuple):
    params: Params  # w_i, every client's last personalized model
    historical: Params  # v_i, every client's inherited private model


class FedPHPLocal(NamedTuple):
    params: Params  # w_i, from the server's model
    historical: Params  # v_i
    mu: Tensor  # mu_t [m], the round's inheritance weight
    opt: dict = {}  # the local trainer's optimizer state, by slot (`trainer.slot_of`)


class FedPHP(Algorithm):
    name = "fedphp"
    Clients = FedPHPClients

    SERVE = ("local", "hpm")
    agreement_options = dict(lr=0.1, mu_rounds=2)  # fedrun.bench.agreement: mu_t > 0 in its second round

    def __init__(self, lr: float, mu: float, lam: float, mu_rounds: int | None, serve: str, local_epochs: int | None,
                 new_client_steps: int | None, finetune_steps: int, finetune_epochs: int | None,
                 finetune_lr: float | None):
        check_positive("algo.lr", lr)
        check_unit("algo.mu", mu)
        check_unit("algo.lam", lam)
        check_optional_int("algo.mu_rounds", mu_rounds)
        check_choice("algo.serve", serve, self.SERVE)
        check_optional_int("algo.local_epochs", local_epochs)
        check_optional_int("algo.new_client_steps", new_client_steps)
        self.lr, self.mu, self.lam, self.mu_rounds, self.serve = lr, mu, lam, mu_rounds, serve
        self.local_epochs, self.new_client_steps = local_epochs, new_client_steps
        self.set_finetuning(finetune_steps, finetune_epochs, finetune_lr)

    @property
    def run_rounds(self) -> int | None:
        """The run's rounds (`bind`: simulate binds the run before its first round)."""
        return self.run.rounds

    def mu_at(self, rnd: int) -> float:
        """mu_t of round `rnd` (1, 2, ...); mu itself where no run gave its rounds (client_init called
        outside `simulate`, which always does)."""
        T = self.mu_rounds or self.run_rounds
        if T is None:
            return self.mu
        return min(self.mu * (rnd - 1) / T, self.mu)

    def phases(self) -> tuple[Phase, ...] | None:
        return None if self.local_epochs is None else (Phase(self.client_step, epochs=self.local_epochs),)

    def init(self, params: Params, num_clients: int) -> ServerState:
        return ServerState(params=params, clients=FedPHPClients(params=stack(params, num_clients),
                                                                historical=stack(params, num_clients)))

    def client_init(self, state: ServerState, clients: Tensor, rnd: int) -> FedPHPLocal:
        first = next(iter(state.params.values()))
        m = len(clients)
        return FedPHPLocal(params=stack(state.params, m), historical=gather(state.clients.historical, clients),
                           mu=torch.full((m,), self.mu_at(rnd), dtype=first.dtype, device=first.device))

    optim_ok = True  # one optimizer of the client's model (PFLlib's clientPHP)
    # v_i, a constant teacher, gives its features by an eval-mode forward (its running statistics); it
    # inherits w_i's statistics as its parameters (mixed by mu_t; the step counter: w_i's)
    batchnorm_ok = True

    def client_step(self, engine: Engine, local: FedPHPLocal, batches, rnd: int) -> FedPHPLocal:
        (x, y), = batches
        lam = self.lam
        if lam:  # (a constant of the step: no gradient flows to v_i)
            z_hist = client_features(engine, local.historical, x)

        batchnorm = any(is_buffer(k) for k in local.params)

        def loss(p, x, y, *hist):
            if not lam:
                return torch.nn.functional.cross_entropy(engine.logits(p, x), y)
            if batchnorm:  # one forward: BatchNorm's running statistics move once a step
                z, logits = features_and_logits(engine, p, x)
            else:  # (the two passes the traces ran: features="both" rounds the logits differently)
                logits, z = engine.logits(p, x), engine.features(p, x)
            return (1 - lam) * torch.nn.functional.cross_entropy(logits, y) + lam * mmd_rbf(z, hist[0])

        g, _, local = self.value_and_grad(engine, local, "params", loss, x, y, *((z_hist,) if lam else ()))
        return self.descend(local, "params", g, self.lr, rnd)

    @staticmethod
    def inherit(local: FedPHPLocal) -> Params:
        """v_i <- (1 - mu_t) w_i + mu_t v_i (mu_t: the round's, set by client_init); of a BatchNorm
        model, the running statistics as the parameters, the integer step counter w_i's."""
        w, v, mu = local.params, local.historical, local.mu
        return {k: w[k] * per_client(1 - mu, w[k]) + v[k] * per_client(mu, w[k]) if w[k].is_floating_point()
                else w[k] for k in w}

    def _kept(self, state: ServerState, clients: Tensor, local: FedPHPLocal) -> FedPHPClients:
        """The per-client state with the clients `clients`' rows replaced: their w_i, their inherited v_i."""
        return FedPHPClients(params=scatter(state.clients.params, clients, local.params),
                             historical=scatter(state.clients.historical, clients, self.inherit(local)))

    def server_update(self, state: ServerState, local: FedPHPLocal, clients: Tensor, selected: Tensor,
                      weights: Tensor | None) -> ServerState:
        new = weighted_mean(gather(local.params, selected), weights)
        return ServerState(params=new, extra=state.extra, clients=self._kept(state, clients, local))

    def personalize(self, engine: Engine, state: ServerState, ctx: EvalContext):
        return state.clients.params if self.serve == "local" else state.clients.historical, None

    def onboard(self, engine: Engine, state: ServerState, ctx: EvalContext, new: Tensor) -> ServerState:
        """A held-out client personalizes as a sampled client of the next round: new_client_steps
        (null: tau) of its FedPHP steps from the server model, supervised by its v_i (the initial
        model: it has no history yet), then v_i takes its model whole (mu_t = 0, as a first round)."""
        local = self.client_init(state, new, 1)
        local = local._replace(params=self.with_own_statistics(state, local.params, new))  # (bn=local: as start_local)
        for batches in onboarding_batches(ctx, new, self.new_client_steps):
            local = self.client_step(engine, local, batches, 0)
        return ServerState(params=state.params, extra=state.extra, clients=self._kept(state, new, local))
