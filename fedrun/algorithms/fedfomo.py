"""FedFomo, first-order model optimization (Zhang, Sapra, Fidler, Yeung, Alvarez, ICLR 2021, Alg. 1 and
eqs. 3-5): every client keeps its own model; before client i trains, the server sends it the models of
its M neighbours, the M clients with the highest affinity P[i, n] (the clients' affinity matrix P
[C, C], started at the identity, so a client's own last model is among its neighbours). Client i
weighs each neighbour model theta_n by the first-order improvement it brings on i's validation rows,

    w_n = (L_i(theta_i) - L_i(theta_n)) / (||theta_n - theta_i|| + 1e-5),

adds the raw w_n into its row P[i, n] (kept by the server), and replaces its model by the mixture

    theta_i <- sum_n max(w_n, 0) theta_n / sum_n max(w_n, 0)      (kept unchanged when no w_n > 0),

then trains it by `tau` steps (`local_epochs` set: passes over its rows) of local SGD (`optim.*`).
Neighbours are only clients whose models the server holds
from the previous round's uploads: min(M, that count) of them (none on the first round), as PFLlib's
server counts them; their models are the stacked per-client models.

theta_i in w_n: `follow=paper` the client's current model (its model after its last training);
`follow=pfllib` (protocol=official) PFLlib's clientFomo.old_model, the client's model right after its
last mixture, BEFORE its last training (docs/baselines.md, "FedFomo").

Validation rows: `val_batches` minibatches of batch_size rows, drawn each round from the client's
TRAINING rows (the round's own sampler; never test rows). They are not withheld from training: the
paper and PFLlib cut a fixed validation split (PFLlib: the last 20 % of a client's training rows) that
the client never trains on; fedrun's samplers draw from all of a client's training rows, and a
per-client split would take rows from training that every other method uses (docs/baselines.md).

Vectorized over the round's clients: the m clients' base models and their M neighbour models, m (M +
1) models, are scored on each client's validation minibatch in one engine call per minibatch (a loss
and gradient: the engines' primitive; the gradient is unused), the mean losses summed in float64
(w_n's numerator is a difference of close losses); the distances one reduction over the stacked
differences. Memory besides the stacked client models: the [C, C] affinity matrix and the round's m
M neighbour models (100 clients of a 1M-parameter model, 10 a round, M 5: a 100 x 100 matrix and 50
gathered models, 200 MB in float32).

Served: each client's last trained model. The shared model (`global_*` metrics) stays the initial
model: FedFomo has no global model.

Per-client state (stacked over ALL clients in `ServerState.clients`, a `FedFomoClients`, checkpointed,
gathered for the round's clients and scattered back): `params` (its model: the server's copy of its
upload and the client's own model are the same tensors), `old` (its model after its last mixture,
PFLlib's old_model), `affinity["P"]` (its row of P); a round's clients hold a `FedFomoLocal`.
`extra["sent"]`: a [C] mask of the clients whose models the previous round uploaded; `extra["trained"]`:
of those that ever did.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from ..engine import Engine
from ..engine.tree import Params, gather, param_names, per_client, scatter, stack
from .base import Algorithm, EvalContext, ModelLocal, Phase, ServerState
from .checks import check_choice, check_int, check_optional_int, check_positive


def weigh(engine: Engine, base: Params, own: Params, nbrs: Params, live: Tensor, batches) -> tuple[Params, Tensor]:
    """(The mixed models [m], the raw weights w_n [m, M]) of m clients from their `base` models (the
    theta_i of w_n), `own` models (kept when no w_n > 0) and neighbour models `nbrs` [m, M, ...] on
    their validation minibatches `batches` (list of (x [m, B, ...], y [m, B])); `live` [m, M] masks
    the neighbours that count (the others get w_n = 0)."""
    m, M = live.shape
    models = {k: torch.cat([base[k].unsqueeze(1), nbrs[k]], 1).flatten(0, 1) for k in base}  # [m (M + 1), ...]
    rep = lambda t: t.unsqueeze(1).expand(m, M + 1, *t.shape[1:]).flatten(0, 1)
    # the mean of the minibatches' mean losses, summed in float64: w_n's numerator is a difference of
    # close losses, which float32 sums would leave with a few digits (PFLlib sums Python floats). A
    # BatchNorm model's losses are its training-mode forward's (PFLlib's received models score in
    # train(): batch statistics); the scored copies' running statistics are dropped
    names = param_names(base)  # the distance of parameters only (PFLlib's, over model.parameters())
    score = engine.grad if len(names) == len(base) else engine.state_grad
    losses = sum(score(models, rep(x), rep(y))[1].detach().double() for x, y in batches).view(m, M + 1) / len(batches)
    dist = sum((nbrs[k] - base[k].unsqueeze(1)).flatten(2).square().sum(2) for k in names).sqrt()  # [m, M]
    gain = (losses[:, :1] - losses[:, 1:]).to(dist.dtype)
    w = torch.where(live, gain / (dist + 1e-5), torch.zeros_like(dist))
    pos = w.clamp(min=0)
    total = pos.sum(1, keepdim=True)
    coef = pos / torch.where(total > 0, total, torch.ones_like(total))
    mixed = {}
    for k in names:  # a BatchNorm model's running statistics stay the client's own (PFLlib mixes parameters)
        mix = (coef.view(m, M, *[1] * (own[k].dim() - 1)) * nbrs[k]).sum(1)
        mixed[k] = torch.where(per_client(total.view(-1) > 0, own[k]).bool(), mix, own[k])
    return {k: mixed.get(k, own[k]) for k in own}, w


class FedFomoClients(NamedTuple):
    params: Params  # every client's model
    old: Params  # every client's model after its last mixture (PFLlib's old_model)
    affinity: dict  # {"P": [C, C]}, every client's row of the affinities P


class FedFomoLocal(NamedTuple):
    params: Params  # the client's model
    old: Params  # its model after its last mixture
    nbrs: Params  # the M neighbours' models it weighs [m, M, ...]
    ids: Tensor  # their clients [m, M]
    live: Tensor  # [m, M] bool: the neighbours that count (uploaded in the previous round)
    w: Tensor  # the weights w_n the weighing found [m, M]
    opt: dict = {}  # the local trainer's optimizer state, by slot (`trainer.slot_of`)


class FedFomo(Algorithm):
    name = "fedfomo"
    Clients = FedFomoClients

    FOLLOW = ("paper", "pfllib")
    protocol = {"follow": dict(honest="paper", official="pfllib")}  # PFLlib: w_n measured from old_model
    # fedrun.bench.agreement: 2 neighbours on 1 validation minibatch (the defaults' 5 x 6 models per
    # client and round made its CNN cases 25 s each, the loop engine scoring each model alone)
    agreement_options = dict(lr=0.1, M=2, val_batches=1)

    def __init__(self, lr: float, M: int, val_batches: int, follow: str | None, new_client_steps: int | None,
                 finetune_steps: int, finetune_epochs: int | None, finetune_lr: float | None):
        check_positive("algo.lr", lr)
        check_int("algo.M", M, 1)
        check_int("algo.val_batches", val_batches, 1)
        check_choice("algo.follow", follow or "paper", self.FOLLOW)
        check_optional_int("algo.new_client_steps", new_client_steps)
        self.lr, self.M, self.val_batches = lr, M, val_batches
        self.follow, self.new_client_steps = follow or "paper", new_client_steps
        self.set_finetuning(finetune_steps, finetune_epochs, finetune_lr)

    @property
    def tau_steps(self) -> int:
        """The run's tau (`bind`: simulate binds the run before its first round)."""
        return self.run.tau

    # its training is local SGD (PFLlib's clientFomo optimizer) on the client's model after its mixture
    optim_ok = True
    batchnorm_ok = True

    def phases(self) -> tuple[Phase, ...]:
        """The weighing (one step of val_batches minibatches), then the training: `tau` steps, or with
        algo.local_epochs E passes over the client's rows (PFLlib's -ls)."""
        train = Phase(self.train_step, epochs=self.local_epochs) if self.local_epochs is not None \
            else Phase(self.train_step, steps=self.tau_steps)
        return Phase(self.weigh_step, steps=1, batches=self.val_batches), train

    def init(self, params: Params, num_clients: int) -> ServerState:
        first = next(iter(params.values()))
        none = torch.zeros(num_clients, dtype=torch.bool, device=first.device)
        return ServerState(params=params, extra={"sent": none, "trained": none.clone()},
                           clients=FedFomoClients(params=stack(params, num_clients), old=stack(params, num_clients),
                                                  affinity={"P": torch.eye(num_clients, dtype=first.dtype,
                                                                           device=first.device)}))

    def client_init(self, state: ServerState, clients: Tensor, rnd: int) -> FedFomoLocal:
        P = state.clients.affinity["P"]
        M = min(self.M, len(P))
        ids = torch.topk(P[clients], M, dim=1).indices  # [m, M]
        count = torch.clamp(state.extra["sent"].sum(), max=self.M)  # PFLlib: min(M, previous uploads)
        live = (torch.arange(M, device=ids.device) < count).expand(len(clients), M)
        return FedFomoLocal(params=gather(state.clients.params, clients), old=gather(state.clients.old, clients),
                            nbrs=gather(state.clients.params, ids), ids=ids, live=live,
                            w=torch.zeros(ids.shape, dtype=P.dtype, device=P.device))

    def weigh_step(self, engine: Engine, local: FedFomoLocal, batches, rnd: int) -> FedFomoLocal:
        base = local.old if self.follow == "pfllib" else local.params
        mixed, w = weigh(engine, base, local.params, local.nbrs, local.live, batches)
        return local._replace(params=mixed, old=mixed, w=w)

    def train_step(self, engine: Engine, local: FedFomoLocal, batches, rnd: int) -> FedFomoLocal:
        return self.sgd_step(engine, local, batches, self.lr, rnd)  # one plain SGD step (FedAvg's)

    client_step = train_step

    def server_update(self, state: ServerState, local: FedFomoLocal, clients: Tensor, selected: Tensor,
                      weights: Tensor | None) -> ServerState:
        up = clients[selected]
        P = state.clients.affinity["P"].index_put((up.unsqueeze(1), local.ids[selected]), local.w[selected],
                                                  accumulate=True)
        sent = torch.zeros_like(state.extra["sent"]).index_fill(0, up, True)
        kept = FedFomoClients(params=scatter(state.clients.params, clients, local.params),
                              old=scatter(state.clients.old, clients, local.old), affinity={"P": P})
        return ServerState(params=state.params, extra={"sent": sent, "trained": state.extra["trained"] | sent},
                           clients=kept)

    def personalize(self, engine: Engine, state: ServerState, ctx: EvalContext):
        return state.clients.params, None

    def onboard(self, engine: Engine, state: ServerState, ctx: EvalContext, new: Tensor) -> ServerState:
        """A held-out client has no affinities of its own: from the initial model (as every client
        starts), it weighs the M models the training clients valued most (the largest column sums of
        P off its diagonal, among clients that ever uploaded) on val_batches minibatches of its
        training rows, mixes them as a training client does, then takes new_client_steps (null: tau)
        steps of local SGD; it is served the result."""
        P, trained = state.clients.affinity["P"], state.extra["trained"]
        M = min(self.M, len(P))
        popular = torch.where(trained, P.sum(0) - P.diagonal(), torch.full_like(P[0], -float("inf")))
        ids = torch.topk(popular, M).indices.expand(len(new), M)
        live = (torch.arange(M, device=ids.device) < trained.sum()).expand(len(new), M)
        start = self.own_models(state, new)  # (bn=local: its own statistics, the initial)
        steps = self.new_client_steps or ctx.tau
        x, y = ctx.train_batch(ctx.batch_size, steps=(self.val_batches + steps,), clients=new)
        val = [(x[:, s], y[:, s]) for s in range(self.val_batches)]
        w, _ = weigh(engine, start, start, gather(state.clients.params, ids), live, val)
        for s in range(self.val_batches, self.val_batches + steps):  # (the trainer's plain Local: a model)
            w = self.train_step(engine, ModelLocal(params=w), [(x[:, s], y[:, s])], 0).params
        params = scatter(state.clients.params, new, w)
        return ServerState(params=state.params, extra=state.extra, clients=state.clients._replace(params=params))
