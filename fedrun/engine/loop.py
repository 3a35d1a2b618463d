"""The reference engine: a Python loop over clients, plain autograd."""
from __future__ import annotations

from typing import Callable, Collection

import torch
import torch.nn.functional as F
from torch import Tensor

from ..data.federated import ClientSplit
from .base import Engine
from .batchnorm import _training
from .proto import proto_logits
from .tree import Params, tree_map


class LoopEngine(Engine):
    """Reference: a Python loop over clients, plain autograd, each client's rows sliced directly."""

    name = "loop"

    def _grad1(self, p: Params, x: Tensor, y: Tensor, create_graph: bool = False, wrt: Collection[str] | None = None):
        p, names = self._differentiated(p, wrt)
        loss = self.loss(p, x, y)
        g = torch.autograd.grad(loss, [p[k] for k in names], create_graph=create_graph)
        return p, dict(zip(names, g)), loss

    @staticmethod
    def _client(params: Params, i: int) -> Params:
        return {k: v[i] for k, v in params.items()}

    @staticmethod
    def _stack(rows: list[Params]) -> Params:
        return {k: torch.stack([r[k] for r in rows]) for k in rows[0]}

    def grad(self, params: Params, x: Tensor, y: Tensor, wrt: Collection[str] | None = None) -> tuple[Params, Tensor]:
        grads, losses = [], []
        for i in range(len(x)):
            _, g, loss = self._grad1(self._client(params, i), x[i], y[i], wrt=wrt)
            grads.append(g)
            losses.append(loss.detach())
        return self._stack(grads), torch.stack(losses)

    def train_grad(self, params: Params, buffers: Params, x: Tensor, y: Tensor,
                   wrt: Collection[str] | None = None) -> tuple[Params, Tensor, Params]:
        grads, losses, bufs = [], [], []
        with _training(self.model):
            for i in range(len(x)):
                p, names = self._differentiated(self._client(params, i), wrt)  # (`wrt`: the others constants)
                b = {k: v[i].clone() for k, v in buffers.items()}  # updated in place by the forward
                loss = self._train_loss(p, b, x[i], y[i])
                grads.append(dict(zip(names, torch.autograd.grad(loss, [p[k] for k in names]))))
                losses.append(loss.detach())
                bufs.append(b)
        return self._stack(grads), torch.stack(losses), self._stack(bufs)

    def train_value_and_grad(self, fn: Callable[..., Tensor], params: Params, buffers: Params,
                             *args) -> tuple[Params, Tensor, Params]:
        grads, values, bufs = [], [], []
        with _training(self.model):
            for i in range(len(next(iter(params.values())))):
                p = {k: v.detach().requires_grad_(True) for k, v in self._client(params, i).items()}
                b = {k: v[i].clone() for k, v in buffers.items()}  # updated in place by fn's forwards
                value = fn({**p, **b}, *[tree_map(lambda t: t[i], a) for a in args])
                grads.append(dict(zip(p, torch.autograd.grad(value, list(p.values()), allow_unused=True,
                                                             materialize_grads=True))))
                values.append(value.detach())
                bufs.append(b)
        return self._stack(grads), torch.stack(values), self._stack(bufs)

    def hvp(self, params: Params, v: Params, x: Tensor, y: Tensor) -> Params:
        out = []
        for i in range(len(x)):
            p, g, _ = self._grad1(self._client(params, i), x[i], y[i], create_graph=True)
            dot = sum((g[k] * v[k][i]).sum() for k in g)
            out.append(dict(zip(p, torch.autograd.grad(dot, list(p.values())))))
        return self._stack(out)

    def value_and_grad(self, fn: Callable[..., Tensor], params: Params, *args: Tensor) -> tuple[Params, Tensor]:
        grads, values = [], []
        # (the clients: params' leading dim; args may hold dicts of stacked tensors, as GPFL's onboarding
        # passes its frozen body and CoV: each client's entries, as vmap gives them)
        for i in range(len(next(iter(params.values())))):
            p = {k: v.detach().requires_grad_(True) for k, v in self._client(params, i).items()}
            value = fn(p, *[tree_map(lambda t: t[i], a) for a in args])
            # parameters fn does not use (Proto never uses the output layer) get zero gradients
            grads.append(dict(zip(p, torch.autograd.grad(value, list(p.values()), allow_unused=True,
                                                         materialize_grads=True))))
            values.append(value.detach())
        return self._stack(grads), torch.stack(values)

    @staticmethod
    def inner_grad(fn: Callable[..., Tensor], p: Params, *args: Tensor, create_graph: bool = False) -> Params:
        """Plain autograd; with `create_graph` the outer gradient goes through it (second order)."""
        return dict(zip(p, torch.autograd.grad(fn(p, *args), list(p.values()), create_graph=create_graph)))

    def full_grad(self, params: Params, split: ClientSplit, shared: bool) -> tuple[Params, Tensor]:
        grads, losses = [], []
        for c in range(split.num_clients):
            rows = split.client_rows(c)
            p = params if shared else self._client(params, c)
            _, g, loss = self._grad1(p, split.x[rows], split.y[rows])
            grads.append(g)
            losses.append(loss.detach())
        return self._stack(grads), torch.stack(losses)

    def evaluate(self, params: Params, split: ClientSplit, shared: bool, centers: Tensor | None = None,
                 present: Tensor | None = None) -> tuple[Tensor, Tensor]:
        losses, correct = [], []
        with torch.no_grad():
            for c in range(split.num_clients):
                rows = split.client_rows(c)
                p = params if shared else self._client(params, c)
                if centers is None:
                    logits = self.logits(p, split.x[rows])
                else:
                    logits = proto_logits(self.features(p, split.x[rows]), centers[c], present[c])
                losses.append(self.criterion(logits, split.y[rows], reduction="sum"))
                correct.append((logits.argmax(-1) == split.y[rows]).sum().to(logits.dtype))
        return torch.stack(losses), torch.stack(correct)

    def class_sums(self, params: Params, split: ClientSplit, shared: bool) -> tuple[Tensor, Tensor, Tensor | None]:
        sums, counts, losses = [], [], []
        with torch.no_grad():
            for c in range(split.num_clients):
                rows = split.client_rows(c)
                p = params if shared else self._client(params, c)
                if self._both:
                    feats, logits = self.features_logits(p, split.x[rows])
                    losses.append(self.criterion(logits, split.y[rows], reduction="sum"))
                else:
                    feats = self.features(p, split.x[rows])
                onehot = F.one_hot(split.y[rows], self.num_classes).to(feats.dtype)
                sums.append(onehot.T @ feats)
                counts.append(onehot.sum(0))
        return torch.stack(sums), torch.stack(counts), torch.stack(losses) if losses else None
