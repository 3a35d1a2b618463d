"""FedBN (Li, Jiang, Zhang, Kamp, Dou, "FedBN: Federated Learning on Non-IID Features via Local Batch
Normalization", ICLR 2021, Algorithm 1): FedAvg in which every BatchNorm layer stays with its client.
Each round the sampled clients start from the server's model with their OWN BatchNorm layers (affine
weight and bias, running mean and variance), take `tau` SGD steps of lr `lr` in training mode (batch
statistics; the running ones updated), and the server averages every other parameter over them.
A client is served the server's shared layers with its own BatchNorm layers, scored in eval mode
(its running statistics).

State: `ServerState.clients` (a `FedBNClients`) holds in `bn` every client's BatchNorm entries
(parameters and buffers, `engine.batchnorm.batchnorm_names`), stacked over ALL clients and started
from the initial model's; a round's clients hold a `batchnorm.BatchNormLocal`; the
clients that trained write theirs back, the others keep theirs. The server's own BatchNorm entries
are the (weighted) mean of the round's clients' (parameters as FedAvg averages them, buffers by
`engine.batchnorm.mean_buffers`): clients never receive them; only the `global_*` metrics score them.

The layers are found by their buffers (any module owning a running_mean), not by name.

The local trainer: `optim.*` applies to the local steps (one optimizer per client over all its
parameters, its own BatchNorm layers' included, as PFLlib's clientBN has; slot "opt") and to a
held-out client's fit of its BatchNorm layers (a fresh state). `bn=local`: every client keeps its
BatchNorm layers either way; the server's model (the `global_*` metrics) carries the first aggregated
client's running statistics instead of their mean, as PFLlib's serverbn copies its first uploaded model.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from ..engine import Engine
from ..engine.batchnorm import batchnorm_names, is_buffer, split_buffers
from ..engine.tree import Params, expand, gather, scatter, stack
from ..errors import ConfigError
from .base import Algorithm, EvalContext, ServerState
from .batchnorm import BatchNormLocal, BatchNormState
from .checks import check_optional_int, check_positive
from .personalize import onboarding_batches


class FedBNClients(NamedTuple):
    bn: Params  # every client's BatchNorm layers: affine parameters and running statistics


class FedBN(BatchNormState, Algorithm):
    name = "fedbn"
    Clients = FedBNClients
    optim_ok = True  # BatchNormState.client_step: one step of the client's optimizer
    batchnorm_ok = True

    def __init__(self, lr: float, new_client_steps: int | None,
                 finetune_steps: int, finetune_epochs: int | None, finetune_lr: float | None):
        check_positive("algo.lr", lr)
        self.set_finetuning(finetune_steps, finetune_epochs, finetune_lr)
        if finetune_steps or finetune_epochs:
            raise ConfigError("algo=fedbn: test-time fine-tuning (algo.finetune_steps / finetune_epochs) is not "
                              "implemented for BatchNorm models; set algo.finetune_steps=0 algo.finetune_epochs=null")
        check_optional_int("algo.new_client_steps", new_client_steps)
        self.lr, self.new_client_steps = lr, new_client_steps

    def check_params(self, params: Params) -> None:
        if not split_buffers(params)[1]:
            raise ConfigError("algo=fedbn keeps the model's BatchNorm layers local, but this model has none; "
                              "use model=mlp_bn or cnn_bn")

    def init(self, params: Params, num_clients: int) -> ServerState:
        self.check_params(params)
        state = super().init(params, num_clients)
        mine = {k: params[k] for k in batchnorm_names(params)}
        return ServerState(params=state.params, extra=state.extra, clients=FedBNClients(bn=stack(mine, num_clients)))

    def client_init(self, state: ServerState, clients: Tensor, rnd: int) -> BatchNormLocal:
        own = gather(state.clients.bn, clients)
        p = stack(state.params, len(clients))
        return BatchNormLocal(params={k: own.get(k, v) for k, v in p.items()},
                              buffers={k: v for k, v in own.items() if is_buffer(k)})

    def server_update(self, state: ServerState, local: BatchNormLocal, clients: Tensor, selected: Tensor,
                      weights: Tensor | None) -> ServerState:
        new = super().server_update(state, local, clients, selected, weights)  # FedAvg's means (BatchNormState)
        mine = state.clients.bn
        trained = {**local.params, **local.buffers}
        bn = scatter(mine, clients, {k: trained[k] for k in mine})
        extra = new.extra
        if self.bn == "local":  # the server's statistics: the first aggregated client's (PFLlib's serverbn)
            extra = {**extra, "buffers": {k: v[selected[0]] for k, v in local.buffers.items()}}
        return ServerState(params=new.params, extra=extra, clients=FedBNClients(bn=bn))

    def shared_buffers(self, local: BatchNormLocal) -> Params:
        """{}: no statistics are shared (each client's are in `clients.bn`; `bn=local`: server_update)."""
        return {}

    def personalize(self, engine: Engine, state: ServerState, ctx: EvalContext):
        mine = state.clients.bn
        C = next(iter(mine.values())).shape[0]
        return {**expand(state.params, C), **mine}, None

    def onboard(self, engine: Engine, state: ServerState, ctx: EvalContext, new: Tensor) -> ServerState:
        """A held-out client's BatchNorm layers, fitted with the shared layers frozen: new_client_steps
        (null: tau) training-mode SGD steps of lr on minibatches of its training rows (the running
        statistics updated as in training), from its (initial) layers."""
        mine = state.clients.bn
        local = self.client_init(state, new, 0)
        p, buffers = local.params, local.buffers
        own = [k for k in p if k in mine]
        for (x, y), in onboarding_batches(ctx, new, self.new_client_steps):
            g, _, buffers = engine.train_grad(p, buffers, x, y)
            if self.optim.plain:
                p = {k: torch.add(v, g[k], alpha=-self.lr) if k in mine else v for k, v in p.items()}
            else:  # (the round-0 rate; a fresh optimizer state, carried over these steps)
                local = self.descend(local._replace(params=p), "params", g, self.lr, 0, names=own)
                p = local.params
        fitted = {**p, **buffers}
        return ServerState(params=state.params, extra=state.extra,
                           clients=FedBNClients(bn=scatter(mine, new, {k: fitted[k] for k in mine})))
