"""FedDBE, domain bias elimination (Zhang, Hua, Cao, Wang, Guan, Ma, NeurIPS 2023, "Eliminating Domain
Bias for Federated Learning in Representation Space").

Each client keeps a personalized representation bias, a vector m_i as wide as the representation
(PRBM, started at 0), added to every representation before the head: the client's model is
h(f(x) + m_i). Its local step (SGD of lr `lr` on the model and on m_i) minimizes

    CE(h(f(x) + m_i), y) + kappa * mean_dims( 0.5 (r - g)^2 ),

r a running mean of the round's minibatch representation means (momentum `momentum`: r <- (1 -
momentum) r + momentum mean_rows f(x), r reset to 0 at each round's start, its earlier value held
constant in each step's gradient) and g the global mean representation (MR, the mean regularizer).
g is fixed once, before round 1 (`prepare`): every training client takes one round of plain
cross-entropy steps from the initial model (its `tau` steps on minibatches of the evaluation's round-0
stream, or with `local_epochs` E passes over its own rows from that stream, no bias) tracking r; g
is the mean of the clients' r weighted by their training rows; those models are discarded (PFLlib's
FedDBE server does this in its constructor: every client's train(), local_epochs passes of its
shuffling, drop_last loader, r reset once at its start). The server averages the model (FedAvg).
Served: the server model with each client's m_i (a linear head: its bias b + W m_i, the same logits);
`global_*` scores the server model without it.

Per-client state (a `FedDBEClients`): `dbe["bias"]` [C, d]; a round's clients hold a `FedDBELocal`;
server: `extra["global_mean"]` [d].
"""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from ..engine import Engine
from ..engine.tree import Params, expand, gather, head_names, only, stack, weighted_mean
from .base import Algorithm, EvalContext, ServerState
from .checks import check_optional_int, check_positive, check_unit
from .personalize import onboarding_batches
from .representation import apply_head, features_and_logits, head_of, require_linear_head, step_features
from .trainer import ModelLocal, slot_of

BIAS = "dbe.bias"  # the client's representation bias among a step's differentiated params


class FedDBEClients(NamedTuple):
    dbe: dict  # {"bias": [C, d]}, every client's representation bias m_i


class FedDBELocal(NamedTuple):
    params: Params  # the client's model, from the server's
    dbe: dict  # {"bias": [m, d]}, m_i
    running: Tensor  # r [m, d], the running mean of the round's minibatch representation means
    global_mean: Tensor  # g [m, d] (expanded: the same for every client)
    opt: dict = {}  # the local trainer's optimizer state, by slot (`trainer.slot_of`)


