"""MOON, model-contrastive federated learning (Li, He, Song, CVPR 2021, Sec. 3.2, eq. 3-4; Alg. 1).

Each sampled client takes `tau` SGD steps of lr `lr` from the server model w^t on

    l = CE(w; x, y) + mu * l_con,   l_con = -log( exp(sim(z, z_glob) / T)
                                                  / (exp(sim(z, z_glob) / T) + exp(sim(z, z_prev) / T)) )

averaged over the minibatch's rows, where z is the row's representation by the client's current
model, z_glob by the round's server model w^t and z_prev by the client's own model of its last round
(both constants), sim the cosine similarity and T the temperature (`temperature`). The server
averages the models (FedAvg). MOON is a global method: the global model is served (`finetune_*`
fine-tunes it per client, as for FedAvg).

The representation is the model's last hidden layer (`Engine.features`), as in PFLlib's clientMOON
(`model.base(x)`); the paper adds a projection head (a 2-layer MLP) after the encoder and contrasts
its outputs (docs/baselines.md). l_con is computed as logsumexp - sim, the same number as the
exp/log quotient without its overflow at small T.

Per-client state (a `MOONClients`): every client's model after its last round (`prev`, stacked over
ALL clients, the initial model until it first trains, as PFLlib's `old_model`). A round's clients hold
a `MOONLocal`.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from ..engine import Engine
from ..engine.tree import Params, expand, gather, scatter, stack, weighted_mean
from .base import Algorithm, ServerState
from .checks import check_positive, require_body
from .representation import client_features, features_and_logits


class MOONClients(NamedTuple):
    prev: Params  # every client's model after its last round


class MOONLocal(NamedTuple):
    params: Params  # w: the client's model, from the server's
    server: Params  # w^t, the round's server model (expanded: one copy for all clients); z_glob's model
    prev: Params  # the client's model of its last round; z_prev's model
    opt: dict = {}  # the local trainer's optimizer state, by slot (`trainer.slot_of`)


class MOON(Algorithm):
    name = "moon"
    Clients = MOONClients
    agreement_options = dict(lr=0.1, mu=1.0, temperature=0.5)  # fedrun.bench.agreement

    def __init__(self, lr: float, mu: float, temperature: float, finetune_steps: int,
                 finetune_epochs: int | None, finetune_lr: float | None):
        check_positive("algo.lr", lr)
        check_positive("algo.mu", mu, allow_zero=True)
        check_positive("algo.temperature", temperature)
        self.lr, self.mu, self.temperature = lr, mu, temperature
        self.set_finetuning(finetune_steps, finetune_epochs, finetune_lr)

    def check_params(self, params: Params) -> None:
        super().check_params(params)
        require_body(self.name, params, "contrasts the representations of a hidden layer")

    def init(self, params: Params, num_clients: int) -> ServerState:
        self.check_params(params)
        return ServerState(params=params, clients=MOONClients(prev=stack(params, num_clients)))

    def client_init(self, state: ServerState, clients: Tensor, rnd: int) -> MOONLocal:
        m = len(clients)
        return MOONLocal(params=stack(state.params, m), server=expand(state.params, m),
                         prev=gather(state.clients.prev, clients))

    optim_ok = True  # one optimizer of the client's model on CE + mu l_con (PFLlib's clientMOON)
    # the global and previous models are constants: their representations come from eval-mode forwards
    # (their running statistics), as the MOON authors' code keeps global_net and previous_nets in eval()
    batchnorm_ok = True

    def client_step(self, engine: Engine, local: MOONLocal, batches, rnd: int) -> MOONLocal:
        (x, y), = batches
        mu, T = self.mu, self.temperature
        if mu:  # (constants of the step: no gradient flows through them)
            z_glob, z_prev = client_features(engine, local.server, x), client_features(engine, local.prev, x)

        def loss(p: Params, x: Tensor, y: Tensor, *others: Tensor) -> Tensor:
            z, logits = features_and_logits(engine, p, x)
            out = engine.criterion(logits, y)
            if mu:
                z_glob, z_prev = others
                sims = torch.stack([F.cosine_similarity(z, z_glob, dim=-1), F.cosine_similarity(z, z_prev, dim=-1)]) / T
                out = out + mu * (torch.logsumexp(sims, 0) - sims[0]).mean()
            return out

        g, _, local = self.value_and_grad(engine, local, "params", loss, x, y, *((z_glob, z_prev) if mu else ()))
        return self.descend(local, "params", g, self.lr, rnd)

    def server_update(self, state: ServerState, local: MOONLocal, clients: Tensor, selected: Tensor,
                      weights: Tensor | None) -> ServerState:
        new = weighted_mean(gather(local.params, selected), weights)
        prev = scatter(state.clients.prev, clients, local.params)
        return ServerState(params=new, extra=state.extra, clients=MOONClients(prev=prev))
