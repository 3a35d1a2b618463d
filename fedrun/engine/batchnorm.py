"""BatchNorm in the engine: which entries of a model's state are running statistics, and how
stacked ones are split and averaged."""
from __future__ import annotations

from torch import Tensor, nn

from .tree import BUFFERS as BUFFERS  # (the names' home is tree.py; re-exported)
from .tree import Params, is_buffer, weighted_mean


def split_buffers(state: Params) -> tuple[Params, Params]:
    """(trainable parameters, BatchNorm buffers) of a model state; buffers are {} without BatchNorm."""
    return ({k: v for k, v in state.items() if not is_buffer(k)}, {k: v for k, v in state.items() if is_buffer(k)})


def batchnorm_names(state: Params) -> list[str]:
    """The entries of the model's BatchNorm layers: their affine parameters and their buffers (the
    layers are the modules owning a running_mean)."""
    layers = {k.rsplit(".", 1)[0] + "." for k in state if k.endswith(".running_mean")}
    return [k for k in state if k.rsplit(".", 1)[0] + "." in layers]


def mean_buffers(stacked: Params, weights: Tensor | None = None) -> Params:
    """The server's BatchNorm buffers from clients' (leading dim = clients): running statistics
    averaged as parameters are (`weighted_mean`); the integer step counter num_batches_tracked,
    which BatchNorm reads only when its momentum is None (never in fedrun), the largest."""
    floats = {k: v for k, v in stacked.items() if v.is_floating_point()}
    out = weighted_mean(floats, weights)
    out.update({k: v.max(0).values for k, v in stacked.items() if not v.is_floating_point()})
    return {k: out[k] for k in stacked}


def _has_batchnorm(model: nn.Module) -> bool:
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())


class _training:
    """The model in training mode for a block (BatchNorm: batch statistics, running ones updated);
    fedrun keeps BatchNorm models in eval mode otherwise (evaluation uses the running statistics)."""

    def __init__(self, model: nn.Module):
        self.model = model

    def __enter__(self):
        self.model.train()

    def __exit__(self, *exc):
        self.model.eval()
