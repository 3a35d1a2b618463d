"""APPLE, learned core-model mixtures (Luo & Wu, IJCAI 2022): every client i keeps a core model c_i
and a directed relationship vector p_i over the C training clients; its personalized model is

    theta_i = sum_j p_ij c_j,

the mixture of every client's core model as the server last received it, with its own c_i as it
trains. A local step at theta_i (gradient g = grad f_i(theta_i)) moves its own core and its vector:

    c_i  <- c_i  - (lr C) p_ii g                               (d theta_i / d c_i = p_ii; the C undoes p ~ 1/C)
    p_ij <- p_ij - dr_lr (<g, c_j>~ + lam_t mu (p_ij - p0_j))  (j = 1..C, c_i the updated one)

<g, c_j>~ the mean over parameter tensors of the element-wise mean of g c_j (PFLlib's normalization
of the inner product), p0_j = n_j / N the clients' shares of training rows, lam_t a cosine decay of
the proximal weight from 1 to 0 over the first L = int(decay x rounds) rounds
(lam_1 = 1, lam_t = (cos((t - 2) pi / L) + 1) / 2 for t - 2 < L, else 0: PFLlib's schedule, which
sets it after each round). p_i starts at 1/C.

What the client uploads as its next core model (`follow`): `paper`, its trained c_i (the paper's
"uploads its updated core model"); `pfllib` (protocol=official), its personalized model theta_i as
computed at the start of its last step, as PFLlib's clientAPPLE does (docs/baselines.md, "APPLE").
Served: theta_i (`pfllib`: that same model, which is what PFLlib scores; `paper`: p_i times the
current cores).

Vectorized: the C core models stacked [C, ...] in `ServerState.clients.params`; each local step
forms the mixtures of all the round's m clients as one [m, C] x [C, P] product per parameter tensor,
and the p-gradients as one [m, P] x [P, C] product. The round's Local holds the stacked cores as an
expanded (stride-0) view, so training keeps ONE copy of them on the device: C core models, plus
per client its own core, its mixture and its gradient (m x 3 models) and p [m, C]. (Batched seeds
join the replicas' views into one [m, C, ...] tensor, a copy of C models per client; and the
round's non-finite check allocates an [m, C, P] boolean once per round.)

Per-client state (an `AppleClients`, stacked over ALL clients in `ServerState.clients`, checkpointed,
gathered for the round's clients and scattered back, so unsampled clients keep theirs): `params`, the
core models (started from the initial model), `theta`, the served theta_i, and `p["p"]`, the p_i
[C, C]. A round's clients hold an `AppleLocal`.
Held-out clients have no core: their columns of every p are 0 and never move (`extra["member"]`).

BatchNorm (a model state with running statistics): theta_i is the model that runs (PFLlib's
clientAPPLE: `self.model`, whose `parameters()` `aggregate_parameters` overwrites with the p-weighted
mix of the cores before each step, its buffers untouched), so its running statistics are the
client's own: kept in `clients.theta` (from the initial model's), updated by each step's forward
in training mode (its minibatch's statistics) and served with theta_i. The cores are parameters only
(PFLlib's `model_c`, a copy of the client's model, is only ever mixed by `parameters()`): no
statistics are mixed, averaged or uploaded, so `bn=averaged` and `bn=local` are the same run. A
held-out client's theta starts from the initial model's statistics and its onboarding steps'
forwards (training mode) move them.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

from ..engine import Engine
from ..engine.tree import Params, add, expand, gather, is_buffer, only, param_names, scale, scatter, stack, sub
from .base import Algorithm, EvalContext, Phase, ServerState
from .checks import check_choice, check_optional_int, check_positive
from .personalize import onboarding_batches
from .trainer import slot_of


class AppleClients(NamedTuple):
    """APPLE's per-client state, stacked over ALL clients (the fields: the names checkpoints hold)."""

    params: Params  # the core models c_j (parameters only)
    theta: Params  # the served theta_i (a model state: with the client's own BatchNorm statistics)
    p: dict  # {"p": the p_i [C, C]}


