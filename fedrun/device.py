"""The `device=` option: auto | cpu | cuda | cuda:N."""
from __future__ import annotations

import torch

from .algorithms.base import ConfigError


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cpu" or name == "cuda" or (name.startswith("cuda:") and name[5:].isdigit()):
        if name.startswith("cuda") and not torch.cuda.is_available():
            raise ConfigError(f"device={name!r} but no CUDA device is available; use device=auto or device=cpu")
        return torch.device(name)
    raise ConfigError(f"device={name!r} is not allowed; choose one of: auto, cpu, cuda, cuda:N")
