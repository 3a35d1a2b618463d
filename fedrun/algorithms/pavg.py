"""P-Avg (Proto) / Per-FedAvg (MAML) of paper 004's experiments (Acar et al. 2021): FedAvg on the
adaptation's meta-loss, the debiased local SGD (`debiased.DebiasedSGD`) with no regularizer."""
from __future__ import annotations

import torch
from torch import Tensor

from ..errors import ConfigError
from .base import Local, ServerState
from .checks import check_choice
from .debiased import AGREEMENT_META, DebiasedSGD
from .trainer import RunInfo


class PAvg(DebiasedSGD):
    """P-Avg (Proto) / Per-FedAvg (MAML) of paper 004's experiments: FedAvg on the meta-loss.

    `proto_first_step_only` (adaptation=proto) reproduces the authors' P-Avg (Proto) training
    loop, which switches the model's Proto mode off inside its step loop: only each round's first
    local step embeds with the last hidden layer, the later ones with the network's outputs.
    """

    name = "pavg"
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

    def client_init(self, state: ServerState, clients: Tensor, rnd: int) -> Local:
        local = super().client_init(state, clients, rnd)
        if self.proto_first_step_only:
            local["steps"] = torch.zeros(len(clients), 1, device=clients.device)
        return local

    def logits_embedding(self, local: Local) -> bool:
        return self.proto_first_step_only and bool(local["steps"][0] > 0)
