"""Text classifiers for AG News-like data: rows of int64 token ids [B, L], 0 the padding id.

  FastText     Joulin et al. 2017 as PFLlib has it (`fastText`): mean of the tokens' embeddings,
               a linear hidden layer (the Proto features), the head.
  TextCNN      Kim 2014 as PFLlib has it (`TextCNN`): 1-d convolutions of widths 3, 4, 5 over the
               embeddings, ReLU, max over time, concatenated (the Proto features), the head.
  Transformer  a small post-norm encoder (Vaswani et al. 2017; PFLlib's `TransformerModel`, the
               layers of nn.TransformerEncoderLayer): scaled embeddings + sinusoidal positions,
               `layers` x (self-attention, ReLU feed-forward), mean over the non-padding tokens
               (the Proto features), the head.

No dropout (PFLlib's TextCNN has 0.8, its Transformer 0.1): fedrun's models behave the same in
training and evaluation (BatchNorm aside), so the vmap and loop engines compute the same numbers.
Attention is written with plain ops: torch's scaled_dot_product_attention has no vmap batching rule
on the CPU (it falls back to a loop over clients).
"""
from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ConfigError
from .small import _outputs

PAD = 0  # the padding token id


def _embed(embedding: nn.Embedding, x: torch.Tensor) -> torch.Tensor:
    """The tokens' embeddings [B, L, d], 0 at padding tokens (what nn.Embedding's padding_idx gives
    PFLlib's models). Masked here instead: torch 2.x's vmap of embedding drops padding_idx's zero
    gradient for every client but the first (it indexes the stacked tables as one), so the engines
    would differ."""
    return embedding(x) * (x != PAD).unsqueeze(-1).to(embedding.weight.dtype)


