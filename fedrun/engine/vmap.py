"""The fast engine: every primitive as one torch.func.vmap'd computation over clients (and over
row chunks for full passes)."""
from __future__ import annotations

import weakref
from typing import Callable, Collection

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import grad, grad_and_value, jvp, vmap

from ..data.federated import ClientSplit
from .base import Engine
from .batchnorm import _training
from .loop import LoopEngine
from .tree import Params, tree_flatten, tree_unflatten


class VmapEngine(Engine):
    name = "vmap"

    def __init__(self, model: nn.Module, max_chunks: int = 1024, criterion: Callable = F.cross_entropy,
                 paths: dict[str, str] | None = None):
        super().__init__(model, max_chunks, criterion, paths)
        self._losses = vmap(self.loss)
        self._stacked = callable(getattr(model, "stacked_forward", None))
        # the model's hand-written backward pass, for the loss it was written for
        self._has_ce_grad = hasattr(model, "stacked_ce_grad") and criterion is F.cross_entropy
        self._hvp = vmap(lambda p, v, x, y: jvp(lambda q: grad(self.loss)(q, x, y), (p,), (v,))[1])
        masked_loss = lambda p, x, y, m: self._masked(p, x, y, m)[0]
        self._chunk_autograd = {
            shared: vmap(grad_and_value(masked_loss), in_dims=(None if shared else 0, 0, 0, 0))
            for shared in (True, False)
        }
        # the hand-written backward per row chunk (its weights: the chunk's row mask)
        self._chunk_hand = {shared: (lambda p, x, y, m, shared=shared: self.model.stacked_ce_grad(p, x, y, m, shared))
                            for shared in (True, False)}
        self._chunk_eval = {
            shared: vmap(self._masked, in_dims=(None if shared else 0, 0, 0, 0)) for shared in (True, False)
        }
        self._chunk_proto = {
            shared: vmap(self._masked_proto, in_dims=(None if shared else 0, 0, 0, 0, 0, 0)) for shared in (True, False)
        }
        self._chunk_class = {
            shared: vmap(self._class_sums, in_dims=(None if shared else 0, 0, 0, 0)) for shared in (True, False)
        }
        # id(split) -> (a weak reference to the split, its padded chunk view or None when too large)
        self._chunk_x: dict[int, tuple[weakref.ref, tuple[Tensor, Tensor] | None]] = {}
        # Full passes of convolutional models on the CPU run client by client (the loop engine's;
        # branch "conv"): one convolution over a whole group of row chunks makes activations of
        # hundreds of MB (64x28x28 floats per CIFAR image) that leave the caches, and with per-client
        # weights it is a grouped convolution; both measured 1.6-2.3x slower than per-client passes there.
        convolutional = any(isinstance(m, nn.modules.conv._ConvNd) for m in model.modules())
        self._loop = LoopEngine(model, max_chunks, criterion, paths) if convolutional else None
        if self._stacked and not convolutional:  # per-client models' full passes: the batched-matmul
            self._chunk_eval[False] = self._stacked_masked  # forward (a CNN's: the loop engine's on the
            # CPU, the vmapped `_masked` elsewhere, as before)

    def grad(self, params: Params, x: Tensor, y: Tensor, wrt: Collection[str] | None = None) -> tuple[Params, Tensor]:
        # A vmapped forward, then ONE reverse pass of the summed client losses: client i's loss
        # depends only on its own slice of the stacked parameters, so the gradient of the sum with
        # respect to the stack is every client's own gradient (~30% faster on CPU than vmap(grad)).
        # Fully connected models with cross-entropy skip autograd: their hand-written backward (`wrt`: it
        # stops at the lowest layer differentiated; the LSTM's computes every gradient and returns those).
        if self._hand(x):
            with torch.no_grad():
                return self.model.stacked_ce_grad(params, x, y, wrt=None if wrt is None else self._wanted(params, wrt))
        with torch.enable_grad():
            p, names = self._differentiated(params, wrt)  # (`wrt`: the others constants, no backward through them)
            losses = self._stacked_losses(p, x, y) if self._stacked else self._losses(p, x, y)
            grads = torch.autograd.grad(losses.sum(), [p[k] for k in names])
        return dict(zip(names, grads)), losses.detach()

    def train_grad(self, params: Params, buffers: Params, x: Tensor, y: Tensor,
                   wrt: Collection[str] | None = None) -> tuple[Params, Tensor, Params]:
        # The vmapped forward updates each client's slice of the stacked buffer copies in place
        # (torch.func batches BatchNorm's running-statistics update over clients); they are returned.
        if self._conv_on_cpu(x):
            return self._loop.train_grad(params, buffers, x, y, wrt=wrt)
        b = {k: v.clone() for k, v in buffers.items()}
        with torch.enable_grad(), _training(self.model):
            p, names = self._differentiated(params, wrt)
            losses = vmap(self._train_loss)(p, b, x, y)
            grads = torch.autograd.grad(losses.sum(), [p[k] for k in names])
        return dict(zip(names, grads)), losses.detach(), b

    def _hand(self, x: Tensor) -> bool:
        """Whether gradients go through the model's hand-written backward (branch "backward")."""
        return self._has_ce_grad and self.path("backward", x.device) == "hand"

    def _stacked_losses(self, p: Params, x: Tensor, y: Tensor) -> Tensor:
        """Per-client mean losses via the model's batched-matmul forward (same numbers as vmap)."""
        kw = {} if self._loop is None else {"per_client": self.path("conv", x.device) == "per_client"}
        logits = self.model.stacked_forward(p, x, **kw)  # [m, B, classes]
        per_row = self.criterion(logits.flatten(0, 1), y.flatten(0, 1), reduction="none")
        return per_row.view(y.shape[0], -1).mean(1)

    def _stacked_masked(self, p: Params, x: Tensor, y: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        """`_masked` of every chunk [m, B] with its own params [m, ...], as the model's batched-matmul
        forward computes the logits (as `_stacked_losses` does; the vmapped `_masked` is the fallback):
        each chunk's summed masked loss and correct count [m]. CPU, one thread, the personalized models
        of the default run on all 20,603 synthetic test rows: 20-22 -> 11-15 ms, on the 185,192 training
        rows 95-98 -> 50-64 ms (runs alternating)."""
        logits = self.model.stacked_forward(p, x).contiguous()  # [m, B, classes] (argmax over a strided
        # last dimension, as a narrow layer's transposed product gives, took ~10x longer)
        rows = self.criterion(logits.flatten(0, 1), y.flatten(), reduction="none").view_as(mask)
        return (rows * mask).sum(1), ((logits.argmax(-1) == y).to(mask.dtype) * mask).sum(1)

    def _conv_on_cpu(self, x: Tensor) -> bool:
        """A convolutional model whose passes go client by client (branch "conv", the CPU's default):
        its vmapped convolutions are grouped convolutions over all clients, slower on the CPU than
        the loop engine's per-client ones (see `__init__`)."""
        return self._loop is not None and self.path("conv", x.device) == "per_client"

    def hvp(self, params: Params, v: Params, x: Tensor, y: Tensor) -> Params:
        if self._conv_on_cpu(x):
            return self._loop.hvp(params, v, x, y)
        return self._hvp(params, v, x, y)

    def value_and_grad(self, fn: Callable[..., Tensor], params: Params, *args: Tensor) -> tuple[Params, Tensor]:
        """Per-client gradients of fn(p, *args) -> scalar at stacked `params` (args stacked too):
        vmap(fn), then ONE reverse pass of the sum, as in `grad`. A convolutional model on the CPU
        goes client by client (the loop engine's), as its full passes do: through the vmapped
        (grouped) convolutions, paper 004's meta-losses for 10 clients x 2 batches of 50 CIFAR-shaped
        images took 3.6 s (Proto) and 23.5 s (MAML, 5 second-order inner steps) of CPU, client by
        client 2.2 and 19.4 s (one thread)."""
        if args and torch.is_tensor(args[0]) and self._conv_on_cpu(args[0]):  # (args led by a dict, as GPFL's
            return self._loop.value_and_grad(fn, params, *args)  # onboarding passes its body: vmapped)
        with torch.enable_grad():
            p = {k: v.detach().requires_grad_(True) for k, v in params.items()}
            values = vmap(fn)(p, *args)
            grads = torch.autograd.grad(values.sum(), list(p.values()), allow_unused=True, materialize_grads=True)
        return dict(zip(p, grads)), values.detach()

    def train_value_and_grad(self, fn: Callable[..., Tensor], params: Params, buffers: Params,
                             *args) -> tuple[Params, Tensor, Params]:
        # as `train_grad`: the vmapped forwards update each client's slice of the buffer copies in place
        if args and torch.is_tensor(args[0]) and self._conv_on_cpu(args[0]):
            return self._loop.train_value_and_grad(fn, params, buffers, *args)
        b = {k: v.clone() for k, v in buffers.items()}
        with torch.enable_grad(), _training(self.model):
            p = {k: v.detach().requires_grad_(True) for k, v in params.items()}
            values = vmap(lambda p_, b_, *a: fn({**p_, **b_}, *a))(p, b, *args)
            grads = torch.autograd.grad(values.sum(), list(p.values()), allow_unused=True, materialize_grads=True)
        return dict(zip(p, grads)), values.detach(), b

    @staticmethod
    def inner_grad(fn: Callable[..., Tensor], p: Params, *args: Tensor, create_graph: bool = False) -> Params:
        """grad of fn(p, *args) inside a vmapped per-client function: torch.func.grad, which the
        outer reverse pass differentiates through (second order) unless detached (first order)."""
        g = grad(fn)(p, *args)
        return g if create_graph else {k: v.detach() for k, v in g.items()}

    # The padded chunk view of a split's rows is kept between calls when it is small; a large one
    # is gathered group by group, so memory stays at one group of chunks plus per-client results.
    CACHE_BYTES = 256 * 2**20

    def _chunk_rows(self, split: ClientSplit, sl: slice) -> tuple[Tensor, Tensor]:
        key = id(split)
        held = self._chunk_x.get(key)
        if held is None or held[0]() is not split:  # (a freed split's id can be reused by another split)
            nbytes = split.chunk_idx.numel() * split.x[0].numel() * split.x.element_size()
            held = (weakref.ref(split), split.rows(split.chunk_idx) if nbytes <= self.CACHE_BYTES else None)
            self._chunk_x[key] = held
        cached = held[1]
        if cached is not None:
            return cached[0][sl], cached[1][sl]
        return split.rows(split.chunk_idx[sl])

    # On the CPU a full pass goes through at most this many rows at a time: one pass over a whole
    # synthetic split (185k rows, activations of tens of MB that leave the caches) measured 1.4x
    # slower than groups of 16k rows; on a GPU large groups are better (fewer kernel launches).
    CPU_GROUP_ROWS = 16384

    def _group(self, split: ClientSplit) -> int:
        """Chunks per group of a full pass: `max_chunks`, on the CPU (branch "groups") also at most
        CPU_GROUP_ROWS rows."""
        if self.path("groups", split.x.device) == "chunks":
            return self.max_chunks
        return max(1, min(self.max_chunks, self.CPU_GROUP_ROWS // split.chunk_idx.shape[1]))

    def _sum_per_client(self, fns, params: Params, split: ClientSplit, shared: bool, *per_client: Tensor) -> list:
        """Runs fns[shared] over groups of chunks (`_group`) and sums each output per client.
        `per_client` tensors [C, ...] go with each chunk's owner."""
        acc, spec = None, None
        group = self._group(split)
        for s in range(0, len(split.chunk_idx), group):
            sl = slice(s, s + group)
            owner = split.chunk_client[sl]
            p = params if shared else {k: v[owner] for k, v in params.items()}
            extra = [t[owner] for t in per_client]
            leaves, spec = tree_flatten(fns[shared](p, *self._chunk_rows(split, sl), split.chunk_mask[sl], *extra))
            if acc is None:
                acc = [torch.zeros((split.num_clients,) + t.shape[1:], dtype=t.dtype, device=t.device) for t in leaves]
            for a, t in zip(acc, leaves):
                a.index_add_(0, owner, t)
        return tree_unflatten(acc, spec)

    def full_grad(self, params: Params, split: ClientSplit, shared: bool) -> tuple[Params, Tensor]:
        if self._conv_on_cpu(split.x):
            return self._loop.full_grad(params, split, shared)
        hand = self._hand(split.x)
        with torch.no_grad() if hand else torch.enable_grad():
            grads, loss = self._sum_per_client(self._chunk_hand if hand else self._chunk_autograd, params, split,
                                               shared)
        n = split.sizes.to(split.chunk_mask.dtype)
        return {k: g / n.view(-1, *[1] * (g.dim() - 1)) for k, g in grads.items()}, loss / n

    def evaluate(self, params: Params, split: ClientSplit, shared: bool, centers: Tensor | None = None,
                 present: Tensor | None = None) -> tuple[Tensor, Tensor]:
        if self._conv_on_cpu(split.x):
            return self._loop.evaluate(params, split, shared, centers, present)
        if centers is not None:
            return tuple(self._sum_per_client(self._chunk_proto, params, split, shared, centers, present))
        if shared:
            return self._evaluate_shared(params, split)
        loss, correct = self._sum_per_client(self._chunk_eval, params, split, shared)
        return loss, correct

    def loss_sums(self, params: Params, split: ClientSplit, shared: bool) -> Tensor:
        if shared and not self._conv_on_cpu(split.x):
            return self._evaluate_shared(params, split, accuracy=False)[0]
        return super().loss_sums(params, split, shared)

    @torch.no_grad()
    def _evaluate_shared(self, params: Params, split: ClientSplit,
                         accuracy: bool = True) -> tuple[Tensor, Tensor | None]:
        """One model for every client: a plain forward over the flat rows, in blocks (at most a group
        of chunks' rows), summed per client by each row's owner. No padding, and the layers run as
        single matrix products (vmapped with unbatched weights they were 2.7x slower on the CPU).
        Fully connected models with cross-entropy give class-major logits [classes, rows]
        (`class_major_logits`) and the losses come from them; the training-loss pass (`loss_sums`)
        skips the argmax. CPU, one thread, the synthetic training rows (185k): losses alone 36-40 ->
        22-26 ms; the training-loss pass with its unused argmax before, 41-54 ms."""
        # (output_size: the number of rows is known, so no device-to-host read of the sizes' sum)
        owner = torch.repeat_interleave(torch.arange(split.num_clients, device=split.y.device), split.sizes,
                                        output_size=len(split.y))
        block = self._group(split) * split.chunk_idx.shape[1]
        class_major = self._hand(split.x) and hasattr(self.model, "class_major_logits")
        loss = correct = None
        for s in range(0, len(split.y), block):
            x, y, o = split.x[s : s + block], split.y[s : s + block], owner[s : s + block]
            if class_major:
                logits = self.model.class_major_logits(params, x)
                rows_loss = torch.log_softmax(logits, 0).gather(0, y.unsqueeze(0)).squeeze(0).neg_()
            else:
                logits = self.logits(params, x)
                rows_loss = self.criterion(logits, y, reduction="none")
            if loss is None:
                loss = torch.zeros(split.num_clients, dtype=logits.dtype, device=logits.device)
                correct = torch.zeros_like(loss) if accuracy else None
            loss.index_add_(0, o, rows_loss)
            if accuracy:
                # (argmax over the classes of class-major logits, argmax(0), took ~3x longer than a
                # transposed copy and argmax over its last dimension, CPU)
                hit = (logits.t().contiguous() if class_major else logits).argmax(-1) == y
                correct.index_add_(0, o, hit.to(logits.dtype))
        return loss, correct

    def class_sums(self, params: Params, split: ClientSplit, shared: bool) -> tuple[Tensor, Tensor, Tensor | None]:
        """Per-client sums [C, K, d] of the features of each class's rows, counts [C, K], and summed
        losses [C] (None when the model cannot give features and logits from one pass)."""
        if self._conv_on_cpu(split.x):
            return self._loop.class_sums(params, split, shared)
        out = self._sum_per_client(self._chunk_class, params, split, shared)
        return (*out, None) if len(out) == 2 else tuple(out)
