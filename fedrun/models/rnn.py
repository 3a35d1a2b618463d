"""LEAF's Shakespeare character model (Caldas et al. 2018, LEAF; McMahan et al. 2017's next-character
LSTM): embedding 8 -> 2-layer LSTM of 256 units -> linear -> the next character, predicted from the
last step's output.

The recurrence is written out as matrix products over time (`lstm_layers`) instead of calling
nn.LSTM: cuDNN's and ATen's fused LSTM kernels have no vmap batching rule, so vmapped over clients
they fall back to a per-client loop; these plain ops batch (per-client weights give batched matrix
products). nn.LSTM is kept as the holder of the weights, with its names, shapes and initialization,
so a state dict moves between the two and the test compares them on the same weights.
"""
from __future__ import annotations

import torch
from torch import nn

from .small import _outputs


def lstm_layers(lstm: nn.LSTM, x: torch.Tensor) -> torch.Tensor:
    """The top layer's outputs [B, T, H] of `lstm` (batch_first, unidirectional, zero initial state)
    on x [B, T, in], computed as nn.LSTM does (gates i, f, g, o): the input projection of all steps
    in one product per layer, then one [B, H] x [H, 4H] product per step."""
    h_seq = x
    for layer in range(lstm.num_layers):
        w_ih, w_hh = getattr(lstm, f"weight_ih_l{layer}"), getattr(lstm, f"weight_hh_l{layer}")
        xs = h_seq @ w_ih.T
        if lstm.bias:
            xs = xs + (getattr(lstm, f"bias_ih_l{layer}") + getattr(lstm, f"bias_hh_l{layer}"))
        h = c = xs.new_zeros(xs.shape[0], lstm.hidden_size)
        outs = []
        for t in range(xs.shape[1]):
            i, f, g, o = (xs[:, t] + h @ w_hh.T).chunk(4, -1)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(c)
            outs.append(h)
        h_seq = torch.stack(outs, 1)
    return h_seq


class LSTM(nn.Module):
    """Next-character LSTM: int64 character ids [B, T] -> logits [B, num_classes] for character T+1.

    LEAF's Shakespeare model is the default (vocab_size 80, embed_dim 8, hidden 256, layers 2); the
    Proto features are the top layer's last output (`hidden` values). `in_features` (the sequence
    length) is accepted for the common model interface."""

    def __init__(self, in_features: int, num_classes: int, vocab_size: int = 80, embed_dim: int = 8,
                 hidden: int = 256, layers: int = 2):
        super().__init__()
        self.num_classes = num_classes
        self.embedding = nn.Embedding(vocab_size, embed_dim)
        self.lstm = nn.LSTM(embed_dim, hidden, layers, batch_first=True)  # its weights; see the module docstring
        self.head = nn.Linear(hidden, num_classes)

    features_and_logits = True

    def forward(self, x: torch.Tensor, features: bool | str = False):
        h = lstm_layers(self.lstm, self.embedding(x))[:, -1]
        return _outputs(h, self.head, features)