class FedDBE(Algorithm):
    name = "feddbe"
    Clients = FedDBEClients
    agreement_options = dict(lr=0.1, kappa=1.0)  # fedrun.bench.agreement: the regularizer on

    def __init__(self, lr: float, momentum: float, kappa: float, new_client_steps: int | None, finetune_steps: int,
                 finetune_epochs: int | None, finetune_lr: float | None):
        check_positive("algo.lr", lr)
        check_unit("algo.momentum", momentum)
        check_positive("algo.kappa", kappa, allow_zero=True)
        check_optional_int("algo.new_client_steps", new_client_steps)
        self.lr, self.momentum, self.kappa, self.new_client_steps = lr, momentum, kappa, new_client_steps
        self.set_finetuning(finetune_steps, finetune_epochs, finetune_lr)

    def check_params(self, params: Params) -> None:
        super().check_params(params)
        require_linear_head(self.name, params, "adds a per-client bias to the representation before the head")

    def init(self, params: Params, num_clients: int) -> ServerState:
        self.check_params(params)
        w = next(params[k] for k in head_names(params) if params[k].dim() == 2)
        zero = torch.zeros(w.shape[1], dtype=w.dtype, device=w.device)
        return ServerState(params=params, extra={"global_mean": zero},
                           clients=FedDBEClients(dbe={"bias": stack({"b": zero}, num_clients)["b"]}))

    def prepare(self, engine: Engine, state: ServerState, ctx: EvalContext) -> ServerState:
        """The global mean representation g: every training client's running mean after a round of
        plain cross-entropy steps from the initial model, weighted by its training rows. The clients
        train in the round's chunks (`ctx.chunked`: client_chunk, memory='s plan, out-of-memory
        halving), each chunk from its clients' rows drawn for all of them first. A round is the run's:
        tau steps of batch_size rows (`init_rows`), or with `local_epochs` E passes over each client's
        own rows (floor(n_c / batch_size) steps a pass, as the round's epochs phase: `ctx.train_passes`),
        both from round 0's evaluation stream `ctx.gen`."""
        split = ctx.data.train
        everyone = torch.arange(ctx.data.num_train_clients, device=split.x.device)

        def running(clients: Tensor, rows: Tensor) -> Tensor:
            local = self.client_init(state, clients, 0)
            for s in range(rows.shape[1]):
                local = self._step(engine, local, [split.rows(rows[:, s])], dbe=False)
            return local.running

        if self.local_epochs is None:
            r = ctx.chunked(running, everyone, init_rows(ctx, everyone, None))
        else:  # PFLlib's constructor: each client's train(), local_epochs passes of its shuffling loader
            r = ctx.train_passes(engine, lambda e, local, batches, rnd: self._step(e, local, batches, dbe=False),
                                 lambda cs: self.client_init(state, cs, 0), everyone, self.local_epochs,
                                 lambda local: local.running)
        n = ctx.data.train.sizes[: ctx.data.num_train_clients].to(r.device, r.dtype)
        g = (n.unsqueeze(-1) * r).sum(0) / n.sum()
        return ServerState(params=state.params, extra={**state.extra, "global_mean": g}, clients=state.clients)

    def client_init(self, state: ServerState, clients: Tensor, rnd: int) -> FedDBELocal:
        m, g = len(clients), state.extra["global_mean"]
        return FedDBELocal(params=stack(state.params, m), dbe={"bias": state.clients.dbe["bias"][clients]},
                           running=torch.zeros(m, *g.shape, dtype=g.dtype, device=g.device),
                           global_mean=g.expand(m, *g.shape))

    optim_ok = True  # the model's optimizer and the bias's (PFLlib's clientDBE: optimizer, opt_client_mean)
    batchnorm_ok = True  # the running mean r from the step's training-mode forward (batch statistics)

    def optim_slots(self, local: FedDBELocal) -> dict:
        return {**super().optim_slots(local), slot_of("dbe"): ("dbe", ["bias"])}

    def client_step(self, engine: Engine, local: FedDBELocal, batches, rnd: int) -> FedDBELocal:
        return self._step(engine, local, batches, dbe=True, rnd=rnd)

    def _step(self, engine: Engine, local: FedDBELocal, batches, dbe: bool, rnd: int = 0) -> FedDBELocal:
        """One SGD step of lr on the model and the bias (`dbe`: FedDBE's loss; else plain
        cross-entropy without the bias, the constructor's round), the running mean moved."""
        (x, y), = batches
        mom, kappa = self.momentum, self.kappa
        bias = local.dbe["bias"]

        def loss(p: Params, x: Tensor, y: Tensor, running: Tensor, g: Tensor) -> Tensor:
            model = {k: v for k, v in p.items() if k != BIAS}
            z, logits = features_and_logits(engine, model, x)
            if not dbe:
                return engine.criterion(logits, y)
            r = (1 - mom) * running + mom * z.mean(0)
            out = engine.criterion(apply_head(engine, head_of(model), z + p[BIAS]), y)
            return out + kappa * (0.5 * (r - g) ** 2).mean()

        with torch.no_grad():  # the running mean of the round's minibatch representation means
            z = client_means(engine, local.params, x)
            running = (1 - mom) * local.running + mom * z
        g, _, both = self.value_and_grad(engine, ModelLocal(params={**local.params, BIAS: bias}), "params", loss, x, y,
                                         local.running, local.global_mean)
        local = local._replace(params=only(both.params, local.params), running=running)
        local = self.descend(local, "params", only(g, local.params), self.lr, rnd)
        if self.optim.plain:  # (the traces' arithmetic, bit for bit)
            return local._replace(dbe={"bias": bias - self.lr * g[BIAS]})
        return self.descend(local, "dbe", {"bias": g[BIAS]}, self.lr, rnd)

    def server_update(self, state: ServerState, local: FedDBELocal, clients: Tensor, selected: Tensor,
                      weights: Tensor | None) -> ServerState:
        new = weighted_mean(gather(local.params, selected), weights)
        bias = state.clients.dbe["bias"].index_copy(0, clients, local.dbe["bias"])
        return ServerState(params=new, extra=state.extra, clients=FedDBEClients(dbe={"bias": bias}))

    def personalize(self, engine: Engine, state: ServerState, ctx: EvalContext):
        bias = state.clients.dbe["bias"]
        served = dict(expand(state.params, bias.shape[0]))
        w = next(k for k in head_names(state.params) if state.params[k].dim() == 2)
        b = next(k for k in head_names(state.params) if state.params[k].dim() == 1)
        served[b] = state.params[b] + bias @ state.params[w].T  # h(z + m) = W z + (b + W m)
        return self.with_own_statistics(state, served), None  # (bn=local: each client's own statistics)

    def onboard(self, engine: Engine, state: ServerState, ctx: EvalContext, new: Tensor) -> ServerState:
        """A held-out client's bias: new_client_steps (null: tau) of its FedDBE steps from the server
        model and a zero bias; it is then served the server model with that bias (as a trained
        client, whose own model the next round's server model replaces); bn=local: the steps' training-mode
        forwards move its own statistics (the initial model's), which it keeps and is served with."""
        local = self.client_init(state, new, 0)
        local = local._replace(params=self.with_own_statistics(state, local.params, new))
        for batches in onboarding_batches(ctx, new, self.new_client_steps):
            local = self._step(engine, local, batches, dbe=True)
        bias = state.clients.dbe["bias"].index_copy(0, new, local.dbe["bias"])
        return ServerState(params=state.params, extra=state.extra, clients=FedDBEClients(dbe={"bias": bias}),
                           trainer=self.kept_own_statistics(state, new, local.params))


def init_rows(ctx: EvalContext, clients: Tensor, steps: int | None) -> Tensor:
    """The training rows [len(clients), steps, B] of the round before round 1 (`prepare`): `steps`
    (None: tau) draws of batch_size rows per client from round 0's stream, as `onboarding_batches`
    draws them (tests replace it with a trace's)."""
    return ctx.train_rows(ctx.batch_size, (steps or ctx.tau,), clients)


def client_means(engine: Engine, params: Params, x: Tensor) -> Tensor:
    """Every client's mean representation [m, d] of its minibatch x [m, B, ...], as its training step's
    forward computes it (a BatchNorm model: batch statistics; `step_features`)."""
    return step_features(engine, params, x).mean(1)
