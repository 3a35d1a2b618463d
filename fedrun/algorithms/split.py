"""Algorithms that split the model into a body (the representation: every layer but the output
layer) and a head (the output layer, `base.head_names`), one part shared and averaged, the other
personal or frozen.

  fedper    FedPer (Arivazhagan et al. 2019): all parameters trained jointly for `tau` SGD steps of
            lr `lr`; the server averages the BODY only; each client keeps its HEAD.
  lgfedavg  LG-FedAvg (Liang et al. 2020): the mirror image: the server averages the HEAD only; each
            client keeps its BODY (its local representation).
  fedrep    FedRep (Collins, Hassani, Mokhtari, Shakkottai, ICML 2021, Alg. 1): each round, the
            first `head_steps` local steps train the client's HEAD only (body frozen), the remaining
            `tau - head_steps` steps train the BODY only (head frozen), both with lr `lr`; the
            server averages the body; each client keeps its head. (The paper counts these in
            epochs, 10 for the head and 1 for the body; here they are steps of the round's tau.)
  fedbabu   FedBABU (Oh, Kim, Yun, ICLR 2022): FedAvg with the head frozen at its (random) initial
            value during training; only the body learns and is averaged. Test time: the whole model
            is fine-tuned, `finetune_steps` SGD steps of lr `alpha` on the client's training rows.

The personal part lives in `ServerState.clients["part"]` (stacked over ALL clients, started from the
initial model, checkpointed; unsampled clients keep theirs). Served models: the server's shared
part with each client's personal part. The `global_*` metrics score the server model, whose
personal part stays the initial one (meaningful for fedbabu only).

A step trains every parameter's gradient from one backward pass and masks the update of the parts
a phase freezes (FedRep: a per-client step counter in the round's state, compared on the device;
no host synchronization). The frozen part's update is multiplied by 0, so it stays bit-exact.
"""
from __future__ import annotations

import torch
from torch import Tensor

from ..engine import Engine, Params, stack, weighted_mean
from .base import (Algorithm, EvalContext, Local, ServerState, check_int, check_optional_int, check_positive, fit_part,
                   gather, head_names, onboarding_batches, require_body, scatter, sgd_step)
from .perfedavg import FedAvg


class FedPer(Algorithm):
    name = "fedper"
    personal_part = "head"  # which part each client keeps: head | body

    def __init__(self, lr: float, new_client_steps: int | None,
                 finetune_steps: int, finetune_epochs: int | None, finetune_lr: float | None):
        check_positive("algo.lr", lr)
        check_optional_int("algo.new_client_steps", new_client_steps)
        self.lr, self.new_client_steps = lr, new_client_steps
        self.set_finetuning(finetune_steps, finetune_epochs, finetune_lr)

    def personal_names(self, params: Params) -> list[str]:
        head = head_names(params)
        return head if self.personal_part == "head" else [k for k in params if k not in head]

    def check_params(self, params: Params) -> None:
        super().check_params(params)
        require_body(self.name, params, f"keeps the model's {self.personal_part} per client and shares the rest")

    def init(self, params: Params, num_clients: int) -> ServerState:
        self.check_params(params)
        mine = {k: params[k] for k in self.personal_names(params)}
        return ServerState(params=params, clients={"part": stack(mine, num_clients)})

    def client_init(self, state: ServerState, clients: Tensor, rnd: int) -> Local:
        p = stack(state.params, len(clients))
        return {"params": {**p, **gather(state.clients["part"], clients)}}

    def client_step(self, engine: Engine, local: Local, batches, rnd: int) -> Local:
        return sgd_step(engine, local, batches, self.lr)

    def server_update(self, state: ServerState, local: Local, clients: Tensor, selected: Tensor,
                      weights: Tensor | None) -> ServerState:
        mine = state.clients["part"]
        shared = weighted_mean({k: v[selected] for k, v in local["params"].items() if k not in mine}, weights)
        part = scatter(mine, clients, {k: local["params"][k] for k in mine})
        return ServerState(params={**state.params, **shared}, extra=state.extra, clients={**state.clients, "part": part})

    def personalize(self, engine: Engine, state: ServerState, ctx: EvalContext):
        mine = state.clients["part"]
        C = next(iter(mine.values())).shape[0]
        return {k: mine[k] if k in mine else v.unsqueeze(0).expand(C, *v.shape) for k, v in state.params.items()}, None

    def onboard(self, engine: Engine, state: ServerState, ctx: EvalContext, new: Tensor) -> ServerState:
        """A held-out client's personal part, fitted with the shared part frozen: new_client_steps
        (null: tau) SGD steps of lr on minibatches of its training rows, from its (initial) part."""
        part = state.clients["part"]
        p = {**stack(state.params, len(new)), **gather(part, new)}
        p = fit_part(engine, p, list(part), onboarding_batches(ctx, new, self.new_client_steps), self.lr)
        return ServerState(params=state.params, extra=state.extra,
                           clients={**state.clients, "part": scatter(part, new, {k: p[k] for k in part})})


class LGFedAvg(FedPer):
    name = "lgfedavg"
    personal_part = "body"


class FedRep(FedPer):
    name = "fedrep"

    def __init__(self, lr: float, head_steps: int, new_client_steps: int | None,
                 finetune_steps: int, finetune_epochs: int | None, finetune_lr: float | None):
        super().__init__(lr, new_client_steps, finetune_steps, finetune_epochs, finetune_lr)
        check_int("algo.head_steps", head_steps, 0)
        self.head_steps = head_steps

    def client_init(self, state: ServerState, clients: Tensor, rnd: int) -> Local:
        local = super().client_init(state, clients, rnd)
        return {**local, "step": torch.zeros(len(clients), 1, dtype=torch.long, device=clients.device)}

    def client_step(self, engine: Engine, local: Local, batches, rnd: int) -> Local:
        (x, y), = batches
        p, step = local["params"], local["step"]
        g, _ = engine.grad(p, x, y)
        head = set(head_names(p))
        on_head = step < self.head_steps  # [m, 1]: this step trains the head (else the body)
        new = {}
        for k in p:
            mask = (on_head if k in head else ~on_head).to(p[k].dtype).view(-1, *[1] * (p[k].dim() - 1))
            new[k] = p[k] - self.lr * mask * g[k]
        return {"params": new, "step": step + 1}


class FedBABU(FedAvg):
    name = "fedbabu"
    batchnorm = False

    def __init__(self, lr: float, beta: float | None, alpha: float | None, finetune_steps: int,
                 finetune_epochs: int | None, finetune_lr: float | None):
        super().__init__(lr, beta, alpha, finetune_steps, finetune_epochs, finetune_lr)

    def check_params(self, params: Params) -> None:
        super().check_params(params)
        require_body(self.name, params, "trains the model's body with its head frozen")

    def client_step(self, engine: Engine, local: Local, batches, rnd: int) -> Local:
        (x, y), = batches
        p = local["params"]
        g, _ = engine.grad(p, x, y)
        head = set(head_names(p))
        return {**local, "params": {k: p[k] if k in head else torch.add(p[k], g[k], alpha=-self.beta) for k in p}}

    def server_update(self, state: ServerState, local: Local, clients: Tensor, selected: Tensor,
                      weights: Tensor | None) -> ServerState:
        head = set(head_names(state.params))  # the frozen head is not averaged (a mean of equal
        body = {k: v[selected] for k, v in local["params"].items() if k not in head}  # copies rounds)
        return ServerState(params={**state.params, **weighted_mean(body, weights)}, extra=state.extra,
                           clients=state.clients)
