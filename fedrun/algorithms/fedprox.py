"""FedProx (Li, Sahu, Zaheer, Sanjabi, Talwalkar, Smith, MLSys 2020, eq. 2 / Alg. 2).

Each client approximately minimizes its loss plus a proximal term toward the round's server model
w^t,  h_i(w) = f_i(w) + mu/2 ||w - w^t||^2,  by `tau` SGD steps of lr `beta`:

    w <- w - beta * (grad f_i(w; D) + mu (w - w^t)).

The server averages (as FedAvg). mu = 0 is FedAvg exactly. Test time: the global model, and (as
FedAvg) `finetune_steps` steps of lr `alpha` on the client's training rows (alpha null: none).

The paper's systems heterogeneity (stragglers doing fewer steps, "gamma-inexact" solutions) is not
simulated: every sampled client does `tau` steps. PFLlib's FedProx (clientprox.py,
PerturbedGradientDescent: d_p = grad + mu (p - w^t)) computes the same step.

A round's clients hold a `FedProxLocal`; there is no per-client state.
"""
from __future__ import annotations

from typing import NamedTuple

from ..engine import Engine
from ..engine.tree import Params, expand, prox_grad, stack
from .base import ServerState
from .checks import check_positive
from .fedavg import AveragedSGD


class FedProxLocal(NamedTuple):
    params: Params  # w: the clients' models
    anchor: Params  # w^t, the round's server model (expanded: one copy for all clients)
    opt: dict = {}  # the local trainer's optimizer state, by slot (`trainer.slot_of`)


class FedProx(AveragedSGD):
    name = "fedprox"

    def __init__(self, lr: float, beta: float | None, alpha: float | None, finetune_steps: int,
                 finetune_epochs: int | None, mu: float, finetune_lr: float | None):
        super().__init__(lr, beta, alpha, finetune_steps, finetune_epochs, finetune_lr)
        check_positive("algo.mu", mu, allow_zero=True)
        self.mu = mu

    def client_init(self, state: ServerState, clients, rnd: int) -> FedProxLocal:
        return FedProxLocal(params=stack(state.params, len(clients)), anchor=expand(state.params, len(clients)))

    optim_ok = True
    batchnorm_ok = True

    def client_step(self, engine: Engine, local: FedProxLocal, batches, rnd: int) -> FedProxLocal:
        (x, y), = batches
        g, _, local = self.grad(engine, local, "params", x, y)
        g = prox_grad(g, local.params, local.anchor, self.mu)
        return self.descend(local, "params", g, self.beta, rnd)
