"""The engine: stacked per-client parameters and the two engines that compute on them (see base.py
for the primitives). `VmapEngine` (vmap.py) is the fast path, `LoopEngine` (loop.py) the reference;
tree.py holds the per-client tree helpers, batchnorm.py the BatchNorm bookkeeping, work.py the per-client
steps of uneven counts computed at the cost of the work done (local epochs, fine-tuning in epochs)."""
from .base import Engine
from .loop import LoopEngine
from .tree import Params, params_of, stack, weighted_mean
from .vmap import VmapEngine

ENGINES = {"vmap": VmapEngine, "loop": LoopEngine}

__all__ = ["ENGINES", "Engine", "LoopEngine", "Params", "VmapEngine", "params_of", "stack", "weighted_mean"]
