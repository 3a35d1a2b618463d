"""Global and personalized metrics for ALL clients at once (docs/outputs.md names every column).

For each served model ("global": the algorithm's shared model, `Algorithm.eval_params`, normally
the server model; "pers": the per-client personalized models):
  <m>_acc             pooled accuracy over all clients' test rows (total correct / total rows)
  <m>_acc_mean/std/min/max   over clients, each client's accuracy counting once (unweighted)
  <m>_acc_p10/p25/p75        quantiles of the clients' accuracies (linear interpolation, unweighted):
                      the lowest decile's bound and the inter-quartile range
  <m>_loss            pooled mean test loss; <m>_loss_mean: unweighted mean of client losses
  train_loss          the global model's mean loss over all clients' training rows (pooled), or over
                      the personalization minibatches when `personalize_batch` is set
With held-out clients (`FederatedData.num_holdout`, never trained) these are over the training
clients, and `new_<m>_*` are the same summaries over the held-out clients (their lowest client and
quantiles among themselves): the global model, and the algorithm's personalization from their own
training rows (`Algorithm.onboard` first fits what the method keeps per client, docs/data.md).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import Tensor

from .algorithms.base import Algorithm, EvalContext, ServerState
from .data.federated import FederatedData
from .engine import Engine


@dataclass
class Evaluation:
    row: dict  # the metrics.csv row (without round bookkeeping)
    per_client: dict[str, Tensor]  # name -> [C] values for clients.csv


# the client quantiles of accuracy in metrics.csv: the lowest decile and the inter-quartile range
QUANTILES = (("p10", 0.10), ("p25", 0.25), ("p75", 0.75))


def _summaries(prefix: str, loss_sum: Tensor, correct: Tensor, n: Tensor) -> dict:
    """The metrics.csv columns of one served model over a set of clients, computed on the device and
    read back in one copy (no read per client, nor per column)."""
    acc = correct / n
    loss = loss_sum / n
    q = torch.quantile(acc, torch.tensor([v for _, v in QUANTILES], dtype=acc.dtype, device=acc.device))
    values = torch.stack([correct.sum() / n.sum(), acc.mean(), acc.std(unbiased=False), acc.min(), acc.max(), *q,
                          loss_sum.sum() / n.sum(), loss.mean()]).tolist()
    names = ["acc", "acc_mean", "acc_std", "acc_min", "acc_max", *(f"acc_{name}" for name, _ in QUANTILES),
             "loss", "loss_mean"]
    return {f"{prefix}_{k}": v for k, v in zip(names, values)}


def served(algo: Algorithm, engine: Engine, state: ServerState, ctx: EvalContext):
    """`algo.personalize` of `state`, after `algo.onboard` has fitted the held-out clients' own
    state (the run's state itself is not changed), then `algo.finetune_served`."""
    data = ctx.data
    if data.num_train_clients < data.num_clients:
        new = torch.arange(data.num_train_clients, data.num_clients, device=data.train.x.device)
        onboarded = algo.onboard(engine, state, ctx, new)  # (the trainer's state kept, with what onboard set of it)
        state = replace(onboarded, trainer={**state.trainer, **onboarded.trainer})
    return algo.finetune_served(engine, state, ctx, *algo.personalize(engine, state, ctx))


def evaluate(algo: Algorithm, engine: Engine, state: ServerState, data: FederatedData, ctx: EvalContext) -> Evaluation:
    """Evaluates the global and personalized models on every client's test rows.

    `ctx`: what personalization may use (see `Algorithm.personalize`). `train_loss` is the global
    model's loss on all training rows, or on the adaptation minibatches when the personalization
    computed it there anyway (`personalize_batch`).
    """
    n_test = data.test.sizes.to(torch.float32)
    n_train = data.train.sizes.to(torch.float32)
    shared = algo.eval_params(state)
    with torch.no_grad():
        g_loss, g_correct = engine.evaluate(shared, data.test, True)
    per_client = {"global_acc": g_correct / n_test, "global_loss": g_loss / n_test}
    t = data.num_train_clients  # clients t.. are held out: summarized apart, as new_*
    seen, new = slice(0, t), slice(t, data.num_clients)

    def summaries(prefix: str, loss: Tensor, correct: Tensor) -> dict:
        out = _summaries(prefix, loss[seen], correct[seen], n_test[seen])
        if t < data.num_clients:
            out.update(_summaries(f"new_{prefix}", loss[new], correct[new], n_test[new]))
        return out

    row = summaries("global", g_loss, g_correct)
    pers, train_loss = served(algo, engine, state, ctx)
    if train_loss is None:
        with torch.no_grad():  # the shared model's per-client summed losses (the engine may skip the accuracy)
            train_loss = engine.loss_sums(shared, data.train, True) / n_train
    if pers is not None:
        with torch.no_grad():  # each algorithm scores what it serves (per-client params, Proto's prototypes)
            p_loss, p_correct = algo.score(engine, pers, data.test)
        row.update(summaries("pers", p_loss, p_correct))
        per_client.update(pers_acc=p_correct / n_test, pers_loss=p_loss / n_test)
    train_loss = train_loss.detach()
    row = {"train_loss": float((train_loss * n_train)[seen].sum() / n_train[seen].sum()), **row}
    per_client["train_loss"] = train_loss
    return Evaluation(row=row, per_client={k: v.detach().cpu() for k, v in per_client.items()})
