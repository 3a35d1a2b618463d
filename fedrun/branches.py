"""Every path the engine (and the models it drives) chooses by device, named in ONE place.

A run never sets these: each branch takes its default for the device the tensors are on. Tests and
`fedrun-bench --gpu-check` force each value (`VmapEngine(model, paths={...})`), so the path a GPU
takes runs on the CPU too, and the engine-agreement test walks `BRANCHES`: a branch added here is
checked against the loop engine without a further line of test code.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn


def _convolutional(model: nn.Module) -> bool:
    return any(isinstance(m, nn.modules.conv._ConvNd) for m in model.modules())


@dataclass(frozen=True)
class Branch:
    values: tuple[str, ...]
    cpu: str  # the value on the CPU
    other: str  # the value on any other device (cuda)
    applies: Callable[[nn.Module], bool]  # whether the branch changes anything for this model
    doc: str


BRANCHES: dict[str, Branch] = {
    "conv": Branch(
        ("per_client", "vmap"), "per_client", "vmap", _convolutional,
        "convolutional models' passes (full passes, HVPs, meta-gradients, the batched forward): client by "
        "client as the loop engine does, or vmapped over clients (grouped convolutions, one launch)"),
    "backward": Branch(
        ("hand", "autograd"), "hand", "hand", lambda m: hasattr(m, "stacked_ce_grad"),
        "minibatch and full-batch gradients of models with a hand-written cross-entropy backward: it, "
        "or autograd through the vmapped (batched-matmul) forward"),
    "groups": Branch(
        ("rows", "chunks"), "rows", "chunks", lambda m: True,
        "full passes: groups of at most VmapEngine.CPU_GROUP_ROWS rows, or of max_chunks chunks"),
    "layout": Branch(
        ("channels_last", "contiguous"), "channels_last", "contiguous", _convolutional,
        "images' memory order outside torch.func transforms (oneDNN is faster channels-last)"),
    "rnn": Branch(
        ("fused", "batched"), "fused", "batched", lambda m: hasattr(m, "rnn"),
        "the LSTM's hand-path gradients (branch backward=hand): client by client through torch's fused LSTM "
        "(oneDNN on the CPU, its weights stay in cache), or the recurrence batched over clients and rows, one "
        "batched product per step and a backward through time by hand"),
}


def check_paths(paths: dict[str, str] | None) -> dict[str, str]:
    """`paths` validated: every key a branch, every value one of its values."""
    paths = dict(paths or {})
    for name, value in paths.items():
        if name not in BRANCHES:
            raise ValueError(f"engine path {name!r} is not a branch; choose from: {', '.join(BRANCHES)}")
        if value not in BRANCHES[name].values:
            raise ValueError(f"engine path {name}={value!r} is not allowed; choose one of: "
                             f"{', '.join(BRANCHES[name].values)}")
    return paths


def choose(name: str, device: torch.device | str, forced: dict[str, str] | None = None) -> str:
    """The value of branch `name` for tensors on `device`: `forced[name]` if given, else its default."""
    if forced and name in forced:
        return forced[name]
    b = BRANCHES[name]
    return b.cpu if torch.device(device).type == "cpu" else b.other


def settings(model: nn.Module, device: torch.device | str = "cpu") -> list[dict[str, str]]:
    """Path settings that, between them, run every value of every branch that applies to `model` on
    `device`: {} (every default there) and the other values all forced at once (each branch has two
    values; a third would add a setting)."""
    out: list[dict[str, str]] = [{}]
    for name, b in BRANCHES.items():
        if b.applies(model):
            others = [v for v in b.values if v != choose(name, device)]
            for i, v in enumerate(others):
                if i + 1 >= len(out):
                    out.append({})
                out[i + 1][name] = v
    return out
