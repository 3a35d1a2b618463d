"""Per-client parameter trees: dicts name -> tensor, "stacked" with a leading client dimension."""
from __future__ import annotations

import torch
from torch import Tensor, nn



Params = dict[str, Tensor]


def stack(params: Params, m: int) -> Params:
    """m copies of unstacked params along a new leading client dimension."""
    return {k: v.unsqueeze(0).expand(m, *v.shape).clone() for k, v in params.items()}


def weighted_mean(stacked: Params, weights: Tensor | None = None) -> Params:
    """Mean over the client dimension, uniform or with `weights` [m] (normalized here)."""
    if weights is None:
        return {k: v.mean(0) for k, v in stacked.items()}
    w = weights / weights.sum()
    return {k: torch.tensordot(w.to(v.dtype), v, dims=1) for k, v in stacked.items()}


def params_of(model: nn.Module) -> Params:
    """The model's initial state: its parameters and, for a model with BatchNorm layers, their
    buffers (running_mean, running_var, num_batches_tracked; see `split_buffers`)."""
    out = {k: v.detach().clone() for k, v in model.named_parameters()}
    out.update({k: v.detach().clone() for k, v in model.named_buffers()})
    return out
