"""pFedMe: personalized FL with Moreau envelopes (Dinh, Tran, Nguyen, NeurIPS 2020; paper 002, Alg. 1).

Each client i keeps a local model w_i (started from the server model w every round) and, in each
of R local rounds (`tau`), draws a minibatch D and approximately solves the inner problem (eq. 7)

    theta_i = argmin_theta  f_i(theta; D) + lam/2 ||theta - w_i||^2   (+ mu/2 ||theta||^2, official code)

with K gradient steps of lr `personal_lr`, warm-started from the previous theta_i, then moves its
local model along the Moreau envelope's gradient lam (w_i - theta_i) (eq. 6, Alg. 1 line 8):

    w_i <- w_i - eta * lam * (w_i - theta_i).

The server mixes the average of the sampled clients' local models into w with `beta` (line 10):
    w <- (1 - beta) w + beta * mean_i w_i.

Served models: GM is w; PM (`personalized=theta`) is theta_i, the client's personalized parameter
(as the paper says), or (`personalized=local`) w_i, which is what the authors' code evaluated in
effect (CharlieDinh/pFedMe). With `train_all` every client runs its local rounds every round (the
authors' code; only the sampled ones are aggregated) and the PM served is the one that training
produced; otherwise each client's PM is computed at test time by the same R local rounds from w on
the client's own training minibatches (drawn from the evaluation's random stream; with
`local_epochs` E, E passes over its rows of batch_size minibatches, as its training rounds).

The local trainer (fedrun.algorithms.trainer):
- `optim.*` applies to the local model's step w_i <- w_i - eta lam (w_i - theta_i): it is a gradient
  step of the Moreau envelope F_i(w) = min_theta f_i(theta) + lam/2 ||theta - w||^2, whose gradient is
  lam (w - theta*(w)) (eq. 6; theta_i, the K inner steps' approximation of theta*), so momentum,
  weight decay (on w_i), Adam and the schedules act on F_i, one optimizer state per client (slot
  "opt"). The K inner steps stay the paper's solver of the prox problem (plain steps of personal_lr,
  warm-started), not steps of training: an optimizer's state there would carry across different
  prox problems. `mu` (the official code's L2 term on theta, inside the prox problem) and
  optim.weight_decay (on w_i, in the envelope's step) act on different variables. The server's
  mixing step with beta is not a local step.
- BatchNorm: the inner steps' forwards run in training mode and move theta_i's running statistics,
  which the local model w_i carries too (PFLlib's clientpFedMe trains one model, theta, whose
  buffers the restored w keeps). The server mixes the parameters with beta and takes the clients'
  mean statistics (`bn=averaged`: a mix with beta > 1 could make a variance negative), or each client
  keeps its own (`bn=local`).
- `algo.local_epochs=E`: E passes over each client's rows, one local round (K inner steps) per
  minibatch, as PFLlib's clientpFedMe loops over its DataLoader.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from ..engine import Engine
from ..engine.tree import Params, gather, param_names, weighted_mean
from .base import Algorithm, EvalContext, ModelLocal, ServerState
from .checks import check_choice, check_int, check_positive


class PFedMeLocal(NamedTuple):
    params: Params  # w_i, the local model (from the server's)
    theta: Params  # theta_i, the inner problem's solution (warm-started: w_i's copy at the round's start)
    opt: dict = {}  # the local trainer's optimizer state, by slot (`trainer.slot_of`)


class PFedMe(Algorithm):
    name = "pfedme"
    PERSONALIZED = ("theta", "local")
    protocol = {"train_all": dict(honest=False, official=True),  # every client trains every round
                "mu": dict(honest=0.0, official=0.001),  # extra L2 term mu*theta in the inner problem
                "personalized": dict(honest="theta", official="local")}  # the PM: each client's local model
    agreement_options = dict(lam=15.0, eta=0.05, personal_lr=0.05, K=2, beta=1.5)  # fedrun.bench.agreement
    optim_ok = True  # the local model's step along the Moreau envelope's gradient; the inner solver is the paper's
    batchnorm_ok = True

    def __init__(self, lr: float, lam: float, eta: float | None, personal_lr: float, K: int, beta: float,
                 mu: float | None, personalized: str | None, train_all: bool | None,
                 finetune_steps: int, finetune_epochs: int | None, finetune_lr: float | None):
        check_positive("algo.lr", lr)
        check_positive("algo.lam", lam)
        check_positive("algo.eta", eta, allow_null=True)
        eta = lr if eta is None else eta  # eta: the paper's name of lr; given, it wins
        self.lr = eta
        self.set_finetuning(finetune_steps, finetune_epochs, finetune_lr)
        check_positive("algo.personal_lr", personal_lr)
        check_int("algo.K", K, 1)
        check_positive("algo.beta", beta)
        check_positive("algo.mu", 0.0 if mu is None else mu, allow_zero=True)
        check_choice("algo.personalized", personalized or "theta", self.PERSONALIZED)
        check_choice("algo.train_all", bool(train_all) if train_all is not None else False, [True, False])
        self.lam, self.eta, self.personal_lr, self.K, self.beta = lam, eta, personal_lr, K, beta
        self.mu = mu or 0.0
        self.personalized = personalized or "theta"
        self.train_all = bool(train_all)

    def client_init(self, state: ServerState, clients: Tensor, rnd: int) -> PFedMeLocal:
        params = super().client_init(state, clients, rnd).params
        return PFedMeLocal(params=params, theta={k: v.clone() for k, v in params.items()})

    def with_shared_buffers(self, local: PFedMeLocal, buffers: Params) -> PFedMeLocal:
        """(`bn=local`) the client's own statistics in its local model and in theta, which starts as its copy."""
        return local._replace(params={**local.params, **buffers}, theta={**local.theta, **buffers})

    def client_step(self, engine: Engine, local: PFedMeLocal, batches, rnd: int) -> PFedMeLocal:
        (x, y), = batches
        names = param_names(local.params)
        shapes = [local.params[k].shape for k in names]
        w, theta = _flat([local.params[k] for k in names]), _flat([local.theta[k] for k in names])
        state = local.theta  # theta's model state (with a BatchNorm model's running statistics)
        for _ in range(self.K):  # the inner problem, on the same minibatch
            at = ModelLocal(params={**state, **dict(zip(names, _views(theta, shapes)))})  # theta's model state
            g, _, at = self.grad(engine, at, "params", x, y)
            state = at.params
            theta = theta - self._inner_step(theta, w, _flat([g[k] for k in names]))
        buffers = {k: v for k, v in state.items() if k not in names}  # (moved by the inner steps' forwards)
        new_theta = {**state, **dict(zip(names, _views(theta, shapes)))}
        if self.optim.plain:  # (this order of operations: the golden traces' numbers)
            t = w - theta
            t.mul_(self.eta * self.lam)
            return local._replace(params={**local.params, **buffers, **dict(zip(names, _views(w - t, shapes)))},
                                  theta=new_theta)
        t = w - theta
        t.mul_(self.lam)  # the Moreau envelope's gradient lam (w - theta)
        local = local._replace(params={**local.params, **buffers}, theta=new_theta)
        return self.descend(local, "params", dict(zip(names, _views(t, shapes))), self.eta, rnd)

    def _inner_step(self, theta: Tensor, w: Tensor, g: Tensor) -> Tensor:
        """personal_lr * (g + lam (theta - w) + mu theta), elementwise over all clients' parameters
        packed into one flat tensor, in place on one temporary (two with mu): the same operations
        in the same order as the formula and the authors' optimizer (so the same rounding; the
        golden traces check it). On the CPU, with all clients' stacked parameters (or several
        seeds' clients), dispatching and allocating every intermediate cost more than the
        arithmetic: one update of 100 clients' 4 tensors took 270 us as torch._foreach calls over
        the tensors, 160-220 us on one flat tensor including packing the gradient into it (one
        thread)."""
        t = theta - w
        t.mul_(self.lam)
        t.add_(g)
        if self.mu:
            t.add_(theta * self.mu)
        t.mul_(self.personal_lr)
        return t

    def server_update(self, state: ServerState, local: PFedMeLocal, clients: Tensor, selected: Tensor,
                      weights: Tensor | None) -> ServerState:
        avg = weighted_mean(gather(local.params, selected), weights)
        mixed = set(param_names(avg))  # (BatchNorm's running statistics: the clients' mean, not mixed)
        new = {k: (1 - self.beta) * state.params[k] + self.beta * avg[k] if k in mixed else avg[k] for k in avg}
        extra = dict(state.extra)
        if self.train_all:  # every client trained: what it would serve is at hand
            extra["served"] = self._served(local)
        return ServerState(params=new, extra=extra, clients=state.clients)

    def personalize(self, engine: Engine, state: ServerState, ctx: EvalContext) -> tuple[Params, None]:
        if self.train_all and "served" in state.extra:
            return state.extra["served"], None
        everyone = torch.arange(ctx.data.num_clients, device=ctx.data.train.x.device)
        own = self.own_statistics(state)  # bn=local: each client's own running statistics

        def start(cs: Tensor) -> PFedMeLocal:
            local = self.client_init(state, cs, 0)
            return local if own is None else self.with_shared_buffers(local, {k: v[cs] for k, v in own.items()})

        if self.local_epochs is not None:  # the training's local work: E passes over each client's rows
            return ctx.train_passes(engine, self.client_step, start, everyone, self.local_epochs, self._served), None
        x, y = ctx.train_batch(ctx.personalize_batch or ctx.batch_size, steps=(ctx.tau,))
        local = start(everyone)
        for r in range(ctx.tau):
            local = self.client_step(engine, local, [(x[:, r], y[:, r])], 0)
        return self._served(local), None

    def _served(self, local: PFedMeLocal) -> Params:
        """The PM a client's Local serves: its local model w_i (`personalized=local`) or theta_i."""
        return local.params if self.personalized == "local" else local.theta

def _flat(tensors: list[Tensor]) -> Tensor:
    """The tensors' entries, one after another, in one flat tensor (one copy)."""
    return torch.cat([t.reshape(-1) for t in tensors])


def _views(flat: Tensor, shapes: list) -> list[Tensor]:
    """Views of `flat` (as packed by `_flat`) in the original shapes."""
    sizes = [int(torch.Size(s).numel()) for s in shapes]
    return [part.view(s) for part, s in zip(flat.split(sizes), shapes)]
