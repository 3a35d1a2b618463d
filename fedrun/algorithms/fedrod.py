"""FedRoD (Chen & Chao, ICLR 2022, "On Bridging Generic and Personalized Federated Learning for Image
Classification", Sec. 4, Alg. 1, the linear personalized head).

One model, a body f (the representation) and a generic head h_G, trained by every client with the
balanced softmax loss (the paper's BR loss; Ren et al. 2020): cross-entropy of the logits
h_G(f(x)) + log n_{i,c}, n_{i,c} the client's number of training rows of class c. Besides it each
client keeps a personalized head h_P, trained on the cross-entropy of h_G(f(x)) + h_P(f(x)) with f
and h_G held fixed. One local step does both from the same minibatch and the same point (PFLlib's
clientROD: the generic model's SGD step, then the personal head's on the representation and the
generic logits computed before that step). The server averages the generic model (FedAvg). Served:
h_G + h_P on the shared body (a linear head: one layer of weight W_G + W_P and bias b_G + b_P, the
same logits); `global_*` scores the generic model.

Per-client state (stacked over ALL clients, a `FedRoDClients`): `head`, the personal heads (the initial
head until a client trains), and `counts` ({"n": [C, K]}), every client's class counts of its training
rows (`prepare`, from the data; `init` alone leaves them 1, i.e. plain cross-entropy). A round's
clients hold a `FedRoDLocal`.

The local optimizer (`optim.*`): the generic model and the personal head each have their own (slots
"opt" and "opt.head"), as PFLlib's clientROD keeps `optimizer` and `opt_head`. BatchNorm (in the
body): the step's one forward of the body runs in training mode and updates the generic model's
running statistics, averaged with it (`bn=local`: kept by each client).
"""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from ..engine import Engine
from ..engine.tree import Params, expand, gather, head_names, param_names, scatter, stack, weighted_mean
from .base import EvalContext, LocalLR, ModelLocal, ServerState
from .personalize import onboarding_batches
from .representation import apply_head, features_and_logits, require_linear_head

PERSONAL = "personal."  # the personal head's entries among a step's differentiated params


class FedRoDClients(NamedTuple):
    head: Params  # h_P, every client's personal head
    counts: Params  # {"n": [C, K]}: every client's class counts of its training rows


class FedRoDLocal(NamedTuple):
    params: Params  # the generic model (body f and head h_G)
    head: Params  # h_P, the personal heads
    counts: Tensor  # [m, K]: the clients' class counts (the balanced softmax's n_{i,c})
    opt: dict = {}  # the local trainer's optimizer state, by slot: "opt" (the generic model's), "opt.head"


class FedRoD(LocalLR):
    name = "fedrod"
    Clients = FedRoDClients
    agreement_options = dict(lr=0.1)  # fedrun.bench.agreement
    optim_ok = True  # two optimizers: the generic model's and the personal head's (PFLlib's opt_head)
    batchnorm_ok = True

    def optim_slots(self, local: FedRoDLocal) -> dict:
        return {"opt": ("params", param_names(local.params)), "opt.head": ("head", list(local.head))}

    def check_params(self, params: Params) -> None:
        super().check_params(params)
        require_linear_head(self.name, params, "adds a personal head's logits to the generic head's")

    def init(self, params: Params, num_clients: int) -> ServerState:
        self.check_params(params)
        head = {k: params[k] for k in head_names(params)}
        K = params[head_names(params)[-1]].shape[0]
        counts = torch.ones(num_clients, K, dtype=next(iter(params.values())).dtype,
                            device=next(iter(params.values())).device)
        return ServerState(params=params, clients=FedRoDClients(head=stack(head, num_clients), counts={"n": counts}))

    def prepare(self, engine: Engine, state: ServerState, ctx: EvalContext) -> ServerState:
        """Every client's class counts over its training rows (the balanced softmax's n_{i,c})."""
        n = state.clients.counts["n"]
        counts = ctx.data.train.label_counts(n.shape[1]).to(device=n.device, dtype=n.dtype)
        return ServerState(params=state.params, extra=state.extra, clients=state.clients._replace(counts={"n": counts}))

    def client_init(self, state: ServerState, clients: Tensor, rnd: int) -> FedRoDLocal:
        return FedRoDLocal(params=stack(state.params, len(clients)), head=gather(state.clients.head, clients),
                           counts=state.clients.counts["n"][clients])

    def client_step(self, engine: Engine, local: FedRoDLocal, batches, rnd: int) -> FedRoDLocal:
        return self._step(engine, local, batches, rnd, generic=True)

    def _step(self, engine: Engine, local: FedRoDLocal, batches, rnd: int, generic: bool) -> FedRoDLocal:
        """One optimizer step of lr on the generic model's balanced softmax loss (unless not `generic`: the
        model stays) and of the personal head on the cross-entropy of the summed logits."""
        (x, y), = batches
        both = {**local.params, **{PERSONAL + k: v for k, v in local.head.items()}}

        def loss(p: Params, x: Tensor, y: Tensor, counts: Tensor) -> Tensor:
            model = {k: v for k, v in p.items() if not k.startswith(PERSONAL)}
            z, logits = features_and_logits(engine, model, x)
            balanced = engine.criterion(logits + counts.log(), y)
            mine = apply_head(engine, {k[len(PERSONAL):]: v for k, v in p.items() if k.startswith(PERSONAL)},
                              z.detach())
            return balanced + engine.criterion(logits.detach() + mine, y)

        g, _, out = self.value_and_grad(engine, ModelLocal(params=both), "params", loss, x, y, local.counts)
        # the forward's BatchNorm statistics: the generic model's (held fixed, a held-out client's: its own
        # under bn=local, kept; under bn=averaged the server's, not kept)
        if generic or self.bn == "local":
            local = local._replace(params={k: out.params[k] for k in local.params})
        local = self.descend(local, "head", {k: g[PERSONAL + k] for k in local.head}, self.lr, rnd)
        return self.descend(local, "params", g, self.lr, rnd) if generic else local

    def server_update(self, state: ServerState, local: FedRoDLocal, clients: Tensor, selected: Tensor,
                      weights: Tensor | None) -> ServerState:
        new = weighted_mean(gather(local.params, selected), weights)
        head = scatter(state.clients.head, clients, local.head)
        return ServerState(params=new, extra=state.extra, clients=state.clients._replace(head=head))

    def personalize(self, engine: Engine, state: ServerState, ctx: EvalContext):
        mine = state.clients.head
        C = next(iter(mine.values())).shape[0]
        served = dict(expand(state.params, C))
        for k, v in mine.items():  # h_G(z) + h_P(z) of a linear head: weights and biases summed
            served[k] = state.params[k] + v
        return self.with_own_statistics(state, served), None  # (bn=local: each client's own statistics)

    def onboard(self, engine: Engine, state: ServerState, ctx: EvalContext, new: Tensor) -> ServerState:
        """A held-out client's personal head: new_client_steps (null: tau) of its personal-head steps on
        its training rows, from the initial head, the generic model (the server's) held fixed; bn=local:
        the steps' training-mode forwards move its own statistics (the initial model's), which it keeps
        and is served with (bn=averaged: it is served the server's)."""
        local = self.client_init(state, new, 0)
        local = local._replace(params=self.with_own_statistics(state, local.params, new))
        for batches in onboarding_batches(ctx, new, self.new_client_steps):
            local = self._step(engine, local, batches, 0, generic=False)
        head = scatter(state.clients.head, new, local.head)
        return ServerState(params=state.params, extra=state.extra, clients=state.clients._replace(head=head),
                           trainer=self.kept_own_statistics(state, new, local.params))
