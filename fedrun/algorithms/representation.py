"""What the representation methods (MOON, FedRoD, FedProto, FedDBE) share: the model seen as a body
(every layer up to its last hidden one: `Engine.features`, the representation) and a head (its output
layer, `engine.tree.head_names`), computed inside a per-client function (`Engine.value_and_grad`) or for
every client of a round at once (`client_features`)."""
from __future__ import annotations

import torch
from torch import Tensor
from torch.func import functional_call, vmap

from ..engine import Engine
from ..engine.batchnorm import split_buffers
from ..engine.tree import Params, head_names
from ..errors import ConfigError
from .checks import require_body


def features_and_logits(engine: Engine, p: Params, x: Tensor) -> tuple[Tensor, Tensor]:
    """(representation, logits) of one client's rows: one pass where the model gives both."""
    if getattr(engine.model, "features_and_logits", False):
        return engine.features_logits(p, x)
    return engine.features(p, x), engine.logits(p, x)


def head_of(p: Params) -> Params:
    """The head's entries of (stacked or unstacked) params, by their full names."""
    return {k: p[k] for k in head_names(p)}


def apply_head(engine: Engine, head: Params, z: Tensor) -> Tensor:
    """The model's output layer with the parameters `head` (full names, unstacked) applied to the
    representation `z` [B, d]: logits [B, K]."""
    prefix = next(iter(head)).rsplit(".", 1)[0] + "."
    return functional_call(engine.model.head, {k[len(prefix):]: v for k, v in head.items()}, (z,))


def require_linear_head(name: str, params: Params, what: str) -> None:
    """One line unless the model has a body and a linear head (a weight [K, d] and a bias [K])."""
    require_body(name, params, what)
    head = head_names(params)
    shapes = sorted(params[k].dim() for k in head)
    if len(head) != 2 or shapes != [1, 2]:
        raise ConfigError(f"algo={name} {what}, which needs a linear output layer (a weight and a bias); "
                          f"this model's is {', '.join(head)}")


def flat(params: Params) -> tuple[list[str], list[Tensor]]:
    """Names and tensors of a params dict (to pass it through `Engine.value_and_grad`'s tensor args)."""
    return list(params), list(params.values())


def client_features(engine: Engine, params: Params, x: Tensor) -> Tensor:
    """Every client's representations [m, B, d] of its own rows x [m, B, ...] by its own (stacked)
    params, outside autograd: one vmapped pass, or client by client with the loop engine (and where
    the vmap engine's own passes go client by client: convolutions on the CPU, branch "conv")."""
    if engine.name == "loop" or getattr(engine, "_conv_on_cpu", lambda x: False)(x):
        return torch.stack([engine.features({k: v[i] for k, v in params.items()}, x[i]) for i in range(len(x))])
    return vmap(engine.features)(params, x)


def step_features(engine: Engine, state: Params, x: Tensor) -> Tensor:
    """`client_features` as a training step's forward computes them: for a model state with BatchNorm,
    in training mode (each client's batch statistics; the running statistics it would update are
    copies, dropped: the step's own forward updates the state's); without BatchNorm, client_features."""
    params, buffers = split_buffers(state)
    if not buffers:
        return client_features(engine, state, x)
    engine.model.train()
    try:
        return client_features(engine, {**params, **{k: v.clone() for k, v in buffers.items()}}, x)
    finally:
        engine.model.eval()  # (fedrun keeps a BatchNorm model in eval mode outside a step)
