"""FedAvg (McMahan, Moore, Ramage, Hampson, Aguera y Arcas, AISTATS 2017, Algorithm 1; paper 000).

Each sampled client takes `tau` SGD steps of lr `beta` (= `lr`) from the server model on its own
minibatches; the server averages the clients' models (uniformly, or weighted by their numbers of
training rows with aggregate=samples). At test time, "FedAvg + update": each client is served the
global model after `finetune_steps` gradient steps of lr `alpha` on its own training rows
(`personalize.OneStepPersonalization`).

`AveragedSGD` is FedAvg on a model's parameters, the base of FedProx and FedBABU; `FedAvg` adds
BatchNorm models (`batchnorm.BatchNormState`: running statistics averaged like parameters). FedAvg
keeps no per-client state; a round's clients hold a `batchnorm.BatchNormLocal`.
"""
from __future__ import annotations

from torch import Tensor

from ..engine import Engine
from ..engine.tree import gather, weighted_mean
from .base import Algorithm, EvalContext, ServerState
from .batchnorm import BatchNormState
from .checks import check_int, check_positive
from .personalize import OneStepPersonalization


class AveragedSGD(OneStepPersonalization, Algorithm):
    """`tau` local SGD steps of lr `beta`; the server averages. `alpha`: lr of the test-time update
    ("FedAvg + update", the `pers_*` metrics), `finetune_steps` of it (1: the one-step update;
    more: FedAvg + fine-tuning, the baseline of most PFL tables), or `finetune_epochs` passes of
    minibatch SGD over each client's training rows (`personalize.finetune_epochs`; overrides the
    steps); null: no test-time update, only the global model is evaluated (no pers_* columns; an
    evaluation then skips the backward pass over every client's training rows: 30 rounds of the
    pFedMe MNIST DNN preset, every round evaluated, 26 -> 15 s)."""

    name = "fedavg"

    def __init__(self, lr: float, beta: float | None, alpha: float | None, finetune_steps: int,
                 finetune_epochs: int | None, finetune_lr: float | None):
        check_positive("algo.lr", lr)
        check_positive("algo.finetune_lr", finetune_lr, allow_null=True)
        self.finetune_lr = finetune_lr
        check_positive("algo.beta", beta, allow_null=True)
        beta = lr if beta is None else beta  # beta: the paper's name of lr; given, it wins
        self.lr = beta
        check_positive("algo.alpha", alpha, allow_zero=True, allow_null=True)
        check_int("algo.finetune_steps", finetune_steps, 1)
        if finetune_epochs is not None:
            check_int("algo.finetune_epochs", finetune_epochs, 1)
        self.beta, self.alpha, self.finetune_steps, self.finetune_epochs = beta, alpha, finetune_steps, finetune_epochs

    def personalize(self, engine: Engine, state: ServerState, ctx: EvalContext):
        if self.alpha is None:
            return None, None
        return super().personalize(engine, state, ctx)

    def client_step(self, engine: Engine, local, batches, rnd: int):
        return self.sgd_step(engine, local, batches, self.beta, rnd)

    def server_update(self, state: ServerState, local, clients: Tensor, selected: Tensor,
                      weights: Tensor | None) -> ServerState:
        """The (weighted) mean of the clients' models `local.params` (a typed Local: FedProx's, FedAvg's)."""
        return ServerState(params=weighted_mean(gather(local.params, selected), weights), extra=state.extra,
                           clients=state.clients)


class FedAvg(BatchNormState, AveragedSGD):
    __doc__ = AveragedSGD.__doc__ + """

    With a BatchNorm model the running statistics are averaged like the parameters (`bn=averaged`),
    or each client keeps its own (`bn=local`); test-time fine-tuning runs minibatch steps in training
    mode (`personalize.finetune`)."""

    name = "fedavg"
    optim_ok = True  # (not FedProx's or FedBABU's steps, which AveragedSGD also bases)
    batchnorm_ok = True
    # the engines' agreement check (fedrun.bench.agreement): options over the yaml's; on BatchNorm models
    agreement_options = dict(beta=0.05, alpha=0.05)
    agreement_batchnorm = {"alpha": None}  # as it runs there (no test-time steps)
