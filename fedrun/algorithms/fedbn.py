"""FedBN (Li, Jiang, Zhang, Kamp, Dou, "FedBN: Federated Learning on Non-IID Features via Local Batch
Normalization", ICLR 2021, Algorithm 1): FedAvg in which every BatchNorm layer stays with its client.
Each round the sampled clients start from the server's model with their OWN BatchNorm layers (affine
weight and bias, running mean and variance), take `tau` SGD steps of lr `lr` in training mode (batch
statistics; the running ones updated), and the server averages every other parameter over them.
A client is served the server's shared layers with its own BatchNorm layers, scored in eval mode
(its running statistics).

State: `ServerState.clients["bn"]` holds every client's BatchNorm entries (parameters and buffers,
`functional.batchnorm_names`), stacked over ALL clients and started from the initial model's; the
clients that trained write theirs back, the others keep theirs. The server's own BatchNorm entries
are the (weighted) mean of the round's clients' (parameters as FedAvg averages them, buffers by
`functional.mean_buffers`): clients never receive them; only the `global_*` metrics score them.

The layers are found by their buffers (any module owning a running_mean), not by name.
"""
from __future__ import annotations

from torch import Tensor

from ..functional import Engine, Params, batchnorm_names, is_buffer, split_buffers
from .base import (Algorithm, ConfigError, EvalContext, Local, ServerState, check_positive, gather, scatter,
                   sgd_step, stack)


class FedBN(Algorithm):
    name = "fedbn"
    batchnorm = True

    def __init__(self, lr: float):
        check_positive("algo.lr", lr)
        self.lr = lr

    def check_params(self, params: Params) -> None:
        if not split_buffers(params)[1]:
            raise ConfigError("algo=fedbn keeps the model's BatchNorm layers local, but this model has none; "
                              "use model=mlp_bn or cnn_bn")

    def init(self, params: Params, num_clients: int) -> ServerState:
        self.check_params(params)
        state = super().init(params, num_clients)
        mine = {k: params[k] for k in batchnorm_names(params)}
        return ServerState(params=state.params, extra=state.extra, clients={"bn": stack(mine, num_clients)})

    def client_init(self, state: ServerState, clients: Tensor, rnd: int) -> Local:
        own = gather(state.clients["bn"], clients)
        p = stack(state.params, len(clients))
        return {"params": {k: own.get(k, v) for k, v in p.items()},
                "buffers": {k: v for k, v in own.items() if is_buffer(k)}}

    def client_step(self, engine: Engine, local: Local, batches, rnd: int) -> Local:
        return sgd_step(engine, local, batches, self.lr)

    def server_update(self, state: ServerState, local: Local, clients: Tensor, selected: Tensor,
                      weights: Tensor | None) -> ServerState:
        new = super().server_update(state, local, clients, selected, weights)  # FedAvg's means
        mine = state.clients["bn"]
        trained = {**local["params"], **local["buffers"]}
        bn = scatter(mine, clients, {k: trained[k] for k in mine})
        return ServerState(params=new.params, extra=new.extra, clients={**state.clients, "bn": bn})

    def personalize(self, engine: Engine, state: ServerState, ctx: EvalContext):
        mine = state.clients["bn"]
        C = next(iter(mine.values())).shape[0]
        return {**{k: v.unsqueeze(0).expand(C, *v.shape) for k, v in state.params.items()}, **mine}, None
