"""Plain nn.Modules. The engine uses them functionally (torch.func.functional_call) with stacked
per-client parameters; the modules themselves hold only the initial weights."""
from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

ACTIVATIONS = {"relu": nn.ReLU, "elu": nn.ELU, "tanh": nn.Tanh, "sigmoid": nn.Sigmoid}


class MLR(nn.Module):
    """Multinomial logistic regression (softmax regression): one linear layer."""

    def __init__(self, in_features: int, num_classes: int):
        super().__init__()
        self.linear = nn.Linear(in_features, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x.flatten(1))


class MLP(nn.Module):
    """Fully connected network: in -> hidden[0] -> ... -> num_classes, `activation` between layers.

    Per-FedAvg's MNIST network is hidden=[80, 60] with ELU; pFedMe's DNNs are hidden=[20] (synthetic)
    and hidden=[100] (MNIST) with ReLU.
    """

    def __init__(self, in_features: int, num_classes: int, hidden: Sequence[int] = (20,), activation: str = "relu"):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"model.activation={activation!r} is not one of {sorted(ACTIVATIONS)}")
        layers: list[nn.Module] = []
        width = in_features
        for h in hidden:
            layers += [nn.Linear(width, int(h)), ACTIVATIONS[activation]()]
            width = int(h)
        layers.append(nn.Linear(width, num_classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x.flatten(1))
