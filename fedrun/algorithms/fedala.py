"""FedALA, adaptive local aggregation (Zhang, Hua, Wang, Shen, Wu, Guan, AAAI 2023, Alg. 1): a sampled
client does not overwrite its model with the server model w^t; it mixes them element-wise,

    lower layers:  theta <- w^t
    higher layers: theta <- l + (w^t - l) * W        (l: its previous local model, W in [0, 1], kept),

learning W by gradient steps on its own training rows (ALA: W <- clip(W - eta grad_theta f(theta) * (w^t - l),
0, 1), theta recomputed after each), then trains theta by local SGD as FedAvg; the server averages the
trained models. "Higher layers" are the model's last `layer_idx` parameter tensors (PFLlib's count:
2 = the output layer's weight and bias; 0 = all). W starts at ones (theta = w^t).

A client's ALA walks one pass of minibatches over its rows (an `epochs` phase; with `ala_steps` set,
that many minibatches instead), in its first ALA (`start_epochs` passes: PFLlib's start phase) more;
the ALA is skipped, the client keeping its own model whole, while sum(w^t - l) over the model's
first parameter tensor is 0 (PFLlib's test for the first round, where every l is the initial model).
Then its local training: `tau` steps (or `local_epochs` passes) of SGD of `lr`. This is PFLlib's
clientALA / utils.ALA, which the trace of tests/test_golden_pfllib_mix.py replays, but for the
choices docs/baselines.md ("FedALA") names: its ALA walks a contiguous slice of `rand_percent` % of
the rows in order, and its start phase runs until the spread of its last losses is small, where
fedrun walks a shuffled pass of all rows and a fixed number of passes; it runs ALA on every client
every round, fedrun on the round's clients.

Served: each client's last trained model (the shared model until it first trains).

Per-client state (stacked over ALL clients in `ServerState.clients`, a `FedALAClients`, checkpointed,
gathered for the round's clients and scattered back, so unsampled clients keep theirs): `params`, each
client's model, `weights` (its W, shaped as the higher layers, started at ones) and `ala["started"]`
([C] bool, its first ALA done). A round's clients hold a `FedALALocal`.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from ..engine import Engine
from ..engine.tree import Params, gather, only, param_names, per_client, scatter, stack, weighted_mean
from ..errors import ConfigError
from .base import Algorithm, EvalContext, ModelLocal, Phase, ServerState
from .checks import check_int, check_optional_int, check_positive
from .personalize import onboarding_batches


class FedALAClients(NamedTuple):
    params: Params  # every client's model
    weights: Params  # every client's ALA weights W, shaped as the higher layers
    ala: dict  # {"started": [C] bool}, whose first ALA is done


class FedALALocal(NamedTuple):
    params: Params  # theta: the client's model, the server's mixed into it by W
    local: Params  # the client's own higher layers before the mixture
    server: Params  # the server model's higher layers (expanded)
    weights: Params  # W
    active: Tensor  # [m] bool: the clients whose ALA runs (their model is not the server's)
    start: Tensor  # [m] bool: the clients in their first ALA (its start phase)
    opt: dict = {}  # the local trainer's optimizer state, by slot (`trainer.slot_of`)


class FedALA(Algorithm):
    name = "fedala"
    Clients = FedALAClients

    # fedrun.bench.agreement (and test_engines_agree): ALA of 2 minibatches, not a pass over a client's
    # rows (its clients have up to 6,552 rows: a pass of 1,310 steps, ~10 min of loop engine)
    agreement_options = dict(lr=0.1, start_epochs=2, ala_steps=2)

    def __init__(self, lr: float, eta: float, layer_idx: int, start_epochs: int, ala_steps: int | None,
                 local_epochs: int | None, new_client_steps: int | None, finetune_steps: int,
                 finetune_epochs: int | None, finetune_lr: float | None):
        check_positive("algo.lr", lr)
        check_positive("algo.eta", eta)
        check_int("algo.layer_idx", layer_idx, 0)
        check_int("algo.start_epochs", start_epochs, 1)
        check_optional_int("algo.ala_steps", ala_steps)
        self.ala_steps = ala_steps
        check_optional_int("algo.local_epochs", local_epochs)
        check_optional_int("algo.new_client_steps", new_client_steps)
        self.lr, self.eta, self.layer_idx, self.start_epochs = lr, eta, layer_idx, start_epochs
        self.local_epochs, self.new_client_steps = local_epochs, new_client_steps
        self.set_finetuning(finetune_steps, finetune_epochs, finetune_lr)

    def check_params(self, params: Params) -> None:
        super().check_params(params)
        n = len(param_names(params))
        if self.layer_idx > n:  # (names[-k:] would mix all of them, as layer_idx=0 says)
            raise ConfigError(f"algo.layer_idx={self.layer_idx} exceeds this model's {n} parameter tensors; "
                              f"allowed: 0..{n} (the last layer_idx tensors are mixed; 0: all)")

    # its training after the ALA is local SGD (PFLlib's clientALA optimizer): `optim.*` applies there;
    # the ALA's own step on W (clipped to [0, 1], rate eta) is not an optimizer step of the model
    optim_ok = True
    batchnorm_ok = True

    def higher(self, params: Params) -> list[str]:
        """The mixed tensors: the last layer_idx PARAMETER tensors (a BatchNorm model's running
        statistics are not mixed: they go with the lower layers, the server model's)."""
        names = param_names(params)
        return names[-self.layer_idx:] if self.layer_idx else names

    def phases(self) -> tuple[Phase, ...]:
        train = Phase(self.train_step, epochs=self.local_epochs) if self.local_epochs \
            else Phase(self.train_step, steps=self.tau_steps)
        if self.ala_steps is None:  # passes over each client's rows
            ala = (Phase(self.ala_step, epochs=1),)
            if self.start_epochs > 1:
                ala += (Phase(self.ala_start_step, epochs=self.start_epochs - 1),)
        else:  # ala_steps minibatches a "pass"
            ala = (Phase(self.ala_step, steps=self.ala_steps),)
            if self.start_epochs > 1:
                ala += (Phase(self.ala_start_step, steps=(self.start_epochs - 1) * self.ala_steps),)
        return (*ala, train)

    @property
    def tau_steps(self) -> int:
        """The run's tau (`bind`: simulate binds the run before its first round)."""
        return self.run.tau

    def init(self, params: Params, num_clients: int) -> ServerState:
        first = next(iter(params.values()))
        weights = {k: torch.ones(num_clients, *params[k].shape, dtype=params[k].dtype, device=first.device)
                   for k in self.higher(params)}
        started = torch.zeros(num_clients, dtype=torch.bool, device=first.device)
        return ServerState(params=params, clients=FedALAClients(params=stack(params, num_clients), weights=weights,
                                                                ala={"started": started}))

    def client_init(self, state: ServerState, clients: Tensor, rnd: int) -> FedALALocal:
        g = state.params
        l = gather(state.clients.params, clients)
        weights = gather(state.clients.weights, clients)
        first = param_names(g)[0]
        active = (g[first].unsqueeze(0) - l[first]).flatten(1).sum(1) != 0
        start = active & ~state.clients.ala["started"][clients]
        high = self.higher(g)
        theta = {}
        for k in g:
            mixed = l[k] + (g[k] - l[k]) * weights[k] if k in high else g[k].expand_as(l[k])
            theta[k] = torch.where(per_client(active, l[k]).bool(), mixed, l[k])
        return FedALALocal(params=theta, local=only(l, high), server={k: g[k].expand_as(l[k]) for k in high},
                           weights=weights, active=active, start=start)

    def _ala(self, engine: Engine, local: FedALALocal, batches, on: Tensor) -> FedALALocal:
        """One ALA step for the clients `on` ([m] bool); the others keep their Local."""
        (x, y), = batches
        theta, L, G = local.params, local.local, local.server
        # (a BatchNorm model: the forward in training mode; its running statistics are not kept, as
        # PFLlib's ALA trains a throwaway copy of the model and copies back its parameters only)
        g = engine.state_grad(theta, x, y)[0] if len(param_names(theta)) < len(theta) \
            else engine.grad(theta, x, y)[0]
        weights, params = dict(local.weights), dict(theta)
        for k in L:
            w = torch.clamp(local.weights[k] - self.eta * (g[k] * (G[k] - L[k])), 0, 1)
            keep = per_client(on, w).bool()
            weights[k] = torch.where(keep, w, local.weights[k])
            params[k] = torch.where(keep, L[k] + (G[k] - L[k]) * weights[k], theta[k])
        return local._replace(params=params, weights=weights)

    def ala_step(self, engine: Engine, local: FedALALocal, batches, rnd: int) -> FedALALocal:
        return self._ala(engine, local, batches, local.active)

    def ala_start_step(self, engine: Engine, local: FedALALocal, batches, rnd: int) -> FedALALocal:
        return self._ala(engine, local, batches, local.start)

    def train_step(self, engine: Engine, local: FedALALocal, batches, rnd: int) -> FedALALocal:
        return self.sgd_step(engine, local, batches, self.lr, rnd)  # one plain SGD step (FedAvg's)

    client_step = train_step

    def server_update(self, state: ServerState, local: FedALALocal, clients: Tensor, selected: Tensor,
                      weights: Tensor | None) -> ServerState:
        new = weighted_mean(gather(local.params, selected), weights)
        started = state.clients.ala["started"]
        kept = FedALAClients(params=scatter(state.clients.params, clients, local.params),
                             weights=scatter(state.clients.weights, clients, local.weights),
                             ala={"started": started.index_copy(0, clients, started[clients] | local.active)})
        return ServerState(params=new, extra=state.extra, clients=kept)

    def personalize(self, engine: Engine, state: ServerState, ctx: EvalContext):
        return state.clients.params, None

    def onboard(self, engine: Engine, state: ServerState, ctx: EvalContext, new: Tensor) -> ServerState:
        """A held-out client has no local model to mix the server model into (its ALA would be skipped,
        as on a first round): new_client_steps (null: tau) of its local SGD from the server model."""
        # (the trainer's plain Local: only a model to train; bn=local: with its own statistics, the initial ones)
        local = ModelLocal(params=self.own_models(state, new))
        for batches in onboarding_batches(ctx, new, self.new_client_steps):
            local = self.train_step(engine, local, batches, 0)
        params = scatter(state.clients.params, new, local.params)
        return ServerState(params=state.params, extra=state.extra, clients=state.clients._replace(params=params))
