"""FedBABU (Oh, Kim, Yun, ICLR 2022): FedAvg with the head (the output layer, `engine.tree.head_names`)
frozen at its (random) initial value during training; only the body learns and is averaged. Test
time: the whole model is fine-tuned, `finetune_steps` SGD steps of lr `alpha` on the client's
training rows. The `global_*` metrics score the server model (its head the initial one).

With `local_epochs` set, a round is `local_epochs` passes over each client's own rows (PFLlib's
clientBABU.train, local_epochs 1 by default; `base.Phase`; tau is not used); its fine-tuning in
epochs is `finetune_epochs` (PFLlib's fine_tuning_epochs, 10 by default, lr alpha).

The local optimizer (`optim.*`) steps the body only (the frozen head has no gradient, so PFLlib's
SGD over all parameters skips it, weight decay included); test-time fine-tuning stays plain SGD of
alpha (`personalize.finetune`, as FedAvg's). A BatchNorm model's running statistics (in the body)
are averaged with it (`bn=local`: kept by each client); fine-tuning runs in training mode.

No per-client state; a round's clients hold a `FedBABULocal`."""
from __future__ import annotations

from typing import NamedTuple

from torch import Tensor

from ..engine import Engine
from ..engine.tree import Params, gather, head_names, param_names, weighted_mean
from .base import Phase, ServerState
from .checks import check_optional_int, require_body
from .fedavg import AveragedSGD


class FedBABULocal(NamedTuple):
    params: Params  # the round's clients' models (the head frozen at the server's)
    opt: dict = {}  # the local trainer's optimizer state, by slot (`trainer.slot_of`): the body's


class FedBABU(AveragedSGD):
    name = "fedbabu"
    agreement_options = dict(beta=0.1, alpha=0.1, finetune_steps=3)  # fedrun.bench.agreement
    optim_ok = True  # one optimizer, over the body (the head is frozen)
    batchnorm_ok = True

    def __init__(self, lr: float, beta: float | None, alpha: float | None, local_epochs: int | None,
                 finetune_steps: int, finetune_epochs: int | None, finetune_lr: float | None):
        super().__init__(lr, beta, alpha, finetune_steps, finetune_epochs, finetune_lr)
        check_optional_int("algo.local_epochs", local_epochs)
        self.local_epochs = local_epochs

    def phases(self) -> tuple[Phase, ...] | None:
        return None if self.local_epochs is None else (Phase(self.client_step, epochs=self.local_epochs),)

    def check_params(self, params: Params) -> None:
        super().check_params(params)
        require_body(self.name, params, "trains the model's body with its head frozen")

    def optim_slots(self, local: FedBABULocal) -> dict:
        head = set(head_names(local.params))
        return {"opt": ("params", [k for k in param_names(local.params) if k not in head])}

    def client_init(self, state: ServerState, clients: Tensor, rnd: int) -> FedBABULocal:
        return FedBABULocal(params=super().client_init(state, clients, rnd).params)

    def client_step(self, engine: Engine, local: FedBABULocal, batches, rnd: int) -> FedBABULocal:
        (x, y), = batches
        g, _, local = self.grad(engine, local, "params", x, y)
        head = set(head_names(local.params))
        return self.descend(local, "params", {k: v for k, v in g.items() if k not in head}, self.beta, rnd)

    def server_update(self, state: ServerState, local: FedBABULocal, clients: Tensor, selected: Tensor,
                      weights: Tensor | None) -> ServerState:
        head = set(head_names(state.params))  # the frozen head is not averaged (a mean of equal copies rounds)
        body = gather({k: v for k, v in local.params.items() if k not in head}, selected)
        return ServerState(params={**state.params, **weighted_mean(body, weights)}, extra=state.extra,
                           clients=state.clients)