def _mean_tokens(h: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Mean of h [B, L, d] over the non-padding tokens of x [B, L] (a row of padding alone gives 0)."""
    keep = (x != PAD).to(h.dtype).unsqueeze(-1)
    return (h * keep).sum(1) / keep.sum(1).clamp(min=1)


class FastText(nn.Module):
    """Token embeddings (`dim`) averaged over the non-padding tokens, Linear dim -> dim (no
    activation, as PFLlib's), `head` Linear dim -> num_classes. `in_features` (the row length) is
    accepted for the common model interface."""

    def __init__(self, in_features: int, num_classes: int, vocab_size: int = 30000, dim: int = 512):
        super().__init__()
        self.num_classes = num_classes
        self.embedding = nn.Embedding(vocab_size, dim)
        self.hidden = nn.Linear(dim, dim)
        self.head = nn.Linear(dim, num_classes)

    features_and_logits = True

    def forward(self, x: torch.Tensor, features: bool | str = False):
        return _outputs(self.hidden(_mean_tokens(_embed(self.embedding, x), x)), self.head, features)


class TextCNN(nn.Module):
    """Token embeddings (`dim`), one Conv1d of `channels` filters per width in `kernels`, ReLU, max
    over all positions (PFLlib's MaxPool1d over the padded length), concatenated, `head`. Rows must
    be at least max(kernels) tokens long."""

    def __init__(self, in_features: int, num_classes: int, vocab_size: int = 30000, dim: int = 512,
                 channels: int = 100, kernels: Sequence[int] = (3, 4, 5)):
        super().__init__()
        self.num_classes = num_classes
        self.embedding = nn.Embedding(vocab_size, dim)
        self.convs = nn.ModuleList(nn.Conv1d(dim, channels, int(k)) for k in kernels)
        self.head = nn.Linear(channels * len(self.convs), num_classes)

    features_and_logits = True

    def forward(self, x: torch.Tensor, features: bool | str = False):
        e = _embed(self.embedding, x).transpose(1, 2)  # [B, dim, L]
        h = torch.cat([F.relu(conv(e)).amax(-1) for conv in self.convs], 1)
        return _outputs(h, self.head, features)


class EncoderLayer(nn.Module):
    """nn.TransformerEncoderLayer's computation (post-norm, ReLU; batch_first) with a key padding
    mask, from plain ops: x + attention -> norm1, + feed-forward -> norm2. Its in_proj and out_proj
    hold nn.MultiheadAttention's in_proj_weight/bias and out_proj."""

    def __init__(self, dim: int, heads: int, ff: int):
        super().__init__()
        self.heads = heads
        self.in_proj = nn.Linear(dim, 3 * dim)
        self.out_proj = nn.Linear(dim, dim)
        self.linear1, self.linear2 = nn.Linear(dim, ff), nn.Linear(ff, dim)
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        nn.init.xavier_uniform_(self.in_proj.weight)  # nn.MultiheadAttention's initialization
        nn.init.zeros_(self.in_proj.bias)
        nn.init.zeros_(self.out_proj.bias)

    def forward(self, x: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        """x [B, L, dim]; pad [B, L] True where the token is padding (never attended to)."""
        B, L, d = x.shape
        q, k, v = self.in_proj(x).view(B, L, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-1, -2) / math.sqrt(d // self.heads)  # [B, heads, L, L]
        # the dtype's lowest value, not -inf: a row of padding alone attends uniformly instead of NaN
        scores = scores.masked_fill(pad[:, None, None, :], torch.finfo(scores.dtype).min)
        a = (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, L, d)
        x = self.norm1(x + self.out_proj(a))
        return self.norm2(x + self.linear2(F.relu(self.linear1(x))))


def positions(length: int, dim: int, like: torch.Tensor) -> torch.Tensor:
    """Sinusoidal position encodings [length, dim] (Vaswani et al. 2017, Sec. 3.5), computed per
    call: a buffer would be taken for a parameter (fedrun keeps BatchNorm's buffers alone apart)."""
    pos = torch.arange(length, dtype=like.dtype, device=like.device).unsqueeze(1)
    freq = torch.exp(torch.arange(0, dim, 2, dtype=like.dtype, device=like.device) * (-math.log(10000.0) / dim))
    return torch.stack([torch.sin(pos * freq), torch.cos(pos * freq)], -1).flatten(1)[:, :dim]


class Transformer(nn.Module):
    """Embedding x sqrt(dim) + positions, `layers` EncoderLayers, mean over the non-padding tokens
    (`pool="mean"`; "first": the first token's output, as PFLlib's), `head` Linear dim -> num_classes.
    Embedding and head initialized as PFLlib's (uniform +-0.1, head bias 0)."""

    POOLS = ("mean", "first")

    def __init__(self, in_features: int, num_classes: int, vocab_size: int = 30000, dim: int = 128, heads: int = 8,
                 layers: int = 2, ff: int = 512, pool: str = "mean"):
        super().__init__()
        if dim % heads:
            raise ConfigError(f"model.dim={dim} must be a multiple of model.heads={heads}")
        if pool not in self.POOLS:
            raise ConfigError(f"model.pool={pool!r} is not allowed; choose one of: {', '.join(self.POOLS)}")
        self.num_classes, self.dim, self.pool = num_classes, dim, pool
        self.embedding = nn.Embedding(vocab_size, dim)
        self.layers = nn.ModuleList(EncoderLayer(dim, heads, ff) for _ in range(layers))
        self.head = nn.Linear(dim, num_classes)
        nn.init.uniform_(self.embedding.weight, -0.1, 0.1)
        nn.init.uniform_(self.head.weight, -0.1, 0.1)
        nn.init.zeros_(self.head.bias)

    features_and_logits = True

    def forward(self, x: torch.Tensor, features: bool | str = False):
        h = self.embedding(x) * math.sqrt(self.dim)
        h = h + positions(x.shape[1], self.dim, h)
        pad = x == PAD
        for layer in self.layers:
            h = layer(h, pad)
        h = _mean_tokens(h, x) if self.pool == "mean" else h[:, 0]
        return _outputs(h, self.head, features)
