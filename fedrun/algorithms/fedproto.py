"""FedProto (Tan, Long, Liu, Zhou, Lu, Jiang, Zhang, AAAI 2022, "FedProto: Federated Prototype
Learning across Heterogeneous Clients", Sec. 3-4, Alg. 1).

Clients exchange class prototypes, never weights. Every client trains its own model; each local SGD
step (lr `lr`) is on

    CE(w; x, y) + lam * mean_{rows, dims} (z - C_y)^2,

z the row's representation (the model's last hidden layer) and C_y the global prototype of its
class (rows whose class has none add 0; no global prototypes yet: plain cross-entropy). The
client's local prototype of class k is the mean representation of its rows of class k among those
its round's minibatches drew, each taken as the step computed it (as the official code and PFLlib's
clientProto do: before the step's update). The server's global prototype of class k is the mean of
the round's clients' prototypes of k over the clients that have k: unweighted (`follow=pfllib`, the
official code's and PFLlib's `proto_aggregation`) or weighted by the number of rows each prototype
averages (`follow=paper`, the paper's eq. 6 weights |D_i,k| / N_k: equal to them when a round walks
each client's rows once, `sampling=epochs` with tau a pass). The global prototypes are replaced every
round by those of that round's clients (a class none of them has has no prototype that round).

Served: each client's own model classifying a row by its nearest global prototype (squared
Euclidean distance; logits = minus the distance, so the test loss is the cross-entropy of those).
The server model is never trained (`global_*` score the initial model, as for `local`).

Per-client state (a `FedProtoClients`): every client's model, `params` (stacked over ALL clients, the
initial model until it trains); a round's clients hold a `FedProtoLocal`. Server state: the global
prototypes `extra["protos"]` [K, d] and which classes have one, `extra["present"]` [K].
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from ..data.federated import ClientSplit
from ..engine import Engine
from ..engine.tree import Params, gather, head_names, scatter, stack
from ..errors import ConfigError
from .base import Algorithm, EvalContext, ServerState
from .checks import check_choice, check_optional_int, check_positive, require_body
from .personalize import onboarding_batches
from .representation import features_and_logits, step_features


@dataclass
class NearestPrototype:
    """What FedProto serves: every client's own model (stacked `params`) and the global prototypes
    (`centers` [C, K, d], `present` [C, K], the same for every client)."""

    params: Params
    centers: Tensor
    present: Tensor

    def evaluate(self, engine: Engine, split: ClientSplit) -> tuple[Tensor, Tensor]:
        return engine.evaluate(self.params, split, False, self.centers, self.present)


class FedProtoClients(NamedTuple):
    params: Params  # every client's own model


class FedProtoLocal(NamedTuple):
    params: Params  # the client's model
    protos: Tensor  # the global prototypes [m, K, d] (expanded: the same for every client)
    present: Tensor  # which classes have one [m, K]
    sums: Tensor  # the client's sums of its rows' representations by class [m, K, d]
    counts: Tensor  # and the numbers of rows behind them [m, K]
    opt: dict = {}  # the local trainer's optimizer state, by slot (`trainer.slot_of`)


class FedProto(Algorithm):
    name = "fedproto"
    Clients = FedProtoClients
    models_per_round = 0  # prototypes travel, not models
    FOLLOW = ("paper", "pfllib")
    protocol = {"follow": dict(honest="paper", official="pfllib")}  # the official code's unweighted mean
    agreement_options = dict(lr=0.1)  # fedrun.bench.agreement

    def __init__(self, lr: float, lam: float, follow: str | None, new_client_steps: int | None,
                 finetune_steps: int, finetune_epochs: int | None, finetune_lr: float | None):
        check_positive("algo.lr", lr)
        self.set_finetuning(finetune_steps, finetune_epochs, finetune_lr)
        if finetune_steps or finetune_epochs:
            raise ConfigError("algo=fedproto serves nearest-prototype classifiers, which test-time SGD fine-tuning "
                              "does not apply to; set algo.finetune_steps=0 algo.finetune_epochs=null")
        check_positive("algo.lam", lam, allow_zero=True)
        check_choice("algo.follow", follow or "paper", self.FOLLOW)
        check_optional_int("algo.new_client_steps", new_client_steps)
        self.lr, self.lam, self.follow, self.new_client_steps = lr, lam, follow or "paper", new_client_steps

    def check_params(self, params: Params) -> None:
        super().check_params(params)
        require_body(self.name, params, "classifies by prototypes of a hidden layer's representation")

    def init(self, params: Params, num_clients: int) -> ServerState:
        self.check_params(params)
        w = next(p for k, p in params.items() if k in head_names(params) and p.dim() == 2)
        K, d = w.shape
        extra = {"protos": torch.zeros(K, d, dtype=w.dtype, device=w.device),
                 "present": torch.zeros(K, dtype=torch.bool, device=w.device)}
        return ServerState(params=params, extra=extra, clients=FedProtoClients(params=stack(params, num_clients)))

    def client_init(self, state: ServerState, clients: Tensor, rnd: int) -> FedProtoLocal:
        m = len(clients)
        protos, present = state.extra["protos"], state.extra["present"]
        return FedProtoLocal(params=gather(state.clients.params, clients),
                             protos=protos.expand(m, *protos.shape), present=present.expand(m, *present.shape),
                             sums=torch.zeros(m, *protos.shape, dtype=protos.dtype, device=protos.device),
                             counts=torch.zeros(m, protos.shape[0], dtype=protos.dtype, device=protos.device))

    optim_ok = True  # one optimizer of the client's model (PFLlib's clientProto)
    # prototypes from the training forward (batch statistics), as clientProto collects them in train()
    batchnorm_ok = True

    def client_step(self, engine: Engine, local: FedProtoLocal, batches, rnd: int) -> FedProtoLocal:
        (x, y), = batches
        lam = self.lam

        def loss(p: Params, x: Tensor, y: Tensor, protos: Tensor, present: Tensor) -> Tensor:
            z, logits = features_and_logits(engine, p, x)
            out = engine.criterion(logits, y)
            if lam:  # rows of a class without a global prototype: their own (detached) representation
                target = torch.where(present[y].unsqueeze(-1), protos[y], z.detach())
                out = out + lam * ((target - z) ** 2).mean()
            return out

        with torch.no_grad():  # the rows' representations as the step computes them, summed per class
            z = step_features(engine, local.params, x)
            onehot = (y.unsqueeze(-1) == torch.arange(local.counts.shape[1], device=y.device)).to(z.dtype)
            sums, counts = local.sums + onehot.transpose(1, 2) @ z, local.counts + onehot.sum(1)
        g, _, local = self.value_and_grad(engine, local, "params", loss, x, y, local.protos, local.present)
        return self.descend(local, "params", g, self.lr, rnd)._replace(sums=sums, counts=counts)

    def server_update(self, state: ServerState, local: FedProtoLocal, clients: Tensor, selected: Tensor,
                      weights: Tensor | None) -> ServerState:
        sums, counts = local.sums[selected], local.counts[selected]  # [s, K, d], [s, K]
        has = counts > 0
        mine = sums / counts.clamp(min=1).unsqueeze(-1)  # each client's local prototypes
        w = counts if self.follow == "paper" else has.to(counts.dtype)  # rows behind each, or 1 per client
        total = w.sum(0)  # [K]
        protos = (w.unsqueeze(-1) * mine).sum(0) / total.clamp(min=1e-30).unsqueeze(-1)
        present = has.any(0)
        protos = torch.where(present.unsqueeze(-1), protos, torch.zeros_like(protos))
        kept = scatter(state.clients.params, clients, local.params)
        return ServerState(params=state.params, extra={**state.extra, "protos": protos, "present": present},
                           clients=FedProtoClients(params=kept))

    def personalize(self, engine: Engine, state: ServerState, ctx: EvalContext):
        p = state.clients.params
        C = next(iter(p.values())).shape[0]
        protos, present = state.extra["protos"], state.extra["present"]
        return NearestPrototype(p, protos.expand(C, *protos.shape), present.expand(C, *present.shape)), None

    def score(self, engine: Engine, served: NearestPrototype, split: ClientSplit) -> tuple[Tensor, Tensor]:
        return served.evaluate(engine, split)

    def onboard(self, engine: Engine, state: ServerState, ctx: EvalContext, new: Tensor) -> ServerState:
        """A held-out client trains its own model as a round's client does (new_client_steps, null:
        tau, FedProto steps against the global prototypes, from the initial model); it is then served
        its model with the global prototypes (its own prototypes are not sent)."""
        local = self.client_init(state, new, 0)
        for batches in onboarding_batches(ctx, new, self.new_client_steps):
            local = self.client_step(engine, local, batches, 0)
        return ServerState(params=state.params, extra=state.extra,
                           clients=FedProtoClients(params=scatter(state.clients.params, new, local.params)))
