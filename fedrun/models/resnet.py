"""ResNet-10/18/34 (He et al. 2016, BasicBlock) with the CIFAR stem that FL papers train on 32x32
images: one 3x3 convolution, stride 1, and no max-pooling (torchvision's and PFLlib's ImageNet stem,
a 7x7 stride-2 convolution and a max-pool, shrinks a 32x32 image to 8x8 before the first block).

`norm` picks the layer after every convolution:
  bn    BatchNorm2d; its running statistics are buffers, kept per client by the engine (FedBN keeps
        its layers local, FedAvg averages them like parameters; fedrun.engine.batchnorm.split_buffers)
  gn    GroupNorm with `groups` groups per layer (Hsieh et al. 2020, "The Non-IID Data Quagmire",
        Sec. 5: 2 groups), no statistics across rows, so it behaves the same for any client's data
  none  no normalization
The blocks follow torchvision's: conv3x3-norm-ReLU-conv3x3-norm, plus the shortcut (a 1x1
convolution with norm where the shape changes), then ReLU; convolutions have no bias; weights are
initialized as torchvision's (Kaiming normal, fan_out; norm weight 1, bias 0).
"""
from __future__ import annotations

import torch
from torch import nn

from ..errors import ConfigError
from .small import _outputs, image_shape

NORMS = ("bn", "gn", "none")


def _norm(kind: str, channels: int, groups: int) -> nn.Module:
    if kind == "bn":
        return nn.BatchNorm2d(channels)
    if kind == "gn":
        return nn.GroupNorm(groups, channels)
    return nn.Identity()


class BasicBlock(nn.Module):
    def __init__(self, inplanes: int, planes: int, stride: int, norm: str, groups: int):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.norm1 = _norm(norm, planes, groups)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.norm2 = _norm(norm, planes, groups)
        self.relu = nn.ReLU()
        self.shortcut = nn.Sequential()
        if stride != 1 or inplanes != planes:
            self.shortcut = nn.Sequential(nn.Conv2d(inplanes, planes, 1, stride, bias=False),
                                          _norm(norm, planes, groups))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.norm1(self.conv1(x)))
        return self.relu(self.norm2(self.conv2(out)) + self.shortcut(x))


class ResNet(nn.Module):
    """CIFAR-style ResNet of BasicBlocks: stem, four stages of BLOCKS[i] blocks at widths
    width x (1, 2, 4, 8), strides (1, 2, 2, 2), global average pooling (the Proto features,
    8 x width values), `head` Linear -> num_classes.

    Subclasses set BLOCKS: (1, 1, 1, 1) ResNet-10, (2, 2, 2, 2) ResNet-18, (3, 4, 6, 3) ResNet-34.

    Args:
        norm: "bn", "gn" or "none" (module docstring).
        groups: GroupNorm's groups per layer (norm="gn").
        width: the first stage's channels (64 as in the paper; smaller for quick tests).
        in_channels, image_size: the input images' shape (None: read from in_features; the network
            itself takes any size, the shape only unflattens flat rows).
    """

    BLOCKS: tuple[int, ...] = ()

    def __init__(self, in_features: int, num_classes: int, norm: str = "bn", groups: int = 2, width: int = 64,
                 in_channels: int | None = None, image_size: int | None = None):
        super().__init__()
        if norm not in NORMS:
            raise ConfigError(f"model.norm={norm!r} is not allowed; choose one of: {', '.join(NORMS)}")
        if norm == "gn" and (groups < 1 or width % groups):
            raise ConfigError(f"model.groups={groups!r} must be an integer >= 1 that divides model.width={width}")
        self.in_channels, self.image_size = image_shape(in_features, in_channels, image_size)
        self.num_classes = num_classes
        self.stem = nn.Sequential(nn.Conv2d(self.in_channels, width, 3, 1, 1, bias=False),
                                  _norm(norm, width, groups), nn.ReLU())
        layers, inplanes = [], width
        for i, n in enumerate(self.BLOCKS):
            planes = width * 2 ** i
            for j in range(int(n)):
                layers.append(BasicBlock(inplanes, planes, 2 if i and not j else 1, norm, groups))
                inplanes = planes
        self.layers = nn.Sequential(*layers)
        self.head = nn.Linear(inplanes, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    features_and_logits = True

    def forward(self, x: torch.Tensor, features: bool | str = False):
        x = x.reshape(x.shape[0], self.in_channels, self.image_size, self.image_size)
        h = self.layers(self.stem(x)).mean((2, 3))
        return _outputs(h, self.head, features)


class ResNet10(ResNet):
    """ResNet-10: one block per stage (PFLlib's resnet10, with the CIFAR stem)."""

    BLOCKS = (1, 1, 1, 1)


class ResNet18(ResNet):
    """ResNet-18: two blocks per stage (torchvision's resnet18, PFLlib's ResNet18, with the CIFAR stem)."""

    BLOCKS = (2, 2, 2, 2)


class ResNet34(ResNet):
    """ResNet-34: 3, 4, 6, 3 blocks per stage (torchvision's resnet34, with the CIFAR stem)."""

    BLOCKS = (3, 4, 6, 3)
