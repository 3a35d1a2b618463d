"""Paper 004's Proto: class prototypes (mean features) and the distance logits they serve."""
from __future__ import annotations

import torch
from torch import Tensor


def class_means(feats: Tensor, y: Tensor, num_classes: int, mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Proto's class prototypes (paper 004, Sec. 2): the mean feature [K, d] of each class among
    the (unmasked) rows, and which classes [K] occur at all."""
    onehot = (y.unsqueeze(-1) == torch.arange(num_classes, device=y.device)).to(feats.dtype)
    if mask is not None:
        onehot = onehot * mask.unsqueeze(-1)
    counts = onehot.sum(0)
    return onehot.T @ feats / counts.clamp(min=1).unsqueeze(-1), counts > 0


def proto_logits(feats: Tensor, centers: Tensor, present: Tensor) -> Tensor:
    """Logits [B, K] = minus the squared Euclidean distance of each feature [B, d] to each prototype
    [K, d]; classes not `present` [K] get -inf (never predicted)."""
    d2 = (feats * feats).sum(-1, keepdim=True) - 2 * feats @ centers.T + (centers * centers).sum(-1)
    return torch.where(present, -d2, torch.full_like(d2, -torch.inf))