class AppleLocal(NamedTuple):
    """A round's Local of APPLE, stacked over the round's m clients."""

    p: Tensor  # p_i [m, C]
    shape_p: dict  # {"p": p_i}: p's shape for its optimizer slot (a dict, as the trainer's slots take)
    params: Params  # the clients' own cores c_i as they train
    theta: Params  # theta_i (its parameters: the last step's mixture; its BatchNorm statistics: the client's)
    cores: Params  # every core as the server holds it, [m, C, ...] (an expanded view of one set)
    own: Tensor  # [m, C]: one-hot of the client's own column
    p0: Tensor  # [m, C]: the clients' shares of training rows
    member: Tensor  # [m, C] bool: the training clients' columns
    lam: Tensor  # [m]: the round's lam_t
    scale: Tensor  # [m]: C, the scale of the own core's rate
    opt: dict = {}  # the local trainer's optimizer state, by slot ("opt": the core, "opt.p": p)


def mix(p: Tensor, cores: Params) -> Params:
    """sum_j p[i, j] cores_j per row i of p [m, C], over cores stacked [C, ...] (one product per tensor)."""
    return {k: (p @ v.flatten(1)).view(len(p), *v.shape[1:]) for k, v in cores.items()}


def mix_local(p: Tensor, cores: Params) -> Params:
    """The same over a Local's cores [m, C, ...]: one set for all clients (an expanded view, read
    once), or each client's own (batched seeds: the replicas' sets joined)."""
    out = {}
    for k, v in cores.items():
        if v.stride(0) == 0:
            out[k] = (p @ v[0].flatten(1)).view(len(p), *v.shape[2:])
        else:
            out[k] = torch.bmm(p.unsqueeze(1), v.flatten(2)).view(len(p), *v.shape[2:])
    return out


def _dots(g: Params, cores: Params) -> Tensor:
    """[m, C]: mean over tensors k of mean(g_i[k] * cores_j[k]) (PFLlib's normalized <g, c_j>)."""
    total = 0
    for k, gk in g.items():
        v, gf = cores[k], gk.flatten(1)
        if v.stride(0) == 0:  # one set for all clients: [m, P] x [P, C]
            total = total + gf @ v[0].flatten(1).T / gf.shape[1]
        else:
            total = total + torch.bmm(v.flatten(2), gf.unsqueeze(2)).squeeze(2) / gf.shape[1]
    return total / len(g)


