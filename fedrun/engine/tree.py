"""Per-client parameter trees: dicts name -> tensor, "stacked" with a leading client dimension.

THE module of tree helpers (fedjax's tree_util in spirit): algorithms build their local steps and
server updates from these, not from hand-written dict comprehensions over the client axis.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

# torch's pytree functions come from its private torch.utils._pytree (torch has no public module for
# them); fedrun imports that module here and nowhere else (tests/test_layers.py checks): the rest of
# the package takes these four names from this module (`x as x`: re-exported).
from torch.utils._pytree import tree_flatten as tree_flatten
from torch.utils._pytree import tree_leaves as tree_leaves
from torch.utils._pytree import tree_map as tree_map
from torch.utils._pytree import tree_unflatten as tree_unflatten

Params = dict[str, Tensor]


def stack(params: Params, m: int) -> Params:
    """m copies of unstacked params along a new leading client dimension."""
    return {k: v.unsqueeze(0).expand(m, *v.shape).clone() for k, v in params.items()}


def expand(params: Params, m: int) -> Params:
    """m views of the same params along a new leading client dimension (no copy)."""
    return {k: v.unsqueeze(0).expand(m, *v.shape) for k, v in params.items()}


def zeros_like(params: Params, m: int) -> Params:
    """Zeros stacked over m clients, shaped and typed like the unstacked `params`."""
    return {k: torch.zeros(m, *v.shape, dtype=v.dtype, device=v.device) for k, v in params.items()}


def gather(params: Params, idx: Tensor) -> Params:
    """The clients `idx` (positions or a mask) of stacked params: the round's rows of per-client
    state stacked over ALL clients, or the models to aggregate among a round's."""
    return {k: v[idx] for k, v in params.items()}


def scatter(full: Params, ids: Tensor, rows: Params) -> Params:
    """Per-client state with rows `ids` replaced (a new tensor: earlier states stay as they were)."""
    return {k: v.index_copy(0, ids, rows[k].to(v.dtype)) for k, v in full.items()}


def per_client(scalars: Tensor, like: Tensor) -> Tensor:
    """Per-client scalars ([m] or [m, 1]) shaped to broadcast against a stacked tensor `like`
    [m, ...], in `like`'s dtype."""
    return scalars.view(-1, *[1] * (like.dim() - 1)).to(like.dtype)


def weighted_mean(stacked: Params, weights: Tensor | None = None) -> Params:
    """Mean over the client dimension, uniform or with `weights` [m] (normalized here). An integer
    entry (BatchNorm's step counter num_batches_tracked, which it reads only when its momentum is
    None, never in fedrun) takes the largest."""
    if weights is None:
        return {k: v.mean(0) if v.is_floating_point() else v.max(0).values for k, v in stacked.items()}
    w = weights / weights.sum()
    return {k: torch.tensordot(w.to(v.dtype), v, dims=1) if v.is_floating_point() else v.max(0).values
            for k, v in stacked.items()}


# -- the tree algebra of local steps and server rules (fedjax's tree_util): each over the entries of
# its FIRST tree, so a gradient (parameters only) leads and a model state with BatchNorm buffers follows


def add(a: Params, b: Params) -> Params:
    """a + b."""
    return {k: a[k] + b[k] for k in a}


def sub(a: Params, b: Params) -> Params:
    """a - b."""
    return {k: a[k] - b[k] for k in a}


def scale(a: Params, s) -> Params:
    """s * a (s a number, or per-client scalars [m] broadcast over stacked entries)."""
    if torch.is_tensor(s) and s.dim() == 1:
        return {k: a[k] * per_client(s, a[k]) for k in a}
    return {k: a[k] * s for k in a}


def axpy(alpha, x: Params, y: Params) -> Params:
    """y + alpha * x, over y's entries."""
    return {k: y[k] + alpha * x[k] for k in y}


def prox_grad(g: Params, w: Params, anchor: Params, mu: float) -> Params:
    """g + mu (w - anchor): the gradient of a proximal term mu/2 ||w - anchor||^2 added to `g`, over
    g's entries (FedProx, Ditto's personal step, FedAMP's); mu = 0 gives g itself."""
    if not mu:
        return g
    return {k: g[k] + mu * (w[k] - anchor[k]) for k in g}


def dot(a: Params, b: Params) -> Tensor:
    """Per-client inner products <a, b> over a's entries (stacked: [m])."""
    return sum((a[k] * b[k]).flatten(1).sum(1) for k in a)


BUFFERS = ("running_mean", "running_var", "num_batches_tracked")  # what a BatchNorm layer keeps besides
# its affine parameters; fedrun's models have no other buffers


def is_buffer(name: str) -> bool:
    return name.rsplit(".", 1)[-1] in BUFFERS


def param_names(tree: Params) -> list[str]:
    """The trainable entries of a model state: all but BatchNorm's running statistics (BUFFERS)."""
    return [k for k in tree if not is_buffer(k)]


def only(tree: Params, names) -> Params:
    """The entries `names` of `tree`, in tree's order."""
    names = set(names)
    return {k: v for k, v in tree.items() if k in names}


def sgd(params: Params, grads: Params, lr: float) -> Params:
    """params - lr * grads for every tensor, as ONE multi-tensor op (torch._foreach_add: on CUDA a
    few fused launches for all tensors; on the CPU the same per-tensor torch.add, bit for bit).
    Gradients in another dtype (bf16 autocast) are cast to the parameters' first."""
    keys = list(params)
    g = [grads[k] if grads[k].dtype == params[k].dtype else grads[k].to(params[k].dtype) for k in keys]
    return dict(zip(keys, torch._foreach_add([params[k] for k in keys], g, alpha=-lr)))


def sgd_each(params: Params, grads: Params, lr: float) -> Params:
    """`sgd` one tensor at a time: inside torch.func transforms (vmap has no rule for foreach ops)."""
    return {k: torch.add(params[k], grads[k], alpha=-lr) for k in params}


def clip_per_client(g: Params, max_norm: float | None) -> Params:
    """Scales each client's gradient (leading dim = clients) to norm <= max_norm, with
    torch.nn.utils.clip_grad_norm_'s rule (scale max_norm / (norm + 1e-6) when below 1)."""
    if not max_norm:
        return g
    sq = sum(v.flatten(1).pow(2).sum(1) for v in g.values())
    scale = (max_norm / (sq.sqrt() + 1e-6)).clamp(max=1.0)
    return {k: v * per_client(scale, v) for k, v in g.items()}


def params_of(model: nn.Module) -> Params:
    """The model's initial state: its parameters and, for a model with BatchNorm layers, their
    buffers (running_mean, running_var, num_batches_tracked; see `split_buffers`)."""
    out = {k: v.detach().clone() for k, v in model.named_parameters()}
    out.update({k: v.detach().clone() for k, v in model.named_buffers()})
    return out


def head_names(params: Params) -> list[str]:
    """The parameters of the model's output layer (the "head" of FedPer, FedRep, LG-FedAvg, FedBABU):
    those of the module that owns the last parameter (fedrun's models: MLR `linear`, MLP the last
    `net.<i>`, CNN `head`; of a model state, the last parameter, not a BatchNorm buffer, which
    `params_of` lists after them). The rest is the "body" (the representation)."""
    last = param_names(params)[-1].rsplit(".", 1)[0] + "."
    return [k for k in params if k.startswith(last)]
