"""Training-batch augmentation on the device, batched over clients and images (no Python loop).

`crop_flip`: random crop of a padded image (padding 4) and random horizontal flip, the CIFAR
augmentation of paper 004 (paper 004, its authors' code alpemreacar/PFL). The padding takes a per-channel `fill`
(FederatedData.augment_fill): for CIFAR the normalized value of a black pixel, as in the authors'
code, whose torchvision RandomCrop pads the uint8 image before Normalize; None pads with 0 (the
training set's mean colour once normalized). The random numbers are drawn on the CPU from the
generator passed in and then moved to the data's device, so CPU and GPU runs agree.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor


def crop_flip_params(n: int, generator: torch.Generator, padding: int = 4) -> tuple[Tensor, Tensor, Tensor]:
    """(dy, dx, flip) for n images: crop offsets in [0, 2 padding] (padding = no shift), flip bools."""
    dy = torch.randint(0, 2 * padding + 1, (n,), generator=generator)
    dx = torch.randint(0, 2 * padding + 1, (n,), generator=generator)
    flip = torch.rand(n, generator=generator) < 0.5
    return dy, dx, flip


def crop_flip_apply(x: Tensor, dy: Tensor, dx: Tensor, flip: Tensor, padding: int = 4,
                    fill: Tensor | None = None) -> Tensor:
    """Crops x [..., C, H, W] (images flattened in order) at offsets (dy, dx) of the image padded
    with `fill` ([C], per channel; None: 0), then mirrors the images where `flip`; two gathers on the
    padded batch."""
    *lead, c, h, w = x.shape
    if fill is None:
        flat = F.pad(x.reshape(-1, c, h, w), (padding,) * 4)
    else:  # the border holds fill exactly, the image its own values (no arithmetic on either)
        flat = fill.to(x.device, x.dtype)[:, None, None].expand(x.numel() // (c * h * w), c, h + 2 * padding,
                                                                 w + 2 * padding).clone()
        flat[:, :, padding:padding + h, padding:padding + w] = x.reshape(-1, c, h, w)
    dy, dx, flip = dy.to(x.device), dx.to(x.device), flip.to(x.device)
    rows = dy[:, None] + torch.arange(h, device=x.device)  # [n, H]
    cols = torch.arange(w, device=x.device)
    cols = dx[:, None] + torch.where(flip[:, None], w - 1 - cols, cols)  # [n, W]
    n, _, _, wp = flat.shape
    out = flat.gather(2, rows[:, None, :, None].expand(n, c, h, wp))
    out = out.gather(3, cols[:, None, None, :].expand(n, c, h, w))
    return out.reshape(*lead, c, h, w)


def crop_flip(x: Tensor, generator: torch.Generator, padding: int = 4, fill: Tensor | None = None) -> Tensor:
    """Random crop (padding `padding` with `fill`) and horizontal flip, independent per image of x [..., C, H, W]."""
    n = math.prod(x.shape[:-3])
    return crop_flip_apply(x, *crop_flip_params(n, generator, padding), padding=padding, fill=fill)


AUGMENTATIONS = {"crop_flip": crop_flip}
# name -> (draw(n, generator) -> per-image params, apply(x, *params, fill=...) -> x): the training loop draws a
# round's params up front, so how the round's clients are split into chunks cannot change them.
AUGMENTATION_PARTS = {"crop_flip": (crop_flip_params, crop_flip_apply)}


def augment(name: str | None, x: Tensor, generator: torch.Generator, fill: Tensor | None = None) -> Tensor:
    """x augmented by `AUGMENTATIONS[name]` (x itself when name is None): `FederatedData.augment`."""
    return x if name is None else AUGMENTATIONS[name](x, generator, fill=fill)


def draw_augmentation(name: str | None, shape: tuple[int, ...], generator: torch.Generator) -> tuple | None:
    """Per-image augmentation params for a batch of indices of `shape` (None when name is None),
    each a tensor of that shape."""
    if name is None:
        return None
    n = math.prod(shape)
    return tuple(t.reshape(shape) for t in AUGMENTATION_PARTS[name][0](n, generator))


def apply_augmentation(name: str, x: Tensor, params: tuple, fill: Tensor | None = None) -> Tensor:
    """x [*shape, C, H, W] augmented with the params `draw_augmentation` drew for `shape` (`fill`:
    FederatedData.augment_fill)."""
    return AUGMENTATION_PARTS[name][1](x, *(p.reshape(-1) for p in params), fill=fill)
