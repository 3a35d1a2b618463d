"""Stacked client parameters and the two engines that compute on them.

Parameters are dicts name -> tensor. "Stacked" parameters carry a leading client dimension. An
engine offers the few primitives algorithms need, each over ALL clients at once:

  grad(params, x, y)          per-client minibatch gradients (and losses) at per-client params
  hvp(params, v, x, y)        per-client exact Hessian-vector products
  full_grad(params, split)    per-client full-batch gradient of the mean loss over the client's rows
  evaluate(params, split)     per-client summed loss and number correct over the client's rows
                              (with `centers`: of Proto distance logits to per-client prototypes)
  value_and_grad(fn, params, *args)   per-client gradients of an arbitrary per-client function
  inner_grad(fn, p, *args)    a gradient INSIDE such a function (MAML's inner steps), differentiable
                              through when `create_graph`
  class_sums(params, split, K)  per-client, per-class sums of features and counts over all rows
                              (and the summed loss from the same pass)

`VmapEngine` is the fast path: one torch.func.vmap'd computation over clients (and over row chunks
for full passes). `LoopEngine` is the reference: one client at a time with plain autograd. Tests
check that both return the same numbers.
"""
from __future__ import annotations

import warnings
from typing import Callable, Collection

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call

from ..branches import check_paths, choose
from ..data.federated import ClientSplit
from .batchnorm import _has_batchnorm, is_buffer, split_buffers
from .proto import proto_logits
from .tree import Params

# torch.func's jvp path calls a deprecated torch.jit helper internally; the warning is not ours.
warnings.filterwarnings("ignore", message=r".*torch\.jit\.script.*deprecated", category=FutureWarning)

