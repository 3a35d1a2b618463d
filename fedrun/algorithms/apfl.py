"""APFL, adaptive personalized FL (Deng, Kamani, Mahdavi 2020, Alg. 1): each client keeps a local
model v_i and a mixing weight alpha_i; per local step, on one minibatch D,

    w     <- w - lr grad f_i(w; D)
    vbar   = alpha_i v_i + (1 - alpha_i) w                 (before the step)
    v_i   <- v_i - lr alpha_i grad f_i(vbar; D)
    alpha_i <- clip(alpha_i - alpha_lr <v_i - w, grad f_i(vbar; D)>, 0, 1)   (alpha_lr 0: fixed)

w is averaged by the server; the model served is alpha_i v_i + (1 - alpha_i) w^{t+1}.
`follow=pfllib` (protocol=official) reproduces PFLlib's clientAPFL instead, which differs from the
paper in four places: v_i is trained on its OWN loss (v <- v - lr grad f(v; D)); the alpha gradient
is <v_i - w, alpha grad f(v_i) + (1 - alpha) grad f(w)> + 0.02 alpha at the stepped models; after
the round v_i is overwritten by the mixture (1 - alpha_i) w_i + alpha_i v_i (w_i: the client's own
trained w); and that stored mixture is what is served (the traces of tests/test_golden_pfllib.py
check it).

Per-client state (stacked over ALL clients in `ServerState.clients`, an `APFLClients`, checkpointed,
gathered for the round's clients and scattered back, so unsampled clients keep theirs): the local
models v (started from the initial model) and the mixing weights `mix["alpha"]` ([C, 1]). A round's
clients hold an `APFLLocal`.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from ..engine import Engine
from ..engine.batchnorm import is_buffer
from ..engine.tree import (
    Params,
    add,
    dot,
    expand,
    gather,
    param_names,
    per_client,
    scale,
    scatter,
    stack,
    sub,
    weighted_mean,
)
from .base import Algorithm, EvalContext, ServerState
from .checks import check_choice, check_optional_int, check_positive, check_unit
from .personalize import onboarding_batches
from .trainer import ModelLocal, slot_of


class APFLClients(NamedTuple):
    v: Params  # v_i, every client's local model
    mix: dict  # {"alpha": [C, 1]}, every client's mixing weight alpha_i


class APFLLocal(NamedTuple):
    params: Params  # w: the shared model, trained as FedAvg's
    v: Params  # v_i
    alpha: Tensor  # alpha_i [m, 1]
    opt: dict = {}  # the local trainer's optimizer state, by slot (`trainer.slot_of`)


class APFL(Algorithm):
    name = "apfl"
    Clients = APFLClients

    FOLLOW = ("paper", "pfllib")
    protocol = {"follow": dict(honest="paper", official="pfllib")}  # PFLlib's clientAPFL update

    def __init__(self, lr: float, alpha: float, alpha_lr: float, follow: str | None, new_client_steps: int | None,
                 finetune_steps: int, finetune_epochs: int | None, finetune_lr: float | None):
        check_positive("algo.lr", lr)
        check_optional_int("algo.new_client_steps", new_client_steps)
        self.new_client_steps = new_client_steps
        self.set_finetuning(finetune_steps, finetune_epochs, finetune_lr)
        check_choice("algo.follow", follow or "paper", self.FOLLOW)
        self.follow = follow or "paper"
        check_unit("algo.alpha", alpha)
        check_positive("algo.alpha_lr", alpha_lr, allow_zero=True)
        self.lr, self.alpha, self.alpha_lr = lr, float(alpha), alpha_lr

    def init(self, params: Params, num_clients: int) -> ServerState:
        first = next(iter(params.values()))
        alpha = torch.full((num_clients, 1), self.alpha, dtype=first.dtype, device=first.device)
        return ServerState(params=params, clients=APFLClients(v=stack(params, num_clients), mix={"alpha": alpha}))

    def client_init(self, state: ServerState, clients: Tensor, rnd: int) -> APFLLocal:
        return APFLLocal(params=stack(state.params, len(clients)), v=gather(state.clients.v, clients),
                         alpha=state.clients.mix["alpha"][clients])

    @staticmethod
    def _kept(state: ServerState, clients: Tensor, v: Params, alpha: Tensor) -> APFLClients:
        """The per-client state with the clients `clients`' rows replaced by v, alpha."""
        return APFLClients(v=scatter(state.clients.v, clients, v),
                           mix={"alpha": state.clients.mix["alpha"].index_copy(0, clients, alpha)})

    @staticmethod
    def _mix(v: Params, w: Params, alpha: Tensor) -> Params:
        """alpha v + (1 - alpha) w per client (alpha [m, 1]) over the parameters; a BatchNorm model's
        running statistics are v's (those of the mixture's own forwards, or with follow=pfllib of v's:
        PFLlib mixes `parameters()` only)."""
        return {k: v[k] if is_buffer(k) else torch.lerp(w[k], v[k], per_client(alpha, v[k])) for k in v}

    # Two models, two optimizers (PFLlib's clientAPFL: optimizer for w, optimizer_per for v); alpha's own
    # step (alpha_lr, clipped to [0, 1], PFLlib's alpha_update by hand) is not an optim.* step.
    optim_ok = True
    # v's running statistics are those of the mixture's forwards (the model served), w's its own
    batchnorm_ok = True

    def optim_slots(self, local: APFLLocal) -> dict:
        return {**super().optim_slots(local), slot_of("v"): ("v", param_names(local.v))}

    def client_step(self, engine: Engine, local: APFLLocal, batches, rnd: int) -> APFLLocal:
        (x, y), = batches
        g, _, local = self.grad(engine, local, "params", x, y)
        if self.follow == "pfllib":
            return self._pfllib_step(engine, local, g, x, y, rnd)
        w, v, alpha = local.params, local.v, local.alpha
        # grad f(vbar) at the mixture vbar (v's running statistics updated by its forward)
        gbar, _, mixed = self.grad(engine, ModelLocal(params=self._mix(v, w, alpha)), "params", x, y)
        buffers = {k: t for k, t in mixed.params.items() if is_buffer(k)}
        if self.alpha_lr:
            alpha = (alpha - self.alpha_lr * dot(gbar, sub(v, w)).view(-1, 1)).clamp(0.0, 1.0)
        if self.optim.plain:  # (the arithmetic of the traces: lr alpha grad, bit for bit)
            local = local._replace(v={**v, **buffers, **{k: v[k] - self.lr * per_client(local.alpha, v[k]) * gbar[k]
                                                          for k in gbar}})
        else:  # grad_v f(alpha v + (1 - alpha) w) = alpha grad f(vbar)
            gv = scale(gbar, local.alpha.view(-1))
            local = self.descend(local._replace(v={**v, **buffers}), "v", gv, self.lr, rnd)
        return self.descend(local, "params", g, self.lr, rnd)._replace(alpha=alpha)

    def _pfllib_step(self, engine: Engine, local: APFLLocal, g: Params, x: Tensor, y: Tensor, rnd: int) -> APFLLocal:
        gv, _, local = self.grad(engine, local, "v", x, y)
        alpha = local.alpha
        local = self.descend(self.descend(local, "params", g, self.lr, rnd), "v", gv, self.lr, rnd)
        if self.alpha_lr:
            new_w, new_v, a = local.params, local.v, alpha.view(-1)
            d = dot(add(scale(gv, a), scale(g, 1 - a)), sub(new_v, new_w))
            alpha = (alpha - self.alpha_lr * (d + 0.02 * a).view(-1, 1)).clamp(0.0, 1.0)
        return local._replace(alpha=alpha)

    def server_update(self, state: ServerState, local: APFLLocal, clients: Tensor, selected: Tensor,
                      weights: Tensor | None) -> ServerState:
        new = weighted_mean(gather(local.params, selected), weights)
        if self.follow == "pfllib":  # v_i <- (1 - alpha_i) w_i + alpha_i v_i, with the client's own w_i
            local = local._replace(v=self._mix(local.v, local.params, local.alpha))
        return ServerState(params=new, extra=state.extra, clients=self._kept(state, clients, local.v, local.alpha))

    def personalize(self, engine: Engine, state: ServerState, ctx: EvalContext):
        alpha = state.clients.mix["alpha"]
        if self.follow == "pfllib":  # the stored mixture (PFLlib's model_per)
            return state.clients.v, None
        return self._mix(state.clients.v, expand(state.params, alpha.shape[0]), alpha), None

    def onboard(self, engine: Engine, state: ServerState, ctx: EvalContext, new: Tensor) -> ServerState:
        """A held-out client's v and alpha: new_client_steps (null: tau) of its local APFL steps from
        v = w^t (as every client's v and w start from the same model) and the initial alpha, kept
        as a round's end keeps them; it is then served its mixture with the server model."""
        own = self.with_own_statistics  # (bn=local: w and v with the client's own statistics, the initial ones)
        local = self.client_init(state, new, 0)
        local = local._replace(params=own(state, local.params, new), v=self.own_models(state, new))
        for batches in onboarding_batches(ctx, new, self.new_client_steps):
            local = self.client_step(engine, local, batches, 0)
        v = self._mix(local.v, local.params, local.alpha) if self.follow == "pfllib" else local.v
        return ServerState(params=state.params, extra=state.extra, clients=self._kept(state, new, v, local.alpha))
