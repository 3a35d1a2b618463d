"""Adaptations T_i of paper 004 (Sec. 2, "Transformation function"), shared by the algorithms.

An adaptation turns the meta model w into client i's model using the client's own data. It gives

  meta_loss(engine)  a per-client function L(w; support D, query D') -> scalar: the loss on the
                     query batch of the model adapted on the support batch (Alg. 2, Update:
                     w_bar = T~_i(w, D^k), loss f~_i(w_bar, D^k')); the engines differentiate it
                     per client (`Engine.value_and_grad`);
  personalize(...)   the models served at test time, from ALL of a client's TRAINING rows.

  none    L = loss(w; D'), one batch per step; nothing personalized is served.
  maml    w_bar = k SGD steps of `inner_lr` on D from w (Finn et al. 2017; paper 004 eq. for T_i
          with k steps, as its experiments' "5 adaptation steps"); `first_order` drops the
          second-order terms (the inner gradients are constants), learn2learn style. As in the
          authors' code (their inner optimizer is SGD with the run's weight decay), the inner
          steps during training include the algorithm's `weight_decay`. Test time: `test_steps`
          full-batch GD steps on all of the client's training rows, without weight decay, each
          gradient clipped to the algorithm's `clip` (their test-time fine-tuning clips too).
  proto   r_w(x) = the network up to its last hidden layer; prototypes c_k = mean r_w(x) of the
          support rows of class k; logits = -||r_w(x) - c_k||^2 (Snell et al. 2017; paper 004 Sec. 2);
          L = cross-entropy of the query rows on those logits. Classes absent from the support batch
          are masked (-inf logits) and query rows of such classes are left out of the mean. Test
          time: prototypes from all of the client's training rows. `meta_loss(engine, logits=True)`
          embeds with the network's outputs instead of its last hidden layer (only to reproduce
          the authors' P-Avg (Proto) code; see PAvg).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from ..data.federated import ClientSplit
from ..engine import Engine
from ..engine.batchnorm import is_buffer
from ..engine.proto import class_means, proto_logits
from ..engine.tree import Params, axpy, clip_per_client, sgd_each, stack
from .checks import check_choice, check_int, check_positive

MetaLoss = Callable[..., Tensor]  # (p, *batch tensors) -> scalar, per client


@dataclass
class Prototypes:
    """Proto-adapted models served at test time: every client classifies by the nearest of its own
    class prototypes in the feature space of the shared `params` (paper 004, Sec. 2)."""

    params: Params  # unstacked, shared by all clients (or with `shared` False, each client's, stacked)
    centers: Tensor  # [C, K, d] class prototypes per client
    present: Tensor  # [C, K] bool: the client has training rows of the class (else masked out)
    shared: bool = True

    def evaluate(self, engine: Engine, split: ClientSplit) -> tuple[Tensor, Tensor]:
        """Per-client summed loss and number correct over `split` of the nearest-prototype logits."""
        return engine.evaluate(self.params, split, self.shared, self.centers, self.present)


class NoAdaptation:
    name = "none"
    batches = 1  # minibatches a local step draws per client

    def unused(self, engine: Engine, params: Params, x: Tensor, logits: bool = False) -> frozenset:
        """Names of the parameters the meta-loss does not depend on (none: it is the model's loss)."""
        return frozenset()

    def meta_loss(self, engine: Engine) -> MetaLoss:
        return engine.loss

    def personalize(self, engine: Engine, params: Params, train: ClientSplit, batches=None):
        return None, None

    def score(self, engine: Engine, served, split: ClientSplit) -> tuple[Tensor, Tensor]:
        """Per-client summed loss and number correct of the served models (stacked params) over `split`."""
        return engine.evaluate({k: v.detach() for k, v in served.items()}, split, False)


class MAML(NoAdaptation):
    name = "maml"
    batches = 2

    def __init__(self, inner_lr: float, inner_steps: int, first_order: bool = False, test_steps: int | None = None,
                 weight_decay: float = 0.0, clip: float | None = None):
        self.inner_lr, self.inner_steps, self.first_order = inner_lr, inner_steps, first_order
        self.test_steps = inner_steps if test_steps is None else test_steps
        self.weight_decay, self.clip = weight_decay, clip

    def adapt(self, engine: Engine, p: Params, x: Tensor, y: Tensor) -> Params:
        """One client's model after `inner_steps` SGD steps on (x, y), inside a per-client function."""
        for _ in range(self.inner_steps):
            g = engine.inner_grad(engine.loss, p, x, y, create_graph=not self.first_order)
            if self.weight_decay:
                g = axpy(self.weight_decay, p, g)  # g + weight_decay p
            p = sgd_each(p, g, self.inner_lr)  # (inside vmap)
        return p

    def meta_loss(self, engine: Engine) -> MetaLoss:
        def loss(p: Params, xs: Tensor, ys: Tensor, xq: Tensor, yq: Tensor) -> Tensor:
            return engine.loss(self.adapt(engine, p, xs, ys), xq, yq)
        return loss

    def personalize(self, engine: Engine, params: Params, train: ClientSplit, batches=None):
        """`test_steps` full-batch GD steps of `inner_lr` from the shared `params` on each client's
        training rows (or, when `batches` [C, steps, B] are given, one minibatch per step). Returns
        the adapted models and the shared model's per-client training loss. Each step's
        gradient is clipped per client to `clip` (None/0: not clipped)."""
        p, loss = params, None
        for s in range(self.test_steps):
            if batches is None:
                g, l = engine.full_grad(p, train, shared=s == 0)
            else:
                pp = stack(p, batches[0].shape[0]) if s == 0 else p
                g, l = engine.grad(pp, batches[0][:, s], batches[1][:, s])
            # broadcasts the shared params to [C, ...] at step 0
            p = sgd_each(p, clip_per_client(g, self.clip), self.inner_lr)
            loss = l if loss is None else loss
        return p, (loss if batches is None else None)


class Proto(NoAdaptation):
    name = "proto"
    batches = 2

    def __init__(self):
        self._unused: dict = {}

    def meta_loss(self, engine: Engine, logits: bool = False) -> MetaLoss:
        k = engine.num_classes
        embed = engine.logits if logits else engine.features

        def loss(p: Params, xs: Tensor, ys: Tensor, xq: Tensor, yq: Tensor) -> Tensor:
            centers, present = class_means(embed(p, xs), ys, k)
            logits = proto_logits(embed(p, xq), centers, present)
            return proto_cross_entropy(logits, yq, present)
        return loss

    def unused(self, engine: Engine, params: Params, x: Tensor, logits: bool = False) -> frozenset:
        """Names of the parameters the meta-loss does not depend on (with features: the output
        layer), found once per model by differentiating one row's embedding (stacked params and
        inputs [m, ...] are given; the first client's first row is used)."""
        key = (id(engine.model), logits)
        if key not in self._unused:
            p = {k: v[0].detach().requires_grad_(True) for k, v in params.items() if not is_buffer(k)}
            b = {k: v[0] for k, v in params.items() if is_buffer(k)}  # (BatchNorm: eval mode, running statistics)
            with torch.enable_grad():
                out = (engine.logits if logits else engine.features)({**p, **b}, x[0][:1])
                grads = torch.autograd.grad(out.sum(), list(p.values()), allow_unused=True)
            self._unused[key] = frozenset(k for k, g in zip(p, grads) if g is None)
        return self._unused[key]

    def personalize(self, engine: Engine, params: Params, train: ClientSplit, batches=None, shared: bool = True):
        """Every client's prototypes in the feature space of the shared `params` (not `shared`: of each
        client's own model, stacked: bn=local's own statistics) and, when shared, its per-client training loss
        (None otherwise: the global model's is not the one computed)."""
        with torch.no_grad():
            centers, present, train_loss = engine.prototypes(params, train, shared=shared)
        return Prototypes(params, centers, present, shared), (train_loss if shared else None)

    def score(self, engine: Engine, served: Prototypes, split: ClientSplit) -> tuple[Tensor, Tensor]:
        return served.evaluate(engine, split)


def proto_cross_entropy(logits: Tensor, y: Tensor, present: Tensor) -> Tensor:
    """Mean cross-entropy over the rows whose class has a prototype (others would be +inf)."""
    ok = present[y]
    nll = -torch.where(ok, F.log_softmax(logits, -1).gather(-1, y.unsqueeze(-1)).squeeze(-1),
                       torch.zeros_like(logits[:, 0]))
    return nll.sum() / ok.sum().clamp(min=1).to(nll.dtype)


ADAPTATIONS = ("none", "maml", "proto")


def make_adaptation(adaptation: str, inner_lr: float, inner_steps: int, first_order: bool,
                    test_steps: int | None, weight_decay: float = 0.0, clip: float | None = None) -> NoAdaptation:
    """The adaptation named by the algorithm's options, each checked with a one-line ConfigError."""
    check_choice("algo.adaptation", adaptation, ADAPTATIONS)
    check_positive("algo.inner_lr", inner_lr)
    check_int("algo.inner_steps", inner_steps, 1)
    check_choice("algo.first_order", first_order, [True, False])
    if test_steps is not None:
        check_int("algo.test_steps", test_steps, 1)
    if adaptation == "maml":
        return MAML(inner_lr, inner_steps, bool(first_order), test_steps, weight_decay, clip)
    return Proto() if adaptation == "proto" else NoAdaptation()


__all__ = ["MAML", "NoAdaptation", "Proto", "Prototypes", "make_adaptation", "proto_cross_entropy"]