class APPLE(Algorithm):
    name = "apple"
    Clients = AppleClients

    FOLLOW = ("paper", "pfllib")
    protocol = {"follow": dict(honest="paper", official="pfllib")}  # PFLlib's clientAPPLE uploads theta_i
    agreement_options = dict(lr=0.05, dr_lr=0.1, mu=0.1)  # fedrun.bench.agreement: p moves

    def __init__(self, lr: float, dr_lr: float, mu: float, decay: float, decay_rounds: int | None, follow: str | None,
                 local_epochs: int | None, new_client_steps: int | None,
                 finetune_steps: int, finetune_epochs: int | None, finetune_lr: float | None):
        check_positive("algo.lr", lr)
        check_positive("algo.dr_lr", dr_lr, allow_zero=True)
        check_positive("algo.mu", mu, allow_zero=True)
        check_positive("algo.decay", decay, allow_zero=True)
        check_optional_int("algo.decay_rounds", decay_rounds, 0)
        check_choice("algo.follow", follow or "paper", self.FOLLOW)
        check_optional_int("algo.local_epochs", local_epochs)
        check_optional_int("algo.new_client_steps", new_client_steps)
        self.lr, self.dr_lr, self.mu, self.decay, self.decay_rounds = lr, dr_lr, mu, decay, decay_rounds
        self.follow, self.local_epochs, self.new_client_steps = follow or "paper", local_epochs, new_client_steps
        self.set_finetuning(finetune_steps, finetune_epochs, finetune_lr)

    @property
    def run_rounds(self) -> int | None:
        """The run's rounds (`bind`: simulate binds the run before its first round)."""
        return self.run.rounds

    @property
    def sizes(self) -> Tensor | None:
        """The training clients' rows (`bind`)."""
        sizes = self.run.train_sizes
        return None if sizes is None else sizes.to(torch.float64)

    def lam_at(self, rnd: int) -> float:
        """lam_t of round `rnd` (1, 2, ...): 1, then PFLlib's cosine decay set after round t - 1."""
        L = self.decay_rounds if self.decay_rounds is not None else (
            None if self.run_rounds is None else int(self.decay * self.run_rounds))
        if rnd <= 1 or L is None:
            return 1.0
        t = rnd - 2
        return (math.cos(t * math.pi / L) + 1) / 2 if t < L else 0.0

    def phases(self) -> tuple[Phase, ...] | None:
        return None if self.local_epochs is None else (Phase(self.client_step, epochs=self.local_epochs),)

    def init(self, params: Params, num_clients: int) -> ServerState:
        first = next(iter(params.values()))
        n = (self.sizes if self.sizes is not None and len(self.sizes) <= num_clients
             else torch.ones(num_clients, dtype=torch.float64))
        member = torch.zeros(num_clients, dtype=torch.bool)
        member[: len(n)] = True
        p0 = torch.zeros(num_clients, dtype=torch.float64)
        p0[: len(n)] = n / n.sum()
        p = torch.where(member, 1.0 / len(n), 0.0).to(first.dtype)
        extra = {"p0": p0.to(first.dtype).to(first.device), "member": member.to(first.device)}
        return ServerState(params=params, extra=extra,  # (cores: parameters only; theta: the model state)
                           clients=AppleClients(params=stack(only(params, param_names(params)), num_clients),
                                                theta=stack(params, num_clients),
                                                p={"p": p.to(first.device).expand(num_clients, -1).clone()}))

    def _local(self, state: ServerState, clients: Tensor, p: Tensor, core: Params, lam: float) -> AppleLocal:
        m, C = len(clients), len(state.extra["p0"])
        first = next(iter(core.values()))
        return AppleLocal(p=p, shape_p={"p": p}, params=core,
                          theta=self.with_statistics(mix(p, state.clients.params), state.clients.theta, clients),
                          cores=expand(state.clients.params, m),
                          # (not one_hot: it checks its indices on the host)
                          own=(clients.unsqueeze(1) == torch.arange(C, device=clients.device)).to(first.dtype),
                          p0=state.extra["p0"].expand(m, -1), member=state.extra["member"].expand(m, -1),
                          lam=torch.full((m,), lam, dtype=first.dtype, device=first.device),
                          scale=state.extra["member"].sum().to(first.dtype).repeat(m))  # (on the device: no host read)

    def client_init(self, state: ServerState, clients: Tensor, rnd: int) -> AppleLocal:
        return self._local(state, clients, state.clients.p["p"][clients], gather(state.clients.params, clients),
                           self.lam_at(rnd))

    @staticmethod
    def with_statistics(mixed: Params, theta: Params, clients: Tensor | None = None) -> Params:
        """The model state of the mixtures `mixed` (parameters) with the clients' own running statistics
        from `theta` (stacked over all clients: rows `clients`; None: `theta`'s rows are the clients'), in
        the model's order; `mixed` itself without BatchNorm."""
        names = [k for k in theta if is_buffer(k)]
        if not names:
            return mixed
        return {k: mixed[k] if k in mixed else (theta[k] if clients is None else theta[k][clients]) for k in theta}

    @staticmethod
    def theta(local: AppleLocal) -> Params:
        """theta_i = sum_j p_ij c_j with the client's own core as it trains (an [m, C] x [C, P] product)."""
        p, own, core = local.p, local.own, local.params
        base = mix_local(p, local.cores)
        frozen = mix_local(own, local.cores)  # its own core as the server holds it
        return add(base, scale(sub(core, frozen), (p * own).sum(1)))

    def client_step(self, engine: Engine, local: AppleLocal, batches, rnd: int) -> AppleLocal:
        (x, y), = batches
        p, own = local.p, local.own
        # the step's forward at theta_i, training mode (BatchNorm: the client's own statistics move)
        g, _, local = self.grad(engine, local._replace(theta={**local.theta, **self.theta(local)}), "theta", x, y)
        theta = local.theta
        pii = (p * own).sum(1) * local.scale
        if self.optim.plain:  # (the arithmetic the golden traces pin)
            core = sub(local.params, scale(g, self.lr * pii))
        else:  # the core's gradient: d theta_i / d c_i = p_ii (times C, the scale of its rate)
            core = self.descend(local, "params", scale(g, pii), self.lr, rnd)
            local, core = core, core.params
        dots = _dots(g, local.cores)
        mine = sum((g[k] * core[k]).flatten(1).mean(1) for k in g) / len(g)  # <g, c_i>~ with the updated c_i
        dots = torch.where(own.bool(), mine.unsqueeze(1), dots)
        grad = dots + (local.lam * self.mu).unsqueeze(1) * (p - local.p0)
        if self.optim.plain:
            p = torch.where(local.member, p - self.dr_lr * grad, p)
        else:  # (held-out clients' columns: no gradient, so no step, under any optimizer of optim.*)
            # (p stepped as the model {"p": p}, the dict the trainer's models are, in the slot "opt.p")
            out = self.descend(local._replace(p={"p": p}), "p", {"p": torch.where(local.member, grad, 0)},
                               self.dr_lr, rnd)
            local, p = out, out.p["p"]
        return local._replace(theta=theta, params=core, p=p)

    # PFLlib's clientAPPLE takes SGD steps of its own core (lr) and of its p_i (dr_lr): optim.* applies to
    # each, two slots ("opt" for the core, "opt.p" for p)
    optim_ok = True
    # theta_i's running statistics are the client's own (PFLlib's clientAPPLE mixes `parameters()` only); the
    # cores carry none, so bn=averaged and bn=local are the same run (module docstring)
    batchnorm_ok = True

    def shared_buffers(self, local: AppleLocal) -> Params:  # (trainer, bn=local): no shared model's statistics
        return {}

    def optim_slots(self, local: AppleLocal) -> dict:
        return {"opt": ("params", param_names(local.params)), slot_of("p"): ("shape_p", ["p"])}

    def server_update(self, state: ServerState, local: AppleLocal, clients: Tensor, selected: Tensor,
                      weights: Tensor | None) -> ServerState:
        up = local.theta if self.follow == "pfllib" else local.params  # (scatter takes the cores' entries)
        served = local.theta if self.follow == "pfllib" else self.with_statistics(self.theta(local), local.theta)
        kept = AppleClients(params=scatter(state.clients.params, clients, up),
                            theta=scatter(state.clients.theta, clients, served),
                            p={"p": state.clients.p["p"].index_copy(0, clients, local.p)})
        return ServerState(params=state.params, extra=state.extra, clients=kept)

    def personalize(self, engine: Engine, state: ServerState, ctx: EvalContext):
        if self.follow == "pfllib":
            return state.clients.theta, None
        return self.with_statistics(mix(state.clients.p["p"], state.clients.params), state.clients.theta), None

    def onboard(self, engine: Engine, state: ServerState, ctx: EvalContext, new: Tensor) -> ServerState:
        """A held-out client has no core in the mixtures: it starts from p_i = p0 (the FedAvg mixture
        of the trained cores) and takes new_client_steps (null: tau) APPLE steps that learn p_i alone
        (lam_t of the round after the last); it is served sum_j p_ij c_j."""
        p0 = state.extra["p0"]
        local = self._local(state, new, p0.expand(len(new), -1).clone(), gather(state.clients.params, new),
                            self.lam_at((self.run_rounds or 0) + 1))
        local = local._replace(own=torch.zeros_like(local.own))  # no own core: theta = p . cores, c_i untouched
        for batches in onboarding_batches(ctx, new, self.new_client_steps):
            local = self.client_step(engine, local, batches, 0)
        kept = state.clients._replace(
            p={"p": state.clients.p["p"].index_copy(0, new, local.p)},
            theta=scatter(state.clients.theta, new, self.with_statistics(self.theta(local), local.theta)))
        return ServerState(params=state.params, extra=state.extra, clients=kept)
