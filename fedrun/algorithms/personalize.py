"""Test-time personalization shared by the algorithms: fine-tuning the served (or the shared) model
on each client's TRAINING rows, Per-FedAvg's one-step update, and the minibatches held-out clients
fit on (`Algorithm.onboard`)."""
from __future__ import annotations

import torch
from torch import Tensor

from ..engine import Engine
from ..engine.batchnorm import split_buffers
from ..engine.tree import Params, expand, sgd, stack
from ..engine.work import steps_by_work

# (annotations only: EvalContext and ServerState are base.py's, which imports this module)


class OneStepPersonalization:
    """Serves each client the server model after `finetune_steps` (default one) gradient steps of lr
    `self.alpha` (or `finetune_lr`, every algorithm's name for it, when given) on the client's own
    training rows (Per-FedAvg's test-time update; "FedAvg + update" for FedAvg; FedAvg + fine-tuning
    with more steps)."""

    alpha: float
    finetune_steps: int = 1
    finetune_epochs: int | None = None
    finetune_lr: float | None = None

    @property
    def test_lr(self) -> float:
        return self.alpha if self.finetune_lr is None else self.finetune_lr

    def finetune_served(self, engine: Engine, state: ServerState, ctx: EvalContext, served, loss):
        return served, loss  # `personalize` is the fine-tuning

    def personalize(self, engine: Engine, state: ServerState, ctx: EvalContext) -> tuple[Params, Tensor]:
        start, stacked = own_start(self, state, self.eval_params(state), ctx.data.num_clients)
        if self.finetune_epochs:
            return finetune_epochs(engine, start, ctx, self.test_lr, self.finetune_epochs, stacked=stacked)
        return finetune(engine, start, ctx, self.test_lr, self.finetune_steps, stacked=stacked)


def own_start(algo, state: ServerState, params: Params, num_clients: int,
              views: bool = False) -> tuple[Params, bool]:
    """(start, stacked) of test-time fine-tuning from the shared model `params`: under bn=local (once a
    round kept them) every client's model, the shared parameters with its own statistics, stacked over
    the `num_clients` clients (PFLlib's clients fine-tune their own models; `views`: the shared
    parameters as views, no copy per client, for a use that only reads them); else `params`, shared."""
    own = algo.own_statistics(state)
    if own is None:
        return params, False
    return {**(expand if views else stack)(params, num_clients), **own}, True


def finetune(engine: Engine, params: Params, ctx: EvalContext, lr: float, steps: int,
             stacked: bool = False) -> tuple[Params, Tensor | None]:
    """Every client's model after `steps` SGD steps of `lr` from the shared `params` (`stacked`:
    from each client's own, stacked over all clients) on its own TRAINING rows: full-batch steps,
    or (with `personalize_batch`) one fresh minibatch per step. Also returns the starting models'
    per-client loss on the first step's rows. One step from shared params is `one_step_adapt` (the
    same draws as before this option existed)."""
    if split_buffers(params)[1]:
        return _finetune_batchnorm(engine, params, ctx, lr, steps, stacked)
    if steps == 1 and not stacked:
        batch = ctx.train_batch() if ctx.personalize_batch else None
        return one_step_adapt(engine, params, ctx.data.train, lr, batch)
    x = y = None
    if ctx.personalize_batch:
        x, y = ctx.train_batch(steps=(steps,))
    p, loss = params, None
    for s in range(steps):
        first = s == 0 and not stacked
        if x is None:
            g, l = engine.full_grad(p, ctx.data.train, shared=first)
        else:
            g, l = engine.grad(stack(p, len(x)) if first else p, x[:, s], y[:, s])
        p = sgd(p, g, lr)  # step 0 broadcasts the shared params to [C, ...]
        loss = l if loss is None else loss
    return p, loss


def _finetune_batchnorm(engine: Engine, params: Params, ctx: EvalContext, lr: float, steps: int,
                        stacked: bool) -> tuple[Params, Tensor]:
    """`finetune` of a model with BatchNorm: minibatch steps in training mode (each client's batch
    statistics, its running ones updated), as a torch model fine-tuned in `train()` steps; the
    minibatches are `personalize_batch` rows, else the run's batch_size (a full-batch step would
    take batch statistics over a client's padded rows)."""
    x, y = ctx.train_batch(ctx.personalize_batch or ctx.batch_size, steps=(steps,))
    p = params if stacked else stack(params, len(x))
    loss = None
    for s in range(steps):
        g, l, buffers = engine.state_grad(p, x[:, s], y[:, s])
        p = {**p, **sgd({k: p[k] for k in g}, g, lr), **buffers}
        loss = l if loss is None else loss
    return p, loss


def finetune_epochs(engine: Engine, params: Params, ctx: EvalContext, lr: float, epochs: int,
                    stacked: bool = False) -> tuple[Params, None]:
    """Every client's model after `epochs` passes of minibatch SGD of `lr` over its own TRAINING rows,
    from the shared `params` (`stacked`: from each client's own): each pass a fresh shuffle cut into
    floor(n_c / B) minibatches of B rows (B = personalize_batch, else the run's batch_size; the last
    partial batch dropped, as a DataLoader with drop_last), so clients take different numbers of
    steps. The cost is the work done (`steps_by_work`: the clients sorted by their steps, each step
    computing only those still in the pass), each client's numbers those of every client stepping
    for the largest count with the finished ones left as they were. Clients with fewer than B rows
    are not fine-tuned."""
    split = ctx.data.train
    B = ctx.personalize_batch or ctx.batch_size
    steps = split.sizes.cpu() // B  # [C] steps per epoch (sizes are host-known: no device sync)
    S = max(int(steps.max()), 1)
    everyone = torch.arange(split.num_clients)
    # (only the rows each client's steps read are shuffled: `shuffled_indices`' used)
    idx = split.shuffled_indices(everyone, epochs, S * B, ctx.gen, steps * B)
    idx = idx.view(split.num_clients, epochs * S, B)

    def step(p: Params, rows: Tensor) -> Params:
        x, y = split.rows(rows)
        g, _, buffers = engine.state_grad(p, x, y)  # (BatchNorm: training mode, its statistics updated)
        return {**p, **{k: p[k] - lr * g[k] for k in g}, **buffers}
    return steps_by_work(params if stacked else expand(params, split.num_clients), idx, steps, epochs, step), None


def one_step_adapt(engine: Engine, params: Params, train, lr: float, batch=None) -> tuple[Params, Tensor]:
    """Every client's model after one gradient step of `lr` from the shared `params` on its own
    TRAINING rows, all of them or the given minibatch (Per-FedAvg's one-step personalization).
    Also returns the shared model's per-client loss on those rows."""
    if batch is None:
        grads, loss = engine.full_grad(params, train, shared=True)
    else:
        grads, loss = engine.grad(stack(params, len(batch[0])), *batch)
    return sgd(params, grads, lr), loss


def onboarding_batches(ctx: EvalContext, new: Tensor, steps: int | None) -> list[list[tuple[Tensor, Tensor]]]:
    """The minibatches the held-out clients `new` fit on: `steps` (None: tau, one round's) draws of
    the run's batch_size TRAINING rows each, from the evaluation's random stream."""
    steps = steps or ctx.tau
    x, y = ctx.train_batch(ctx.batch_size, steps=(steps,), clients=new)
    return [[(x[:, s], y[:, s])] for s in range(steps)]
