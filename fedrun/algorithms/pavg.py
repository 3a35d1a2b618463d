"""P-Avg (Proto) / Per-FedAvg (MAML) of paper 004's experiments (Acar et al. 2021): FedAvg on the
adaptation's meta-loss, the debiased local SGD (`debiased.DebiasedSGD`) with no regularizer.
Per-client state: `PAvgClients` (eval_model=clients_mean's latest models); a round's clients hold a
`PAvgLocal`."""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from ..engine.tree import Params, gather, stack, weighted_mean
from ..errors import ConfigError
from .base import ServerState
from .checks import check_choice
from .debiased import AGREEMENT_META, DebiasedSGD
from .trainer import RunInfo


class PAvgClients(NamedTuple):
    last: Params = {}  # every client's latest local model (eval_model=clients_mean; {}: eval_model=server)


class PAvgLocal(NamedTuple):
    params: Params  # w, the meta model each client trains
    steps: Tensor  # [m, 1] the local steps taken this round (proto_first_step_only reads it)
    opt: dict = {}  # the local trainer's optimizer state, by slot (`trainer.slot_of`)


class PAvg(DebiasedSGD):
    """P-Avg (Proto) / Per-FedAvg (MAML) of paper 004's experiments: FedAvg on the meta-loss.

    `proto_first_step_only` (adaptation=proto) reproduces the authors' P-Avg (Proto) training
    loop, which switches the model's Proto mode off inside its step loop: only each round's first
    local step embeds with the last hidden layer, the later ones with the network's outputs.
    """

    name = "pavg"
    Clients = PAvgClients
    protocol = {**DebiasedSGD.protocol,  # the authors' P-Avg (Proto) loop
                "proto_first_step_only": dict(honest=False, official=True)}
    agreement_options = AGREEMENT_META  # fedrun.bench.agreement
    agreement_variants = ({"adaptation": "proto"},)

    def __init__(self, proto_first_step_only: bool | None, **options):
        check_choice("algo.proto_first_step_only", proto_first_step_only, [True, False, None])
        super().__init__(**options)
        self.proto_first_step_only = bool(proto_first_step_only) and self.adaptation == "proto"

    def check_run(self, run: RunInfo) -> None:
        optim = run.optim
        if self.proto_first_step_only and optim.name != "sgd":
            raise ConfigError(f"algo.proto_first_step_only=true trains the output layer from each round's second step "
                              f"only, which an Adam step count shared by the model's parameters (optim.name="
                              f"{optim.name}) cannot follow; set optim.name=sgd or algo.proto_first_step_only=false")
        super().check_run(run)

    def init(self, params: Params, num_clients: int) -> ServerState:
        return ServerState(params=params, clients=PAvgClients(last=self.last_models(params, num_clients)))

    def client_init(self, state: ServerState, clients: Tensor, rnd: int) -> PAvgLocal:
        m = len(clients)
        return PAvgLocal(params=stack(state.params, m), steps=torch.zeros(m, 1, device=clients.device))

    def logits_embedding(self, local: PAvgLocal) -> bool:
        return self.proto_first_step_only and bool(local.steps[0] > 0)

    def count_step(self, local: PAvgLocal) -> PAvgLocal:
        return local._replace(steps=local.steps + 1)

    def server_update(self, state: ServerState, local: PAvgLocal, clients: Tensor, selected: Tensor,
                      weights: Tensor | None) -> ServerState:
        w = gather(local.params, selected)
        return ServerState(params=weighted_mean(w, weights), extra=state.extra,
                           clients=self.keep_last(state.clients, clients[selected], w))