class Engine:
    """Common part: the model and its loss. Subclasses implement the four primitives."""

    name = "base"

    def __init__(self, model: nn.Module, max_chunks: int = 1024, criterion: Callable = F.cross_entropy,
                 paths: dict[str, str] | None = None):
        self.model = model
        self.max_chunks = max_chunks  # chunks of rows per vmapped call in full passes (memory bound)
        self.criterion = criterion  # criterion(outputs, targets, reduction=...) like F.cross_entropy
        # device branches forced (fedrun.branches.BRANCHES; unset: each device's default)
        self.paths = check_paths(paths)
        for name in ("layout", "rnn"):  # branches the model's own passes choose
            if name in self.paths and hasattr(model, name):
                setattr(model, name, self.paths[name])
        self.batchnorm = _has_batchnorm(model)
        if self.batchnorm:  # every pass but `train_grad` scores with the running statistics
            model.eval()

    def path(self, name: str, device: torch.device) -> str:
        """The value of device branch `name` (fedrun.branches) for tensors on `device`."""
        return choose(name, device, self.paths)

    @property
    def num_classes(self) -> int:
        """The model's number of outputs (Proto's prototypes are indexed by the same labels)."""
        return self.model.num_classes

    def logits(self, p: Params, x: Tensor) -> Tensor:
        return functional_call(self.model, p, (x,))

    def features(self, p: Params, x: Tensor) -> Tensor:
        """The network up to its last hidden layer (Proto's r_w(x))."""
        return functional_call(self.model, p, (x,), {"features": True})

    def loss(self, p: Params, x: Tensor, y: Tensor) -> Tensor:
        if self.batchnorm and not any(is_buffer(k) for k in p):
            raise RuntimeError("a BatchNorm model trains through Engine.state_grad (its batch statistics "
                               "and running buffers); this algorithm's gradients do not handle them")
        return self.criterion(self.logits(p, x), y)

    def state_grad(self, state: Params, x: Tensor, y: Tensor,
                   wrt: Collection[str] | None = None) -> tuple[Params, Tensor, Params]:
        """`grad` of a model state (parameters, and for a BatchNorm model its buffers): per-client
        gradients of the parameters (of the parameters `wrt` only, when given: `grad`) and losses, and
        the buffers after the step ({} without BatchNorm): the forward in training mode (each client's
        batch statistics, its running ones updated, the frozen parameters' layers' too), as a torch
        model's `train()` step computes."""
        params, buffers = split_buffers(state)
        if not buffers:
            return (*self.grad(params, x, y, wrt=wrt), {})
        return self.train_grad(params, buffers, x, y, wrt=wrt)

    def state_value_and_grad(self, fn: Callable[..., Tensor], state: Params,
                             *args) -> tuple[Params, Tensor, Params]:
        """`value_and_grad` of fn(state, *args) at a model state: gradients of the parameters only,
        and, for a BatchNorm model, its buffers after fn's forward passes in training mode (every
        forward of `state` inside fn updates them, as a torch model's forwards in `train()` do)."""
        params, buffers = split_buffers(state)
        if not buffers:
            return (*self.value_and_grad(fn, params, *args), {})
        return self.train_value_and_grad(fn, params, buffers, *args)

    def train_value_and_grad(self, fn: Callable[..., Tensor], params: Params, buffers: Params,
                             *args) -> tuple[Params, Tensor, Params]:
        raise NotImplementedError

    def _train_loss(self, p: Params, b: Params, x: Tensor, y: Tensor) -> Tensor:
        """A client's minibatch loss in training mode; updates its buffers `b` in place (BatchNorm's
        running statistics: momentum-weighted means of the batch's mean and unbiased variance)."""
        return self.criterion(functional_call(self.model, (p, b), (x,)), y)

    def grad(self, params: Params, x: Tensor, y: Tensor, wrt: Collection[str] | None = None) -> tuple[Params, Tensor]:
        """Per-client minibatch gradients (and losses) at per-client `params`; `wrt`: the names of the
        parameters to differentiate (None: all). With `wrt`, the returned gradients hold only those, and an
        autograd pass takes the other parameters as constants (detached): no backward through a frozen
        part upstream of them (FedRep's body in its head phase); the numbers of the `wrt` entries are those
        of the full gradient's."""
        raise NotImplementedError

    def train_grad(self, params: Params, buffers: Params, x: Tensor, y: Tensor,
                   wrt: Collection[str] | None = None) -> tuple[Params, Tensor, Params]:
        """`grad` for a model with BatchNorm: per-client gradients (of `wrt`, as `grad`) and losses in training
        mode (each client's batch statistics) and every client's buffers after the step (stacked, new tensors;
        every layer's statistics move, the frozen ones' too)."""
        raise NotImplementedError

    @staticmethod
    def _wanted(params: Params, wrt: Collection[str] | None) -> list[str]:
        """The names of the parameters `wrt` (None: all of `params`), in `params`' order. Raises ValueError
        when `wrt` names no parameter, or a name not in `params`."""
        if wrt is None:
            return list(params)
        wanted = set(wrt)
        missing = sorted(wanted.difference(params))
        if missing or not wanted:
            raise ValueError(f"wrt must name parameters of the model; not parameters: {missing or 'none named'}")
        return [k for k in params if k in wanted]

    def _differentiated(self, params: Params, wrt: Collection[str] | None) -> tuple[Params, list[str]]:
        """(`params` as autograd leaves: the parameters `wrt` (None: all) requiring gradients, the others
        detached constants; the names of those differentiated, in `params`' order)."""
        names = self._wanted(params, wrt)
        on = set(names)
        return {k: v.detach().requires_grad_(k in on) for k, v in params.items()}, names

    def _masked(self, p: Params, x: Tensor, y: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        logits = self.logits(p, x)
        loss = (self.criterion(logits, y, reduction="none") * mask).sum()
        correct = ((logits.argmax(-1) == y).to(mask.dtype) * mask).sum()
        return loss, correct

    def _masked_proto(self, p: Params, x: Tensor, y: Tensor, mask: Tensor, centers: Tensor,
                      present: Tensor) -> tuple[Tensor, Tensor]:
        logits = proto_logits(self.features(p, x), centers, present)
        loss = torch.where(mask > 0, F.cross_entropy(logits, y, reduction="none"), torch.zeros_like(mask)).sum()
        correct = ((logits.argmax(-1) == y).to(mask.dtype) * mask).sum()
        return loss, correct

    def loss_sums(self, params: Params, split: ClientSplit, shared: bool) -> Tensor:
        """Per-client summed losses over a split's rows: `evaluate` when only the losses are needed
        (the training-loss pass); an engine may skip counting correct rows."""
        return self.evaluate(params, split, shared)[0]

    @property
    def _both(self) -> bool:
        """Whether the model's forward gives features and logits from one pass (features="both")."""
        return bool(getattr(self.model, "features_and_logits", False))

    def features_logits(self, p: Params, x: Tensor) -> tuple[Tensor, Tensor]:
        return functional_call(self.model, p, (x,), {"features": "both"})

    def _class_sums(self, p: Params, x: Tensor, y: Tensor, mask: Tensor) -> tuple[Tensor, ...]:
        if self._both:
            feats, logits = self.features_logits(p, x)
        else:
            feats = self.features(p, x)
        onehot = (y.unsqueeze(-1) == torch.arange(self.num_classes, device=y.device)).to(feats.dtype)
        onehot = onehot * mask.unsqueeze(-1)
        out = (onehot.T @ feats, onehot.sum(0))
        return (*out, (self.criterion(logits, y, reduction="none") * mask).sum()) if self._both else out

    def prototypes(self, params: Params, split: ClientSplit, shared: bool) -> tuple[Tensor, Tensor, Tensor | None]:
        """Every client's Proto prototypes [C, K, d] from ALL of its rows in `split`, which classes
        [C, K] it has (one full pass, features summed per class), and each client's mean loss [C]
        over those rows from the same pass (None when the model cannot give features and logits
        at once, see fedrun.models)."""
        sums, counts, loss = self.class_sums(params, split, shared)
        if loss is not None:
            loss = loss / split.sizes.to(loss.dtype)
        return sums / counts.clamp(min=1).unsqueeze(-1), counts > 0, loss
